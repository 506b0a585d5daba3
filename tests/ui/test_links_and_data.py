"""Links (query parameters) reproduce the sidebar, every bad parameter gets a message; the data
picker, typed paths, uploads by their own name, guidance before a choice, messages for bad N."""

from __future__ import annotations

import pandas as pd
import pytest
from apptest_utils import errors, make_app, open_page

from ui.datasets import UPLOAD, data_label, normalised, safe_name, save_upload, upload_path
from ui.paths import resolve_typed


def rows(n: int = 60) -> pd.DataFrame:
    words = ["good", "bad", "film", "plot", "great", "dull"]
    return pd.DataFrame(
        {"text": [f"{words[i % 6]} {words[(i + 1) % 6]} {i}" for i in range(n)],
         "label": ["pos" if i % 2 else "neg" for i in range(n)]}
    )  # fmt: skip


@pytest.fixture
def data_folder(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    rows().to_csv(folder / "amazon.csv", index=False)
    rows().to_csv(folder / "sub" / "b.tsv", sep="\t", index=False)
    (folder / "notes.txt").write_text("not data")
    monkeypatch.setenv("TUNESCOPE_DATA_DIR", str(folder))
    return folder


def sidebar_notes(at) -> list[str]:
    return [w.value for w in at.sidebar.warning]


def test_a_link_sets_the_sidebar(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(data="trec6", n="30", seed="3", pooling="first", max_length="64")
    at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key="data").value == "trec6"
    assert at.sidebar.number_input(key="n").value == 30
    assert at.sidebar.number_input(key="seed").value == 3
    assert at.sidebar.radio(key="pooling").value == "first"
    assert at.sidebar.number_input(key="max_length").value == 64
    assert not sidebar_notes(at)
    at.switch_page("views/data.py").run()
    assert not errors(at)
    assert "**trec6** · N = 30 (seed 3)" in at.caption[0].value
    assert len(at.dataframe[0].value) == 30


@pytest.mark.parametrize(
    "name, value, note",
    [
        ("n", "abc", "is not a whole number of examples from 2 to 100,000: showing N = 40"),
        ("n", "1", "is not a whole number of examples"),
        ("seed", "-1", "is not a whole number ≥ 0: showing seed 0"),
        ("max_length", "4096", "from 8 to 512: showing 128 tokens"),
        ("pooling", "max", "is not one of mean, first: showing mean pooling"),
        ("data", "nope.csv", "names no file in the data folder: showing the default data set"),
        ("data", "/etc/passwd.csv", "outside the folders this dashboard may read"),
        ("data", "upload:0123456789abcdef/gone.csv", "not on this server"),
        ("model", "/etc/models", "outside the ones this dashboard may read"),
    ],
)
def test_a_bad_link_parameter_gets_a_message_and_the_default(
    tiny_bert_dir, monkeypatch, name, value, note
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params[name] = value
    at.run()
    assert not at.exception
    assert any(note in n and f"{name}={value!r}" in n for n in sidebar_notes(at)), sidebar_notes(at)
    assert at.sidebar.number_input(key="n").value == 40
    assert at.sidebar.selectbox(key="data").value == "movie-snippets"
    at.switch_page("views/data.py").run()
    assert not errors(at)  # the defaults work
    next(b for b in at.sidebar.button if b.label == "Dismiss").click().run()
    assert not sidebar_notes(at)


@pytest.mark.parametrize("n, says, not_said", [
    (1, "at least two", "at most"), (0, "from 2 to 100,000", "at most"),
    (200_000, "extracts at most 100,000 examples at a time", "at least two"),
])  # fmt: skip
def test_every_bad_n_gets_a_message_in_the_sidebar_and_on_the_page(
    tiny_bert_dir, monkeypatch, n, says, not_said
):
    """Each bad N gets its own reason (N = 10,000,000 was told "at least two examples")."""
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.number_input(key="n").set_value(n).run()
    assert any(says in e.value for e in at.sidebar.error)
    assert not any(not_said in e.value for e in at.sidebar.error)
    at.switch_page("views/layers.py").run()
    assert not at.exception
    assert any("N must be a whole number" in e for e in errors(at))


def test_the_picker_lists_the_data_folder_and_typed_paths_are_not_doubled(
    tiny_bert_dir, monkeypatch, data_folder
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    picker = at.sidebar.selectbox(key="data")
    assert {"amazon.csv", "sub/b.tsv"} <= set(picker.options)
    assert "notes.txt" not in picker.options
    assert any(str(data_folder) in c.value for c in at.sidebar.caption)
    picker.set_value("sub/b.tsv").run()
    at.switch_page("views/data.py").run()
    assert not errors(at) and at.subheader[0].value == "b.tsv"
    assert "**sub/b.tsv**" in at.caption[0].value
    # Typed as the README says, from the project root: not data/data/amazon.csv.
    assert (
        normalised("data/amazon.csv") == "amazon.csv" == normalised(str(data_folder / "amazon.csv"))
    )
    assert resolve_typed("data/amazon.csv") == data_folder / "amazon.csv"
    assert normalised("trec6") == "trec6" and normalised("data/none.csv") == "data/none.csv"
    typed = make_app(tiny_bert_dir, monkeypatch)
    typed.query_params["data"] = "data/amazon.csv"
    open_page(typed, "views/data.py")
    assert not errors(typed) and typed.subheader[0].value == "amazon.csv"
    assert "**amazon.csv**" in typed.caption[0].value


def test_an_upload_is_known_by_its_file_name(tiny_bert_dir, monkeypatch):
    good = save_upload("My reviews.csv", rows().to_csv(index=False).encode())
    empty = save_upload("../../empty one.csv", b"")
    assert good.endswith("/My reviews.csv") and empty.endswith("/empty one.csv")
    assert upload_path(good).name == "My reviews.csv"
    assert data_label(good) == "My reviews.csv (uploaded)" == data_label(str(upload_path(good)))
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["data"] = good  # a link to an upload of this server
    open_page(at, "views/data.py")
    assert not errors(at)
    assert at.subheader[0].value == "My reviews.csv"
    assert "**My reviews.csv (uploaded)**" in at.caption[0].value
    bad = make_app(tiny_bert_dir, monkeypatch)
    bad.query_params["data"] = empty
    open_page(bad, "views/data.py")
    assert errors(bad) == ["empty one.csv is empty."]


def test_upload_without_a_file_is_guidance_and_never_the_last_typed_path(
    tiny_bert_dir, monkeypatch, data_folder
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.selectbox(key="data").set_value("amazon.csv").run()
    at.sidebar.selectbox(key="data").set_value(UPLOAD).run()
    at.switch_page("views/layers.py").run()
    assert not errors(at)  # guidance, not an error
    assert any("Upload a CSV" in i.value for i in at.info)
    assert not any("amazon" in m.value for m in at.caption)


def test_safe_names():
    assert safe_name("../../etc/passwd.csv") == "passwd.csv"
    assert safe_name("a<b>|c.CSV") == "a_b_c.csv"
    assert safe_name("") == "upload"
    assert len(safe_name("x" * 300 + ".parquet")) == 120


def test_trust_is_ticked_per_model_and_never_taken_from_a_link(
    tiny_bert_dir, monkeypatch, tmp_path
):
    from ui.sidebar import _trust_key, model_spec

    monkeypatch.setenv("TUNESCOPE_ALLOWED_ROOTS", str(tmp_path))
    typed = str(tmp_path / "my-model")
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(model=typed, trust_remote_code="true")
    at.run()
    assert at.sidebar.selectbox(key="model").value == typed
    box = at.sidebar.checkbox(key=_trust_key(typed))
    assert not box.value  # a link cannot tick it
    box.check().run()
    assert any("trust_remote_code is on" in w.value for w in at.sidebar.warning)
    state = {"model": typed, _trust_key(typed): True}
    monkeypatch.setattr("streamlit.session_state", state, raising=False)
    assert model_spec().trust_remote_code and model_spec().name == typed
    state["model"] = typed + "-other"
    assert not model_spec().trust_remote_code  # another model starts untrusted


@pytest.fixture
def review_folder(data_folder):
    """A file whose columns cannot be guessed (review, stars) beside amazon.csv (text, label)."""
    rows().rename(columns={"text": "review", "label": "stars"}).to_csv(
        data_folder / "reviews.csv", index=False
    )
    return data_folder


def test_column_pickers_offer_the_files_columns_and_reset_for_another_data_set(
    tiny_bert_dir, monkeypatch, review_folder
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.selectbox(key="data").set_value("reviews.csv").run()
    text = at.sidebar.selectbox(key="text_col")
    assert text.options == ["review", "stars"] and text.value is None  # the file's own header
    assert at.sidebar.expander[0].proto.expanded  # nothing to guess: the section opens
    at.switch_page("views/data.py").run()
    (message,) = errors(at)
    assert "No text column chosen" in message and "Columns (text, label)" in message
    assert "collapsed" not in message  # the section it names is open
    at.sidebar.selectbox(key="text_col").set_value("review").run()
    assert at.sidebar.expander[0].proto.expanded  # the label column is still missing: stays open
    at.sidebar.selectbox(key="label_col").set_value("stars").run()
    assert not at.sidebar.expander[0].proto.expanded  # both known: it folds
    assert not errors(at)
    at.sidebar.selectbox(key="data").set_value("amazon.csv").run()
    assert not errors(at)  # not "Text column 'review' not found in amazon.csv"
    assert at.sidebar.selectbox(key="text_col").value is None
    assert at.sidebar.selectbox(key="text_col").options == ["text", "label"]
    assert "text_col" not in at.query_params and "label_col" not in at.query_params
    assert not at.sidebar.expander[0].proto.expanded  # text and label are guessed


def test_a_links_column_must_be_a_column_of_its_file(tiny_bert_dir, monkeypatch, review_folder):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(data="reviews.csv", text_col="review", label_col="nope")
    at.run()
    assert at.sidebar.selectbox(key="text_col").value == "review"
    assert any("label_col='nope' is not a column of reviews.csv" in n for n in sidebar_notes(at))
    assert at.sidebar.selectbox(key="label_col").value is None


def test_the_upload_placeholder_never_reaches_the_link(tiny_bert_dir, monkeypatch, data_folder):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.selectbox(key="data").set_value("amazon.csv").run()
    assert at.query_params["data"] in ("amazon.csv", ["amazon.csv"])
    at.sidebar.selectbox(key="data").set_value(UPLOAD).run()
    assert "data" not in at.query_params  # not data=upload+a+file…


def test_a_broken_upload_is_not_offered_in_the_picker(tiny_bert_dir, monkeypatch):
    from types import SimpleNamespace

    from ui.sidebar import UPLOAD_ERROR, _store_upload

    def upload(name: str, content: bytes) -> dict:
        file = SimpleNamespace(name=name, getvalue=lambda: content)
        state = {"data_upload": file, "data": UPLOAD}
        monkeypatch.setattr("streamlit.session_state", state, raising=False)
        _store_upload()
        return state

    broken = upload("broken.csv", b"\xff\xfe not utf-8 \x00")
    assert "data_uploads" not in broken and broken["data"] == UPLOAD
    assert "not valid UTF-8" in broken[UPLOAD_ERROR] and "not added" in broken[UPLOAD_ERROR]
    good = upload("fine.csv", rows().to_csv(index=False).encode())
    assert good["data_uploads"] == [good["data"]] and good["data"].endswith("/fine.csv")
    assert UPLOAD_ERROR not in good


def test_the_data_page_counts_with_thousands_separators(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch, n=1000), "views/data.py")
    assert not errors(at)
    assert any(" of 1,000 examples are longer than" in c.value for c in at.caption)


def test_an_upload_smaller_than_n_is_used_whole_with_a_note(tiny_bert_dir, monkeypatch):
    small = save_upload("small.csv", rows(60).to_csv(index=False).encode())  # train part: 48
    at = make_app(tiny_bert_dir, monkeypatch, n=1000)
    at.query_params["data"] = small
    open_page(at, "views/data.py")
    assert not errors(at)  # was: "N = 1000 is more than the train part holds …: choose N ≤ 48"
    note = "small.csv's train part holds 48 examples, fewer than N = 1,000: all 48 are used."
    assert [i.value for i in at.sidebar.info] == [note]
    assert any(h.value.startswith("The sample: N = 48 examples") for h in at.subheader)
    assert "N = 48 (seed 0)" in at.caption[0].value


def test_a_text_column_of_numbers_is_warned_once_in_the_sidebar(tiny_bert_dir, monkeypatch):
    swapped = rows(60).assign(text=[str(i % 7) for i in range(60)])
    value = save_upload("swapped.csv", swapped.to_csv(index=False).encode())
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["data"] = value
    open_page(at, "views/data.py")
    assert not errors(at)
    expected = "Column 'text', used as a text, holds only numbers (e.g. 0, 1, 2)"
    assert len([w.value for w in at.sidebar.warning if w.value.startswith(expected)]) == 1
    assert not [w.value for w in at.main.warning if w.value.startswith(expected)]  # not twice


def test_the_data_page_shows_the_caches_size_and_where_it_is(tiny_bert_dir, monkeypatch, tmp_path):
    save_upload("reviews.csv", b"x" * 2500)  # 2.5 kB in the cache folder's uploads/
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/data.py")
    assert not errors(at)
    root = tmp_path / "cache"  # tests/conftest.py's TUNESCOPE_CACHE
    line = next(c.value for c in at.caption if c.value.startswith("The cache folder"))
    assert f"The cache folder `{root}` holds 2.5 kB; its disk has " in line
    assert " free. `tunescope cache` lists" in line


def test_a_hub_id_is_refused_at_once_with_the_hub_off(tiny_bert_dir, monkeypatch):
    import time

    from analysis.models import OFFLINE_ENV

    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["model"] = "no-such-model-xyz"
    at.run()
    started = time.perf_counter()
    at.switch_page("views/layers.py").run()
    assert time.perf_counter() - started < 15  # (the hub client's retries alone waited 25 s)
    (message,) = errors(at)
    assert message.startswith("Model 'no-such-model-xyz' is neither a built-in model nor a "
                              "folder, and the model hub is off"), message  # fmt: skip
    assert not at.sidebar.info  # said once, on the page


def test_a_hub_id_with_the_hub_allowed_is_said_to_be_looked_for_there(tiny_bert_dir, monkeypatch):
    import huggingface_hub.constants

    from analysis.models import OFFLINE_ENV

    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # closed
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["model"] = "no-such-model-xyz"
    at.run()
    assert [i.value for i in at.sidebar.info] == [
        "'no-such-model-xyz' is neither a built-in model nor a folder: it is looked for on the "
        "model hub (http://127.0.0.1:9), which has 10 s to answer."
    ]
    at.switch_page("views/layers.py").run()
    (message,) = errors(at)
    assert "the model hub (http://127.0.0.1:9) could not say within 10 s" in message, message


def test_a_small_upload_warns_that_its_scores_move_in_coarse_steps(tiny_bert_dir, monkeypatch):
    value = save_upload("tiny.csv", rows(40).to_csv(index=False).encode())  # dev, test: 4 each
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["data"] = value
    open_page(at, "views/data.py")
    assert not errors(at)
    said = [w.value for w in at.sidebar.warning if "steps of" in w.value]
    assert said == [
        "The dev and test parts hold only 4 examples each: accuracy on them moves in steps of 25 "
        "points (100 / n: one example), so a difference of a few such steps between runs is "
        "noise. A file with more rows gives finer scores."
    ]
    assert not [w for w in at.main.warning if "steps of" in w.value]  # said once


@pytest.mark.parametrize("typed", ["upload a file", "Upload a file...", " upload a file… "])
def test_typing_the_upload_entry_chooses_it(tiny_bert_dir, monkeypatch, typed):
    assert normalised(typed) == UPLOAD  # what the picker's callback makes of the typed text
    at = make_app(tiny_bert_dir, monkeypatch)
    at.session_state["data"] = typed  # typed as a new option (AppTest cannot type one)
    at.run()
    assert at.session_state["data"] == UPLOAD
    options = at.sidebar.selectbox(key="data").options
    assert [o for o in options if "upload a file" in o.lower()] == [UPLOAD]  # no option of its own
    at.switch_page("views/data.py").run()
    assert not errors(at), errors(at)  # was: "Unknown data set '…/upload a file'"
    assert any("Upload a CSV" in i.value for i in at.info)
