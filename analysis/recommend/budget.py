"""What each choice costs, measured: its trainable count (the model each run trains, prepared as
the engine prepares it) and its step time as a ratio to full fine-tuning's, timed side by side
on one batch (docs/explanation/recommendation.md, "The budget").

Step time: every choice takes one untimed warm-up step, then ``timed_steps`` timed AdamW steps on
the same batch of ``batch_size`` train examples (padded to their longest, at most ``max_length``
tokens); its time is the median. Full fine-tuning is timed first and again last, and the ratio
divides by the median of both, so a machine that slows down meanwhile shows as a drift (reported)
rather than as a cheaper choice. Random layers are timed with seed 0's draw.

Matching: an alternative is at its candidate's budget when its trainable count is within ±10 %
(`MATCH`); otherwise the note says by how much it differs.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.progress import Progress, no_progress
from analysis.recommend.choices import Proposal
from analysis.recommend.config import RecommendConfig

if TYPE_CHECKING:
    from analysis.models import LoadedModel

MATCH = 0.10  # ±10 % of the candidate's trainable count (SPEC's "same budget")


@dataclass(frozen=True)
class Cost:
    """One choice's cost: trainable entries, the model's parameters, its median step time (s) and
    that as a ratio to full fine-tuning's; ``match``: how its count compares with the candidate it
    is matched to ("" for the reference and the candidates)."""

    n_trainable: int
    n_params: int
    step_time_s: float
    step_time_ratio: float
    match: str = ""
    matched_to: str | None = None

    @property
    def share(self) -> float:
        return self.n_trainable / self.n_params


@dataclass(frozen=True)
class Costs:
    """Every choice's `Cost` by name, and the drift of full fine-tuning's step time between its
    first and last timing (last / first − 1)."""

    by_name: dict[str, Cost]
    drift: float

    def __getitem__(self, name: str) -> Cost:
        return self.by_name[name]

    def get(self, name: str) -> Cost | None:
        return self.by_name.get(name)


def match_note(count: int, reference: int, reference_name: str) -> str:
    """``matched to X (+2.1 %)`` within ±10 %, else ``not matched: 35 % fewer trainable
    parameters than X``."""
    change = count / reference - 1
    if abs(change) <= MATCH + 1e-12:
        return f"matched to {reference_name} ({100 * change:+.1f} %)"
    more = "more" if change > 0 else "fewer"
    return (
        f"not matched: {100 * abs(change):.0f} % {more} trainable parameters than {reference_name}"
    )


def measure(
    cfg: RecommendConfig,
    proposal: Proposal,
    loaded: LoadedModel,
    progress: Progress | None = None,
) -> Costs:
    """Count and time every choice of ``proposal`` (module docstring)."""
    import torch

    from analysis.data import load_data
    from analysis.extract import pad_id_of, texts_of, tokenize

    # the run's own mixed precision (bf16 / fp16 on CUDA), so the timing is the runs' own
    from analysis.finetune.engine import _autocast, build_model, make_optimizer, train_step

    progress = progress or no_progress
    data = load_data(cfg.data)
    regression = data.task_type == "regression"
    n_outputs = 1 if regression else data.n_classes
    train = data.parts["train"]
    rows = train.sample(n=min(cfg.batch_size, len(train)), random_state=0)
    tokens = tokenize(loaded.tokenizer, *texts_of(rows), cfg.max_length)
    device = loaded.device
    batch = {
        k: v.to(device)
        for k, v in tokens.pad(range(len(rows)), pad_id_of(loaded.tokenizer)).items()
    }
    labels = torch.tensor(
        rows["label"].to_numpy(), dtype=torch.float32 if regression else torch.long
    )
    labels = labels.to(device)
    loss_fn = torch.nn.MSELoss() if regression else torch.nn.CrossEntropyLoss()
    base = cfg.base_run(cfg.seeds[0])

    def timed(choice) -> tuple[int, int, float]:
        run = choice.config(base, seed=0)
        built = build_model(run, loaded, n_outputs, device)
        optimizer, scheduler = make_optimizer(built.prepared, run)
        autocast, amp_dtype = _autocast(torch.device(device), run.mixed_precision)
        scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        times = []
        built.model.train()
        for step in range(cfg.timed_steps + 1):
            start = time.perf_counter()
            train_step(built.model, batch, labels, loss_fn, optimizer, scheduler, built.prepared,
                       scaler, autocast)  # fmt: skip
            if step:  # the first step allocates: not timed
                times.append(time.perf_counter() - start)
        return built.n_trainable, built.n_params, statistics.median(times)

    order = [c for c in proposal.choices if c.role == "reference"]
    order += [c for c in proposal.choices if c.role != "reference"]
    measured: dict[str, tuple[int, int, float]] = {}
    total = len(order) + 1
    for i, choice in enumerate(order):
        progress(i / total, f"timing {choice.name}")
        measured[choice.name] = timed(choice)
    reference = order[0].name
    progress(len(order) / total, f"timing {reference} again")
    first = measured[reference][2]
    last = timed(order[0])[2]
    full_time = statistics.median([first, last])
    progress(1.0, "costs measured")
    counts = {name: n for name, (n, _, _) in measured.items()}
    out = {}
    measured[reference] = (*measured[reference][:2], full_time)  # the reference: 1× itself
    for choice in proposal.choices:
        n, n_params, seconds = measured[choice.name]
        matched = choice.matched_to or _nearest(choice, proposal, counts)
        note = "" if matched is None else match_note(n, counts[matched], matched)
        out[choice.name] = Cost(n, n_params, seconds, seconds / full_time, note, matched)
    return Costs(out, last / first - 1)


def _nearest(choice, proposal: Proposal, counts: dict[str, int]) -> str | None:
    """The candidate nearest in trainable count (log scale) to an alternative matched to none."""
    if choice.role != "alternative":
        return None
    candidates = [c.name for c in proposal.candidates]
    if not candidates:
        return None
    mine = counts[choice.name]
    return min(candidates, key=lambda name: abs(math.log(counts[name] / mine)))
