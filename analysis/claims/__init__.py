"""The papers' claims, re-measured on the current model and data (docs/explanation/claims.md).

Each claim is a recipe: what it needs (layer-metric repeats, or fine-tuning runs over seeds), a
verdict rule, and the paper's own figure. Verdicts: **holds**, **holds weakly** (X1 only),
**does not hold**, **inconclusive** (the interval covers both), **unstable** (samples disagree)
or **not measured yet** while runs are missing — never a bare number.

| id | measured as                                              | needs                       | module      |
|----|----------------------------------------------------------|-----------------------------|-------------|
| X1 | ρ(ν, s) over R bootstrap repeats (mean, 5th–95th %)      | repeats, mean pooling       | `layers`    |
| X2 | ℓ*'s share of repeats                                    | repeats, mean pooling       | `layers`    |
| X3 | ζ(first) > ζ(mean) on the same resamples                 | repeats, both poolings      | `layers`    |
| X4 | (1, ℓ*, ℓ*) vs (1, L, L), step time                      | runs × seeds                | `layers`    |
| H1 | top-k PageRank heads vs k random heads per layer         | head statistics, runs       | `heads`     |
| H2 | PageRank vs top-k I_h vs top-k total correlation         | head statistics, runs       | `heads`     |
| S1 | intrinsic subspace vs full vs random subspace            | a trajectory run, then runs | `subspace`  |
| S2 | full with outliers zeroed vs as many random weights      | a trajectory run, then runs | `subspace`  |

What the families share: the papers and the claims' texts (`papers`), the settings and the
measured inputs (`config`), a claim's result, table and JSON (`result`), the planned runs, their
reuse and queueing (`runs`); `evaluate` puts them together. Random arms draw anew for every
training seed, so their spread includes the draw. Comparisons use `analysis.compare.compare`
(diff of mean test scores, se = √(se_A² + se_B²), "A better" when |diff| > t · se, t at 97.5 %
with Welch degrees of freedom).

The names below are the claims' public face: ``from analysis.claims import evaluate`` or
``from analysis import claims; claims.evaluate(…)``.
"""

from analysis.claims.config import ClaimInputs, ClaimsConfig, SampleInputs
from analysis.claims.evaluate import evaluate, plan_runs, prepare, run_claims
from analysis.claims.heads import HEAD_SELECTORS, head_selections, heads_comparisons
from analysis.claims.layers import (
    CLAIM_METRICS,
    combine_samples,
    layer_claims,
    layer_claims_estimate,
    layer_samples,
)
from analysis.claims.papers import (
    CLAIMS,
    LAYER_CLAIMS,
    PAPERS,
    RUN_CLAIMS,
    ClaimInfo,
    Paper,
    parse_only,
)
from analysis.claims.result import (
    MIN_SEEDS,
    VERDICTS,
    ClaimResult,
    claims_json,
    claims_table,
    ours_text,
)
from analysis.claims.runs import (
    PlannedRun,
    estimate_seconds,
    missing_runs,
    queue_runs,
    run_status,
)
from analysis.claims.subspace import outlier_file, random_file, source_run, write_disable_files

__all__ = [
    "CLAIMS", "CLAIM_METRICS", "HEAD_SELECTORS", "LAYER_CLAIMS", "MIN_SEEDS", "PAPERS",
    "RUN_CLAIMS", "VERDICTS", "ClaimInfo", "ClaimInputs", "ClaimResult", "ClaimsConfig", "Paper",
    "PlannedRun", "SampleInputs", "claims_json", "claims_table", "combine_samples",
    "estimate_seconds", "evaluate", "head_selections", "heads_comparisons", "layer_claims",
    "layer_claims_estimate", "layer_samples", "missing_runs", "ours_text", "outlier_file",
    "parse_only", "plan_runs", "prepare", "queue_runs", "random_file", "run_claims",
    "run_status", "source_run", "write_disable_files",
]  # fmt: skip
