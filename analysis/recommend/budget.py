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

Measured once: each choice's count and times are a disk-cache entry keyed by what produced them
(`cost_recipe`), so a second recommendation on the same model, data and run settings times
nothing. Once the comparison's runs finish, their own step times refine the ratio
(`run_step_time_ratios`, `Costs.refined`): a whole run's mean step beats a few timed steps.

Matching: an alternative is at its candidate's budget when its trainable count is within ±10 %
(`MATCH`); otherwise the note says by how much it differs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from analysis.progress import Progress, no_progress
from analysis.recommend.choices import REFERENCE, Choice, Proposal
from analysis.recommend.config import RecommendConfig

if TYPE_CHECKING:
    from analysis.data.parts import TaskData
    from analysis.finetune.config import FinetuneConfig
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
    runs: int = 0  # the seeds of finished runs the ratio comes from (0: the timed steps)

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

    def refined(self, ratios: Mapping[str, tuple[float, int]]) -> Costs:
        """These costs with the step-time ratios of finished runs where there are some (name →
        (ratio, seeds): `run_step_time_ratios`)."""
        by_name = {
            name: replace(cost, step_time_ratio=ratios[name][0], runs=ratios[name][1])
            if name in ratios else cost
            for name, cost in self.by_name.items()
        }  # fmt: skip
        return Costs(by_name, self.drift)


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


# What a step's work does not depend on: left out of a cost's cache key, so that another number
# of steps or another evaluation schedule reuses the measurement.
NOT_IN_A_STEP = ("steps", "n_train", "n_eval", "eval_every", "trajectory_every", "trajectory_dtype")
COSTS_KIND = "costs"  # the disk cache's entries of measured costs (JSON, no tensors)
COSTS_VERSION = 1  # bump when the timing changes what an entry means


def cost_recipe(
    run: FinetuneConfig, loaded: LoadedModel, data_fingerprint: str, timed_steps: int,
    threads: int,
) -> dict[str, Any]:  # fmt: skip
    """What one choice's measured cost depends on, its cache key: the model's weights, the data
    (the batch is drawn from it), the run's settings but those no step depends on
    (`NOT_IN_A_STEP`) — the method and its options, batch size, max length… —, the device, the
    torch threads, the timed steps and the timing's version."""
    setting = {k: v for k, v in run.to_dict().items() if k not in NOT_IN_A_STEP}
    setting["model"] = loaded.identity()
    setting["data"] = {**setting["data"], "fingerprint": data_fingerprint}
    return {"run": setting, "device": str(loaded.device), "threads": threads,
            "timed_steps": timed_steps, "version": COSTS_VERSION}  # fmt: skip


def measure(
    cfg: RecommendConfig,
    proposal: Proposal,
    loaded: LoadedModel,
    progress: Progress | None = None,
) -> Costs:
    """Count and time every choice of ``proposal`` (module docstring), or read what was measured
    from the disk cache (`cost_recipe`): a choice is timed only when no entry has it, beside full
    fine-tuning."""
    from analysis.cache import DiskCache
    from analysis.data import load_data

    progress = progress or no_progress
    data = load_data(cfg.data)
    cache = DiskCache()
    recipes = {c.name: _recipe(cfg, c, loaded, data.fingerprint) for c in proposal.choices}
    measured: dict[str, dict[str, Any]] = {}
    for name, recipe in recipes.items():
        found = cache.load(COSTS_KIND, recipe)
        if found is not None:
            measured[name] = found[1]
    missing = [c for c in proposal.choices if c.name not in measured]
    if missing:
        timed = time_steps(cfg, proposal.choices[0], missing, loaded, data, progress)
        for name, values in timed.items():
            cache.save(COSTS_KIND, recipes[name], {}, values)
        measured.update(timed)
    progress(1.0, "costs measured")
    counts = {name: int(m["n_trainable"]) for name, m in measured.items()}
    out = {}
    for choice in proposal.choices:
        m = measured[choice.name]
        n, n_params, seconds = int(m["n_trainable"]), int(m["n_params"]), float(m["step_time_s"])
        ratio = seconds / float(m["full_step_time_s"])
        matched = choice.matched_to or _nearest(choice, proposal, counts)
        note = "" if matched is None else match_note(n, counts[matched], matched)
        if choice.role != "reference" and not cfg.budget.allows(n / n_params, ratio):
            note = "; ".join(filter(None, [note, f"over the budget ({cfg.budget.text()})"]))
        out[choice.name] = Cost(n, n_params, seconds, ratio, note, matched)
    full = [float(m["full_step_time_s"]) for m in measured.values()]
    return Costs(out, max(full) / min(full) - 1)


def reference_cached(cfg: RecommendConfig, loaded: LoadedModel, data: TaskData) -> bool:
    """Whether full fine-tuning's measured cost with these settings is in the disk cache (the
    first measurement writes every choice's with it)."""
    from analysis.cache import DiskCache

    recipe = _recipe(cfg, REFERENCE, loaded, data.fingerprint)
    return DiskCache().entry_dir(COSTS_KIND, recipe).is_dir()


def _recipe(
    cfg: RecommendConfig, choice: Choice, loaded: LoadedModel, data_fingerprint: str
) -> dict[str, Any]:
    """`cost_recipe` of one choice as `time_steps` times it (seed 0), in this process."""
    import torch

    run = choice.config(cfg.base_run(cfg.seeds[0]), seed=0)
    return cost_recipe(run, loaded, data_fingerprint, cfg.timed_steps, torch.get_num_threads())


def time_steps(
    cfg: RecommendConfig, reference: Choice, choices: Sequence[Choice], loaded: LoadedModel,
    data: TaskData, progress: Progress,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Time ``choices`` side by side with ``reference`` (full fine-tuning) on one batch (module
    docstring): name → n_trainable, n_params, step_time_s (its median) and full_step_time_s
    (full fine-tuning's median of the same turns; the reference's own: its median over them
    all)."""
    import torch

    from analysis.extract import pad_id_of, texts_of, tokenize

    # the run's own mixed precision (bf16 / fp16 on CUDA), so the timing is the runs' own
    from analysis.finetune.engine import _autocast, build_model, make_optimizer, train_step

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

    progress(0.0, f"timing {reference.name}")
    full = Stepper(reference)
    full.step()  # the first step allocates: not timed
    full_medians = [statistics.median(full.step() for _ in range(cfg.timed_steps))]
    out: dict[str, dict[str, Any]] = {}
    others = [c for c in choices if c.name != reference.name]
    for i, choice in enumerate(others):
        progress((i + 1) / (len(others) + 1), f"timing {choice.name} beside {reference.name}")
        mine = Stepper(choice)
        mine.step()
        pairs = [(mine.step(), full.step()) for _ in range(cfg.timed_steps)]
        full_median = statistics.median(f for _, f in pairs)
        full_medians.append(full_median)
        out[choice.name] = {"n_trainable": mine.built.n_trainable,
                            "n_params": mine.built.n_params,
                            "step_time_s": statistics.median(m for m, _ in pairs),
                            "full_step_time_s": full_median}  # fmt: skip
        del mine
    if any(c.name == reference.name for c in choices):
        seconds = statistics.median(full_medians)
        out[reference.name] = {"n_trainable": full.built.n_trainable,
                               "n_params": full.built.n_params, "step_time_s": seconds,
                               "full_step_time_s": seconds}  # fmt: skip
    return out


def run_step_time_ratios(
    step_times: Mapping[str, Mapping[int, float]], reference: str
) -> dict[str, tuple[float, int]]:
    """Arm → (step-time ratio, seeds) from finished runs' own step times (arm → seed index i →
    seconds per step): the median of the arm's runs over the median of ``reference``'s runs of
    the same indices — its i-th run beside full's i-th, as the timing pairs its steps —, and how
    many that is. Arms with no index in common with the reference are left out; the reference is
    1.0 over its own runs."""
    full = {s: t for s, t in step_times.get(reference, {}).items() if _positive(t)}
    out = {}
    for arm, times in step_times.items():
        seeds = sorted(s for s, t in times.items() if s in full and _positive(t))
        if seeds:
            ratio = statistics.median(times[s] for s in seeds) / statistics.median(
                full[s] for s in seeds
            )
            out[arm] = (1.0 if arm == reference else ratio, len(seeds))
    return out


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _nearest(choice, proposal: Proposal, counts: dict[str, int]) -> str | None:
    """The candidate nearest in trainable count (log scale) to an alternative matched to none."""
    if choice.role != "alternative":
        return None
    candidates = [c.name for c in proposal.candidates]
    if not candidates:
        return None
    mine = counts[choice.name]
    return min(candidates, key=lambda name: abs(math.log(counts[name] / mine)))
