"""Method ``subspace``: train inside the subspace another run's trajectory spans
(docs/explanation/subspaces.md, paper 003 Eq. 3–4); `reparameterise` serves ``subspace-random``
too (`analysis.finetune.methods.subspace_random`).

Each kept encoder layer is re-parameterised as

    θ_layer = θ_0 + V · θ̄,   θ̄ = (1/h) Σ_{j=1..h} θ_j,   θ_j ∈ R^r,  h = 16,

with θ_0 the layer's weights before training (flattened in the recorder's order, see
`analysis.subspace`) and V (D × r) the principal directions of another run's trajectory (or, for
``subspace-random``, a random orthonormal basis of the same shape). Only the θ_j and the
classifier train; embeddings stay frozen. A subspace found on one dataset can train on another
(the paper's inductive setting): only the model must be the same.

How it is wired (exact, and cheap):

- The layers keep their ordinary parameters, so names, ``state_dict``, forward speed, trajectory
  capture and the zero-weights file all work as for any run. These parameters have
  ``requires_grad`` so backward computes ∂L/∂θ_layer, but they are not in the optimizer.
- A post-accumulate-grad hook on each of them applies the chain rule at once:
  ∂L/∂θ_j = (1/h) V[slice]ᵀ ∂L/∂θ_layer[slice], added to the θ_j's gradient, after which the
  parameter's own gradient is dropped (no optimizer state, no memory for it).
- After every optimizer step (`Prepared.after_step`) the effective weights are rewritten as
  θ_0 + V θ̄ in place (one D × r mat-vec per layer).

The θ_j of a layer are a module's ``coords`` (`layer_subspace`), registered on the model
(``model.subspace``), so a saved and restored state dict restores them with the weights; θ_0 and
V are plain attributes outside the state dict (V is as large as r copies of the layer and needs
no copying).

On the ensemble of h vectors: with a plain average every θ_j receives the same gradient
(1/h) ∂L/∂θ̄, so they move in lockstep and the ensemble acts through the starting point θ̄(0),
the mean of h independent draws, whose variance is 1/h of one draw. We follow the paper's formula
as stated. Initialisation: θ_j ~ N(0, σ²) with σ = ``INIT_STD`` = 1e-3 per coordinate, drawn from
the method stream of the run's seed (`analysis.seeding`, a sub-stream per layer), so the model
starts within ‖V θ̄(0)‖ ≈ σ √(r/h) of θ_0.

Memory: V holds r × D float32 numbers per layer (r = 32 snapshots on MiniLM: 230 MB a layer).
torch is imported when a run prepares: the registry reads this module's ``SPEC`` without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.config import setting
from analysis.finetune.spec import MethodSpec, at_classifier_layer, refuse_export, short_source

if TYPE_CHECKING:
    import torch
    from torch import nn

    from analysis.finetune.model import EncoderClassifier
    from analysis.finetune.prepared import MethodInputs, Prepared
    from analysis.subspace.trajectory import Trajectory

H_VECTORS = 16
INIT_STD = 1e-3
BASIS, COORDS = 1, 2  # the method stream's sub-streams (then the layer): random bases, the θ_j


@dataclass(frozen=True)
class SubspaceOptions:
    """Methods ``subspace`` / ``subspace-random``: train inside a subspace of each layer.

    ``subspace`` needs ``source``: the run (or trajectory folder) whose trajectory spans the
    subspace; ``subspace-random`` takes its dimensions from ``source`` when given.
    """

    source: str | None = setting(
        None, help="run id (or trajectory folder) whose trajectory spans the subspace",
        flat="subspace_from", kind="run",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.source is not None and (
            not isinstance(self.source, str) or not self.source.strip()
        ):
            raise ValueError("subspace_from must be a run id or a trajectory folder.")


# -- one layer's subspace ------------------------------------------------------------------------


def layer_subspace(
    theta0: torch.Tensor, V: torch.Tensor, h: int, generator: torch.Generator
) -> nn.Module:
    """The h trainable vectors θ_j of one layer, ``coords`` (h, r), with its ``theta0`` (D,) and
    ``V`` (D, r) as plain attributes: out of the state dict (no copies of V when a run saves its
    best state), moved to the coordinates' device on use."""
    import torch
    from torch import nn

    sub = nn.Module()
    coords = torch.randn(h, V.shape[1], generator=generator) * INIT_STD
    sub.coords = nn.Parameter(coords.to(theta0.device))
    sub.theta0, sub.V = theta0, V
    return sub


def _on_device(sub: nn.Module) -> None:
    if sub.V.device != sub.coords.device:
        sub.V, sub.theta0 = sub.V.to(sub.coords.device), sub.theta0.to(sub.coords.device)


def effective(sub: nn.Module) -> torch.Tensor:
    """θ_0 + V θ̄, (D,) float32."""
    import torch

    _on_device(sub)
    with torch.no_grad():
        return sub.theta0 + sub.V @ sub.coords.mean(dim=0).to(sub.V.dtype)


def add_grad(sub: nn.Module, start: int, grad: torch.Tensor) -> None:
    """Chain rule for a parameter at flat offset ``start``: ∂L/∂θ_j += (1/h) V[slice]ᵀ g."""
    import torch

    _on_device(sub)
    with torch.no_grad():
        g = grad.reshape(-1).to(sub.V.dtype)
        step = (sub.V[start : start + g.numel()].T @ g) / sub.coords.shape[0]  # (r,)
        step = step.to(sub.coords.dtype).expand_as(sub.coords)
        if sub.coords.grad is None:
            sub.coords.grad = step.clone()
        else:
            sub.coords.grad += step


def write_effective(layer: nn.Module, sub: nn.Module) -> None:
    """Copy θ_0 + V θ̄ into the layer's parameters (in the recorder's order)."""
    import torch

    from analysis.subspace.trajectory import layer_slots

    flat = effective(sub)
    params = dict(layer.named_parameters())
    with torch.no_grad():
        for slot in layer_slots(layer):
            part = flat[slot.offset : slot.offset + slot.numel].view(slot.shape)
            params[slot.name].copy_(part.to(params[slot.name].dtype))


def _grad_hook(sub: nn.Module, start: int) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        if param.grad is not None:
            add_grad(sub, start, param.grad)
            param.grad = None

    return hook


# -- the model in its subspaces ------------------------------------------------------------------


def reparameterise(
    model: EncoderClassifier,
    bases: list[torch.Tensor],
    seed: int,
    description: str,
    h: int = H_VECTORS,
) -> Prepared:
    """Train ``model`` in the subspaces ``bases`` (one (D_ℓ, r_ℓ) V per kept layer, bottom up).

    Returns the `Prepared` the engine trains: the θ_j and the classifier, with ``after_step``
    rewriting every layer's effective weights.
    """
    import torch
    from torch import nn

    from analysis.finetune.prepared import Prepared
    from analysis.seeding import Stream
    from analysis.subspace.trajectory import flatten_layer, layer_slots

    layers = list(model.layers)
    if len(bases) != len(layers):
        raise ValueError(f"Need one subspace per kept layer ({len(layers)}), got {len(bases)}.")
    model.requires_grad_(False)
    subs = []
    for number, (layer, V) in enumerate(zip(layers, bases, strict=True), start=1):
        theta0 = flatten_layer(layer).clone()
        if V.shape[0] != theta0.numel():
            raise ValueError(
                f"Layer {number} has {theta0.numel()} parameters but its subspace has "
                f"{V.shape[0]} rows: the subspace comes from a different model."
            )
        generator = Stream(seed, "method").child(COORDS, number).torch()
        sub = layer_subspace(theta0, V.to(theta0.device, torch.float32), h, generator)
        params = dict(layer.named_parameters())
        for slot in layer_slots(layer):
            param = params[slot.name]
            param.requires_grad_(True)  # for ∂L/∂θ_layer; the hook hands it on to the θ_j
            param.register_post_accumulate_grad_hook(_grad_hook(sub, slot.offset))
        write_effective(layer, sub)
        subs.append(sub)
    model.subspace = nn.ModuleList(subs)
    model.classifier.requires_grad_(True)

    def after_step() -> None:
        for layer, sub in zip(layers, subs, strict=True):
            write_effective(layer, sub)

    classifier = list(model.classifier.parameters())
    decay = [p for p in classifier if p.ndim >= 2]
    no_decay = [p for p in classifier if p.ndim < 2] + [s.coords for s in subs]
    dims = sorted({int(s.V.shape[1]) for s in subs})
    return Prepared(
        decay=decay,
        no_decay=no_decay,
        description=f"{description}: {h} vectors in R^{'/'.join(map(str, dims))} per layer "
        f"for {len(layers)} layers, and the classifier",
        after_step=after_step,
        trained_layers=tuple(range(1, len(layers) + 1)),
    )


def intrinsic_bases(model: EncoderClassifier, traj: Trajectory) -> list[torch.Tensor]:
    """Each kept layer's V: the principal directions of its moves along ``traj``."""
    from analysis.subspace.spectrum import load_layer_svd
    from analysis.subspace.trajectory import layer_slots

    bases = []
    for number, layer in enumerate(model.layers, start=1):
        if number not in traj.slots:
            raise ValueError(
                f"The trajectory has no layer {number} (it recorded layers {traj.layers}); "
                "train with the classifier's layer within the recorded layers."
            )
        names = [(s.name, s.shape) for s in layer_slots(layer)]
        if names != [(s.name, s.shape) for s in traj.slots[number]]:
            raise ValueError(
                f"Layer {number}'s parameters differ from the trajectory's: the subspace was "
                "found on a different model."
            )
        svd, _ = load_layer_svd(traj, number)
        if svd.V.shape[1] == 0:
            raise ValueError(f"Layer {number}'s trajectory did not move: its subspace is empty.")
        bases.append(svd.V)
    return bases


def source_trajectory(cfg, inputs: MethodInputs) -> Trajectory:
    """The source run's trajectory, which the caller resolved from ``cfg.option("run")``."""
    if inputs.trajectory is None:
        raise ValueError(
            f"Method {cfg.method!r} needs the trajectory of {cfg.option('run')!r}: give it to "
            "run_finetune (trajectory=...), or run through the runs database, which finds a "
            "run's trajectory by its id."
        )
    return inputs.trajectory


# -- the method ----------------------------------------------------------------------------------


def prepare(model: EncoderClassifier, cfg, inputs: MethodInputs) -> Prepared:
    """V = the principal directions of the source run's trajectory (``inputs.trajectory``)."""
    bases = intrinsic_bases(model, source_trajectory(cfg, inputs))
    return reparameterise(model, bases, cfg.seed, f"intrinsic subspace of {cfg.option('run')}")


def needs_source(options: SubspaceOptions) -> None:
    if not options.source:
        raise ValueError("Method 'subspace' needs subspace_from: the run whose trajectory to use.")


def source_label(kind: str, config: Mapping[str, Any]) -> str:
    """``subspace of ab12cd``: the kind and the source run's short name."""
    source = (config.get("options") or {}).get("source")
    label = f"{kind} of {short_source(str(source))}" if source else str(config.get("method"))
    return label + at_classifier_layer(config)


SPEC = MethodSpec(
    name="subspace",
    label="train inside the subspace of another run's trajectory (Subspaces page)",
    colour="#393b79",
    default_lr=1e-2,  # a handful of coordinates per layer
    prepare=prepare,
    options=SubspaceOptions,
    order=80,
    check=needs_source,
    export=refuse_export(
        "subspace training moves each layer inside a basis read from a tunescope trajectory (a "
        "re-parameterisation with its own forward pass): no transformers or PEFT setting "
        "expresses it"
    ),
    run_label=lambda config: source_label("subspace", config),
)
