"""What each choice costs, measured: its trainable count (the model each run trains, prepared as
the engine prepares it) and its step time as a ratio to full fine-tuning's, timed side by side
on one batch (docs/explanation/recommendation.md, "The budget").

Step time, side by side: full fine-tuning's model stays built; every other choice's model is
built beside it and the two take turns, one AdamW step each on the same batch of ``batch_size``
train examples (padded to their longest, at most ``max_length`` tokens), ``timed_steps`` times
after one untimed warm-up step. The choice's ratio is the median of its step times over the
median of full fine-tuning's steps *of those same turns*, so a machine that slows down or speeds
up meanwhile moves both alike. ``drift``: how far full fine-tuning's medians spread over the
whole measurement (largest / smallest − 1). Random layers are timed with seed 0's draw. Two
models are in memory at a time.

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

# An alternative is at a candidate's budget within ±10 % of the candidate's trainable count
# (docs/explanation/recommendation.md, "The budget").
MATCH = 0.10


@dataclass(frozen=True)
class Cost:
    """One choice's cost: trainable entries, the model's parameters, its median step time (s) and
    that as a ratio to full fine-tuning's; ``match``: how its count compares with the candidate it
    is matched to ("" for the reference and the candidates), and whether it exceeds the budget."""

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
    """Every choice's `Cost` by name, and the drift of full fine-tuning's step time over the
    measurement (its largest median over its smallest − 1)."""

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

    class Stepper:
        """One choice's model, ready to train on the batch; `step` returns its seconds."""

        def __init__(self, choice) -> None:
            run = choice.config(base, seed=0)
            self.built = build_model(run, loaded, n_outputs, device)
            self.optimizer, self.scheduler = make_optimizer(self.built.prepared, run)
            self.autocast, amp = _autocast(torch.device(device), run.mixed_precision)
            self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
            self.built.model.train()

        def step(self) -> float:
            start = time.perf_counter()
            train_step(self.built.model, batch, labels, loss_fn, self.optimizer, self.scheduler,
                       self.built.prepared, self.scaler, self.autocast)  # fmt: skip
            return time.perf_counter() - start  # a Python float came back: the device is done

    reference = proposal.choices[0]
    progress(0.0, f"timing {reference.name}")
    full = Stepper(reference)
    full.step()  # the first step allocates: not timed
    full_medians = [statistics.median(full.step() for _ in range(cfg.timed_steps))]
    measured: dict[str, tuple[int, int, float, float]] = {}
    others = proposal.choices[1:]
    for i, choice in enumerate(others):
        progress((i + 1) / (len(others) + 1), f"timing {choice.name} beside {reference.name}")
        mine = Stepper(choice)
        mine.step()
        pairs = [(mine.step(), full.step()) for _ in range(cfg.timed_steps)]
        full_median = statistics.median(f for _, f in pairs)
        full_medians.append(full_median)
        seconds = statistics.median(m for m, _ in pairs)
        measured[choice.name] = (mine.built.n_trainable, mine.built.n_params, seconds,
                                 seconds / full_median)  # fmt: skip
        del mine
    measured[reference.name] = (full.built.n_trainable, full.built.n_params,
                                statistics.median(full_medians), 1.0)  # fmt: skip
    progress(1.0, "costs measured")
    counts = {name: n for name, (n, *_) in measured.items()}
    out = {}
    for choice in proposal.choices:
        n, n_params, seconds, ratio = measured[choice.name]
        matched = choice.matched_to or _nearest(choice, proposal, counts)
        note = "" if matched is None else match_note(n, counts[matched], matched)
        if choice.role != "reference" and not cfg.budget.allows(n / n_params, ratio):
            note = "; ".join(filter(None, [note, f"over the budget ({cfg.budget.text()})"]))
        out[choice.name] = Cost(n, n_params, seconds, ratio, note, matched)
    return Costs(out, max(full_medians) / min(full_medians) - 1)


def _nearest(choice, proposal: Proposal, counts: dict[str, int]) -> str | None:
    """The candidate nearest in trainable count (log scale) to an alternative matched to none."""
    if choice.role != "alternative":
        return None
    candidates = [c.name for c in proposal.candidates]
    if not candidates:
        return None
    mine = counts[choice.name]
    return min(candidates, key=lambda name: abs(math.log(counts[name] / mine)))
