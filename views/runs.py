"""Runs: every fine-tuning run kept in the runs database, with filters, details and export."""

import json

import streamlit as st

from analysis.runs.results import with_groups
from ui.figures.finetune import loss_curve
from ui.finetune.state import get_db

st.title("Runs")
st.markdown(
    "Every fine-tuning run launched from the Fine-tune page or the CLI (`python -m analysis "
    "finetune`, `sweep`), kept in the runs database under the cache folder. Only a completed run "
    "(status **done**) has a result; a cancelled or failed run keeps its curves and its reason."
)
db = get_db()
db.reap_dead()
everything = db.list_runs()
if everything.empty:
    st.info("No runs yet: launch one on the Fine-tune page.")
    st.stop()

columns = st.columns(4)
filters = {}
for column, name in zip(columns, ["model", "data", "method", "status"], strict=True):
    chosen = column.multiselect(name.capitalize(), sorted(everything[name].dropna().unique()))
    filters[name] = chosen or None
runs = with_groups(db.list_runs(**filters))  # + each run's group and a label telling them apart
st.dataframe(runs.drop(columns=["config_json", "result_json"]), hide_index=True, width="stretch")
left, right = st.columns(2)
left.download_button(
    "Download CSV (one row a run)",
    runs.drop(columns=["result_json"]).to_csv(index=False),
    "runs.csv",
    "text/csv",
)
right.download_button(
    "Download JSON (config, result and steps)",
    json.dumps(db.export_records(**filters), indent=1, default=str),
    "runs.json",
    "application/json",
)

if runs.empty:
    st.stop()
st.header("One run")
run_id = st.selectbox(
    "Run",
    runs["id"],
    format_func=lambda i: (
        f"{i} · {runs.set_index('id').loc[i, 'label']} · {runs.set_index('id').loc[i, 'status']}"
    ),
)
run = db.get_run(run_id)
a, b, c, d = st.columns(4)
a.metric("status", run["status"])
b.metric("test score", f"{run['result']['score']:.4f}" if run["result"] else "—")
c.metric("method", run["label"])
d.metric("seed", run["seed"])
if run["error"]:
    st.warning(run["error"])
if run["status"] in ("queued", "running") and st.button("Cancel this run"):
    st.toast(f"Run {run_id}: {db.request_cancel(run_id)}")
steps = db.steps(run_id)
if not steps.empty:
    st.markdown("Train loss per step and, on the right axis, the dev score at each evaluation.")
    st.plotly_chart(loss_curve(steps, run["label"]), width="stretch")
left, right = st.columns(2)
left.markdown("**Config**")
left.json(run["config"], expanded=False)
right.markdown("**Result**")
right.json(run["result"] or {}, expanded=False)
