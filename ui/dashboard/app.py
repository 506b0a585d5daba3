"""tunescope — which layers and heads of a pretrained encoder should you tune for your task?

Run with ``tunescope app``, or ``streamlit run app.py`` at the top of a checkout (that app.py runs
this one). This file only sets up navigation and the shared sidebar; each page lives in views/
beside it (not pages/: a folder of that name beside the main script switches Streamlit into its
legacy multipage mode, which fights st.navigation), registered by its absolute path, so that the
pages are the same whichever script Streamlit started. Streamlit reads .streamlit/config.toml beside
the main script (loopback only, no usage statistics); the checkout's top-level .streamlit/ is a
link to this folder's. This folder is not a package: Streamlit puts the main script's folder first
on sys.path, and ui/'s own modules there would shadow libraries (ui/datasets.py the `datasets`
package).
"""

from pathlib import Path

import streamlit as st

from analysis.workspace import Workspace
from ui.lessons.bar import add_view_button, lesson_bar
from ui.lessons.prepare import prepare_builtin_in_background, preparing_note
from ui.loaders import warm_up
from ui.memo import end_run, start_run
from ui.nav import page_path
from ui.sidebar import default_model, render_sidebar

# The page icon is a file of ours: a ":material/…:" or emoji icon makes every browser fetch the
# favicon from an outside font server, and the dashboard makes no outside request.
ICON = Path(__file__).resolve().parents[1] / "icon.png"
st.set_page_config(page_title="tunescope", page_icon=str(ICON), layout="wide")

PAGES = [
    st.Page(page_path("views/home.py"), title="Home", icon=":material/home:", default=True),
    st.Page(page_path("views/recommend.py"), title="Recommend", icon=":material/recommend:"),
    st.Page(page_path("views/data.py"), title="Data", icon=":material/table_view:"),
    st.Page(page_path("views/layers.py"), title="Layers", icon=":material/layers:"),
    st.Page(page_path("views/heads.py"), title="Heads", icon=":material/hub:"),
    st.Page(page_path("views/finetune.py"), title="Fine-tune", icon=":material/model_training:"),
    st.Page(page_path("views/subspace.py"), title="Subspaces", icon=":material/scatter_plot:"),
    st.Page(page_path("views/runs.py"), title="Runs", icon=":material/list_alt:"),
    st.Page(page_path("views/claims.py"), title="Paper check", icon=":material/fact_check:"),
    st.Page(page_path("views/lessons.py"), title="Lessons", icon=":material/school:"),
]


@st.fragment(run_every=3)
def preparing_banner() -> None:
    """While the server prepares the built-in lesson: what that means, refreshed; gone once done
    (the next page no longer draws it)."""
    note = preparing_note()
    if note:
        st.info(note, icon=":material/hourglass_top:")


warm_up(default_model())  # the compute workers start with the first page (ui/loaders.py)
start_run()  # this view's computations queue by when it started (ui/memo.py)
navigation = st.navigation(PAGES)
with Workspace.from_env().active():  # the app's one workspace: cache, runs, uploads
    prepare_builtin_in_background()  # the built-in lessons, once per server (ui/lessons/prepare.py)
    if preparing_note():
        preparing_banner()
    render_sidebar()
    add_view_button(navigation.url_path)
    with lesson_bar(
        navigation.url_path
    ):  # the presenter bar and the step's note, in a lesson (ui/lessons/bar.py)
        navigation.run()
    end_run(navigation.url_path)  # the server's part of this view, in the compute log
