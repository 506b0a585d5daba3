"""The Layers page's what-ifs: pooling, imbalance, scarcity and seeds (SPEC.md, "Robustness what-ifs").

Each setting is another sample (or pooling) of the same data: its own extraction, disk-cached,
then the same cached metrics. Results stay in the session until the sidebar settings change.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import POOLINGS, ExtractConfig, SampleSpec, to_dict
from analysis.layers.whatif import compare_settings, seed_band
from ui.figures import layers as figures
from ui.layers.state import get_layer_metrics
from ui.loaders import get_states

SHARES = (0.5, 0.25, 0.1, 0.05)
GROUP_TITLES = {
    "pooling": "Pooling: mean of the tokens vs the first token",
    "imbalance": "Imbalance: share p of the first class, N fixed",
    "scarcity": "Scarcity: label-balanced samples of growing N",
    "seeds": "Seeds: other random samples of the same size",
}


def parse_ladder(text: str) -> list[int]:
    """'200, 500, 1000' → [200, 500, 1000] (sorted, unique); a clear ValueError otherwise."""
    try:
        values = sorted({int(part) for part in text.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        raise ValueError(
            f"The N ladder must be whole numbers separated by commas (got {text!r})."
        ) from None
    if any(v < 10 for v in values):
        raise ValueError("Every N of the ladder must be at least 10 examples.")
    return values


def plan(
    cfg: ExtractConfig, pooling: bool, shares: list[float], ladder: list[int], n_seeds: int,
    classification: bool,
) -> dict[str, dict[str, ExtractConfig]]:  # fmt: skip
    """The extractions each chosen what-if needs: group → setting name → config."""
    groups: dict[str, dict[str, ExtractConfig]] = {}
    sample = cfg.sample
    if pooling:
        groups["pooling"] = {p: dataclasses.replace(cfg, pooling=p) for p in POOLINGS}
    if shares and classification:
        groups["imbalance"] = {
            f"p = {p}": dataclasses.replace(
                cfg, sample=SampleSpec(sample.n, sample.seed, sample.part, "share", p)
            )
            for p in shares
        }
    if ladder:
        scheme = "balanced" if classification else "random"
        groups["scarcity"] = {
            f"N = {n}": dataclasses.replace(
                cfg, sample=SampleSpec(n, sample.seed, sample.part, scheme)
            )
            for n in ladder
        }
    if n_seeds > 1:
        groups["seeds"] = {
            f"seed {s}": dataclasses.replace(cfg, sample=dataclasses.replace(sample, seed=s))
            for s in range(sample.seed, sample.seed + n_seeds)
        }
    return groups


def form(cfg: ExtractConfig, classification: bool) -> dict[str, dict[str, ExtractConfig]] | None:
    """Draw the what-if form; the plan when it was submitted with valid values, else None."""
    with st.form("layers_whatif_form"):
        c1, c2 = st.columns(2)
        pooling = c1.checkbox("pooling: mean vs first token", value=True, key="whatif_pooling")
        shares = c1.multiselect(
            "imbalance: share p of the first class", SHARES, default=list(SHARES),
            key="whatif_shares", disabled=not classification,
            help="Needs classes; the sample keeps N and takes share p from the first class.",
        )  # fmt: skip
        ladder_text = c2.text_input(
            "scarcity: N ladder (label-balanced)", "200, 500", key="whatif_ladder"
        )
        n_seeds = c2.number_input("seeds (1 = off)", 1, 10, 3, key="whatif_seeds")
        submitted = st.form_submit_button("Run what-ifs", type="primary")
    if not submitted:
        return None
    try:
        ladder = parse_ladder(ladder_text)
    except ValueError as exc:
        st.error(str(exc))
        return None
    return plan(cfg, pooling, list(shares), ladder, int(n_seeds), classification)


def run(groups: dict[str, dict[str, ExtractConfig]], n_bins: int) -> dict[str, Any]:
    """Extract and measure every setting (progress shown); group → curves, table, failures."""
    total = sum(len(g) for g in groups.values()) or 1
    overall = st.progress(0.0, text="What-ifs")
    results: dict[str, Any] = {}
    done = 0
    for group, settings in groups.items():
        frames, failed = {}, {}
        for name, cfg in settings.items():
            overall.progress(
                done / total, text=f"What-ifs: {group}, {name} ({done + 1} of {total})"
            )
            try:
                states = get_states(cfg, label=f"{group}, {name}: hidden states")
                frames[name], _ = get_layer_metrics(
                    states, cfg.sample.seed, n_bins, f"{group}, {name}: metrics"
                )
            except ValueError as exc:  # an infeasible sample (too few examples of a class…)
                failed[name] = str(exc)
            done += 1
        results[group] = {"frames": frames, "failed": failed}
        if frames:
            results[group]["curves"], results[group]["table"] = compare_settings(frames)
    overall.empty()
    return results


def show(results: dict[str, Any]) -> None:
    """Overlaid curves, ζ and |ρ| per setting, and downloads, one block per what-if."""
    for group, result in results.items():
        st.markdown(f"##### {GROUP_TITLES[group]}")
        for name, message in result["failed"].items():
            st.warning(f"{name}: {message}")
        if "curves" not in result:
            continue
        curves, table = result["curves"], result["table"]
        if group == "seeds":
            left, right = st.columns(2)
            left.plotly_chart(
                figures.band_figure(curves, seed_band(curves, "nu"), "nu"), width="stretch"
            )
            right.plotly_chart(
                figures.band_figure(curves, seed_band(curves, "probe"), "probe"), width="stretch"
            )
        else:
            st.plotly_chart(figures.whatif_figure(curves, "nu", "ν per layer"), width="stretch")
        st.plotly_chart(figures.whatif_bars(table), width="stretch")
        st.dataframe(table, hide_index=True, width="stretch")
        payload = {"curves": curves.to_dict("records"), "table": table.to_dict("records")}
        st.download_button(
            f"{group} what-if (JSON)", json.dumps(payload, default=float),
            f"layers_whatif_{group}.json", "application/json", key=f"whatif_dl_{group}",
        )  # fmt: skip


def whatif_view(cfg: ExtractConfig, classification: bool, n_bins: int) -> None:
    """Form → runs → results, kept in the session for the current sidebar settings."""
    key = canonical_json(to_dict(cfg))
    groups = form(cfg, classification)
    if groups:
        st.session_state["layers_whatif"] = {"key": key, "results": run(groups, n_bins)}
    saved = st.session_state.get("layers_whatif")
    if saved and saved["key"] == key:
        show(saved["results"])
    elif saved:
        st.caption("The sidebar settings changed since the last what-ifs: run them again.")
