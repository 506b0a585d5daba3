"""Method ``subspace-random``: train inside a random orthonormal subspace of the shape of
``subspace``'s (the paper's control; the training is `analysis.finetune.methods.subspace`'s
`reparameterise`).

Each kept layer's V is drawn from the method stream of the run's seed, a sub-stream per layer
(`analysis.seeding`): r columns, r the intrinsic
subspace's dimension of that layer when a source run is given, else ``DEFAULT_RANDOM_DIM``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.finetune.methods.subspace import (
    BASIS,
    SubspaceOptions,
    intrinsic_bases,
    reparameterise,
    source_label,
    source_trajectory,
)
from analysis.finetune.spec import MethodSpec, refuse_export

if TYPE_CHECKING:
    import torch

    from analysis.finetune.model import EncoderClassifier
    from analysis.finetune.prepared import MethodInputs, Prepared

DEFAULT_RANDOM_DIM = 32  # without a source run


def random_orthonormal(dim: int, r: int, generator: torch.Generator) -> torch.Tensor:
    """A (dim, r) float32 matrix with orthonormal columns spanning a uniformly random subspace.

    QR of a Gaussian matrix, done as Cholesky-QR twice (G = AᵀA, A ← A R⁻¹): memory stays about
    one copy of A (Householder QR needs two), and a Gaussian A is so well conditioned that two
    passes give columns orthonormal to float32 precision.
    """
    import torch

    if not 1 <= r <= dim:
        raise ValueError(f"A random subspace needs 1 ≤ r ≤ D (got r={r}, D={dim}).")
    basis = torch.randn(dim, r, generator=generator, dtype=torch.float32)
    for _ in range(2):
        gram = (basis.T @ basis).double()  # (r, r)
        chol = torch.linalg.cholesky(gram).float()  # gram = L Lᵀ, so R = Lᵀ
        basis = torch.linalg.solve_triangular(chol.T, basis, upper=True, left=False)
    return basis


def prepare(model: EncoderClassifier, cfg, inputs: MethodInputs) -> Prepared:
    """A random orthonormal V per layer, of the intrinsic one's shape when ``cfg.option("run")``
    names a source, else r = ``DEFAULT_RANDOM_DIM``; drawn from the method stream of the run's
    seed, a sub-stream per layer."""
    from analysis.seeding import Stream

    if cfg.option("run"):
        dims = [int(V.shape[1]) for V in intrinsic_bases(model, source_trajectory(cfg, inputs))]
    else:
        dims = [DEFAULT_RANDOM_DIM] * len(model.layers)
    bases = []
    for number, (layer, r) in enumerate(zip(model.layers, dims, strict=True), start=1):
        dim = sum(p.numel() for p in layer.parameters())
        generator = Stream(cfg.seed, "method").child(BASIS, number).torch()
        bases.append(random_orthonormal(dim, min(r, dim), generator))
    return reparameterise(model, bases, cfg.seed, "random orthonormal subspace")


SPEC = MethodSpec(
    name="subspace-random",
    label="train inside a random subspace (of a source run's shape, else r = 32)",
    colour="#9c9ede",
    default_lr=1e-2,
    prepare=prepare,
    options=SubspaceOptions,
    order=90,
    random=True,  # the basis is drawn with the run's seed
    export=refuse_export(
        "random-subspace training re-parameterises each layer (a fixed random basis and its own "
        "forward pass): no transformers or PEFT setting expresses it"
    ),
    run_label=lambda config: source_label("random subspace", config),
)
