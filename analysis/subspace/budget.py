"""How often a run snapshots its trajectory, and what the snapshots cost on disk.

One rule, used by the page, the CLI (``--trajectory-every auto``) and ``FinetuneConfig``
(``trajectory_every="auto"``): snapshot every k = ⌈steps / 32⌉ steps, so a run records θ_0 and at
most 32 moves θ_1..θ_t whatever its length. Thirty-two is what the spectrum needs (the papers look
at the first few directions) and bounds the disk: a MiniLM snapshot in float16 is 21 MB, so at
most ≈ 0.7 GB per run instead of growing with the steps.

No torch here: the CLI's ``--help`` and the config import this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_SNAPSHOTS = 32  # moves θ_1..θ_t recorded at most by the automatic interval (θ_0 comes on top)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
THETA0_BYTES = 4  # θ_0 is always stored in float32


def auto_every(steps: int, max_snapshots: int = MAX_SNAPSHOTS) -> int:
    """The automatic snapshot interval k = ⌈steps / max_snapshots⌉ (at least 1).

    A run of ``steps`` steps then records t = ⌊steps / k⌋ ≤ ``max_snapshots`` moves.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive whole number (got {steps!r}).")
    if max_snapshots < 1:
        raise ValueError(f"max_snapshots must be at least 1 (got {max_snapshots!r}).")
    return max(1, math.ceil(steps / max_snapshots))


def resolve_every(every: int | str | None, steps: int) -> int | None:
    """``"auto"`` → `auto_every` (steps); a whole number or None stays as it is."""
    if isinstance(every, str):
        if every.strip().lower() != "auto":
            raise ValueError(
                f"trajectory_every must be a positive number of steps, 'auto' or None "
                f"(got {every!r})."
            )
        return auto_every(steps)
    return every


def snapshot_count(steps: int, every: int) -> int:
    """Moves recorded by a run of ``steps`` steps snapshotting every ``every``: t = ⌊steps / k⌋
    (θ_0, at step 0, is not counted)."""
    return steps // every


def trajectory_bytes(
    layer_params: Sequence[int], steps: int, every: int, dtype: str = "float16"
) -> int:
    """Estimated disk size of a trajectory: Σ_ℓ D_ℓ · (4 + t · bytes(dtype)).

    layer_params: the parameter count D_ℓ of each recorded layer; θ_0 is stored in float32, each
    of the t moves in ``dtype``. The safetensors headers (a few hundred bytes a file) are left out.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            f"Unknown trajectory dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}."
        )
    total = sum(int(d) for d in layer_params)
    return total * (THETA0_BYTES + snapshot_count(steps, every) * DTYPE_BYTES[dtype])
