"""Writing files so that a reader never sees half of one: write a temporary file beside the
target, then rename it over the target (atomic on POSIX filesystems). And reading the JSON
objects the stages write, where a missing or broken file is an answer, not a crash."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

# The process umask, read once: mkstemp creates files 0600, but results are for everyone to read.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path in `path`'s folder to write; on success it gets the usual permissions
    and is renamed over `path`, on failure it is deleted. Readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, problems: list[str] | None = None, shown: str | None = None) -> dict | None:
    """The JSON object in `path`, or None when the file is missing, unreadable or holds something
    other than an object. With `problems`, a sentence saying why (naming the file as `shown`) is
    appended there for the caller to show."""
    shown = shown or str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        if problems is not None:
            problems.append(f"`{shown}` could not be read ({type(exc).__name__}); it is left out.")
        return None
    if not isinstance(doc, dict):
        if problems is not None:
            problems.append(f"`{shown}` does not hold a JSON object; it is left out.")
        return None
    return doc
