"""The fine-tuning methods: every module of ``analysis/finetune/methods/`` that declares a ``SPEC``.

The modules are found once, on first use (`pkgutil`), in their specs' ``order``; `register` adds
a method from elsewhere (a plugin, a test). Everything that lists methods asks here: the config's
accepted names and flat keys, the CLI's flags, the page's fields, the labels and colours.
Free of torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from analysis.finetune.spec import MethodSpec, OptionField

_SPECS: dict[str, MethodSpec] = {}


def _discover() -> dict[str, MethodSpec]:
    if not _SPECS:
        import analysis.finetune.methods as package

        found = []
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            spec = getattr(module, "SPEC", None)
            if isinstance(spec, MethodSpec):
                found.append(spec)
        for spec in sorted(found, key=lambda s: (s.order, s.name)):
            _SPECS[spec.name] = spec
    return _SPECS


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method (a ValueError if its name or one of its flat keys is taken by another)."""
    specs = _discover()
    if spec.name in specs:
        raise ValueError(f"A fine-tuning method {spec.name!r} exists already.")
    taken = {f.flat: s for s in specs.values() for f in s.fields}
    for f in spec.fields:
        other = taken.get(f.flat)
        if other is not None and other.options is not spec.options:
            raise ValueError(f"The option key {f.flat!r} belongs to method {other.name!r}.")
    specs[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a method `register` added (tests)."""
    _discover().pop(name, None)


def method_specs() -> tuple[MethodSpec, ...]:
    return tuple(_discover().values())


def method_names(where: Callable[[MethodSpec], bool] | None = None) -> tuple[str, ...]:
    """Every method's name, or those whose spec satisfies ``where``
    (``method_names(lambda s: s.reference)``)."""
    return tuple(name for name, spec in _discover().items() if where is None or where(spec))


def method_spec(name: str) -> MethodSpec:
    """The spec of ``name``, or a ValueError listing the methods there are."""
    specs = _discover()
    if name not in specs:
        raise ValueError(f"Unknown fine-tuning method {name!r}: choose one of {', '.join(specs)}.")
    return specs[name]


def find_spec(name: Any) -> MethodSpec | None:
    """The spec of ``name``, or None for a name no method has (an imported run's ``custom``)."""
    return _discover().get(name) if isinstance(name, str) else None


def default_lr(method: str) -> float:
    """The body learning rate of ``method`` when none is given (its spec's ``default_lr``)."""
    return method_spec(method).default_lr


def default_lrs_text() -> str:
    """Each method's default body learning rate, for help texts: ``layers 5e-05, full 5e-05…``."""
    return ", ".join(f"{s.name} {s.default_lr:g}" for s in method_specs())


def sweep_methods() -> tuple[str, ...]:
    """The methods a sweep offers as whole-model baselines, in their ``sweep`` order."""
    offered = [s for s in method_specs() if s.sweep is not None]
    return tuple(s.name for s in sorted(offered, key=lambda s: s.sweep))


def option_owners() -> dict[str, tuple[OptionField, tuple[str, ...]]]:
    """Every flat option key → (its field, the methods that take it), in method order."""
    out: dict[str, tuple[OptionField, tuple[str, ...]]] = {}
    for spec in method_specs():
        for f in spec.fields:
            field, owners = out.get(f.flat, (f, ()))
            out[f.flat] = (field, (*owners, spec.name))
    return out


def flat_defaults() -> dict[str, Any]:
    """Every flat option key with its default (None where a method needs a choice), plus the
    provenance key of a head selection (``heads_settings``)."""
    out: dict[str, Any] = {}
    for key, (field, _) in option_owners().items():
        out[key] = field.default
        if field.kind == "heads":
            out[f"{key}_settings"] = None  # HeadSelection.settings: where the selection came from
    return out


def colours() -> dict[str, str]:
    """Each method's own figure colour (methods coloured by their strategy family are absent)."""
    return {s.name: s.colour for s in method_specs() if s.colour is not None}
