"""The Layers page's what-ifs: pooling, imbalance, scarcity and seeds
(docs/explanation/layer-metrics.md, "Robustness what-ifs").

Each setting is another sample (or pooling) of the same data: its own extraction, disk-cached,
then the same cached metrics. Results stay in the session until the sidebar settings change.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from analysis.cache import canonical_json
from analysis.config import POOLINGS, ExtractConfig, SampleSpec, to_dict
from analysis.layers.metrics import is_flat
from analysis.layers.whatif import compare_settings, seed_band
from ui.figures import layers as figures
from ui.layers.state import get_layer_metrics
from ui.links import BIND
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
        pooling = c1.checkbox(
            "pooling: mean vs first token", value=True, key="whatif_pooling", bind=BIND
        )
        shares = c1.multiselect(
            "imbalance: share p of the first class", SHARES, default=list(SHARES),
            key="whatif_shares", disabled=not classification, bind=BIND,
            help="Needs classes; the sample keeps N and takes share p from the first class.",
        )  # fmt: skip
        ladder_text = c2.text_input(
            "scarcity: N ladder (label-balanced)", "200, 500", key="whatif_ladder", bind=BIND
        )
        n_seeds = c2.number_input("seeds (1 = off)", 1, 10, 3, key="whatif_seeds", bind=BIND)
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


AGREES = -0.85  # the paper's ρ(ν, s) on its tasks: ν tracks the probe at or below it


def rho_text(value: float | None, probe_curve: np.ndarray) -> str:
    """ρ(ν, s) of one setting as a reader takes it: a number, or why it is undefined."""
    if value is not None and math.isfinite(value):
        return f"{value:+.2f}"
    curve = np.asarray(probe_curve, dtype=float)
    if curve.size and np.isfinite(curve).all() and is_flat(curve):
        return "undefined (flat probe curve)"
    return "undefined"


def readable(curves: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The what-if table with labelled columns and ρ as text (undefined said as such)."""
    rows = []
    for record in table.to_dict("records"):
        probe = curves.loc[(curves["setting"] == record["setting"]) & (curves["layer"] >= 1)]
        rows.append(
            {
                "setting": record["setting"],
                "N": record["n"],
                "ℓ*": record["l_star"],
                "ζ (smoothness of ν)": record["zeta"],
                "ρ(ν, s)": rho_text(record["rho"], probe["probe"].to_numpy()),
            }
        )
    return pd.DataFrame(rows)


def conclusion(group: str, table: pd.DataFrame) -> str:
    """What to conclude from one what-if: whether ℓ* holds across its settings, and whether ν
    tracks the probe in them (ρ(ν, s) ≤ −0.85, as in the paper)."""
    l_stars = [int(v) for v in table["l_star"] if v is not None and not pd.isna(v)]
    rhos = [float(v) for v in table["rho"] if v is not None and math.isfinite(float(v))]
    parts = []
    if not l_stars:
        parts.append("No setting has an ℓ*.")
    elif len(set(l_stars)) == 1:
        parts.append(f"ℓ* = {l_stars[0]} in every setting: it does not hinge on this choice.")
    else:
        parts.append(
            f"ℓ* moves between settings ({', '.join(str(v) for v in l_stars)}): on this data it "
            f"depends on the {group}, so treat it as a hint."
        )
    undefined = len(table) - len(rhos)
    agree = sum(r <= AGREES for r in rhos)
    if rhos:
        parts.append(
            f"ν tracks the probe (ρ ≤ {AGREES}) in {agree} of {len(table)} settings"
            + (f"; ρ is undefined in {undefined} (nothing to correlate)" if undefined else "")
            + "."
        )
    else:
        parts.append(
            "ρ(ν, s) is undefined in every setting (a flat probe curve): the probe does not "
            "tell the layers apart here, so these settings cannot confirm or refute ν."
        )
    advice = {
        "pooling": "The paper found mean pooling's ν curve smoother (lower ζ) than the first "
        "token's: prefer the pooling with the lower ζ and a defined ρ.",
        "imbalance": "If ℓ* or ρ changes as p falls, rebalance the sample (or weight the "
        "classes) before trusting ℓ* on imbalanced data.",
        "scarcity": "If ℓ* still changes between the largest N, more examples are needed "
        "before it settles (the paper: thousands).",
        "seeds": "Settings that differ only in the random sample: any change of ℓ* is "
        "sampling noise, so ℓ* is only as firm as its agreement across seeds.",
    }[group]
    if group == "pooling" and table["zeta"].notna().all() and len(table) > 1:
        smoother = str(table.loc[table["zeta"].idxmin(), "setting"])
        advice = f"The {smoother} pooling gives the smoother ν curve (lower ζ). " + advice
    if group == "scarcity" and len(l_stars) >= 2:
        settled = l_stars[-1] == l_stars[-2]
        advice = (
            "ℓ* is the same at the two largest N: it has settled. "
            if settled
            else "ℓ* differs between the two largest N: it has not settled yet. "
        ) + advice
    return " ".join(parts) + " " + advice


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
        st.dataframe(readable(curves, table), hide_index=True, width="stretch")
        st.markdown(f"**What to conclude.** {conclusion(group, table)}".replace("ℓ*", "ℓ\\*"))
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
