"""How long work takes on this machine: rates measured as the work ran, kept in the disk cache,
and the estimates a computation says before it starts (docs/explanation/performance.md,
"Estimates before the work").

Every computation that writes a disk-cache entry (an extraction, a layer table, the layer
repeats, the head statistics) stores its ``seconds`` and its amount of ``work`` in the entry's
meta, so the cache itself is the record of what this machine did: a rate is the median of
seconds / work over the newest entries of one kind (`measured_rate`). The work is counted in a
unit per kind (`UNITS`), chosen so that the rate hardly depends on the settings:

- an extraction or the head statistics: tokens × millions of parameters (a forward pass costs
  about that);
- a layer table: examples × layers × d_model (its Gram matrices and probe fits grow with it);
- the repeats: repeats × examples × layers × d_model.

An estimate (`estimate`) comes from the rate of earlier work of the same kind on the same
device, else from a timing made just now on a small piece of the same work (``calibrate``: an
extraction times one batch through the model), else there is none, and the progress line says
the time left as soon as some of the work is done (`announce`). Nothing here is a constant of
some other machine.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.progress import Progress

# What a kind's ``work`` counts (the disk-cache kind's name → its unit, in words).
UNITS = {
    "states": "tokens × M parameters",
    "heads": "tokens × M parameters",
    "layer_metrics": "examples × layers × d_model",
    "layer_repeats": "repeats × examples × layers × d_model",
}
NEWEST = 9  # entries a rate is the median of
# A kind whose rate stands in for another's while that one has none measured here: the head
# statistics are a forward pass with attention weights (and small SVDs per head). (A repeat is
# not a layer table: it reuses the table's probe predictions, and costs a fraction of one.)
STAND_INS = {"heads": "states"}


@dataclass(frozen=True)
class Estimate:
    """``seconds`` of some work on this machine and where the figure comes from."""

    seconds: float
    source: str

    def text(self) -> str:
        return f"about {duration(self.seconds)} on this machine ({self.source})"


def duration(seconds: float) -> str:
    """A duration in words: "40 s", "3 min", "1.5 h"."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def work_meta(kind: str, work: float, seconds: float, device: str) -> dict:
    """What an entry of ``kind`` stores of its computation, for `measured_rate`."""
    if kind not in UNITS:
        raise ValueError(f"No unit of work for {kind!r}: one of {', '.join(UNITS)}.")
    return {"seconds": seconds, "work": float(work), "work_unit": UNITS[kind], "device": device}


def forward_work(tokens: float, n_params: int) -> float:
    """A forward pass's work: tokens × millions of parameters."""
    return float(tokens) * n_params / 1e6


def measured_rate(kind: str, root: Path, device: str | None = None) -> tuple[float, int] | None:
    """(seconds per unit of work, how many entries) over the newest `NEWEST` entries of ``kind``
    under the cache folder ``root`` that stored their work (on ``device`` when given), or None."""
    folder = Path(root) / kind
    if not folder.is_dir():
        return None
    metas = sorted(folder.glob("*/meta.json"), key=_mtime, reverse=True)
    rates = []
    for path in metas:
        try:
            meta = json.loads(path.read_text(encoding="utf-8")).get("meta", {})
        except (OSError, ValueError):
            continue  # an entry being written or removed meanwhile
        work, seconds = meta.get("work"), meta.get("seconds")
        if not work or seconds is None or (device and meta.get("device", device) != device):
            continue
        rates.append(float(seconds) / float(work))
        if len(rates) == NEWEST:
            break
    return (statistics.median(rates), len(rates)) if rates else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def estimate(
    kind: str,
    work: float,
    root: Path,
    device: str | None = None,
    calibrate: Callable[[], tuple[float, float]] | None = None,
) -> Estimate | None:
    """The seconds ``work`` units of ``kind`` will take here (module docstring): from earlier
    entries of the kind, else of its stand-in (`STAND_INS`), else from ``calibrate()`` —
    (seconds, work) of a small piece timed now — else None."""
    what = kind.replace("_", " ")
    measured = measured_rate(kind, root, device)
    if measured is None and kind in STAND_INS:
        stand_in = measured_rate(STAND_INS[kind], root, device)
        if stand_in is not None:
            rate, n = stand_in
            return Estimate(work * rate, f"from the rate of {_earlier(n, STAND_INS[kind])}")
    if measured is not None:
        rate, n = measured
        return Estimate(work * rate, f"from the rate of {_earlier(n, kind)}")
    if calibrate is not None:
        seconds, piece = calibrate()
        if piece > 0:
            return Estimate(work * seconds / piece, f"timed just now on a small part of the {what}")
    return None


def _earlier(n: int, kind: str) -> str:
    names = {"states": ("extraction", "extractions"), "heads": ("head analysis", "head analyses"),
             "layer_metrics": ("layer table", "layer tables"),
             "layer_repeats": ("run of repeats", "runs of repeats")}  # fmt: skip
    one, many = names.get(kind, (kind, kind))
    return f"{n} earlier {one if n == 1 else many} here"


def announce(progress: Progress, planned: Estimate | None, what: str) -> Progress:
    """``progress`` told before the work starts how long it will take (``planned``), and after
    that, with every report, about how long is left: from the share done so far once some of it
    is, else from the estimate."""
    start = time.perf_counter()
    if planned is not None:
        progress(0.0, f"{what}: {planned.text()}")
    else:
        progress(0.0, f"{what}: no rate measured here yet; the time left shows once part is done")

    def report(fraction: float, message: str = "") -> None:
        elapsed = time.perf_counter() - start
        if fraction >= 0.05 and fraction < 1.0:
            left = elapsed * (1.0 - fraction) / fraction
        elif planned is not None and fraction < 1.0:
            left = max(planned.seconds - elapsed, 0.0)
        else:
            left = None
        suffix = f" · about {duration(left)} left" if left is not None and left >= 1 else ""
        progress(fraction, f"{message}{suffix}")

    return report
