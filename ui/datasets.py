"""Which data the sidebar names, and how a person reads its name.

The sidebar's dataset value is one string (it is also the link's ``data`` parameter):

- a built-in name (``movie-snippets``, ``trec6``) or a GLUE task (``glue/sst2``);
- a file path, relative to the data folder (``amazon.csv``, ``reviews/2024.jsonl``) or absolute;
- an upload, ``upload:<sha256 prefix>/<file name>``.

Uploads are stored content-addressed, ``<cache root>/uploads/<first 16 hex digits of the
SHA-256>/<file name>``: the folder makes two different files with one name distinct and one file
uploaded twice a single copy, while the file inside keeps the name it was uploaded under (made
safe: no folders, no odd characters). So the data library's messages and titles, which name a
file by its base name, say ``amazon.csv is empty.``, not a hash; `data_label` names an upload
"amazon.csv (uploaded)" wherever the UI shows a data set (runs, captions, tables).
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from analysis.config import DataSpec, SampleSpec
from analysis.data import BUILTIN_DATA, GLUE_DATA, SUPPORTED_EXTENSIONS, fit_to_part, load_data
from analysis.io import atomic_write_bytes
from analysis.workspace import Workspace
from ui.paths import data_dir, relative_to_data, resolve_typed

UPLOAD = "upload a file…"
UPLOAD_PREFIX = "upload:"
MAX_LISTED = 500  # files of the data folder offered in the picker
_UNSAFE = re.compile(r"[^\w.\- ()+,=@]+")


class NothingChosen(ValueError):
    """No data (or model) chosen yet: the page shows guidance, not an error."""


def named(value: str) -> bool:
    """A built-in data set or GLUE task (no file behind it)."""
    return value.strip().lower() in BUILTIN_DATA or value.strip().lower() in GLUE_DATA


def uploads_dir() -> Path:
    return Workspace.current().uploads


def safe_name(name: str) -> str:
    """A file name safe to store: its last path part, odd characters replaced, at most 120
    characters, the extension kept."""
    base = Path(str(name).replace("\\", "/")).name.strip() or "upload"
    stem, suffix = Path(base).stem, Path(base).suffix.lower()
    stem = _UNSAFE.sub("_", stem).strip(" .") or "upload"
    return f"{stem[: 120 - len(suffix)]}{_UNSAFE.sub('', suffix)}"


def save_upload(name: str, content: bytes) -> str:
    """Store an uploaded file (content-addressed, under its own name) and return its value
    ``upload:<digest>/<name>``."""
    digest = hashlib.sha256(content).hexdigest()[:16]
    file_name = safe_name(name)
    target = uploads_dir() / digest / file_name
    if not target.exists():
        atomic_write_bytes(target, content)
    return f"{UPLOAD_PREFIX}{digest}/{file_name}"


def upload_path(value: str) -> Path:
    """The stored file of an upload value; a ValueError naming the file when it is not here."""
    rest = value[len(UPLOAD_PREFIX) :]
    digest, _, file_name = rest.partition("/")
    if (
        not re.fullmatch(r"[0-9a-f]{16}", digest)
        or not file_name
        or safe_name(file_name) != file_name
    ):
        raise ValueError(f"{value!r} is not an upload of this dashboard.")
    path = uploads_dir() / digest / file_name
    if not path.is_file():
        raise ValueError(
            f"The uploaded file {file_name} is not on this server (any more): upload it again."
        )
    return path


def upload_value(path: Path | str) -> str | None:
    """The upload value of a stored upload's path (None for any other path)."""
    try:
        rel = Path(path).resolve().relative_to(uploads_dir().resolve())
    except ValueError:
        return None
    return f"{UPLOAD_PREFIX}{rel.as_posix()}" if len(rel.parts) == 2 else None


def names_upload(value: str) -> bool:
    """Whether typed text names the upload entry: "upload a file", in any case, with or without
    its dots."""
    return value.strip().rstrip(".…").strip().casefold() == UPLOAD.rstrip("…").casefold()


def normalised(value: str) -> str:
    """A typed path to a file of the data folder, as its path relative to that folder
    (``data/amazon.csv`` → ``amazon.csv``); the upload entry's words, as the entry; anything
    else unchanged."""
    if value and names_upload(value):
        return UPLOAD
    if not value or named(value) or value == UPLOAD or value.startswith(UPLOAD_PREFIX):
        return value
    relative = relative_to_data(resolve_typed(value))
    if relative is not None and (data_dir() / relative).is_file():
        return relative
    return value


def data_files() -> list[str]:
    """Data files in the data folder and its subfolders, as paths relative to it (sorted; hidden
    files and folders skipped; at most 500)."""
    folder = data_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        if path.suffix.lower() in SUPPORTED_EXTENSIONS:
            found.append(rel.as_posix())
            if len(found) >= MAX_LISTED:
                break
    return found


def data_label(value: str) -> str:
    """How a person reads a data set's name: built-ins as they are, uploads by their file name,
    files in the data folder by their path relative to it, other files by their path."""
    text = str(value)
    if text.startswith(UPLOAD_PREFIX):
        return f"{text.rsplit('/', 1)[-1]} (uploaded)"
    if named(text) or not text.strip():
        return text
    upload = upload_value(text) if Path(text).is_absolute() else None
    if upload is not None:
        return data_label(upload)
    relative = relative_to_data(text) if Path(text).is_absolute() else None
    return relative or text


def option_label(value: str) -> str:
    """The sidebar picker's text for one of its values."""
    if value == UPLOAD:
        return value
    if named(value):
        return value
    return data_label(value)


COLUMN_KEYS = ("text_col", "pair_col", "label_col")  # the sidebar's column pickers (and link)


def file_columns(path: str) -> list[str]:
    """The column names of a data file as the data library reads it (the library's DataError,
    with its message, when the file cannot be read). Cached per file version."""
    from analysis.data.files import checked_file

    resolved, stat = checked_file(DataSpec(str(path)))
    return list(_columns(str(resolved), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=32)
def _columns(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    from analysis.data.files import read_columns

    del mtime_ns, size  # part of the cache key only
    return tuple(read_columns(Path(path)))


def fitted_sample(spec: DataSpec, sample: SampleSpec) -> tuple[SampleSpec, str]:
    """The sample the pages draw: ``sample``, or — for a data file whose part is smaller than the
    sidebar's N — the whole part, with the note that says so (`analysis.data.fit_to_part`).
    Built-in and GLUE sets are left as asked (large; GLUE may need the hub); a file that cannot
    be read is left to the page's message."""
    if named(spec.name):
        return sample, ""
    try:
        return fit_to_part(load_data(spec), sample)
    except ValueError:
        return sample, ""


def data_warnings(spec: DataSpec) -> tuple[str, ...]:
    """What looks like a mistake in a data file's columns (`analysis.data.TaskData.warnings`)."""
    if named(spec.name):
        return ()
    try:
        return load_data(spec).warnings
    except ValueError:
        return ()
