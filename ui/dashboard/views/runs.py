"""Runs: every fine-tuning run kept in the runs database, with filters, several runs at once
(selected in the table: compared, tagged, cancelled, deleted), curves side by side, notes and
tags, files, details and export."""

import streamlit as st

from ui.export import run_recipe_button
from ui.finetune.state import get_db
from ui.nav import next_step
from ui.runs.selection import selection_view
from ui.runs.view import compare_view, filtered_runs, import_form, pick_run, run_view, runs_table

st.title("Runs")
st.markdown(
    "Every fine-tuning run launched from the Fine-tune or Subspaces page or the CLI "
    "(`python -m tunescope finetune`, `sweep`), kept in the runs database under the cache folder. "
    "Only a completed run (status **done**) has a result; a cancelled or failed run keeps its "
    "curves and its reason. Give runs a note and tags to find them again; they are exported with "
    "the runs."
)
db = get_db()
db.reap_dead()
import_form(db)
everything = db.list_runs()
if everything.empty:
    st.info("No runs yet: launch one on the Fine-tune page, or import one trained elsewhere.")
    next_step("views/runs.py")
    st.stop()

runs, filters = filtered_runs(db, everything)
selected = runs_table(db, runs, filters)
if runs.empty:
    st.info("No run matches these filters.")
    next_step("views/runs.py")
    st.stop()
selection_view(db, runs[runs["id"].isin(selected)])

st.header("Curves side by side")
compare_view(db, runs)

st.header("One run")
run_id = pick_run(runs)
run_view(db, run_id)
run_recipe_button(db, run_id, "runs_recipe")
next_step("views/runs.py")
