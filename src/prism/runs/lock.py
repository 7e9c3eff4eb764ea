"""One writer per run: an exclusive lock on `.seed<k>.lock` beside the run's folder (`.x.lock`
beside a result `x.json`), naming its holder (docs/training.md, "Exit codes")."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import secrets
import socket
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

from prism.errors import EXIT_REFUSED, PrismError
from prism.runs.layout import lock_path

TOKEN_ENV = "PRISM_RUN_LOCK_TOKEN"  # the lock a parent process holds for this one
_HELD_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_ATTEMPTS = 20  # opens raced by holders that released (and removed) the file in between


def _holder(text: str) -> dict | None:
    """The JSON object a lock file holds, or None."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def describe_holder(text: str) -> str:
    """'train.py, pid 4242 on node7, Slurm job 991' from a lock file's content."""
    doc = _holder(text)
    if doc is None:
        return text.strip() or "holder unknown"
    parts = [str(doc["program"])] if doc.get("program") else []
    if doc.get("pid") is not None:
        parts.append(f"pid {doc['pid']}" + (f" on {doc['host']}" if doc.get("host") else ""))
    if doc.get("slurm_job"):
        parts.append(f"Slurm job {doc['slurm_job']}")
    return ", ".join(parts) or "holder unknown"


class LockHeld(PrismError, RuntimeError):
    """Another process holds the lock; `holder` describes it, `token` is the one it recorded."""

    exit_code = EXIT_REFUSED

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.holder = path, describe_holder(text)
        self.token = (_holder(text) or {}).get("token")
        super().__init__(f"{path} is held by {self.holder}")


class LocksUnsupported(PrismError, RuntimeError):
    """The filesystem refuses file locks (some network filesystems without a lock service)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"cannot lock {path}: the filesystem refuses file locks ({reason})")


def _same_file(f, path: Path) -> bool:
    """The open file is still the one the path names (not removed or replaced since)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(f.fileno())
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _make_folders(folder: Path) -> list[Path]:
    """mkdir -p; returns the folders this call created, deepest first."""
    missing = list(itertools.takewhile(lambda part: not part.exists(), (folder, *folder.parents)))
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty (the run's own files are there) or already gone
            return


class RunLock:
    """A held lock: `release()` (or leaving its `with` block) drops it and removes its file."""

    def __init__(self, path: Path, file, token: str, made: list[Path]) -> None:
        self.path, self.token = path, token
        self._file, self._made = file, made

    @classmethod
    def acquire(cls, path: str | Path) -> RunLock:
        """Lock `path` now or raise LockHeld (naming the holder) or LocksUnsupported; an OSError
        when its folder cannot be made or the file opened."""
        path = Path(path)
        made: list[Path] = []
        for _ in range(_ATTEMPTS):
            made += _make_folders(path.parent)
            try:
                f = open(path, "a+")
            except FileNotFoundError:  # a releasing holder removed the folder just now
                continue
            except OSError:  # read-only, full, not permitted: leave no folder made for it
                _remove_if_empty(made)
                raise
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                f.seek(0)
                text = f.read() if exc.errno in _HELD_ERRNOS else ""
                f.close()
                _remove_if_empty(made)
                if exc.errno in _HELD_ERRNOS:
                    raise LockHeld(path, text) from None
                raise LocksUnsupported(path, exc.strerror or errno.errorcode.get(exc.errno, "?")) from None
            if _same_file(f, path):
                break
            f.close()  # locked a file its holder removed on release: lock the new one
        else:
            _remove_if_empty(made)
            raise LockHeld(path, "")  # holders came and went every time: one of them holds it
        token = secrets.token_hex(16)
        holder = {
            "program": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "token": token,
        }
        lock = cls(path, f, token, made)
        try:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(holder) + "\n")
            f.flush()
        except BaseException:  # a full disk: drop the lock and its file rather than hold it blind
            lock.release()
            raise
        return lock

    def release(self) -> None:
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            if _same_file(f, self.path):
                self.path.unlink()  # while still locked: nobody can lock it between unlink and unlock
        except OSError:
            pass  # a read-only or vanished folder: the lock is dropped all the same
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        _remove_if_empty(self._made)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@contextmanager
def hold(path: str | Path, token: str | None = None) -> Iterator[RunLock | None]:
    """The lock of `path` for this process; or None when a parent process holds it for this one
    (its recorded token is `token`, passed down in TOKEN_ENV)."""
    try:
        lock = RunLock.acquire(path)
    except LockHeld as exc:
        if not (token and exc.token == token):
            raise
        lock = None
    # outside the except block: an error of the run must not carry LockHeld as its context
    with lock or nullcontext():
        yield lock


def hold_run(run_dir: str | Path) -> Iterator[RunLock | None]:
    """hold() for a run folder, honouring the token of a parent that holds it (TOKEN_ENV)."""
    return hold(lock_path(run_dir), os.environ.get(TOKEN_ENV))
