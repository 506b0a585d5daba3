"""Preparing a lesson with the library itself (`tunescope lesson prepare`, the server's
background preparation): each need computed by the function its page calls underneath, so the
page then finds the very cache entry (`analysis.lessons.prepare`)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.config import DataSpec, ModelSpec
from analysis.lessons.lesson import Step
from analysis.lessons.lookup import CacheLookup
from analysis.lessons.prepare import (
    Need,
    Sizes,
    estimate_seconds,
    step_settings,
    view_digest,
)
from analysis.lessons.runs import LessonRuns
from analysis.progress import Progress, no_progress
from analysis.workspace import Workspace

# Every kind of need but the fine-tuning runs and the trajectory analysis that reads one: what
# set-up or a server's first start prepares (runs take hours of CPU nobody asked for).
ANALYSES = ("states", "layer table", "repeats", "picture", "head statistics", "attention",
            "claim inputs", "recommendation")  # fmt: skip


class LibraryRunner:
    """``compute``, ``cached``, ``digest`` and ``weight`` of `analysis.lessons.prepare`, on one
    workspace, loading each model and data set once.

    wait_runs, poll_s, say: how the claims' fine-tuning runs are queued and waited for
    (`analysis.lessons.runs.LessonRuns`: ``runs``); kinds: the kinds of needs it computes (None:
    all; `ANALYSES`: everything but fine-tuning runs and what reads them) — of the others it only
    says whether they are cached."""

    def __init__(
        self, workspace: Workspace, wait_runs: bool = True, poll_s: float = 10.0,
        say: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
        load_model: Callable[[ModelSpec], Any] | None = None,
        load_data: Callable[[DataSpec], Any] | None = None,
        kinds: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        from analysis.data import load_data as library_data
        from analysis.models import load_model as library_model

        self.workspace = workspace
        self.runs = LessonRuns(workspace, wait_runs, poll_s, say)
        self.model = load_model or functools.lru_cache(maxsize=2)(library_model)
        self.data = load_data or functools.lru_cache(maxsize=4)(library_data)
        self._inputs: dict[str, Any] = {}
        self.kinds = kinds
        self.lookup = CacheLookup(self)

    @property
    def uploads(self) -> Path:
        return self.workspace.uploads

    def digest(self, step: Step) -> str:
        cfg = step_settings(step, self.uploads)
        return view_digest(step, self.model(cfg.model).identity(), self.data(cfg.data).fingerprint)

    def cached(self, need: Need) -> bool:
        """Whether ``need`` is in the cache now (`CacheLookup.cached`)."""
        return self.lookup.cached(need)

    def estimate(self, need: Need) -> float | None:
        """``need``'s seconds on this machine (`analysis.lessons.prepare.estimate_seconds`), None
        while a part of it has no rate measured here."""
        found = self._inputs_of(need)
        if found is None:
            return 1.0
        loaded = self.model(found[0])
        return estimate_seconds(need, Sizes(
            loaded.n_params, loaded.n_layers, loaded.d_model, self._tokens(*found),
            self.workspace.root, str(loaded.device),
        ))  # fmt: skip

    def weight(self, need: Need) -> float:
        """``need``'s share of the progress bar: its estimate, one second while it has none."""
        seconds = self.estimate(need)
        return 1.0 if seconds is None else seconds

    @functools.lru_cache(maxsize=8)  # noqa: B019  (one runner per preparation)
    def _tokens(self, model: ModelSpec, data: DataSpec, max_length: int) -> float:
        """Mean tokens the model reads of one example of ``data`` (of up to 200 of them)."""
        from analysis.extract import tokens_of

        rows = self.data(data).parts["train"].iloc[:200]
        return tokens_of(self.model(model), rows, max_length) / max(1, len(rows))

    @staticmethod
    def _inputs_of(need: Need) -> tuple[ModelSpec, DataSpec, int] | None:
        s = need.settings
        for cfg in (s.get("cfg"), getattr(s.get("stats"), "extract", None), s.get("claims"),
                    s.get("rec")):  # fmt: skip
            if cfg is not None:
                return cfg.model, cfg.data, cfg.max_length
        return None

    # -- computing -------------------------------------------------------------------------------

    def compute(self, need: Need, progress: Progress = no_progress) -> bool:
        """Compute ``need`` into the cache (or find it there); True when it was already cached.
        A need of a kind this runner leaves alone: whether it is cached, nothing computed."""
        if self.kinds is not None and need.kind not in self.kinds:
            return self.cached(need)
        return getattr(self, "_" + need.kind.replace(" ", "_"))(need.settings, progress)

    def states(self, cfg):
        from analysis.extract import extract_states

        return extract_states(cfg, loaded=self.model(cfg.model))

    def _states(self, s, progress) -> bool:
        from analysis.extract import extract_states

        states = extract_states(s["cfg"], progress=progress, loaded=self.model(s["cfg"].model))
        return bool(states.meta["cache_hit"])

    def _table(self, s, progress=None):
        from analysis.layers.metrics import DEFAULT_BINS
        from analysis.layers.table import cached_layer_metrics

        states = self.states(s["cfg"])
        return states, cached_layer_metrics(states, s["seed"], DEFAULT_BINS, progress=progress)

    def _layer_table(self, s, progress) -> bool:
        return self._table(s, progress)[1][1]

    def _repeats(self, s, progress) -> bool:
        from analysis.layers.metrics import DEFAULT_BINS
        from analysis.layers.repeats import cached_layer_repeats

        states = self.states(s["cfg"])
        _, hit = cached_layer_repeats(
            states, s["seed"], s["repeats"], DEFAULT_BINS, progress=progress
        )
        return hit

    def picture_layer(self, s) -> int:
        """The picture's layer: the view's, else ℓ* (the page's default), else the top layer."""
        from analysis.layers.table import summary

        if s["layer"] >= 0:
            return s["layer"]
        states, (df, _) = self._table(s)
        l_star = summary(df)["l_star"]
        return states.n_layers if l_star is None else int(l_star)

    def _picture(self, s, progress) -> bool:
        from analysis.layers.projection import cached_projection

        states = self.states(s["cfg"])
        _, hit = cached_projection(states, self.picture_layer(s), s["method"], s["seed"])
        return hit

    def _head_statistics(self, s, progress) -> bool:
        from analysis.heads.collect import head_stats

        stats = s["stats"]
        _, meta = head_stats(stats, progress=progress, loaded=self.model(stats.extract.model))
        return bool(meta["cache_hit"])

    def attention_text(self, s) -> tuple[str, str | None]:
        """The text the step's attention view shows: the typed one, else its example's."""
        from analysis.data import sample

        if s["text"]:
            return s["text"], None
        extract = s["stats"].extract
        rows = sample(self.data(extract.data), extract.sample).reset_index(drop=True)
        if not 0 <= s["example"] < len(rows):
            raise ValueError(f"Example {s['example']} is not within 0..{len(rows) - 1}.")
        row = rows.loc[s["example"]]
        return str(row["text"]), (str(row["text_pair"]) if "text_pair" in rows else None)

    def _attention(self, s, progress) -> bool:
        from analysis.heads.attention import cached_attention_pattern

        extract = s["stats"].extract
        text, pair = self.attention_text(s)
        _, hit = cached_attention_pattern(self.model(extract.model), text, pair, extract.max_length)
        return hit

    def _claim_inputs(self, s, progress) -> bool:
        self.claim_inputs(s["claims"], progress)
        return False  # the claims' own entries say nothing of hits: counted as computed

    def claim_inputs(self, cfg, progress: Progress = no_progress):
        from analysis import claims

        key = repr(cfg)
        if key not in self._inputs:
            self._inputs[key] = claims.prepare(cfg, self.model(cfg.model), progress=progress)
        return self._inputs[key]

    def _recommendation(self, s, progress) -> bool:
        from analysis.recommend.recommendation import recommend

        hit = self.lookup.recommendation_cached(s["rec"])
        recommend(s["rec"], self.model(s["rec"].model), progress=progress)
        return hit

    def _claim_runs(self, s, progress) -> bool:
        return self.runs.claim_runs(s["claims"], self.claim_inputs(s["claims"]), progress)

    def trajectory_run(self, s) -> str | None:
        """The run the step's Subspaces view shows (`LessonRuns.trajectory_run`)."""
        return self.runs.trajectory_run(s["model"], s["run"])

    def _trajectory(self, s, progress) -> bool:
        from analysis.subspace.report import analyse_trajectory

        hit = self.lookup.trajectory_cached(s)
        run = self.trajectory_run(s)
        if run is None:
            raise ValueError(
                f"No finished run of {s['model']} recorded a trajectory: the Subspaces step "
                "needs one (a Paper check step with S1 trains it)."
            )
        analyse_trajectory(self.runs.db().trajectory_dir(run), centre=s["centre"],
                           progress=progress)  # fmt: skip
        return hit
