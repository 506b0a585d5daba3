"""What a recommendation is computed on and with: `Budget` and `RecommendConfig`
(docs/explanation/recommendation.md). One frozen, self-validating config drives the CLI, the
Recommend page and the runs' settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.config import POOLINGS, DataSpec, ExtractConfig, ModelSpec, SampleSpec, setting
from analysis.finetune.config import FinetuneConfig

BUDGET_KINDS = ("params", "time")
DESIGN_KINDS = ("sequential", "fixed", "whole-table")  # analysis.runs.planner.POLICIES


@dataclass(frozen=True)
class Budget:
    """How much a choice may cost: ``params`` (its trainable share of the model's parameters) or
    ``time`` (its step time as a share of full fine-tuning's), at most ``value`` ∈ (0, 1].
    No kind: no limit — the recommendation is the cheapest choice not shown worse than full."""

    kind: str | None = None
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind is None:
            if self.value is not None:
                raise ValueError("A budget value needs its kind: params or time.")
            return
        if self.kind not in BUDGET_KINDS:
            raise ValueError(f"Unknown budget {self.kind!r}: choose params or time.")
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ValueError(
                f"A {self.kind} budget is a share in (0, 1], e.g. {self.kind}=0.1 or "
                f"{self.kind}=10% (got {value!r})."
            )
        object.__setattr__(self, "value", float(value))

    @classmethod
    def parse(cls, text: str | None) -> Budget:
        """``""`` / ``auto`` → no limit; ``params=0.1``, ``params=10%``, ``time=0.5``."""
        text = (text or "").strip().lower()
        if text in ("", "auto", "none"):
            return cls()
        kind, sep, value = text.partition("=")
        if not sep or kind.strip() not in BUDGET_KINDS:
            raise ValueError(
                f"--budget takes params=SHARE or time=SHARE, e.g. params=10% or time=0.5 "
                f"(got {text!r})."
            )
        value = value.strip()
        scale = 100.0 if value.endswith("%") else 1.0
        try:
            number = float(value.rstrip("%")) / scale
        except ValueError:
            raise ValueError(f"--budget {kind}: {value!r} is not a number.") from None
        return cls(kind.strip(), number)

    def allows(self, share: float | None, step_time_ratio: float | None) -> bool:
        """Whether a choice of this trainable share and step-time ratio fits (unknown: fits)."""
        cost = {"params": share, "time": step_time_ratio}.get(self.kind or "")
        return cost is None or cost <= self.value + 1e-12

    def text(self) -> str:
        if self.kind is None:
            return "no limit: the cheapest choice not shown worse than full fine-tuning"
        if self.kind == "params":
            return f"at most {100 * self.value:g} % of the parameters trainable"
        return f"at most {self.value:g}× full fine-tuning's step time"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "text": self.text()}


@dataclass(frozen=True)
class RecommendConfig:
    """The question (model, data, the analyses' sample), the budget, the candidates' sizes and
    the comparison's runs.

    n / sample_seed / pooling / max_length: the layer analyses' sample (the sidebar's);
    repeats: bootstrap repeats for ℓ*'s counts; heads_n / xi: the head statistics' examples
    and ξ; k: heads per layer (None: 3, or the most a params budget allows); lora_r /
    lora_alpha: the uniform LoRA whose total rank r · L the allocation shares out; seeds,
    design, max_seeds: the comparison's seeds and design (`analysis.recommend.outcome`); steps,
    batch_size, n_train, n_eval, eval_every: every arm's runs; delta: δ in points of the task's
    metric (1 point = 0.01); timed_steps: steps timed per choice for its step time.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    budget: Budget = field(default_factory=Budget)
    n: int = setting(1000, help="examples of the layer analyses (ν, probe, ℓ*)")
    sample_seed: int = setting(0, help="sampling seed of the analyses")
    pooling: str = setting("mean", help="pooling of the analyses and the runs' classifier")
    max_length: int = setting(128, help="tokens kept per example")
    repeats: int = setting(50, help="bootstrap repeats of the layer metrics (ℓ*'s counts)")
    heads_n: int = setting(300, help="examples of the head statistics")
    xi: float = setting(0.9, help="singular-value mass threshold ξ of the head statistics")
    k: int | None = setting(None, help="heads per layer (default 3, or a params budget's most)")
    lora_r: int = setting(8, help="rank r of the uniform LoRA whose total r · L is shared out")
    lora_alpha: float = setting(16.0, help="LoRA scale numerator at rank r")
    seeds: tuple[int, ...] = setting(
        (0, 1, 2),
        help="training seeds every arm starts with (r₀ of the sequential design; the fixed "
        "grid's seeds)",
    )
    design: str = setting(
        "sequential",
        help="sequential: rounds, cheapest arm first, one more seed to every undecided arm up to "
        "--max-seeds; fixed: every arm × the given seeds; whole-table: every arm to --max-seeds",
    )
    max_seeds: int = setting(10, help="R_max: the most seeds an arm gets (sequential, whole-table)")
    steps: int = setting(200, help="optimizer steps of every run")
    batch_size: int = setting(16, help="examples per training step")
    n_train: int | None = setting(None, help="train examples (default all)")
    n_eval: int | None = setting(1000, help="dev / test examples scored")
    eval_every: int = setting(50, help="dev score every k steps")
    delta: float = setting(
        1.0, help="δ in points of the metric: a choice holds up when its interval's lower end is "
        "≥ −δ against full fine-tuning",
    )  # fmt: skip
    timed_steps: int = setting(5, help="steps timed per choice for its step time (median)")

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise ValueError("budget must be a Budget.")
        seeds = tuple(self.seeds)
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise ValueError(f"Seeds must be distinct whole numbers ≥ 0 (got {self.seeds!r}).")
        object.__setattr__(self, "seeds", seeds)
        if self.design not in DESIGN_KINDS:
            raise ValueError(
                f"Unknown design {self.design!r}: choose one of {', '.join(DESIGN_KINDS)}."
            )
        if self.design != "fixed":
            if len(seeds) < 2:
                raise ValueError("The sequential designs start every arm with ≥ 2 seeds.")
            if (
                isinstance(self.max_seeds, bool)
                or not isinstance(self.max_seeds, int)
                or (self.max_seeds < len(seeds))
            ):
                raise ValueError(
                    f"max_seeds (R_max) must be a whole number ≥ the {len(seeds)} starting seeds "
                    f"(got {self.max_seeds!r})."
                )
        if self.pooling not in POOLINGS:
            raise ValueError(f"Unknown pooling {self.pooling!r}: choose {' or '.join(POOLINGS)}.")
        checks = {"repeats": 1, "heads_n": 2, "lora_r": 1, "timed_steps": 1}
        for name, least in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be a whole number ≥ {least} (got {value!r}).")
        if self.k is not None and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"k must be a whole number of heads ≥ 1 (got {self.k!r}).")
        for name in ("lora_alpha", "delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number (got {value!r}).")
        SampleSpec(n=self.n, seed=self.sample_seed)
        SampleSpec(n=self.heads_n, seed=self.sample_seed)
        self.base_run()  # steps, batch size, max length, n_train, n_eval, eval_every

    def extract_config(self, n: int | None = None) -> ExtractConfig:
        return ExtractConfig(
            model=self.model, data=self.data, sample=SampleSpec(n=n or self.n, seed=self.sample_seed),
            pooling=self.pooling, max_length=self.max_length,
        )  # fmt: skip

    def base_run(self, seed: int | None = None) -> FinetuneConfig:
        """Full fine-tuning with these run settings; every arm replaces its method."""
        return FinetuneConfig(
            model=self.model, data=self.data, method="full", steps=self.steps,
            batch_size=self.batch_size, max_length=self.max_length, n_train=self.n_train,
            n_eval=self.n_eval, eval_every=self.eval_every, pooling=self.pooling,
            seed=self.seeds[0] if seed is None else seed,
        )  # fmt: skip

    def heads_provenance(self) -> dict[str, Any]:
        """What the Heads page and the Paper check record about a selection's sample, so that a
        PageRank run queued here and there is one run group."""
        return {"data": self.data.name, "sample_seed": self.sample_seed,
                "max_length": self.max_length}  # fmt: skip
