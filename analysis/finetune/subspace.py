"""Fine-tuning inside a subspace (docs/explanation/subspaces.md, paper 003 Eq. 3–4).

Each kept encoder layer is re-parameterised as

    θ_layer = θ_0 + V · θ̄,   θ̄ = (1/h) Σ_{j=1..h} θ_j,   θ_j ∈ R^r,  h = 16,

with θ_0 the layer's weights before training (flattened in the recorder's order, see
`analysis.subspace`) and V (D × r) either the principal directions of another run's trajectory
(method ``subspace``) or a random orthonormal basis of the same shape (``subspace-random``).
Only the θ_j and the classifier train; embeddings stay frozen. A subspace found on one dataset
can train on another (the paper's inductive setting): only the model must be the same.

How it is wired (exact, and cheap):

- The layers keep their ordinary parameters, so names, ``state_dict``, forward speed, trajectory
  capture and the zero-weights file all work as for any run. These parameters have
  ``requires_grad`` so backward computes ∂L/∂θ_layer, but they are not in the optimizer.
- A post-accumulate-grad hook on each of them applies the chain rule at once:
  ∂L/∂θ_j = (1/h) V[slice]ᵀ ∂L/∂θ_layer[slice], added to the θ_j's gradient, after which the
  parameter's own gradient is dropped (no optimizer state, no memory for it).
- After every optimizer step (`Prepared.after_step`) the effective weights are rewritten as
  θ_0 + V θ̄ in place (one D × r mat-vec per layer).

The θ_j are registered on the model (``model.subspace``), so a saved and restored state dict
restores them with the weights; θ_0 and V are plain tensors outside the state dict (V is as large
as r copies of the layer and needs no copying).

On the ensemble of h vectors: with a plain average every θ_j receives the same gradient
(1/h) ∂L/∂θ̄, so they move in lockstep and the ensemble acts through the starting point θ̄(0),
the mean of h independent draws, whose variance is 1/h of one draw. We follow the paper's formula
as stated. Initialisation: θ_j ~ N(0, σ²) with σ = ``INIT_STD`` = 1e-3 per coordinate, drawn from
the method stream of the run's seed (`analysis.seeding`, a sub-stream per layer), so the model
starts within ‖V θ̄(0)‖ ≈ σ √(r/h) of θ_0.

Memory: V holds r × D float32 numbers per layer (r = 32 snapshots on MiniLM: 230 MB a layer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.model import EncoderClassifier
from analysis.finetune.prepared import MethodInputs, Prepared
from analysis.seeding import Stream
from analysis.subspace.spectrum import load_layer_svd
from analysis.subspace.trajectory import Trajectory, flatten_layer, layer_slots

H_VECTORS = 16
INIT_STD = 1e-3
DEFAULT_RANDOM_DIM = 32  # subspace-random without a reference run
BASIS, COORDS = 1, 2  # the method stream's sub-streams (then the layer): random bases, the θ_j


def random_orthonormal(dim: int, r: int, generator: torch.Generator) -> torch.Tensor:
    """A (dim, r) float32 matrix with orthonormal columns spanning a uniformly random subspace.

    QR of a Gaussian matrix, done as Cholesky-QR twice (G = AᵀA, A ← A R⁻¹): memory stays about
    one copy of A (Householder QR needs two), and a Gaussian A is so well conditioned that two
    passes give columns orthonormal to float32 precision.
    """
    if not 1 <= r <= dim:
        raise ValueError(f"A random subspace needs 1 ≤ r ≤ D (got r={r}, D={dim}).")
    basis = torch.randn(dim, r, generator=generator, dtype=torch.float32)
    for _ in range(2):
        gram = (basis.T @ basis).double()  # (r, r)
        chol = torch.linalg.cholesky(gram).float()  # gram = L Lᵀ, so R = Lᵀ
        basis = torch.linalg.solve_triangular(chol.T, basis, upper=True, left=False)
    return basis


class LayerSubspace(nn.Module):
    """The h trainable vectors θ_j (h, r) of one layer, with its θ_0 (D,) and V (D, r) outside
    the state dict."""

    def __init__(
        self, theta0: torch.Tensor, V: torch.Tensor, h: int, generator: torch.Generator
    ) -> None:
        super().__init__()
        coords = torch.randn(h, V.shape[1], generator=generator) * INIT_STD
        self.coords = nn.Parameter(coords.to(theta0.device))
        # Plain attributes, not buffers: kept out of state_dict (no copies of V when a run saves
        # its best state) and moved to the coordinates' device on use.
        self.theta0 = theta0
        self.V = V

    @property
    def h(self) -> int:
        return self.coords.shape[0]

    def _on(self, device: torch.device) -> None:
        if self.V.device != device:
            self.V, self.theta0 = self.V.to(device), self.theta0.to(device)

    def theta_bar(self) -> torch.Tensor:
        return self.coords.mean(dim=0)  # (r,)

    @torch.no_grad()
    def effective(self) -> torch.Tensor:
        """θ_0 + V θ̄, (D,) float32."""
        self._on(self.coords.device)
        return self.theta0 + self.V @ self.theta_bar().to(self.V.dtype)

    @torch.no_grad()
    def add_grad(self, start: int, grad: torch.Tensor) -> None:
        """Chain rule for a parameter at flat offset ``start``: ∂L/∂θ_j += (1/h) V[slice]ᵀ g."""
        self._on(self.coords.device)
        g = grad.reshape(-1).to(self.V.dtype)
        step = (self.V[start : start + g.numel()].T @ g) / self.h  # (r,)
        step = step.to(self.coords.dtype).expand_as(self.coords)
        if self.coords.grad is None:
            self.coords.grad = step.clone()
        else:
            self.coords.grad += step


@torch.no_grad()
def write_effective(layer: nn.Module, sub: LayerSubspace) -> None:
    """Copy θ_0 + V θ̄ into the layer's parameters (in the recorder's order)."""
    flat = sub.effective()
    params = dict(layer.named_parameters())
    for slot in layer_slots(layer):
        param = params[slot.name]
        param.copy_(flat[slot.offset : slot.offset + slot.numel].view(slot.shape).to(param.dtype))


def _grad_hook(sub: LayerSubspace, start: int) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        if param.grad is not None:
            sub.add_grad(start, param.grad)
            param.grad = None

    return hook


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
        sub = LayerSubspace(theta0, V.to(theta0.device, torch.float32), h, generator)
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


def _intrinsic_bases(model: EncoderClassifier, traj: Trajectory) -> list[torch.Tensor]:
    bases = []
    for number, layer in enumerate(model.layers, start=1):
        if number not in traj.slots:
            raise ValueError(
                f"The trajectory has no layer {number} (it recorded layers {traj.layers}); "
                "train with ℓ_head within the recorded layers."
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


def prepare_subspace(
    model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs
) -> Prepared:
    """Method ``subspace``: V = the principal directions of the source run's trajectory
    (``inputs.trajectory``, resolved from ``cfg.option("run")`` by the caller)."""
    traj = _source(cfg, inputs)
    return reparameterise(
        model, _intrinsic_bases(model, traj), cfg.seed, f"intrinsic subspace of {cfg.option('run')}"
    )


def prepare_subspace_random(
    model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs
) -> Prepared:
    """Method ``subspace-random``: a random orthonormal V of the intrinsic one's shape.

    The shape comes from run ``cfg.option("run")`` when given, else r = ``DEFAULT_RANDOM_DIM``.
    The basis is drawn from the method stream of the run's seed, a sub-stream per layer.
    """
    if cfg.option("run"):
        dims = [int(V.shape[1]) for V in _intrinsic_bases(model, _source(cfg, inputs))]
    else:
        dims = [DEFAULT_RANDOM_DIM] * len(model.layers)
    bases = []
    for number, (layer, r) in enumerate(zip(model.layers, dims, strict=True), start=1):
        dim = sum(p.numel() for p in layer.parameters())
        generator = Stream(cfg.seed, "method").child(BASIS, number).torch()
        bases.append(random_orthonormal(dim, min(r, dim), generator))
    return reparameterise(model, bases, cfg.seed, "random orthonormal subspace")


def _source(cfg: FinetuneConfig, inputs: MethodInputs) -> Trajectory:
    if inputs.trajectory is None:
        raise ValueError(
            f"Method {cfg.method!r} needs the trajectory of {cfg.option('run')!r}: give it to "
            "run_finetune (trajectory=...), or run through the runs database, which finds a "
            "run's trajectory by its id."
        )
    return inputs.trajectory
