"""Whether a lesson's need is in the cache now, found without computing anything: the entry each
need's page call would write, looked up by its recipe (`analysis.lessons.library.LibraryRunner`
asks; its loaders give the model, the data and the states)."""

from __future__ import annotations

from typing import Any

from analysis.lessons.prepare import Need


class CacheLookup:
    """``cached(need)`` for one runner (its model, data and states loaders, its runs)."""

    def __init__(self, runner: Any) -> None:  # the LibraryRunner that asks (no import back up)
        self.runner = runner

    def cached(self, need: Need) -> bool:
        """Whether ``need`` is in the cache now (nothing is computed to find out). The claims'
        inputs have no single entry to look for: they count as there once their runs were
        planned with them."""
        from analysis.cache import DiskCache
        from analysis.extract import states_cached

        s = need.settings
        if need.kind == "states":
            return states_cached(s["cfg"], self.runner.model(s["cfg"].model))
        if need.kind in ("layer table", "repeats", "picture"):
            if not states_cached(s["cfg"], self.runner.model(s["cfg"].model)):
                return False
            return self._entry(need, self.runner.states(s["cfg"]))
        if need.kind == "head statistics":
            from analysis.heads.collect import head_stats_recipe

            stats = s["stats"]
            recipe = head_stats_recipe(stats, self.runner.model(stats.extract.model),
                                       self.runner.data(stats.extract.data).fingerprint)  # fmt: skip
            return DiskCache().entry_dir("heads", recipe).is_dir()
        if need.kind == "attention":
            loaded = self.runner.model(s["stats"].extract.model)
            text, pair = self.runner.attention_text(s)
            recipe = {"model": loaded.identity(), "text": text, "text_pair": pair,
                      "max_length": int(s["stats"].extract.max_length), "version": 1}  # fmt: skip
            return DiskCache().entry_dir("attention", recipe).is_dir()
        if need.kind == "claim inputs":
            return self.runner.runs.planned(s["claims"])  # (computed when the runs were planned)
        if need.kind == "claim runs":
            return self.runner.runs.claim_runs_done(s["claims"])
        if need.kind == "recommendation":
            return self.recommendation_cached(s["rec"])
        if need.kind == "trajectory":
            return self.trajectory_cached(s)
        return True

    def recommendation_cached(self, rec) -> bool:
        """Whether a recommendation's analyses and costs are in the cache: its states, layer
        table, repeats, head statistics and weight SNR, and full fine-tuning's measured cost
        (every choice's cost is written with it)."""
        from analysis.cache import DiskCache
        from analysis.heads.collect import HeadStatsConfig
        from analysis.recommend.budget import reference_cached
        from analysis.recommend.evidence import SNR_KIND, snr_recipe

        table = {"cfg": rec.extract_config(), "seed": rec.sample_seed}
        stats = HeadStatsConfig(rec.extract_config(n=rec.heads_n), xi=rec.xi)
        needs = [Need("states", "", {"cfg": table["cfg"]}), Need("layer table", "", table),
                 Need("head statistics", "", {"stats": stats})]  # fmt: skip
        if rec.repeats > 1:
            needs.append(Need("repeats", "", {**table, "repeats": rec.repeats}))
        loaded, data = self.runner.model(rec.model), self.runner.data(rec.data)
        snr = DiskCache().entry_dir(SNR_KIND, snr_recipe(loaded)).is_dir()
        return all(self.cached(n) for n in needs) and snr and reference_cached(rec, loaded, data)

    def _entry(self, need: Need, states) -> bool:
        from analysis.cache import DiskCache
        from analysis.layers.metrics import DEFAULT_BINS
        from analysis.layers.projection import projection_recipe
        from analysis.layers.repeats import repeats_recipe
        from analysis.layers.table import metrics_recipe

        s, cache = need.settings, DiskCache()
        if need.kind == "layer table":
            return cache.entry_dir(
                "layer_metrics", metrics_recipe(states, s["seed"], DEFAULT_BINS)
            ).is_dir()
        if need.kind == "repeats":
            recipe = repeats_recipe(states, s["seed"], s["repeats"], DEFAULT_BINS)
            return cache.entry_dir("layer_repeats", recipe).is_dir()
        table = {**s, "layer": -1}
        if s["layer"] < 0 and not self._entry(Need("layer table", "", table), states):
            return False
        recipe = projection_recipe(states, self.runner.picture_layer(s), s["method"], s["seed"])
        return cache.entry_dir("projection", recipe).is_dir()

    def trajectory_cached(self, s) -> bool:
        from analysis.cache import DiskCache
        from analysis.subspace.spectrum import svd_recipe
        from analysis.subspace.trajectory import open_trajectory

        run = self.runner.trajectory_run(s)
        if run is None:
            return False
        traj = open_trajectory(self.runner.runs.db().trajectory_dir(run))
        cache = DiskCache()
        return all(
            cache.entry_dir("subspace-svd", svd_recipe(traj, layer, s["centre"])).is_dir()
            for layer in traj.layers
        )
