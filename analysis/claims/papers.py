"""The papers and their claims, as the papers state them: who says what, where, what we measure
and the rule our verdict follows (`CLAIMS`), and which claims rest on layer metrics and which on
fine-tuning runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """One of the papers whose claims are re-measured (the files of shared/papers/)."""

    key: str  # the paper file's number (000, 002, 003)
    short: str  # how a claim cites it
    title: str
    authors: str
    year: int
    venue: str
    arxiv: str

    @property
    def url(self) -> str:
        return f"https://arxiv.org/abs/{self.arxiv}"

    def reference(self) -> str:
        return f"{self.authors} ({self.year}). *{self.title}*. {self.venue}, arXiv {self.arxiv}."


PAPERS: dict[str, Paper] = {
    p.key: p
    for p in (
        Paper("000", "Xie et al. 2022",
              "Hidden State Variability of Pretrained Language Models Can Guide Computation "
              "Reduction for Transfer Learning",
              "Shuo Xie, Jiahao Qiu, Ankita Pasad, Li Du, Qing Qu, Hongyuan Mei", 2022,
              "Findings of EMNLP 2022", "2210.10041"),
        Paper("002", "HiFi, Gui & Xiao 2023",
              "HiFi: High-Information Attention Heads Hold for Parameter-Efficient Model "
              "Adaptation",
              "Anchun Gui, Han Xiao", 2023, "ACL 2023", "2305.04573"),
        Paper("003", "Zhang et al. 2023",
              "Fine-tuning Happens in Tiny Subspaces: Exploring Intrinsic Task-specific "
              "Subspaces of Pre-trained Language Models",
              "Zhong Zhang, Bang Liu, Junming Shao", 2023, "ACL 2023", "2305.17446"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class ClaimInfo:
    id: str
    claim: str
    paper: str
    measured_as: str
    rule: str
    source: str = ""  # the PAPERS key: "(000)" in the texts reads "(Xie et al. 2022)"

    def __post_init__(self) -> None:
        if not self.source:
            cited = [key for key in PAPERS if f"({key}" in self.claim]
            object.__setattr__(self, "source", cited[0] if cited else "")
        for field_name in ("claim", "paper"):
            text = getattr(self, field_name)
            for key, ref in PAPERS.items():
                text = text.replace(f"({key}", f"({ref.short}")
            object.__setattr__(self, field_name, text)

    @property
    def reference(self) -> Paper:
        return PAPERS[self.source]


CLAIMS: dict[str, ClaimInfo] = {
    c.id: c
    for c in (
        ClaimInfo(
            "X1", "ν tracks the probe (000)", "ρ(ν, s) ≤ −0.85 on every GLUE task (000, Table 1)",
            "full-sample ρ(ν, s) with its 90 % bootstrap interval (BCa, R repeats), on each of S "
            "samples",
            "on every sample: the interval's upper end ≤ −0.5 and the estimate ≤ −0.85 (holds "
            "weakly: only the first); does not hold: the interval above −0.5; samples "
            "disagreeing: unstable",
        ),
        ClaimInfo(
            "X2", "ℓ* lies mid-network (000)",
            "most tasks' ℓ* in the middle layers, near ℓ_mid = 13 of 24 for RoBERTa-large (000)",
            "ℓ* counts over R bootstrap repeats, on each of S samples",
            "on every sample the repeats choosing some 1 < ℓ < L number ≥ ⌈0.8 R⌉; does not "
            "hold: those choosing 1 or L do; samples disagreeing: unstable",
        ),
        ClaimInfo(
            "X3", "first-token ν curves are less smooth (000, ζ)",
            "CLS-token ν jumps from < 50 to > 500 between layers on SST-2 (000)",
            "ζ(first) − ζ(mean) on the same examples, with its 90 % bootstrap interval (BCa, "
            "the same resamples for both poolings), on each of S samples",
            "on every sample the interval lies above 0; below 0: does not hold; samples "
            "disagreeing: unstable",
        ),
        ClaimInfo(
            "X4", "tuning up to ℓ* matches full fine-tuning at a fraction of the cost (000, Fig. 4)",
            "(1, ℓ*, ℓ*) about as good as full fine-tuning on GLUE with fewer layers (000, Fig. 4)",
            "(1, ℓ*, ℓ*) − (1, L, L) test score, ± t·s.e. (Welch) over seeds; step time",
            "holds: no difference shown or (1, ℓ*, ℓ*) better, with lower step time; does not "
            "hold: full better, or no time saved",
        ),
        ClaimInfo(
            "H1", "PageRank heads beat random heads of the same k (002, Table 3)",
            "GLUE average 84.7 vs 82.4 (+2.3) (002, Table 3)",
            "top-k PageRank heads − k random heads per layer, test score ± t·s.e. (Welch) over seeds",
            "holds: PageRank better; does not hold: random better; else inconclusive",
        ),
        ClaimInfo(
            "H2", "both information and correlation matter (002, ablations)",
            "PageRank 84.7 vs top-k I_h 84.1 and top-k correlation 83.8 (002, Table 3)",
            "PageRank − the better of top-k I_h and top-k total correlation, ± t·s.e. (Welch)",
            "holds: PageRank ≥ each, better than one; does not hold: an ablation better",
        ),
        ClaimInfo(
            "S1", "intrinsic-subspace tuning ≈ full ≫ random subspace (003)",
            "intrinsic comparable to full on GLUE; random subspace barely above a frozen "
            "encoder (003, Table 1)",
            "intrinsic − full test score ± t·s.e. (Welch) (and intrinsic − random subspace)",
            "holds: intrinsic vs full no difference shown or better, and intrinsic better than "
            "random; does not hold: full or random better than intrinsic",
        ),
        ClaimInfo(
            "S2", "zeroing outlier weights hurts more than zeroing as many random weights (003)",
            "≈ 0.3 % of weights zeroed: outliers degrade significantly, random ones do not "
            "(003, Table 3)",
            "outliers zeroed − random weights zeroed, test score ± t·s.e. (Welch) over seeds",
            "holds: random-zeroed better; does not hold: outliers-zeroed better; else "
            "inconclusive",
        ),
    )
}  # fmt: skip
LAYER_CLAIMS = ("X1", "X2", "X3")
RUN_CLAIMS = ("X4", "H1", "H2", "S1", "S2")


def parse_only(text: str | None) -> tuple[str, ...]:
    """``"X1,h1"`` → ("X1", "H1"); None / "" → every claim. Unknown ids are a ValueError."""
    if not text or not text.strip():
        return tuple(CLAIMS)
    ids = tuple(dict.fromkeys(part.strip().upper() for part in text.split(",") if part.strip()))
    unknown = [i for i in ids if i not in CLAIMS]
    if unknown:
        raise ValueError(f"Unknown claim {', '.join(unknown)}: choose from {', '.join(CLAIMS)}.")
    return ids
