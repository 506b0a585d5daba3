"""How every page shows a comparison of two settings (`analysis.compare`): a forest plot of the
differences with their ± t·s.e. intervals (t at 97.5 %, Welch df), a table with the verdicts, the
rule in words and a download."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from analysis.compare import Comparison, comparisons_frame
from ui.figures.compare import forest
from ui.tables import dashes

RULE = (
    "**How a verdict is reached.** For two settings A and B, diff is the difference of their "
    "mean test scores over seeds and se its standard error; A (or B) is called better only when "
    "the difference is more than t · se, t the 97.5 % quantile of Student's t at the Welch "
    "degrees of freedom (about 2.8–4.3 with 3 seeds a side, not 2), otherwise the verdict is *no "
    "difference shown* with the number of seeds each side had. Only runs identical in every "
    "setting but the seed are averaged. *paired p*: a paired bootstrap over the test examples "
    "(both sides scored on the same test part), the chance that resampling the test set alone "
    "reverses the sign of the difference (two-sided); it says nothing about seed-to-seed "
    "variation, which the verdict rests on."
)


def explain() -> None:
    st.markdown(RULE)
    st.latex(
        r"\mathrm{diff}=\bar s_A-\bar s_B,\quad se=\sqrt{se_A^2+se_B^2},\quad "
        r"se_X=\frac{\operatorname{sd}(s_X)}{\sqrt{n_X}},\quad"
        r"\text{verdict}=\begin{cases}A\text{ better} & \mathrm{diff}>t\,se\\"
        r"B\text{ better} & \mathrm{diff}<-t\,se\\ \text{no difference shown} & \text{else}"
        r"\end{cases},\quad t=t_{0.975,\,\nu_{\mathrm{Welch}}},\ "
        r"\nu_{\mathrm{Welch}}=\frac{se^4}{se_A^4/(n_A-1)+se_B^4/(n_B-1)}"
    )


def show(comparisons: Sequence[Comparison], metric: str, key: str) -> None:
    """The forest plot, the table and its CSV download for ``comparisons``."""
    if not comparisons:
        return
    frame = comparisons_frame(comparisons)
    st.plotly_chart(forest(frame, metric), width="stretch", key=f"{key}_forest")
    shown = dashes(frame)  # a missing se / interval reads "–"
    formats = {
        "diff": st.column_config.NumberColumn(format="%+.4f"),
        "se": st.column_config.NumberColumn(format="%.4f"),
        "paired_p": st.column_config.NumberColumn("paired p", format="%.3f"),
    }
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config={
            c: f
            for c, f in formats.items()
            if c in shown and pd.api.types.is_numeric_dtype(shown[c])
        },
        key=f"{key}_table",
    )
    st.download_button(
        "Comparisons (CSV)", frame.to_csv(index=False), f"{key}.csv", "text/csv", key=f"{key}_csv"
    )


def withheld(reasons: Sequence[str]) -> None:
    """Why no verdict is given between some settings (both at chance level: `analysis.runs.chance`),
    one line each, in place of their forest plot."""
    for reason in reasons:
        st.info(reason, icon=":material/block:")
