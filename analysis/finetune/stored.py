"""How a fine-tuning config is stored, and how a method's options given flat are read.

A stored config (`FinetuneConfig.to_dict`) holds the settings every run has beside ``"method"``
and ``"options"``: that method's own options, by field name, in their JSON form
(`analysis.finetune.spec.options_json`) — nothing of any other method, so adding a method or an
option leaves every other run's stored config as it is::

    {"model": {…}, "data": {…}, "method": "lora", "options": {"layers_to_transform": [2, 3],
     "r": 8, …}, "layers": [2, 3], "classifier_layer": 3, "steps": 200, "lr": 0.0005,
     "classifier_lr": 0.001, …}

The layers are stored apart: ``"layers": [ℓ_bottom, ℓ_top]`` (the layers that train, for method
``layers``; a placing method's default placement) and ``"classifier_layer": ℓ_cls`` (where the
model is cut: every method has one), because they are two settings, not one. The Python API
keeps the triple (``FinetuneConfig(layers=(1, 3, 3))``).

`flat_config` takes a method's options flat, under their flat names (``lora_r``, ``heads`` with
``heads_settings``…: the CLI's flags), beside the common keys. Configs the runs database stored
under older names or forms are rewritten once by its migration (`analysis.runs.migration`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.registry import flat_defaults, method_spec, option_owners
from analysis.finetune.spec import MethodSpec, option_json


def config_kwargs(
    payload: Mapping[str, Any], own: set[str], stored: bool = False
) -> dict[str, Any]:
    """`FinetuneConfig` keyword arguments from a config (``own``: the config's field names):
    the stored form when ``stored`` (its layers as ``layers`` [ℓ_bottom, ℓ_top] and
    ``classifier_layer``), else the keyword form (``layers`` (ℓ_bottom, ℓ_top, ℓ_cls)).
    Either may give the options flat. Unknown keys are an error; a flat option key the method does not
    use must hold its default (``heads`` for method ``full`` is refused, not dropped)."""
    payload = dict(payload)
    if stored:
        payload["layers"] = joined_layers(
            payload.get("layers"), payload.pop("classifier_layer", None)
        )
    nested = isinstance(payload.get("options"), Mapping)
    flat_keys = set() if nested else set(flat_defaults())
    unknown = sorted(set(payload) - own - flat_keys)
    if unknown:
        raise ValueError(f"Unknown fine-tuning config keys: {', '.join(unknown)}.")
    kwargs = {k: v for k, v in payload.items() if k in own and k != "options"}
    for name, spec_class in (("model", ModelSpec), ("data", DataSpec)):
        if isinstance(kwargs.get(name), Mapping):
            try:
                kwargs[name] = spec_class(**kwargs[name])
            except TypeError as exc:
                raise ValueError(f"Bad {name} spec in a fine-tuning config: {exc}") from None
    if isinstance(kwargs.get("layers"), list):
        kwargs["layers"] = tuple(kwargs["layers"])
    spec = method_spec(kwargs.get("method", "full"))
    if nested:
        kwargs["options"] = options_from_json(spec, payload["options"])
    elif not _is_options(payload.get("options")):
        flat = {k: v for k, v in payload.items() if k in flat_keys}
        kwargs["options"] = options_from_json(spec, flat_options(spec, flat, strict=True))
    else:
        kwargs["options"] = payload["options"]  # an options object (flat_config(options=…))
    return kwargs


def joined_layers(layers: Any, classifier_layer: Any) -> list[Any] | None:
    """The stored ``layers`` [ℓ_bottom, ℓ_top] and ``classifier_layer`` ℓ_cls as one
    [ℓ_bottom, ℓ_top, ℓ_cls] (None: neither given); a ValueError for one without the other."""
    if layers is None and classifier_layer is None:
        return None
    if layers is None or classifier_layer is None or isinstance(layers, str) or len(layers) != 2:
        raise ValueError(
            "A stored config gives layers as [ℓ_bottom, ℓ_top] together with classifier_layer "
            f"(ℓ_cls), or neither (got layers {layers!r}, classifier_layer "
            f"{classifier_layer!r})."
        )
    return [*layers, classifier_layer]


def stored_layers(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(ℓ_bottom, ℓ_top, ℓ_cls) of a stored config, or None where it names no layers."""
    joined = joined_layers(config.get("layers"), config.get("classifier_layer"))
    if joined is None:
        return None
    bottom, top, head = joined
    return int(bottom), int(top), int(head)


def _is_options(value: Any) -> bool:
    return value is not None and dataclasses.is_dataclass(value)


def options_from_json(spec: MethodSpec, given: Mapping[str, Any]) -> Any:
    """The options of ``spec`` from their stored form; None = the defaults (or, where the method
    needs a choice that is missing, None: `FinetuneConfig` says what is missing)."""
    names = {f.name: f for f in spec.fields}
    unknown = sorted(set(given) - set(names))
    if unknown:
        takes = ", ".join(names) or "none"
        raise ValueError(
            f"Method {spec.name!r} has no option {', '.join(unknown)} (its options: {takes})."
        )
    if spec.options is None:
        return None
    kwargs = {name: value for name, value in given.items() if value is not None}
    if any(f.required and f.name not in kwargs for f in spec.fields):
        return None
    return spec.options(**kwargs)


def flat_options(spec: MethodSpec, flat: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    """The options of ``spec`` in their stored form (by field name) from a flat config's option
    keys. ``strict``: a key of another method must be absent or hold its default."""
    mine = {f.flat: f for f in spec.fields}
    if strict:
        defaults, owners = flat_defaults(), option_owners()
        for key, value in flat.items():
            owned = key in mine or key.removesuffix("_settings") in mine
            if not owned and value != defaults.get(key):
                takers = owners.get(key.removesuffix("_settings"), (None, ()))[1]
                raise ValueError(
                    f"{key} is only used by method{'s' if len(takers) > 1 else ''} "
                    f"{' / '.join(repr(o) for o in takers)}."
                )
    out: dict[str, Any] = {}
    for key, field in mine.items():
        if key not in flat:
            continue
        value = flat[key]
        if field.kind == "heads" and value is not None and not hasattr(value, "settings"):
            settings = flat.get(f"{key}_settings") or {}
            if not isinstance(settings, Mapping):
                raise ValueError(
                    f"{key}_settings must be a JSON object (the selection's settings)."
                )
            value = {"layers": value, "settings": dict(settings)}
        out[field.name] = value
    return out


def nested(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a stored config, or a run's setting: its options flat) with its method's
    options under ``"options"``, every option there (an option a run's setting leaves out holds
    its default), without any checks: what run labels read."""
    try:
        spec = method_spec(str(config.get("method")))
    except ValueError:
        return dict(config)
    given = config.get("options")
    if not isinstance(given, Mapping):
        given = flat_options(spec, config, strict=False)
    defaults = {f.name: option_json(f.kind, f.default) for f in spec.fields}
    return {**config, "options": {**defaults, **given}}
