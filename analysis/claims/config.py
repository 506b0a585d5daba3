"""What the claims are measured on and with (`ClaimsConfig`), and what they rest on once
measured (`ClaimInputs`: the layer repeats of each sample, ℓ*, the head selections)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analysis.claims.papers import CLAIMS, LAYER_CLAIMS, RUN_CLAIMS, parse_only
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec, setting
from analysis.finetune.config import FinetuneConfig

if TYPE_CHECKING:
    from analysis.heads.selection_file import HeadSelection
    from analysis.layers.repeats import LayerRepeats


@dataclass(frozen=True)
class ClaimsConfig:
    """What the claims are measured on and with.

    Layer claims: ``samples`` samples of ``n`` examples (sampling seed ``sample_seed``:
    `layer_samples`), ``repeats`` bootstrap repeats on each.
    Run claims: ``seeds`` × ``steps`` steps of batch ``batch_size`` (dev / test: at most
    ``n_eval`` examples, the same for every run); heads: ``k`` per layer, statistics on
    ``heads_n`` examples.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    only: tuple[str, ...] = setting(
        tuple(CLAIMS), help="claims to measure, e.g. X1,H1 (default all)"
    )
    n: int = setting(1000, help="examples of the layer claims")
    sample_seed: int = setting(0, help="sampling seed of the layer claims")
    repeats: int = setting(50, help="bootstrap repeats per sample (X1–X3; ≥ 50 for 90 % intervals)")
    samples: int = setting(
        3, help="samples of N examples each layer claim is judged on (disjoint when the data allow)"
    )
    max_length: int = setting(128, help="tokens kept per example")
    seeds: tuple[int, ...] = setting((0, 1, 2), help="training seeds of the run claims")
    steps: int = setting(200, help="optimizer steps of every run")
    batch_size: int = setting(16, help="examples per training step")
    n_train: int | None = setting(None, help="train examples (default all)")
    n_eval: int | None = setting(1000, help="dev / test examples scored")
    eval_every: int = setting(50, help="dev score every k steps")
    k: int = setting(3, help="heads per layer (H1, H2)")
    heads_n: int = setting(300, help="examples of the head statistics")
    xi: float = setting(0.9, help="singular-value mass threshold ξ of the head statistics")

    def __post_init__(self) -> None:
        object.__setattr__(self, "only", parse_only(",".join(self.only)))
        if not isinstance(self.repeats, int) or self.repeats < 2:
            raise ValueError(f"The claims need at least 2 repeats (got {self.repeats!r}).")
        if not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"The claims need at least 1 sample (got {self.samples!r}).")
        seeds = tuple(self.seeds)
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise ValueError(f"Seeds must be distinct whole numbers ≥ 0 (got {self.seeds!r}).")
        object.__setattr__(self, "seeds", seeds)
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a whole number of heads ≥ 1 (got {self.k!r}).")
        self.base_run()  # validates steps, batch size, max length, n_train, n_eval, eval_every
        SampleSpec(n=self.n, seed=self.sample_seed)
        SampleSpec(n=self.heads_n, seed=self.sample_seed)

    @property
    def layer_claims(self) -> tuple[str, ...]:
        return tuple(c for c in self.only if c in LAYER_CLAIMS)

    @property
    def run_claims(self) -> tuple[str, ...]:
        return tuple(c for c in self.only if c in RUN_CLAIMS)

    def extract_config(self, pooling: str = "mean", n: int | None = None) -> ExtractConfig:
        return ExtractConfig(
            model=self.model,
            data=self.data,
            sample=SampleSpec(n=n or self.n, seed=self.sample_seed),
            pooling=pooling,
            max_length=self.max_length,
        )

    def base_run(self, seed: int | None = None) -> FinetuneConfig:
        """Full fine-tuning with these settings (every run claim varies this)."""
        return FinetuneConfig(
            model=self.model, data=self.data, method="full", steps=self.steps,
            batch_size=self.batch_size, max_length=self.max_length, n_train=self.n_train,
            n_eval=self.n_eval, eval_every=self.eval_every,
            seed=self.seeds[0] if seed is None else seed,
        )  # fmt: skip

    def trajectory_run(self) -> FinetuneConfig:
        """The subspace claims' source: full fine-tuning, ~16 float16 snapshots, first seed."""
        return dataclasses.replace(
            self.base_run(), trajectory_every=max(1, self.steps // 16), trajectory_dtype="float16"
        )

    def heads_provenance(self) -> dict[str, Any]:
        """What the Heads page records about its sample (so its selections and ours match)."""
        return {"data": self.data.name, "sample_seed": self.sample_seed,
                "max_length": self.max_length}  # fmt: skip


@dataclass
class SampleInputs:
    """One sample of the layer claims: its examples' description, the full-sample ℓ* and the
    repeats (mean pooling: ν and the probe; first-token pooling: ν only, for X3)."""

    label: str
    n: int
    l_star: int | None = None
    mean_repeats: LayerRepeats | None = None
    first_repeats: LayerRepeats | None = None


@dataclass
class ClaimInputs:
    """The analyses the claims rest on: per sample the repeats (mean and first-token pooling) and
    the full-sample ℓ*; ℓ* of the first sample (for X4's runs), L, the head selections, and how
    the samples were drawn (``sample_mode`` "disjoint" or "overlapping")."""

    n_layers: int
    l_star: int | None = None
    mean_repeats: LayerRepeats | None = None
    first_repeats: LayerRepeats | None = None
    selections: dict[str, HeadSelection] = field(default_factory=dict)
    # the random-heads arm draws anew for every training seed: seed → its selection
    random_selections: dict[int, HeadSelection] = field(default_factory=dict)
    samples: list[SampleInputs] = field(default_factory=list)
    sample_mode: str = ""
