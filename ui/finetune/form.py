"""The launch form of the fine-tune page: one run or a sweep, queued for the worker.

A form, so moving a slider never starts anything: only "Estimate" and "Queue" act. Its values
stay across page switches (``persist_state``). ℓ* and the head selection default to what the
Layers and Heads pages found for exactly this model, data and sample (`ui.suggestions`: ℓ* from
the Layers analysis cached on disk); ℓ*, ℓ_top and ℓ_head follow that ℓ* until the user edits
them (then the form says which ℓ* it uses). The layer fields are kept per extraction, so another
data set or model starts on its own ℓ*.
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import TYPE_CHECKING

import streamlit as st

from analysis.config import default_of, help_of, parse_ints
from analysis.finetune.config import FinetuneConfig, canonical, grid_factors, lr_scaled
from analysis.finetune.registry import default_lrs_text, method_names, method_spec
from analysis.finetune.spec import DEFAULT_CLASSIFIER_LR, LR_GRID
from analysis.heads.selection_file import HeadSelection
from analysis.runs.db import run_label
from analysis.strategies import middle_layer, strategy_names, sweep_strategies
from ui.finetune.executor import executor_picker
from ui.finetune.method_fields import option_widgets
from ui.finetune.state import format_seconds, measured_step_time, timed_step_time
from ui.sidebar import describe
from ui.suggestions import extraction_key, heads_for, l_star_for

if TYPE_CHECKING:
    from analysis.config import ExtractConfig
    from analysis.models import LoadedModel
    from analysis.runs.db import RunsDB
    from analysis.runs.executor import ExecutorChoice

STRATEGY_HELP = (
    "down: (ℓ_b, ℓ*, ℓ_h) for ℓ_b ∈ {1, ℓ*−2, ℓ*−1, ℓ*}, ℓ_h ∈ {ℓ*, L} · up: (ℓ*+1, L, L) · "
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
TIMED = "ft_timed_step_s"  # this session's timings: (model, method, batch, length, device) → s


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


def launch_form(extract_cfg: ExtractConfig, loaded: LoadedModel, db: RunsDB) -> None:
    """Draw the form; on submit, check, estimate and/or queue the runs and start the worker.

    The method is picked above the form, so the form shows that method's own fields only
    (`ui.finetune.method_fields`). The caller has loaded the model and the data
    (`ui.loaders`), so a bad file is refused on the page with the message every page gives,
    never queued to fail in the worker."""
    executor = executor_picker(db.path.parent)
    n_layers = loaded.n_layers
    l_star_found = l_star_for(extract_cfg, n_layers)
    heads_found = heads_for(extract_cfg)
    key = functools.partial(layer_key, extract_cfg)
    names = method_names()
    method = st.selectbox(
        "Method (one run)", names, format_func=lambda m: f"{m} — {method_spec(m).label}",
        key="ft_method", persist_state=KEEP,
    )  # fmt: skip
    with st.form("ft_launch"):
        mode = st.radio(
            "What to launch", ["One run per seed", "A sweep of strategies"], horizontal=True,
            key="ft_mode", persist_state=KEEP,
        )  # fmt: skip
        left, right = st.columns(2)
        strategies = right.multiselect(
            "Strategies (sweep)", strategy_names(), default=["down", "up", "baselines"],
            help=STRATEGY_HELP, key="ft_strategies", persist_state=KEEP,
        )  # fmt: skip
        suggested = l_star_found or middle_layer(n_layers)
        for name in ("l_star", "top", "head"):  # they follow ℓ* unless the user edited them
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
                f"ℓ* = {l_star_found}, from the Layers analysis (lowest ν) for "
                f"{describe(extract_cfg)}."
            )
        l_star = left.number_input(
            "ℓ* (best-specialised layer)", 1, n_layers, key=key("l_star"), persist_state=KEEP,
            help="Taken from the Layers analysis cached for these settings; ℓ_top and ℓ_head "
            "follow it until you edit them.",
        )  # fmt: skip
        c1, c2, c3 = right.columns(3)
        bottom = c1.number_input("ℓ_bottom", 1, n_layers, key=key("bottom"), persist_state=KEEP)
        top = c2.number_input("ℓ_top", 1, n_layers, key=key("top"), persist_state=KEEP)
        head = c3.number_input("ℓ_head", 1, n_layers, key=key("head"), persist_state=KEEP)
        option_values = option_widgets(method, left, n_layers, int(l_star), heads_found, key)
        # Three fields a row, so that no label is cut short.
        a, c, d = st.columns(3)
        b, b2, _ = st.columns(3)
        e, f, g = st.columns(3)
        steps = a.number_input(
            "Steps", 1, 100_000, default_of(FinetuneConfig, "steps"), step=50, key="ft_steps",
            persist_state=KEEP,
        )  # fmt: skip
        lr_text = b.text_input(
            "Learning rate", "", placeholder="method default", help=lr_help(), key="ft_lr",
            persist_state=KEEP,
        )  # fmt: skip
        classifier_lr = b2.number_input(
            "Classifier learning rate", min_value=1e-7, max_value=1.0, value=DEFAULT_CLASSIFIER_LR,
            format="%.1e", help=help_of(FinetuneConfig, "classifier_lr") + " (its own AdamW group)",
            key="ft_head_lr", persist_state=KEEP,
        )  # fmt: skip
        batch_size = c.number_input(
            "Batch size", 1, 1024, default_of(FinetuneConfig, "batch_size"), key="ft_batch",
            persist_state=KEEP,
        )  # fmt: skip
        seeds_text = d.text_input(
            "Seeds", "0,1,2", key="ft_seeds", persist_state=KEEP,
            help="comma-separated; 3 by default, so that every comparison can reach a verdict "
            "(one seed a side has no interval)",
        )  # fmt: skip
        n_train = e.number_input(
            "Train examples (0 = all)", 0, 10_000_000, default_of(FinetuneConfig, "n_train") or 0,
            step=500, key="ft_n_train", persist_state=KEEP,
            help=help_of(FinetuneConfig, "n_train"),
        )  # fmt: skip
        n_eval = f.number_input(
            "Dev/test examples scored", 1, 1_000_000, default_of(FinetuneConfig, "n_eval"),
            step=100, key="ft_n_eval", persist_state=KEEP, help=help_of(FinetuneConfig, "n_eval"),
        )  # fmt: skip
        eval_every = g.number_input(
            "Dev score every k steps", 1, 100_000, default_of(FinetuneConfig, "eval_every"),
            key="ft_eval_every", persist_state=KEEP,
        )  # fmt: skip
        lr_grid = st.checkbox(
            "Sweep: learning-rate grid " + ", ".join(f"×{_factor(f)}" for f in LR_GRID),
            help="Each strategy also at the other multiples of its body learning rate; the rate "
            "with the best mean dev score is kept in the results (never chosen on test).",
            key="ft_lr_grid", persist_state=KEEP,
        )  # fmt: skip
        first, second, _ = st.columns([1, 1, 4])
        estimate_only = first.form_submit_button("Estimate time")
        queue = second.form_submit_button("Queue", type="primary")
    if not (estimate_only or queue):
        return
    problems = Problems()
    seeds = problems.check(lambda: _ints(seeds_text, "Seeds"), (0,))
    common = dict(
        model=extract_cfg.model, data=extract_cfg.data, steps=int(steps),
        lr=problems.check(lambda: _learning_rate(lr_text), None),
        classifier_lr=float(classifier_lr),
        batch_size=int(batch_size), max_length=extract_cfg.max_length, pooling=extract_cfg.pooling,
        n_train=int(n_train) or None, n_eval=int(n_eval), eval_every=int(eval_every),
    )  # fmt: skip
    one = mode.startswith("One")
    given = problems.check(option_values, {})
    if one:
        triple = (int(bottom), int(top), int(head))
        plan = [("single", method, triple if method_spec(method).needs_layers else None)]
    else:
        plan = [
            (s.strategy_family, s.method, s.layers)
            for s in sweep_strategies(strategies, n_layers, int(l_star))
        ]
    heads = given.get("heads") if method == "heads" else heads_found

    def checked(m: str, layers, seed: int) -> FinetuneConfig:
        cfg = canonical(_config(common, m, layers, seed, given if one else {}, heads), n_layers)
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
    if lr_grid and not one:
        configs = [
            (family, lr_scaled(cfg, factor))
            for family, cfg in configs
            for factor in grid_factors(cfg.method)
        ]
    _show_estimate(db, configs, loaded, time_now=estimate_only)
    if queue:
        _queue(db, configs, sweep=not one, executor=executor)


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


def _show_estimate(db: RunsDB, configs: list, loaded: LoadedModel, time_now: bool) -> None:
    """Steps × seconds per step, summed over the runs. Seconds per step: measured on earlier runs
    of this model; else, on "Estimate time", timed now on one run per method."""
    total, sources = 0.0, set()
    # Timings of this session (model, method, batch size, max length), so "Queue" right after
    # "Estimate time" estimates from them instead of saying there is nothing to estimate from.
    timed, fresh = st.session_state.setdefault(TIMED, {}), set()
    for _, cfg in configs:
        per_step, source = measured_step_time(db, cfg, run_label(cfg.to_dict()))
        what = (cfg.model.name, cfg.method, cfg.batch_size, cfg.max_length, cfg.device)
        if per_step is None and (time_now or what in timed):
            if time_now and what not in fresh:  # once per kind of run and press
                timed[what] = timed_step_time(cfg, loaded)
                fresh.add(what)
            if what in fresh:
                source = f"timed just now on 2 steps of one {cfg.method} run (others alike)"
            else:
                source = f"timed earlier in this session on 2 steps of one {cfg.method} run"
            per_step = timed[what]
        if per_step is None:
            st.info(
                f"No earlier {cfg.method} run of this model to estimate from: press **Estimate "
                "time** for a quick timing of 2 steps here."
            )
            return
        total += per_step * cfg.steps
        sources.add(source)
    st.info(
        f"Estimated training time: **{format_seconds(total)}** for {len(configs)} run(s) "
        "(steps × seconds per step; loading data and scoring dev/test come on top). "
        f"Source: {_sources(sources)}."
    )


def _sources(sources: set[str]) -> str:
    if len(sources) <= 2:
        return "; ".join(sorted(sources))
    kinds = {"measured" if s.startswith("measured") else "timed" for s in sources}
    if kinds == {"measured"}:
        return "measured on earlier runs of this model (same layers where possible, else method)"
    return "measured on earlier runs where possible, else timed just now on 2 steps per method"


def _queue(db: RunsDB, configs: list, sweep: bool, executor: ExecutorChoice) -> None:
    from analysis.runs.launch import launch

    sweep_id = "sweep-" + time.strftime("%Y%m%d-%H%M%S") if sweep else None
    runs = [(cfg, None if family == "single" else family) for family, cfg in configs]
    launched = launch(db, runs, executor, sweep_id)  # an unreachable cluster: nothing queued
    st.success(
        f"Queued {len(launched.ids)} run(s){f' as {sweep_id}' if sweep_id else ''}. They train "
        f"{launched.how} ({launched.workers}); you can switch pages or close the tab."
    )
