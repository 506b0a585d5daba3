"""What a fine-tuning method trains (`Prepared`), and what it needs besides the model (`MethodInputs`).

Partly trained tensors (method ``heads``): the gradient of every entry outside the mask is set to
zero after each backward pass, and the tensor is kept out of weight decay. With AdamW, an entry
whose gradient is always exactly zero keeps both moments at exactly zero, so its update is
0 / (0 + eps) = 0 and the entry stays bit-identical. (Weight decay would shrink it, hence the
no-decay group; the selected entries of such a tensor therefore get no weight decay either.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from analysis.subspace.trajectory import Trajectory


@dataclass(frozen=True)
class MethodInputs:
    """What a method needs besides the model and its config, resolved by the caller.

    trajectory: the source run's trajectory (methods ``subspace`` / ``subspace-random``);
    `analysis.runs.execute` finds it from the run id in ``cfg.option("run")``.
    """

    trajectory: Trajectory | None = None


@dataclass
class Prepared:
    """What a method trains.

    decay / no_decay: the trainable parameters, split for AdamW's weight decay (matrices decay;
    biases, LayerNorm weights and masked tensors do not).
    grad_masks: {parameter: bool mask of its shape}, True = this entry trains; the engine zeroes
    the other entries' gradients after every backward pass (`apply_grad_masks`).
    after_step: called after every optimizer step (e.g. to refresh a re-parameterisation), and
    once more after the best-dev state is restored.
    trained_layers: the 1-based layers this method updates, for ``layers_backward``; None = every
    kept layer holding a parameter with ``requires_grad``.
    classifier_params: the fresh classifier's parameters (set by the engine's `build_model`); they get
    their own AdamW groups at the classifier's learning rate (`param_groups`).
    """

    decay: list[nn.Parameter]
    no_decay: list[nn.Parameter]
    grad_masks: dict[nn.Parameter, torch.Tensor] = field(default_factory=dict)
    description: str = ""
    after_step: Callable[[], None] | None = None
    trained_layers: tuple[int, ...] | None = None
    classifier_params: tuple[nn.Parameter, ...] = ()

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        description: str,
        grad_masks: dict[nn.Parameter, torch.Tensor] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> Prepared:
        """Every parameter of ``model`` with ``requires_grad``, split into decay / no-decay."""
        masks = grad_masks or {}
        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []
        for param in model.parameters():
            if not param.requires_grad:
                continue
            if param in masks or param.ndim < 2:
                no_decay.append(param)
            else:
                decay.append(param)
        if not decay and not no_decay:
            raise ValueError(f"Nothing to train ({description}).")
        return cls(decay, no_decay, dict(masks), description, after_step)

    @property
    def params(self) -> list[nn.Parameter]:
        return self.decay + self.no_decay

    @property
    def n_trainable(self) -> int:
        """Entries that train: whole tensors, plus the True entries of masked ones."""
        return sum(
            int(self.grad_masks[p].sum()) if p in self.grad_masks else p.numel()
            for p in self.params
        )

    def param_groups(
        self, weight_decay: float, lr: float | None = None, classifier_lr: float | None = None
    ) -> list[dict]:
        """AdamW groups: body decay / no-decay at ``lr``, classifier decay / no-decay at
        ``classifier_lr`` (docs/explanation/strategies.md, "Learning rates"). A group without
        ``lr`` takes the optimizer's."""
        own = {id(p) for p in self.classifier_params} if classifier_lr is not None else set()
        groups = []
        for params, decay in ((self.decay, weight_decay), (self.no_decay, 0.0)):
            body = [p for p in params if id(p) not in own]
            classifier = [p for p in params if id(p) in own]
            groups.append({"params": body, "weight_decay": decay, **_lr(lr)})
            groups.append({"params": classifier, "weight_decay": decay, **_lr(classifier_lr)})
        return [g for g in groups if g["params"]]

    def apply_grad_masks(self) -> None:
        for param, mask in self.grad_masks.items():
            if param.grad is not None:
                # masked_fill, not a multiply: an inf or NaN gradient times 0 is still NaN
                param.grad.masked_fill_(~mask, 0.0)


def _lr(value: float | None) -> dict:
    return {} if value is None else {"lr": value}
