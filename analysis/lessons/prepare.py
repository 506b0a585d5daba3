"""What each step of a lesson computes, computed ahead of class, and whether it still is.

A step's page computes what its view asks for (`needs_of`): the Layers page the hidden states,
the table of metrics, its bootstrap repeats and the picture of the chosen layer; the Heads page
the head statistics and one example's attention pattern; the Paper check page its inputs and the
fine-tuning runs its claims need; the Subspaces page the analysis of a trajectory run. Every one
of them lives in the disk cache (or the runs database), so computing them once before class
(`prepare`) leaves nothing to compute while the class follows: each page finds its results.

`prepare` takes a ``compute(need, progress) -> hit`` function: the CLI's computes with the
library (`LibraryRunner`), the dashboard's through the pages' own cached calls, so that a page
asking for the same result meanwhile shares it. It records, per step, a digest of the step's
inputs (its view, the model's weights, the data's content) in ``<name>.prepared.json``;
`status` compares them, so a step whose inputs changed since preparing says so.

docs/tutorials/teach-a-lesson.md shows it at work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.cache import canonical_json
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.io import atomic_write_json, read_json
from analysis.lessons.lesson import Lesson, Lessons, Step
from analysis.progress import Progress, no_progress
from analysis.rates import duration, estimate, forward_work
from analysis.workspace import data_folder

if TYPE_CHECKING:
    from analysis.claims import ClaimsConfig
    from analysis.heads.collect import HeadStatsConfig
    from analysis.recommend.config import RecommendConfig

# The pages' own defaults for what their view leaves out (a link leaves out default values);
# the Paper check's and the Recommend page's are their configs' (ClaimsConfig, RecommendConfig).
LAYER_REPEATS = 50  # = analysis.layers.repeats.DEFAULT_REPEATS (the Layers page's R)
HEADS_N, HEADS_XI = 300, 0.9  # ui.heads.state.DEFAULTS
UPLOAD_PREFIX = "upload:"
NAMED_DATA = ("movie-snippets", "trec6")


@dataclass(frozen=True)
class Need:
    """One result a step's page computes: its kind, a readable label and its settings."""

    kind: str  # states | layer table | repeats | picture | head statistics | attention | claim inputs | claim runs | recommendation | trajectory
    label: str
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    key: str = ""  # equal keys: the same result (computed once for every step that needs it)

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(
                self, "key", self.kind + ":" + canonical_json(_plain(dict(self.settings)))
            )


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# -- a step's settings, as its page reads them from the link --------------------------------------


def _int(view: Mapping[str, str], key: str, default: int) -> int:
    text = view.get(key)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"The step's {key}={text!r} is not a whole number.") from None


def _float(view: Mapping[str, str], key: str, default: float) -> float:
    text = view.get(key)
    try:
        return default if text is None else float(text)
    except ValueError:
        raise ValueError(f"The step's {key}={text!r} is not a number.") from None


def data_of(value: str, uploads: Path) -> str:
    """The data set a link names: a built-in or GLUE name as it is, ``upload:<digest>/<name>``
    as the stored upload, a relative path inside the data folder."""
    text = value.strip()
    if text.lower() in NAMED_DATA or text.lower().startswith("glue/"):
        return text
    if text.startswith(UPLOAD_PREFIX):
        digest, _, name = text[len(UPLOAD_PREFIX) :].partition("/")
        path = uploads / digest / name
        if not path.is_file():
            raise ValueError(f"The uploaded file {name} is not in this workspace: upload it again.")
        return str(path)
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else data_folder() / path)


def step_settings(step: Step, uploads: Path) -> ExtractConfig:
    """The sidebar's settings of a step (what its view leaves out: the library's defaults)."""
    view = step.view
    defaults = ExtractConfig()
    return ExtractConfig(
        model=ModelSpec(view.get("model", defaults.model.name)),
        data=DataSpec(
            data_of(view.get("data", defaults.data.name), uploads),
            text_col=view.get("text_col") or None,
            text_pair_col=view.get("pair_col") or None,
            label_col=view.get("label_col") or None,
        ),
        sample=SampleSpec(
            n=_int(view, "n", defaults.sample.n), seed=_int(view, "seed", defaults.sample.seed)
        ),
        pooling=view.get("pooling", defaults.pooling),
        max_length=_int(view, "max_length", defaults.max_length),
    )


def heads_settings(step: Step, cfg: ExtractConfig) -> HeadStatsConfig:
    """The Heads page's statistics of a step: the sidebar with the page's own n and ξ."""
    from analysis.heads.collect import HeadStatsConfig

    view = step.view
    sample = SampleSpec(n=_int(view, "heads_n", HEADS_N), seed=cfg.sample.seed)
    return HeadStatsConfig(
        dataclasses.replace(cfg, sample=sample), xi=_float(view, "heads_xi", HEADS_XI)
    )


def claims_settings(step: Step, cfg: ExtractConfig) -> ClaimsConfig:
    """The Paper check page's settings of a step (its form's values, as the page builds them)."""
    from analysis.claims import CLAIMS, ClaimsConfig

    view, default = step.view, ClaimsConfig()
    number = {name: _int(view, f"claims_{name}", getattr(default, name))
              for name in ("steps", "repeats", "samples", "k")}  # fmt: skip
    seeds = _int(view, "claims_seeds", len(default.seeds))
    chosen = view.get("claims_only", ())
    only = [chosen] if isinstance(chosen, str) else list(chosen)
    only = [c for c in only if c.strip()] or list(CLAIMS)
    return ClaimsConfig(
        model=cfg.model, data=cfg.data, only=tuple(only), n=cfg.sample.n,
        sample_seed=cfg.sample.seed, max_length=cfg.max_length, seeds=tuple(range(seeds)),
        **number,
    )  # fmt: skip


def recommend_settings(cfg: ExtractConfig) -> RecommendConfig:
    """The Recommend page's settings of a step: the sidebar's with the page's defaults (its
    form is not in the link; they are `RecommendConfig`'s)."""
    from analysis.recommend.config import RecommendConfig

    return RecommendConfig(
        model=cfg.model, data=cfg.data, n=cfg.sample.n, sample_seed=cfg.sample.seed,
        pooling=cfg.pooling, max_length=cfg.max_length,
    )  # fmt: skip


def needs_of(step: Step, uploads: Path) -> list[Need]:
    """What the step's page computes for its view (nothing for Home, Data, Fine-tune, Runs: they
    read the data and the runs database)."""
    page, view = step.page, step.view
    if page not in ("layers", "heads", "claims", "recommend", "subspace"):
        return []
    cfg = step_settings(step, uploads)
    where = f"{cfg.model.name} × {Path(cfg.data.name).name}"
    if page == "recommend":
        return [Need("recommendation", f"recommendation (analyses and costs): {where}",
                     {"rec": recommend_settings(cfg)})]  # fmt: skip
    states = Need("states", f"hidden states: {where}, N = {cfg.sample.n:,}", {"cfg": cfg})
    if page == "layers":
        seed, repeats = cfg.sample.seed, _int(view, "layers_repeats", LAYER_REPEATS)
        layer = _int(view, "layer", -1)  # -1: the page's default, ℓ*
        method = view.get("layers_pic_method", "pca")
        out = [
            states,
            Need("layer table", f"layer metrics: {where}", {"cfg": cfg, "seed": seed}),
            Need("picture", f"{method.upper()} picture of layer "
                 + ("ℓ*" if layer < 0 else str(layer)),
                 {"cfg": cfg, "layer": layer, "method": method, "seed": seed}),
        ]  # fmt: skip
        if repeats > 1:
            out.insert(2, Need("repeats", f"{repeats} bootstrap repeats: {where}",
                               {"cfg": cfg, "seed": seed, "repeats": repeats}))  # fmt: skip
        return out
    if page == "heads":
        stats = heads_settings(step, cfg)
        example = _int(view, "example", 0)
        own = view.get("heads_own_text", "").strip()
        return [
            Need("head statistics", f"head statistics: {where}, n = {stats.extract.sample.n}",
                 {"stats": stats}),
            Need("attention", "attention pattern of " + ("your text" if own else f"example {example}"),
                 {"stats": stats, "example": example, "text": own}),
        ]  # fmt: skip
    if page == "claims":
        claims = claims_settings(step, cfg)
        return [
            Need("claim inputs", f"Paper check inputs ({', '.join(claims.only)}): {where}",
                 {"claims": claims}),
            Need("claim runs", f"fine-tuning runs of {', '.join(claims.only)}", {"claims": claims}),
        ]  # fmt: skip
    return [Need("trajectory", f"trajectory analysis: run {view.get('run', 'newest')}",
                 {"model": cfg.model.name, "run": view.get("run", ""),
                  "centre": view.get("sub_centre") == "true"})]  # fmt: skip


# -- preparing -------------------------------------------------------------------------------------

Compute = Callable[[Need, Progress], bool]  # computes a need (or finds it); True: it was cached


@dataclass
class Prepared:
    """What `prepare` did: per need, whether it was already cached, and its seconds."""

    lesson: str
    done: list[tuple[Need, bool, float]] = field(default_factory=list)
    failed: list[tuple[Need, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def computed(self) -> int:
        return sum(not hit for _, hit, _ in self.done)


def unique_needs(lesson: Lesson, uploads: Path) -> tuple[list[Need], dict[int, list[str]]]:
    """Every need of the lesson once (in step order), and the keys each step needs."""
    needs: dict[str, Need] = {}
    per_step: dict[int, list[str]] = {}
    for index, step in enumerate(lesson.steps):
        own = needs_of(step, uploads)
        per_step[index] = [n.key for n in own]
        for need in own:
            needs.setdefault(need.key, need)
    # Runs train in the background workers: queue them first, so they train while the rest
    # is computed; trajectory analyses read runs, so they come last.
    order = {"claim inputs": 0, "claim runs": 1, "trajectory": 3}
    ranked = sorted(needs.values(), key=lambda n: order.get(n.kind, 2))
    return ranked, per_step


def prepare(
    lesson: Lesson,
    store: Lessons,
    compute: Compute,
    digest: Callable[[Step], str],
    uploads: Path,
    progress: Progress | None = None,
    weights: Callable[[Need], float] | None = None,
) -> Prepared:
    """Compute every step's needs, each once; then record each fully prepared step's digest.

    progress(fraction, message) is told each need as it starts (fractions weighted by
    ``weights``, the estimate of each need's seconds). A need that fails (bad settings, a
    model that does not load) is reported and the others go on."""
    progress = progress or no_progress
    needs, per_step = unique_needs(lesson, uploads)
    weight = [max(weights(n), 0.1) if weights else 1.0 for n in needs]
    total, before = sum(weight) or 1.0, 0.0
    out = Prepared(lesson.name)
    start = time.perf_counter()
    for need, w in zip(needs, weight, strict=True):
        began = time.perf_counter()
        low, high = before / total, (before + w) / total
        message = f"{need.label}"

        def part(fraction: float, text: str = "", low=low, high=high, message=message) -> None:
            progress(low + (high - low) * min(max(fraction, 0.0), 1.0),
                     f"{message}: {text}" if text else message)  # fmt: skip

        part(0.0)
        try:
            hit = compute(need, part)
        except ValueError as exc:
            out.failed.append((need, str(exc)))
        else:
            out.done.append((need, hit, time.perf_counter() - began))
        before += w
    failed = {n.key for n, _ in out.failed}
    record = read_prepared(store, lesson.name)
    for index, step in enumerate(lesson.steps):
        if not failed & set(per_step[index]):
            try:
                record[str(index)] = {"digest": digest(step), "at": time.time()}
            except ValueError as exc:
                out.failed.append((Need("step", f"step {index + 1}"), str(exc)))
    atomic_write_json(store.prepared_file(lesson.name), record)
    out.seconds = time.perf_counter() - start
    progress(1.0, "prepared")
    return out


def read_prepared(store: Lessons, name: str) -> dict[str, Any]:
    path = store.prepared_file(name)
    if not path.is_file():
        return {}
    try:
        record = read_json(path, "prepared-lesson record")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def view_digest(step: Step, model_identity: Mapping[str, Any], data_fingerprint: str) -> str:
    """What a step's results depend on: its page and view, the model's weights, the data."""
    payload = {"page": step.page, "view": step.view, "model": dict(model_identity),
               "data": data_fingerprint}  # fmt: skip
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StepStatus:
    """Whether a step is ready for class: ``prepared``, ``not prepared``, ``changed`` (its
    inputs changed since preparing) or ``nothing to prepare``; ``why`` says what."""

    state: str
    why: str = ""

    @property
    def ready(self) -> bool:
        return self.state in ("prepared", "nothing to prepare")


def step_status(
    lesson: Lesson, index: int, store: Lessons, digest: Callable[[Step], str],
    cached: Callable[[Need], bool], uploads: Path,
) -> StepStatus:  # fmt: skip
    """Step ``index``'s status: its recorded digest against the current one, then whether every
    result it needs is still in the cache (a cleared cache unprepares it)."""
    step = lesson.steps[index]
    try:
        needs = needs_of(step, uploads)
    except ValueError as exc:
        return StepStatus("not prepared", str(exc))
    if not needs:
        return StepStatus("nothing to prepare", "this page computes nothing")
    seen = read_prepared(store, lesson.name).get(str(index))
    try:
        now = digest(step)
    except ValueError as exc:
        return StepStatus("not prepared", str(exc))
    if seen is None:
        return StepStatus("not prepared", "never prepared")
    if seen.get("digest") != now:
        return StepStatus(
            "changed", "its inputs changed since preparing (the view, the model's weights or the "
            "data): it will compute, unless prepared again"
        )  # fmt: skip
    missing = [n.label for n in needs if not cached(n)]
    if missing:
        return StepStatus("not prepared", "missing from the cache: " + "; ".join(missing))
    return StepStatus("prepared", "every result it shows is in the cache")


def statuses(lesson: Lesson, *args: Any) -> list[StepStatus]:
    return [step_status(lesson, i, *args) for i in range(len(lesson.steps))]


# -- the estimate ----------------------------------------------------------------------------------

# A recommendation times about this many choices beside full fine-tuning, each step about three
# forward passes (forward, then backward at about twice its cost).
TIMED_CHOICES = 10


@dataclass(frozen=True)
class Sizes:
    """What one need's work is counted from (`analysis.rates`): the model's parameters, layers
    and width, the tokens of one example of its data, and where the cache's rates are."""

    n_params: int
    n_layers: int
    d_model: int
    tokens_per_example: float
    root: Path
    device: str


def estimate_seconds(need: Need, z: Sizes) -> float | None:
    """One need's seconds on this machine from the rates its cache holds (`analysis.rates`):
    None when a part of it has no rate measured here yet."""
    s = need.settings
    per_example = (z.n_layers + 1) * z.d_model  # one example's states, every layer

    def rate(kind: str, work: float, device: str = "cpu") -> float | None:
        found = estimate(kind, work, z.root, device)  # the layer analyses run on the CPU
        return None if found is None else found.seconds

    def forward(kind: str, n: float) -> float | None:
        return rate(kind, forward_work(n * z.tokens_per_example, z.n_params), z.device)

    def analyses(n: int, repeats: int) -> float | None:
        parts = [forward("states", n), rate("layer_metrics", n * per_example)]
        if repeats:
            parts.append(rate("layer_repeats", repeats * n * per_example))
        return None if None in parts else sum(parts)

    if need.kind == "states":
        return forward("states", s["cfg"].sample.n)
    if need.kind == "layer table":
        return rate("layer_metrics", s["cfg"].sample.n * per_example)
    if need.kind == "repeats":
        return rate("layer_repeats", s["repeats"] * s["cfg"].sample.n * per_example)
    if need.kind == "picture":
        return 15.0 if s["method"] == "umap" else 0.5
    if need.kind == "head statistics":
        return forward("heads", s["stats"].extract.sample.n)
    if need.kind == "claim inputs":
        c = s["claims"]
        one = analyses(c.n, c.repeats)
        return None if one is None else c.samples * one
    if need.kind == "recommendation":
        r = s["rec"]
        parts = [analyses(r.n, r.repeats), forward("heads", r.heads_n),
                 forward("states", TIMED_CHOICES * 2 * (r.timed_steps + 1) * 3 * r.batch_size)]  # fmt: skip
        return None if None in parts else sum(parts)
    return 1.0


def describe_estimate(estimates: list[float | None]) -> str:
    """The needs' estimates (`estimate_seconds`) in words: their sum, and how many of them have
    no rate measured here yet (each says its time once it starts)."""
    known = [e for e in estimates if e is not None]
    words = f"about {duration(sum(known))}" if known else "a time not known yet"
    unknown = len(estimates) - len(known)
    if unknown and known:
        words = f"at least {words[6:]}"
    if unknown:
        words += (f" ({unknown} of the results {'has' if unknown == 1 else 'have'} no rate "
                  "measured on this machine yet: each says its time once it starts)")  # fmt: skip
    return words
