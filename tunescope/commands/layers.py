"""``layers``: ν, CCA, rank ϱ and probe score of every layer; ℓ*, ζ and ρ (paper 000); how sure
ℓ* is, and the layer strategies it suggests."""

from __future__ import annotations

import argparse
from typing import Any

from tunescope.commands.options import (
    TqdmProgress,
    add_common,
    extract_config_from_args,
    write_json,
)

NAME = "layers"
HELP = "per-layer task-specialty ν, CCA, rank ϱ and linear probes; the best layer ℓ*"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--bins",
        type=int,
        default=2,
        help="regression tasks: quantile bins of the scores used as classes for ν, CCA and ϱ",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="R stratified bootstrap resamples of the N states: adds bootstrap s.e. per layer, "
        "and with R ≥ 50 90 %% BCa intervals around every value, ρ, |ρ| and ζ; ℓ* as counts of "
        "repeats (1: the single table only)",
    )
    parser.add_argument("--json", default=None, help="write the results as JSON ('-': stdout)")


def table(result: dict[str, Any]) -> str:
    """A readable table of the layers, ℓ* starred; with repeats, each value ± its bootstrap s.e."""
    repeats = "repeats" in result
    width = (19, 15, 15, 15) if repeats else (11, 7, 8, 7)
    names = ("nu", "cca", "rank", "probe")
    lines = [f"{'layer':>5} " + " ".join(f"{m:>{w}}" for m, w in zip(names, width, strict=True))]
    for row in result["layers"]:
        cells = [
            _cell(row.get(m), row.get(f"{m}_se"), fmt)
            for m, fmt in zip(names, ("{:.4g}", "{:.3f}", "{:.2f}", "{:.3f}"), strict=True)
        ]
        star = "  ← ℓ*" if row["layer"] == result["l_star"] else ""
        lines.append(
            f"{row['layer']:>5} "
            + " ".join(f"{c:>{w}}" for c, w in zip(cells, width, strict=True))
            + star
        )
    return "\n".join(lines)


STRATEGY_FAMILIES = {"l_star_down": "ℓ*-down", "l_star_up": "ℓ*-up", "baselines": "baselines"}


def how_sure(summ: Any | None, repeats: int) -> str:
    """How far ℓ* can be trusted: counts over bootstrap repeats, or — from one sample — a note
    that there are none and how to get them (docs/explanation/statistics.md, 'Repeats and bootstrap intervals')."""
    if summ is None:
        return (
            "How sure: ℓ* is from one sample, unrepeated: nothing says how often another sample "
            "would choose another layer. --repeats 50 counts ℓ* over 50 bootstrap resamples "
            "(and adds 90 % intervals)."
        )
    verdict = "stable" if summ.stable else "not stable: weigh the strategies of the other layers"
    return f"How sure: {summ.l_star_sentence()} — {verdict} (R = {repeats})."


def suggestions(result: dict[str, Any]) -> str:
    """The layer strategies ℓ* suggests (the JSON's ``strategies``: (ℓ_bottom, ℓ_top, ℓ_cls)
    triples, docs/explanation/strategies.md), one family a line, and the command that trains
    them."""
    if not result.get("strategies"):
        return "No strategy to suggest: ℓ* is undefined (ν is not finite on any layer 1..L)."
    l_star = result["l_star"]
    l_star = l_star["estimate"] if isinstance(l_star, dict) else l_star
    lines = [f"Suggested strategies (ℓ_bottom, ℓ_top, ℓ_cls) for ℓ* = {l_star}:"]
    for key, family in STRATEGY_FAMILIES.items():
        triples = result["strategies"].get(key) or []
        shown = "  ".join(f"({b}, {t}, {h})" for b, t, h in triples) or "none (ℓ* is the top layer)"
        lines.append(f"  {family:<10} {shown}")
    lines.append(
        f"Train and compare them: sweep --l-star {l_star} --strategies down,up,baselines "
        "(with this command's --model and --data; 3 seeds each)."
    )
    return "\n".join(lines)


def _cell(value: float | None, se: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value) + ("" if se is None else " ± " + fmt.format(se))


def run(args: argparse.Namespace) -> int:
    from analysis.extract import extract_states
    from analysis.layers.repeats import add_repeats, cached_layer_repeats, summarise_repeats
    from analysis.layers.table import cached_layer_metrics, report

    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1 (got {args.repeats}).")
    cfg = extract_config_from_args(args)
    bar = TqdmProgress("hidden states")
    try:
        states = extract_states(cfg, progress=bar)
    finally:
        bar.close()
    bar = TqdmProgress("layer metrics")
    try:
        df, hit = cached_layer_metrics(states, seed=cfg.sample.seed, n_bins=args.bins, progress=bar)
    finally:
        bar.close()
    result = report(cfg, df, hit)
    summ = None
    if args.repeats > 1:
        bar = TqdmProgress(f"{args.repeats} repeats")
        try:
            rep, _ = cached_layer_repeats(
                states, seed=cfg.sample.seed, repeats=args.repeats, n_bins=args.bins, progress=bar
            )
        finally:
            bar.close()
        result = add_repeats(result, rep)
        summ = summarise_repeats(rep)
    write_json(args.json, result)
    if args.json != "-":
        source = "served from the cache" if hit else f"computed in {result['seconds']:.1f} s"
        print(
            f"{cfg.model.name} on {cfg.data.name}: n = {cfg.sample.n}, pooling {cfg.pooling}, "
            f"probe metric {result['metric']}; metrics {source}"
        )
        if result["label_note"]:
            print(result["label_note"])
        print(table(result))
        if summ is None:
            rho = ", ".join(
                f"{k} {'-' if v is None else f'{v:+.3f}'}" for k, v in result["rho"].items()
            )
            zeta = "-" if result["zeta"] is None else f"{result['zeta']:.3g}"
            print(
                f"ℓ* = {result['l_star']} (lowest ν over layers 1..{result['n_layers']}); ζ = {zeta}"
            )
            print(f"ρ(metric, probe) across layers: {rho}")
        else:
            # no bare ζ, ρ or ℓ* once repeats ran: each with its interval (or s.e.), ℓ* as counts
            print(
                f"ℓ* = {summ.l_star} (lowest ν over layers 1..{result['n_layers']}; "
                f"{summ.l_star_sentence()}{'' if summ.stable else ', not stable'}); "
                f"ζ = {summ.zeta.text(3, signed=False)}"
            )
            print("ρ(metric, probe) across layers: " + "; ".join(
                f"{m} {e.text(3)}" for m, e in summ.rho.items()
            ))  # fmt: skip
            print(
                f"(full-sample values with 90 % bootstrap intervals from R = {args.repeats} "
                "repeats; ± in the table = bootstrap s.e.; intervals need R ≥ 50)"
            )
        print(how_sure(summ, args.repeats))
        print(suggestions(result))
        if args.json:
            print(f"JSON written to {args.json}")
    return 0
