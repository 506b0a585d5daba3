import pandas as pd
import pytest
from apptest_utils import errors, make_app, open_page


def test_home_renders(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    assert not at.exception
    assert "which layers and heads" in " ".join(m.value for m in at.markdown).lower()
    assert at.sidebar.number_input(key="n").value == 40


def test_data_page_shows_counts_lengths_and_rows(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/data.py")
    assert not errors(at)
    assert len(at.get("plotly_chart")) == 2  # class counts, length histogram
    assert [m.label for m in at.metric][:3] == ["train", "dev", "test"]
    assert len(at.dataframe[0].value) == 40


def test_settings_survive_page_switches(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.number_input(key="n").set_value(60).run()
    at.switch_page("views/data.py").run()
    assert at.sidebar.number_input(key="n").value == 60
    assert len(at.dataframe[0].value) == 60


def test_bad_file_is_a_clear_message_and_the_app_keeps_serving(
    tiny_bert_dir, monkeypatch, tmp_path
):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"text": [f"text {i}" for i in range(12)], "label": [1] * 12}).to_csv(
        bad, index=False
    )
    monkeypatch.setenv("TUNESCOPE_ALLOWED_ROOTS", str(tmp_path))
    at = open_page(make_app(tiny_bert_dir, monkeypatch, data=str(bad)), "views/data.py")
    assert not at.exception
    assert any("class" in e.lower() for e in errors(at))
    at.switch_page("views/home.py").run()
    assert not at.exception


def test_paths_outside_allowed_roots_are_refused(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.session_state["data"] = "/etc/passwd.csv"  # as if typed into the Dataset box
    at.run()
    at.switch_page("views/data.py").run()
    assert any("outside the folders" in e for e in errors(at))


@pytest.mark.parametrize("page", ["views/home.py", "views/data.py"])
def test_every_foundation_page_renders(tiny_bert_dir, monkeypatch, page):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), page)
    assert not at.exception


def test_home_gives_the_path_and_every_page_links_to_the_next_step(tiny_bert_dir, monkeypatch):
    from ui.nav import PATH, next_of

    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    links = [link.proto.label for link in at.get("page_link")]
    assert [label.split("**")[1] for label in links[:6]] == [s.title for s in PATH]
    assert "Runs" in " ".join(m.value for m in at.markdown)  # the table lists every page
    assert links[-1].startswith("Next: **Data**")
    assert [next_of(s.page).title for s in PATH] == [
        "Layers", "Heads", "Fine-tune", "Subspaces", "Runs", "Fine-tune"
    ]  # fmt: skip
    assert next_of("views/claims.py").title == "Runs"  # off the path: where its runs are followed
    at.switch_page("views/data.py").run()
    assert at.get("page_link")[-1].proto.label.startswith("Next: **Layers**")


def test_while_the_built_in_lesson_is_prepared_every_page_says_so(
    tiny_bert_dir, monkeypatch, tmp_path
):
    import ui.lessons.prepare as prep
    from analysis.workspace import Workspace

    seen = []

    def fake_prepare(name, progress, kinds=None):
        progress(0.0, "hidden states: mpnet")
        seen.append(prep.preparing_note())
        prep._NOW["start"] -= 60  # a minute in, half done: about a minute left
        progress(0.5, "layer metrics: mpnet")
        seen.append(prep.preparing_note())
        at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/layers.py")
        seen.append([i.value for i in at.info])
        return type("Done", (), {"seconds": 1.0})()

    monkeypatch.setattr(prep, "prepare_lesson", fake_prepare)
    prep._prepare_builtin(Workspace(tmp_path / "cache"))
    assert (
        seen[0].startswith("**Preparing the built-in lesson “")
        and "0 % done; now: hidden" in (seen[0])
    )
    assert "50 % done, about 60 s left; now: layer metrics: mpnet" in seen[1]
    assert any(v.startswith("**Preparing the built-in lesson") for v in seen[2]), seen[2]
    assert prep.preparing_note() is None  # done: the banner goes
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/layers.py")
    assert not any("Preparing the built-in lesson" in i.value for i in at.info)
