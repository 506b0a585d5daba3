"""The launch form of the fine-tune page: one run or a sweep, queued for the worker.

A form, so moving a slider never starts anything: only "Estimate" and "Queue" act. Its values
stay across page switches (``persist_state``). ℓ* and the head selection default to what the
Layers and Heads pages found for exactly this model, data and sample (`ui.suggestions`: ℓ* from
the Layers analysis cached on disk); ℓ*, ℓ_top and ℓ_cls follow that ℓ* until the user edits
them (then the form says which ℓ* it uses). The layer fields are kept per extraction, so another
data set or model starts on its own ℓ*.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import default_of, help_of, parse_ints
from analysis.finetune.config import FinetuneConfig, canonical, grid_factors, lr_scaled
from analysis.finetune.registry import default_lrs_text, method_names, method_spec
from analysis.finetune.spec import DEFAULT_CLASSIFIER_LR, LR_GRID
from analysis.heads.selection_file import HeadSelection
from analysis.runs.planner import FIXED, Experiment, PlannedArm
from analysis.strategies import middle_layer, strategy_names, sweep_strategies
from analysis.words import counted
from ui.finetune.estimate import show_estimate
from ui.finetune.executor import executor_picker
from ui.finetune.method_fields import option_widgets
from ui.sidebar import describe
from ui.suggestions import extraction_key, heads_for, l_star_for

if TYPE_CHECKING:
    from analysis.config import ExtractConfig
    from analysis.models import LoadedModel
    from analysis.runs.db import RunsDB
    from analysis.runs.executor import ExecutorChoice

STRATEGY_HELP = (
    "down: (ℓ_b, ℓ*, ℓ_c) for ℓ_b ∈ {1, ℓ*−2, ℓ*−1, ℓ*}, ℓ_c ∈ {ℓ*, L} · up: (ℓ*+1, L, L) · "
    "baselines: (1, L, L), (L−2, L, L), (L−1, L, L), (L, L, L) · middle: down and up of "
    "ℓ_mid = L/2 + 1 · the methods: whole-model baselines (a heads run takes the Heads page's "
    "selection, or the file uploaded for method heads)"
)


def lr_help() -> str:
    """The learning-rate field's help: each method's default body rate, from its spec."""
    return f"blank = the method's default: {default_lrs_text()}"


def _ints(text: str, what: str) -> tuple[int, ...]:
    values = parse_ints(text, what)
    if not values:
        raise ValueError(f"{what}: give at least one whole number.")
    return values


KEEP = "session"  # every field keeps its value across page switches


def layer_key(extract_cfg: ExtractConfig, name: str) -> str:
    """The key of a layer field (ℓ*, ℓ_bottom…), one per extraction: another model, data set or
    sample starts on its own ℓ*, and a layer number never outlives the model it belongs to."""
    digest = hashlib.sha256(extraction_key(extract_cfg).encode()).hexdigest()[:12]
    return f"ft_{name}_{digest}"


def follow(widget_key: str, suggested: int) -> None:
    """Put ``suggested`` in a layer field unless the user edited it: a field still holding the
    value the page last suggested (or none yet) takes the new suggestion; an edited one keeps
    the user's value."""
    last = f"{widget_key}_suggested"
    if widget_key not in st.session_state or st.session_state[widget_key] == st.session_state.get(
        last
    ):
        st.session_state[widget_key] = suggested
    st.session_state[last] = suggested


def chosen_l_star(extract_cfg: ExtractConfig, n_layers: int) -> int:
    """ℓ* as the form holds it for this extraction, else the Layers page's, else the middle."""
    typed = st.session_state.get(layer_key(extract_cfg, "l_star"))
    if isinstance(typed, int) and 1 <= typed <= n_layers:
        return typed
    return l_star_for(extract_cfg, n_layers) or middle_layer(n_layers)


@dataclass
class Submitted:
    """What the form held when one of its buttons was pressed."""

    one: bool  # one run per seed (else a sweep)
    strategies: list[str]  # the sweep's
    l_star: int
    triple: tuple[int, int, int]  # (ℓ_bottom, ℓ_top, ℓ_cls) of one run
    options: Callable[[], dict[str, Any]]  # the method's option fields, once read
    training: dict[str, Any]  # the fields every run has (`training_fields`)
    estimate_only: bool
    queue: bool


def launch_form(extract_cfg: ExtractConfig, loaded: LoadedModel, db: RunsDB) -> None:
    """Draw the form; on submit, check, estimate and/or queue the runs and start the worker.

    The method is picked above the form, so the form shows that method's own fields only
    (`ui.finetune.method_fields`). The caller has loaded the model and the data
    (`ui.loaders`), so a bad file is refused on the page with the message every page gives,
    never queued to fail in the worker."""
    executor = executor_picker(db.workspace.root)
    method = st.selectbox(
        "Method (one run)", method_names(), format_func=lambda m: f"{m} — {method_spec(m).label}",
        key="ft_method", persist_state=KEEP,
    )  # fmt: skip
    with st.form("ft_launch"):
        submitted = form_fields(extract_cfg, loaded.n_layers, method)
    if not (submitted.estimate_only or submitted.queue):
        return
    configs = planned_runs(submitted, extract_cfg, loaded, method)
    show_estimate(db, configs, loaded, time_now=submitted.estimate_only)
    if submitted.queue:
        _queue(db, configs, sweep=not submitted.one, executor=executor)


def form_fields(extract_cfg: ExtractConfig, n_layers: int, method: str) -> Submitted:
    """The form's fields (inside ``st.form``): what to launch, the layers, the method's options,
    the training settings and the two buttons."""
    mode = st.radio(
        "What to launch", ["One run per seed", "A sweep of strategies"], horizontal=True,
        key="ft_mode", persist_state=KEEP,
    )  # fmt: skip
    left, right = st.columns(2)
    strategies = right.multiselect(
        "Strategies (sweep)", strategy_names(), default=["down", "up", "baselines"],
        help=STRATEGY_HELP, key="ft_strategies", persist_state=KEEP,
    )  # fmt: skip
    l_star, triple = layer_fields(extract_cfg, n_layers, left, right)
    key = functools.partial(layer_key, extract_cfg)
    options = option_widgets(method, left, n_layers, l_star, heads_for(extract_cfg), key)
    training = training_fields()
    first, second, _ = st.columns([1, 1, 4])
    estimate_only = first.form_submit_button("Estimate time")
    queue = second.form_submit_button("Queue", type="primary")
    return Submitted(mode.startswith("One"), strategies, l_star, triple, options, training,
                     estimate_only, queue)  # fmt: skip


def layer_fields(
    extract_cfg: ExtractConfig, n_layers: int, left: Any, right: Any
) -> tuple[int, tuple[int, int, int]]:
    """ℓ* (with where it comes from) and (ℓ_bottom, ℓ_top, ℓ_cls); ℓ*, ℓ_top and ℓ_cls follow
    the Layers page's ℓ* until the user edits them."""
    key = functools.partial(layer_key, extract_cfg)
    l_star_found = l_star_for(extract_cfg, n_layers)
    suggested = l_star_found or middle_layer(n_layers)
    for name in ("l_star", "top", "classifier"):  # they follow ℓ* unless the user edited them
        follow(key(name), suggested)
    st.session_state.setdefault(key("bottom"), 1)
    typed = st.session_state[key("l_star")]
    if l_star_found is None:
        left.caption(
            "No ℓ* found yet for this model, data and sample: compute it on the Layers "
            "page, or type one."
        )
    elif typed != l_star_found:
        left.warning(
            f"You set ℓ* = {typed}; the Layers analysis says {l_star_found} for "
            f"{describe(extract_cfg)}. Sweeps and results use ℓ* = {typed}.",
            icon=":material/edit:",
        )
    else:
        left.info(
            f"ℓ* = {l_star_found}, from the Layers analysis (lowest ν) for {describe(extract_cfg)}."
        )
    l_star = left.number_input(
        "ℓ* (best-specialised layer)", 1, n_layers, key=key("l_star"), persist_state=KEEP,
        help="Taken from the Layers analysis cached for these settings; ℓ_top and ℓ_cls "
        "follow it until you edit them.",
    )  # fmt: skip
    c1, c2, c3 = right.columns(3)
    bottom = c1.number_input("ℓ_bottom", 1, n_layers, key=key("bottom"), persist_state=KEEP)
    top = c2.number_input("ℓ_top", 1, n_layers, key=key("top"), persist_state=KEEP)
    classifier = c3.number_input(
        "ℓ_cls", 1, n_layers, key=key("classifier"), persist_state=KEEP,
        help="ℓ_cls: the layer the classifier reads; the layers above it are removed.",
    )  # fmt: skip
    return int(l_star), (int(bottom), int(top), int(classifier))


def training_fields() -> dict[str, Any]:
    """The fields every run has, three a row so that no label is cut short."""
    a, c, d = st.columns(3)
    b, b2, _ = st.columns(3)
    e, f, g = st.columns(3)
    return dict(
        steps=a.number_input(
            "Steps", 1, 100_000, default_of(FinetuneConfig, "steps"), step=50, key="ft_steps",
            persist_state=KEEP,
        ),
        lr_text=b.text_input(
            "Learning rate", "", placeholder="method default", help=lr_help(), key="ft_lr",
            persist_state=KEEP,
        ),
        classifier_lr=b2.number_input(
            "Classifier learning rate", min_value=1e-7, max_value=1.0,
            value=DEFAULT_CLASSIFIER_LR, format="%.1e",
            help=help_of(FinetuneConfig, "classifier_lr") + " (its own AdamW group)",
            key="ft_classifier_lr", persist_state=KEEP,
        ),
        batch_size=c.number_input(
            "Batch size", 1, 1024, default_of(FinetuneConfig, "batch_size"), key="ft_batch",
            persist_state=KEEP,
        ),
        seeds_text=d.text_input(
            "Seeds", "0,1,2", key="ft_seeds", persist_state=KEEP,
            help="comma-separated; 3 by default, so that every comparison can reach a verdict "
            "(one seed a side has no interval)",
        ),
        n_train=e.number_input(
            "Train examples (0 = all)", 0, 10_000_000,
            default_of(FinetuneConfig, "n_train") or 0, step=500, key="ft_n_train",
            persist_state=KEEP, help=help_of(FinetuneConfig, "n_train"),
        ),
        n_eval=f.number_input(
            "Dev/test examples scored", 1, 1_000_000, default_of(FinetuneConfig, "n_eval"),
            step=100, key="ft_n_eval", persist_state=KEEP, help=help_of(FinetuneConfig, "n_eval"),
        ),
        eval_every=g.number_input(
            "Dev score every k steps", 1, 100_000, default_of(FinetuneConfig, "eval_every"),
            key="ft_eval_every", persist_state=KEEP,
        ),
        lr_grid=st.checkbox(
            "Sweep: learning-rate grid " + ", ".join(f"×{_factor(f)}" for f in LR_GRID),
            help="Each strategy also at the other multiples of its body learning rate; the rate "
            "with the best mean dev score is kept in the results (never chosen on test).",
            key="ft_lr_grid", persist_state=KEEP,
        ),
    )  # fmt: skip


def planned_runs(
    submitted: Submitted, extract_cfg: ExtractConfig, loaded: LoadedModel, method: str
) -> list[tuple[str, FinetuneConfig]]:
    """(family, config) of every run the form asks for, checked against the model; one
    ValueError naming every problem of the form."""
    form, n_layers = submitted.training, loaded.n_layers
    problems = Problems()
    seeds = problems.check(lambda: _ints(form["seeds_text"], "Seeds"), (0,))
    common = dict(
        model=extract_cfg.model, data=extract_cfg.data, steps=int(form["steps"]),
        lr=problems.check(lambda: _learning_rate(form["lr_text"]), None),
        classifier_lr=float(form["classifier_lr"]), batch_size=int(form["batch_size"]),
        max_length=extract_cfg.max_length, pooling=extract_cfg.pooling,
        n_train=int(form["n_train"]) or None, n_eval=int(form["n_eval"]),
        eval_every=int(form["eval_every"]),
    )  # fmt: skip
    given = problems.check(submitted.options, {})
    if submitted.one:
        layers = submitted.triple if method_spec(method).needs_layers else None
        plan = [("single", method, layers)]
    else:
        plan = [
            (s.family, s.method, s.layers)
            for s in sweep_strategies(submitted.strategies, n_layers, submitted.l_star)
        ]
    heads_found = heads_for(extract_cfg)

    def checked(m: str, layers, seed: int) -> FinetuneConfig:
        options = given if submitted.one else {}
        cfg = canonical(_config(common, m, layers, seed, options, heads_found), n_layers)
        # Layers within 1..L, heads within 0..H-1: refused here, not in the worker.
        cfg.check_model(loaded.n_layers, loaded.n_heads)
        return cfg

    configs = [
        (family, cfg)
        for family, m, layers in plan
        for seed in seeds
        if (cfg := problems.check(functools.partial(checked, m, layers, seed))) is not None
    ]
    problems.raise_any()  # every problem of the form at once, not one per press
    if form["lr_grid"] and not submitted.one:
        configs = [
            (family, lr_scaled(cfg, factor))
            for family, cfg in configs
            for factor in grid_factors(cfg.method)
        ]
    return configs


class Problems:
    """The form's bad inputs, gathered so that one message lists all of them."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def check(self, compute, fallback=None):
        """``compute()``, or ``fallback`` with its ValueError's message kept."""
        try:
            return compute()
        except ValueError as exc:
            if str(exc) not in self.messages:
                self.messages.append(str(exc))
            return fallback

    def raise_any(self) -> None:
        """One ValueError naming every problem (a bulleted list when there are several)."""
        if len(self.messages) == 1:
            raise ValueError(self.messages[0])
        if self.messages:
            raise ValueError(
                f"{len(self.messages)} problems in the form:\n"
                + "\n".join(f"- {m}" for m in self.messages)
            )


def _factor(factor: float) -> str:
    return "½" if factor == 0.5 else f"{factor:g}"


def _learning_rate(text: str) -> float | None:
    if not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"The learning rate must be a number such as 5e-5 (got {text!r})."
        ) from None


def _config(
    common: dict,
    method: str,
    layers: tuple[int, int, int] | None,
    seed: int,
    given: dict,
    heads: HeadSelection | None,
) -> FinetuneConfig:
    """One run's config; ``given``: the form's option fields (one run), ``heads``: the selection a
    heads run takes when the form gives none (the Heads page's)."""
    spec = method_spec(method)
    options = None
    if spec.options is not None:
        kwargs = dict(given)
        for field in spec.fields:
            if field.kind == "heads" and field.name not in kwargs and heads is not None:
                kwargs[field.name] = heads
            if field.required and field.name not in kwargs:
                what = spec.missing or field.flat
                raise ValueError(
                    f"Method {method} needs {what.split(' (')[0]}: "
                    + ("upload a file, or pick heads on the Heads page for this model and data."
                       if field.kind == "heads" else "fill in its field.")
                )  # fmt: skip
        options = spec.options(**kwargs)
    return FinetuneConfig(method=method, layers=layers, seed=seed, options=options, **common)


def _queue(db: RunsDB, configs: list, sweep: bool, executor: ExecutorChoice) -> None:
    """Queue the form's runs as one planned grid (`analysis.runs.planner`): every strategy ×
    seed that no done, running or queued run of the same setting stands for."""
    from analysis.runs.launch import launch_experiment, new_sweep_id

    experiment = sweep_experiment(configs)
    config = configs[0][1]
    runs = db.list_runs(model=config.model.name, data=config.data.name)
    sweep_id = new_sweep_id("sweep") if sweep else None
    # an unreachable cluster: nothing queued
    launched = launch_experiment(db, experiment, runs, executor, sweep_id)
    reused = len(configs) - len(launched.ids)
    st.success(
        f"Queued {counted(len(launched.ids), 'run')}{f' as {sweep_id}' if sweep else ''}"
        + (f" ({counted(reused, 'run')} already trained or training: reused)" if reused else "")
        + f". They train {launched.how} ({launched.workers}); you can switch pages or close the "
        "tab."
    )


def sweep_experiment(configs: list[tuple[str, FinetuneConfig]]) -> Experiment:
    """The form's runs ((family, config) per strategy × seed) as a planned grid: one arm per
    setting, its family kept ("single" for one run per seed: none), the form's seeds. The
    reference arm — full fine-tuning when the grid has it, else its first setting — trains on the
    seeds as typed; under independent seeds every other setting gets seeds of its own
    (`analysis.seeding.arm_seed`), so that comparing them is valid."""
    arms: dict[str, PlannedArm] = {}
    seeds: list[int] = []
    for family, cfg in configs:
        base = dataclasses.replace(cfg, seed=0)
        name = canonical_json(base.to_dict())  # one arm a setting (the first family names it)
        arms.setdefault(name, PlannedArm(name, base, family=None if family == "single" else family))
        if cfg.seed not in seeds:
            seeds.append(cfg.seed)
    planned = list(arms.values())
    first = next((a for a in planned if method_spec(a.config.method).reference), planned[0])
    planned = [dataclasses.replace(a, reference=a is first) for a in planned]
    return Experiment(tuple(planned), seeds=tuple(seeds), policy=FIXED)
