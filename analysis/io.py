"""The one way tunescope writes files, and reads its JSON back with clear errors.

Every file the project writes (cache entries, trajectory snapshots, head selections,
zero-weights files, CLI reports, uploads, exports) goes through this module, and so does deleting
a run's folders (`remove_folder`), so every write has
the same guarantee: the content lands in a temporary sibling with a unique name, is flushed and
fsync-ed, and is renamed over the target in one step. A reader therefore sees the old file or the
new one, never half of one, and a writer killed mid-write leaves only a ``.tmp-*`` sibling that
no reader takes for the real thing.

Files and folders it creates get the modes an ordinary ``open`` or ``mkdir`` would give them
(0666 / 0777 less the umask), not the owner-only 0600 / 0700 of `tempfile`'s temporary files:
an exported recipe or a shared cache must be readable by whoever may read its folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

TMP_PREFIX = ".tmp-"


def _umask() -> int:
    """The process's umask. Read from /proc where there is one: setting the umask to read it back
    would, for an instant, give other threads' new files the wrong mode."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_sibling(path: Path) -> tuple[int, Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}-", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 → what `open` would have given
    return fd, Path(tmp)


def _publish(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` over ``path`` and make the rename itself durable."""
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # A directory fsync makes the rename survive a power cut; some file systems refuse it.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary sibling, fsync, rename); returns the path."""
    path = Path(path)
    fd, tmp = _temp_sibling(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, payload: Any, indent: int | None = 1) -> Path:
    """JSON of ``payload`` (non-JSON values through ``str``), written atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=indent, default=str))


def atomic_save_tensors(path: Path | str, tensors: dict[str, torch.Tensor]) -> int:
    """A safetensors file written atomically; returns its size in bytes."""
    from safetensors.torch import save_file

    path = Path(path)
    fd, tmp = _temp_sibling(path)
    os.close(fd)
    try:
        save_file(tensors, str(tmp))
        with open(tmp, "rb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~_umask())  # save_file may make a file of its own
            os.fsync(fh.fileno())
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


@contextlib.contextmanager
def atomic_folder(target: Path | str) -> Iterator[Path]:
    """Build a folder in a temporary sibling and rename it into place when the block ends.

    Every file written inside is fsync-ed before the rename, and given the mode `open` would
    give it. If ``target`` already exists when the block ends (another writer of the same content
    won the race), the new folder is discarded and the existing one kept. An exception discards
    the temporary folder.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name[:12]}-", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 → what `mkdir` would have given
    try:
        yield tmp
        for file in tmp.iterdir():
            with open(file, "rb") as fh:
                os.fchmod(fh.fileno(), 0o666 & ~_umask())  # safetensors' save_file makes 0600
                os.fsync(fh.fileno())
        if target.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_folder(path: Path | str) -> bool:
    """Delete a folder so that no reader ever sees half of it; returns whether it existed.

    The folder is first renamed to a ``.tmp-`` sibling in one step (readers then see it gone, and
    a deletion killed half way leaves only a temporary folder that no reader takes for the real
    thing and ``python -m tunescope info`` sweeps), then removed.
    """
    path = Path(path)
    if not path.is_dir():
        return False
    doomed = path.with_name(f"{TMP_PREFIX}{path.name}-deleted-{os.getpid()}-{os.urandom(4).hex()}")
    os.replace(path, doomed)
    _fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def replace_folder(folder: Path | str, target: Path | str) -> Path:
    """Put the finished ``folder`` in place of ``target``, durably: an older ``target`` is first
    removed by `remove_folder`, so no reader ever sees half of either."""
    target = Path(target)
    remove_folder(target)
    _publish(Path(folder), target)
    return target


def read_json(path: Path | str, what: str = "file") -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file is a ValueError naming it.

    ``what`` says what the file is for the message ("zero-weights file", "selection file"…).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"The {what} '{path}' does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(f"Cannot read the {what} '{path}': {reason}.") from None
    return parse_json(text, f"{what} '{path}'")


def parse_json(text: str | bytes, what: str = "file") -> Any:
    """Parse JSON text; malformed text is a ValueError naming ``what`` and the line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"The {what} is not valid JSON: {exc.msg} (line {exc.lineno}).") from None
    except UnicodeDecodeError:
        raise ValueError(f"The {what} is not UTF-8 text.") from None


def json_ready(value: Any) -> Any:
    """``value`` as strict JSON can hold it: NaN and ±inf become None; numpy scalars and arrays,
    tuples, paths and timestamps become plain numbers, lists and strings; dict keys become
    strings; a DataFrame becomes its list of records. The one sanitiser of every JSON output."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    kind = type(value).__module__.split(".")[0]
    if kind == "numpy":
        return json_ready(value.tolist() if hasattr(value, "tolist") else value.item())
    if kind == "pandas":
        if hasattr(value, "to_dict") and hasattr(value, "columns"):
            return json_ready(value.to_dict(orient="records"))
        if type(value).__name__ in ("NAType", "NaTType"):
            return None
        if hasattr(value, "isoformat"):
            return value.isoformat()
    return value
