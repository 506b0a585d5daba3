"""The Runs page (AppTest): filters with tags, curves side by side, a note and tags per run,
deleting a run's files and the run, the run in the link; the overlay figure."""

from __future__ import annotations

import io
import json

import pandas as pd
from apptest_utils import errors, make_app
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import app_test

from analysis.runs.db import RunsDB
from ui.datasets import save_upload, upload_path
from ui.figures.runs import overlay_curves

PAGE = "views/runs.py"


def finished(db: RunsDB, seed: int, data: str = "movie-snippets", losses=(0.9, 0.6, 0.4)) -> str:
    run_id = db.enqueue({"model": {"name": "tiny"}, "data": {"name": data}, "method": "full",
                         "seed": seed, "steps": len(losses)})  # fmt: skip
    db.claim_next(worker_pid=1)
    for step, loss in enumerate(losses, start=1):
        db.log_step(run_id, step, {"loss": loss})
    db.log_step(run_id, len(losses), {"dev": 0.7 + seed / 100}, kind="dev")
    db.finish(run_id, {"score": 0.7 + seed / 100, "metric": "accuracy"})
    return run_id


def media_stores(monkeypatch) -> list[MemoryMediaFileStorage]:
    """The media stores of the AppTest runs from now on (each run makes one and drops it), to
    read what a download button offers."""
    stores: list[MemoryMediaFileStorage] = []

    class Kept(MemoryMediaFileStorage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            stores.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Kept)
    return stores


def download(at, stores: list[MemoryMediaFileStorage], label: str) -> bytes:
    """The bytes behind the download button whose label starts with ``label`` (last run)."""
    button = next(b for b in at.get("download_button") if b.proto.label.startswith(label))
    return stores[-1].get_file(button.proto.url.rsplit("/", 1)[-1]).content


def runs_page(model_dir, monkeypatch, **params):
    at = make_app(model_dir, monkeypatch)
    at.query_params.update(params)
    return at.switch_page(PAGE).run()


def test_overlay_notes_tags_filters_and_export(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    upload = str(upload_path(save_upload("my reviews.csv", b"text,label\n")))
    a, b = finished(db, 0), finished(db, 1, data=upload, losses=(1.0, 0.5, 0.2, 0.1))
    at = runs_page(tiny_bert_dir, monkeypatch)
    assert not errors(at)
    table = at.dataframe[0].value
    assert {"note", "tags"} <= set(table.columns)
    assert "my reviews.csv (uploaded)" in set(table["data"])  # an upload by its own name
    overlay = at.multiselect(key="runs_compare")
    assert set(overlay.value) == {a, b}  # the newest finished runs, to start with
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert len(spec["data"]) == 4  # loss and dev of each run
    assert {t["legendgroup"] for t in spec["data"]} == {f"{a} · full", f"{b} · full"}
    assert any(  # every figure says what it draws
        "train loss per step (top)" in m.value and "dev accuracy at each evaluation" in m.value
        for m in at.markdown
    )

    # A note and tags for the run shown in full (the newest: b).
    assert at.selectbox(key="runs_run").value == b
    at.text_area[0].input("warm-up too short")
    next(x for x in at.text_input if x.label == "Tags").input("keep, lr sweep")
    next(x for x in at.button if x.label == "Save note and tags").click().run()
    assert not errors(at)
    assert db.get_run(b)["note"] == "warm-up too short"
    assert db.get_run(b)["tags"] == ["keep", "lr sweep"]
    at.multiselect(key="runs_filter_tag").set_value(["keep"]).run()
    assert at.dataframe[0].value["id"].tolist() == [b]
    assert at.dataframe[0].value["tags"].tolist() == ["keep, lr sweep"]
    records = db.export_records(tag=["keep"])
    assert records[0]["note"] == "warm-up too short"


def test_delete_files_then_the_run(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    keep, drop = finished(db, 0), finished(db, 1)
    folder = db.workspace.run_folder(drop) / "trajectory"
    folder.mkdir(parents=True)
    (folder / "snap-00000.safetensors").write_bytes(b"\0" * 3_000_000)
    at = runs_page(tiny_bert_dir, monkeypatch, run=drop)
    assert at.selectbox(key="runs_run").value == drop
    button = next(x for x in at.button if x.label.startswith("Delete its files"))
    assert "3.0 MB" in button.label
    button.click().run()
    assert not errors(at) and not folder.exists()
    assert db.get_run(drop)["status"] == "done"
    assert any("owns no files" in c.value for c in at.caption)
    at.checkbox(key=f"runs_delete_sure_{drop}").check().run()
    next(x for x in at.button if x.label == "Delete the run").click().run()
    assert not errors(at)
    assert db.list_runs()["id"].tolist() == [keep]
    assert at.selectbox(key="runs_run").value == keep


def test_a_running_run_cannot_be_deleted_and_a_bad_link_says_so(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    running = db.enqueue({"model": {"name": "tiny"}, "data": {"name": "d"}, "method": "full"})
    db.claim_next(worker_pid=1)  # pid 1 is alive: never reaped
    at = runs_page(tiny_bert_dir, monkeypatch, run="no-such-run")
    assert not at.exception
    assert any(
        "run='no-such-run' is not one of the runs listed" in w.value for w in at.main.warning
    )
    assert at.selectbox(key="runs_run").value == running
    assert at.checkbox(key=f"runs_delete_sure_{running}").disabled
    assert any("Cancel the run before deleting" in c.value for c in at.caption)


def test_overlay_figure():
    steps = pd.DataFrame({"step": [1, 2, 2], "kind": ["train", "train", "dev"],
                          "key": ["loss", "loss", "dev"], "value": [0.9, 0.5, 0.8]})  # fmt: skip
    fig = overlay_curves({"a": steps, "b": steps.assign(value=steps["value"] / 2)}, "accuracy")
    assert [t.name for t in fig.data] == ["a", "a", "b", "b"]
    assert list(fig.data[2].y) == [0.45, 0.25] and list(fig.data[3].y) == [0.4]
    assert fig.data[0].line.color != fig.data[2].line.color
    assert fig.layout.annotations[1].text == "dev accuracy"


def test_the_json_download_carries_each_runs_group_and_label(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    a, b = finished(db, 0), finished(db, 1)
    stores = media_stores(monkeypatch)
    at = runs_page(tiny_bert_dir, monkeypatch)
    assert not errors(at)
    records = json.loads(download(at, stores, "Download JSON"))
    assert [r["id"] for r in records] == [b, a]
    assert records[0]["group"] == records[1]["group"] == db.get_run(a)["group_key"]
    assert [r["label"] for r in records] == ["full", "full"]
    assert records[0]["steps"]  # still the whole record: config, result, note, tags and steps
    table = pd.read_csv(io.StringIO(download(at, stores, "Download CSV").decode()))
    assert table["group"].tolist() == [r["group"] for r in records]


def test_the_table_leads_with_what_a_reader_looks_for(tiny_bert_dir, monkeypatch):
    import numpy as np

    from analysis.predictions import encode_predictions

    db = RunsDB()
    labels = np.array([0, 1, 0, 1, 0, 0])
    for steps, predictions in ((100, np.zeros(6)), (300, labels)):
        run_id = db.enqueue({"model": {"name": "tiny"}, "data": {"name": "movie-snippets"},
                             "method": "full", "seed": 0, "steps": steps})  # fmt: skip
        db.claim_next(worker_pid=1)
        score = float(np.mean(predictions == labels))
        db.finish(
            run_id,
            {
                "score": score,
                "metric": "accuracy",
                "test_predictions": encode_predictions(predictions, labels, "fp", regression=False),
            },
        )
    db.enqueue({"model": {"name": "tiny"}, "data": {"name": "movie-snippets"}, "method": "full"})
    at = runs_page(tiny_bert_dir, monkeypatch)
    assert not errors(at), errors(at)
    table = at.dataframe[0].value
    assert list(table.columns[:7]) == ["method", "label", "score", "metric", "flag", "status",
                                       "seed"]  # fmt: skip
    assert list(table.columns).index("id") < list(table.columns).index("created")
    done = table[table["status"] == "done"]
    assert set(done["label"]) == {"full · steps 100", "full · steps 300"}  # told apart
    flags = dict(zip(done["label"], done["flag"], strict=True))
    assert flags == {"full · steps 100": "predicts one class only", "full · steps 300": ""}
    cells = table.astype(str).to_numpy().ravel()
    assert "None" not in cells and "nan" not in cells  # the queued run's blanks read "–"


def test_the_table_labels_each_method_by_its_own_options(tiny_bert_dir, monkeypatch):
    from analysis.finetune.config import flat_config

    db = RunsDB()
    for options in ({}, {"eva_r": 4}):  # the default rank is left out of the run's group setting
        config = flat_config(model={"name": "tiny"}, method="lora-eva", **options).to_dict()
        run_id = db.enqueue(config)
        db.claim_next(worker_pid=1)
        db.finish(run_id, {"score": 0.7, "metric": "accuracy"})
    at = runs_page(tiny_bert_dir, monkeypatch)
    assert not errors(at), errors(at)
    assert sorted(at.dataframe[0].value["label"]) == ["lora-eva r=4", "lora-eva r=8"]
