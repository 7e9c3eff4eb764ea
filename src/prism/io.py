"""Writing files so that a reader never sees half of one: write a temporary file beside the
target, then rename it over the target (atomic on POSIX filesystems). And reading the JSON
objects the stages write, where a missing or broken file is an answer, not a crash."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from prism.errors import PrismError, exception_chain

# The process umask, read once: mkstemp creates files 0600, but results are for everyone to read.
_UMASK = os.umask(0)
os.umask(_UMASK)


def _space(path: Path) -> str:
    """Free and total space on the filesystem holding `path` (or its nearest existing folder)."""
    for folder in (path, *path.parents):
        try:
            usage = shutil.disk_usage(folder)
        except OSError:
            continue
        return f"{_size(usage.free)} free of {_size(usage.total)}"
    return "free space unknown"


def _size(n: int) -> str:
    if n < 1e6:
        return f"{n / 1e3:.0f} kB"
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.1f} GB"


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest part of `path` (itself or a parent) that exists and is not a folder."""
    part = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    return None if part is None or part.is_dir() else part


# The OS errors that describe the place itself (full, read-only, not permitted, a file in the
# way, missing): the same command fails again until someone changes it. Others (EIO, ENOMEM,
# EMFILE, a network error) may pass, so training counts them as crashes that run_all retries.
PLACE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in "ENOSPC EDQUOT EROFS EACCES EPERM ENOTDIR EEXIST EISDIR ENOENT ENAMETOOLONG".split()
)


def os_error_message(exc: OSError, path: str | Path | None = None) -> str:
    """One sentence naming the path (`path`, else the error's file name) and what failed, for a
    failed read or write: no space left, a read-only filesystem, permission denied, ..."""
    shown = Path(path) if path is not None else Path(exc.filename) if exc.filename else None
    where = str(shown) if shown is not None else "the output"
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        space = _space(shown) if shown is not None else "free space unknown"
        return f"no space left on device while writing {where} ({space} on that filesystem)."
    if code == errno.EROFS:
        return f"cannot write {where}: it is on a read-only filesystem."
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied: this user may not access {where}."
    if code in (errno.ENOTDIR, errno.EEXIST):
        blocker = _file_in_the_way(shown) if shown is not None else None
        if blocker is not None and blocker == shown:
            return f"{where} is a file where a folder is needed."
        if blocker is not None:
            return f"cannot create {where}: {blocker} is a file where a folder is needed."
        if code == errno.EEXIST:
            return f"{where} already exists."
    if code == errno.EISDIR:
        return f"{where} is a folder where a file is needed."
    if code == errno.ENOENT:
        return f"{where} does not exist."
    reason = exc.strerror or str(exc)
    return f"{where}: {reason[0].lower() + reason[1:] if reason else type(exc).__name__}."


def write_error(exc: BaseException, path: str | Path, temp: str | Path | None = None) -> OSError | None:
    """The OS error behind a failed write of `path` (also behind torch.save's "unexpected pos" and
    safetensors' "(os error 28)"), as an OSError naming `path` unless it names another file than
    `path`'s temporary `temp`; None when the failure was not the OS's."""
    for cause in exception_chain(exc):
        code = cause.errno if isinstance(cause, OSError) else None
        if code is None:
            found = re.search(r"\(os error (\d+)\)", str(cause))
            code = int(found.group(1)) if found else (errno.ENOSPC if "No space left" in str(cause) else None)
        if code is not None:
            named = isinstance(cause, OSError) and cause.filename is not None
            if named and cause is exc and not _names_target(cause.filename, Path(path), temp):
                return cause
            return OSError(code, os.strerror(code), str(path))
        if isinstance(cause, (KeyboardInterrupt, SystemExit)):
            return None
    return None


def _names_target(filename, path: Path, temp) -> bool:
    """`filename` is `path`, its temporary `temp`, or a temporary atomic_path tried to create."""
    name = Path(str(filename))
    return (
        str(name) in (str(path), str(temp))
        or name.parent == path.parent
        and name.name.startswith(f".{path.name}.")
        and name.name.endswith(".tmp")
    )


class OutputError(PrismError, ValueError):
    """An output path that cannot be written; the message names it and says why."""


def check_output(path: str | Path, flag: str = "--out", folder: bool = False) -> Path:
    """Refuse, before anything is computed, an output that cannot be written: an existing folder
    where a file is wanted (or a file where a folder is), a part of the path that is a file, a
    location on a read-only filesystem or one this user may not write. Creates nothing."""
    path = Path(path)
    if not folder and path.is_dir():
        raise OutputError(f"{flag} {path} is an existing folder; give the path of a file to write.")
    if folder and (path.exists() or path.is_symlink()) and not path.is_dir():
        raise OutputError(f"{flag} {path} is an existing file; give the path of a folder to write.")
    start = path if folder else path.parent
    anchor = next((p for p in (start, *start.parents) if p.exists() or p.is_symlink()), Path("."))
    if not anchor.is_dir():
        raise OutputError(f"{flag} {path} cannot be created: {anchor} is a file, not a folder.")
    if os.statvfs(anchor).f_flag & os.ST_RDONLY:
        raise OutputError(f"{flag} {path} cannot be written: {anchor} is on a read-only filesystem.")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path} cannot be written: this user may not write in {anchor}.")
    return path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path in `path`'s folder to write; on success it gets the usual permissions
    and is renamed over `path`, on failure it is deleted (an OS failure raised naming `path`)."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(name)
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        failure = write_error(exc, path, temp=tmp)
        if failure is None or failure is exc:
            raise
        raise failure from exc


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_if_changed(path: str | Path, data: bytes) -> bool:
    """Write `data` atomically unless the file already holds exactly it (a report regenerated
    from the same results leaves its file, and its mtime, alone); whether it wrote."""
    path = Path(path)
    if path.is_file() and path.read_bytes() == data:
        return False
    atomic_write_bytes(path, data)
    return True


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def problem(shown: str | Path, why: str) -> str:
    """The sentence for a file left out."""
    return f"`{shown}` {why}; it is left out."


def read_json(path: str | Path, problems: list[str] | None = None, shown: str | None = None) -> dict | None:
    """The JSON object in `path`, or None when the file is missing, unreadable or not an object; then
    with `problems`, a sentence saying why (naming the file as `shown`) is appended there."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        why = f"could not be read ({type(exc).__name__})"
    else:
        if isinstance(doc, dict):
            return doc
        why = "does not hold a JSON object"
    if problems is not None:
        problems.append(problem(shown or path, why))
    return None


def json_lines(
    path: str | Path, missing: Callable[[], Exception], not_json: Callable[[int, str], Exception]
) -> Iterator[tuple[int, Any]]:
    """(line number from 1, value) of each non-blank line of a JSON-lines file, read as consumed;
    raises `missing()` when `path` is not a file, `not_json(line number, why)` at a bad line."""
    if not Path(path).is_file():
        raise missing()
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise not_json(number, exc.msg) from None
            yield number, value
