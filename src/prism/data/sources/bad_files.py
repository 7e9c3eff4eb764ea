"""Local data files that cannot be read: which file, and what is wrong with it, in one sentence,
before anything is read or for a mid-stream failure (docs/data.md, "Bad files")."""

from __future__ import annotations

import errno
import gzip
import json
import re
import time
import zlib
from pathlib import Path
from typing import Callable, Iterable

from prism.data.errors import DataError, StreamStalled
from prism.data.text import MissingText, read_failure
from prism.errors import exception_chain

GZIP_MAGIC = b"\x1f\x8b"
BLOCK_ROW = re.compile(r" in row \d+")  # pyarrow's row number counts within a block, not the file
FIRST_LINE_LIMIT = 1 << 20  # bytes of leading blank lines read before a file counts as blank
# At most this long is spent re-reading the data files to find the one a failure came from: well
# under the stall timeout and train.ddp_timeout_s, which other ranks wait for this one meanwhile
LOOKUP_BUDGET_S = 120.0
# errors of the machine, not of a file: every re-read would meet them again, or make them worse
MACHINE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM})


def _bad(path: Path, what: str, data_path: str) -> DataError:
    return DataError(
        f"data file {path} {what}; fix or remove it, or point data.path={data_path!r} elsewhere."
    )


def _first_record(path: Path) -> str | None:
    """The first non-blank line of a (gzipped) JSON Lines file; None when it has none."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        read = 0
        for line in f:
            if line.strip():
                return line.decode("utf-8")
            read += len(line)
            if read > FIRST_LINE_LIMIT:
                break
    return None


def check_data_file(path: Path, data_path: str) -> None:
    """Raise a DataError naming `path` if it cannot be one of data.path's files."""
    name = path.name.lower()
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror or type(exc).__name__})", data_path) from None
    if size == 0:
        raise _bad(path, "is empty (0 bytes)", data_path)
    if name.endswith(".gz") and head != GZIP_MAGIC:
        raise _bad(path, "is not gzip data although its name ends in .gz (corrupt or misnamed)", data_path)
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            columns = pq.read_schema(path).names
        except Exception as exc:  # pyarrow: ArrowInvalid "Parquet magic bytes not found in footer"
            raise _bad(
                path, f"is not a readable parquet file ({_first(exc)}); it is cut short or corrupt", data_path
            ) from None
        if "text" not in columns:
            raise _bad(path, f"has no 'text' column (it has: {', '.join(columns)})", data_path)
    elif name.endswith((".jsonl", ".jsonl.gz")):
        try:
            line = _first_record(path)
        except Exception as exc:  # a gzip stream broken in its first block, bytes that are not UTF-8
            raise _bad(path, _what(exc), data_path) from None
        if line is None:
            raise _bad(path, "holds no records (only blank lines)", data_path)
        try:
            record = json.loads(line)
        except ValueError:
            raise _bad(
                path, "has a first line that is not JSON (JSON Lines: one object per line)", data_path
            ) from None
        if not isinstance(record, dict):
            raise _bad(
                path, f"has a first line that is a JSON {type(record).__name__}, not an object", data_path
            )
        if "text" not in record:
            raise _bad(
                path, f"has no 'text' column (it has: {', '.join(record)}) in its first record", data_path
            )


def _first(exc: BaseException) -> str:
    text = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _what(exc: BaseException) -> str:
    """What an exception from reading a data file says about the file."""
    if isinstance(exc, MissingText):
        return (
            "holds a record whose 'text' is missing or null (FineWeb-style data needs one "
            "text string per document)"
        )
    if isinstance(exc, EOFError):
        return "ends early: its compressed data is cut short"
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return f"is not valid gzip data ({_first(exc)}): it is corrupt"
    if isinstance(exc, UnicodeDecodeError):
        return f"is not UTF-8 text ({_first(exc)})"
    if isinstance(exc, FileNotFoundError):  # open at the start, so removed or moved since
        return "is gone: it was removed or moved while the data was being read"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot be read ({exc.strerror})"
    text = _first(exc)
    if "JSON parse error" in text:
        # pyarrow counts rows within the block it parsed, not within the file: leave them out
        return f"holds a line that is not JSON ({BLOCK_ROW.sub('', text)})"
    if "parquet" in text.lower() or type(exc).__name__ in ("ArrowInvalid", "ArrowIOError"):
        return f"cannot be decoded ({text}); it is cut short or corrupt"
    return f"could not be read ({text})"


def not_a_file_failure(exc: BaseException) -> bool:
    """Whether `exc` (or one in its chain) is a failure no data file causes: the machine's (files, disk,
    memory), an interrupt, the kit's own stall or a data error already said."""
    if not isinstance(exc, Exception) or isinstance(exc, DataError):  # KeyboardInterrupt, SystemExit
        return True
    return any(
        isinstance(e, (KeyboardInterrupt, MemoryError, StreamStalled))
        or (isinstance(e, OSError) and e.errno in MACHINE_ERRNOS)
        for e in exception_chain(exc)
    )


def named_file(exc: BaseException, files: list[str]) -> str | None:
    """The one file of `files` that `exc`'s chain names in its messages, file names or notes;
    None when none or more than one."""
    parts: list[str] = []
    for e in exception_chain(exc):
        try:
            parts.append(str(e))
        except Exception:  # a broken __str__ says nothing
            pass
        parts.extend(str(v) for v in (getattr(e, "filename", None), getattr(e, "filename2", None)) if v)
        parts.extend(str(n) for n in getattr(e, "__notes__", None) or ())
    text = "\n".join(parts)
    named = {f for f in files if _names(text, f) or _names(text, str(Path(f).resolve()))}
    return named.pop() if len(named) == 1 else None


def _names(text: str, path: str) -> bool:
    """Whether `text` holds `path` as a whole path (not a.json inside a.json.gz, not rel/a.jsonl
    inside /other/rel/a.jsonl)."""
    before = r"(?<![\w.\-])" if Path(path).is_absolute() else r"(?<![\w.\-/])"
    return re.search(before + re.escape(path) + r"(?![\w/\-]|\.\w)", text) is not None


class OutOfTime(Exception):
    """Re-reading the data files ran past its budget before one of them failed."""


def failing_file(
    exc: BaseException, files: list[str], read_file: Callable[[str], Iterable], budget_s: float
) -> tuple[str, BaseException] | None:
    """(file, what reading it raised) for the file of `files` that `exc` came from: the only or named
    one, else the first whose full read fails; None if none; OutOfTime past `budget_s` of re-reads."""
    if not_a_file_failure(exc):
        return None
    if len(set(files)) == 1:
        return files[0], exc
    named = named_file(exc, files)
    if named is not None:
        return named, exc
    deadline = time.monotonic() + budget_s
    for f in files:
        if time.monotonic() >= deadline:
            raise OutOfTime(f)
        batches = read_file(f)
        try:
            for _ in batches:
                if time.monotonic() >= deadline:
                    raise OutOfTime(f)
        except OutOfTime:
            raise
        except Exception as raised:
            return f, raised
        finally:
            batches.close()
    return None


def file_error(
    exc: BaseException,
    files: list[str],
    data_path: str,
    read_file: Callable[[str], Iterable],
    who: str,
    budget_s: float,
) -> DataError:
    """The sentence for `exc`, met while `who` read the data files `files`: the file it came from and
    what is wrong with it (`failing_file`), else what failed (and that no file could be pinned down)."""
    if isinstance(exc, DataError):
        return exc
    try:
        found = failing_file(exc, files, read_file, budget_s)
    except OutOfTime:
        said = read_failure(exc, who).args[0].rstrip(".")
        return DataError(
            f"{said}; which of its {len(files)} files this came from could not be pinned down "
            f"within {budget_s:.0f} s of reading them again one by one; point data.path at fewer "
            "files to find it."
        )
    if found is None:
        return read_failure(exc, who)
    bad, raised = found
    return _bad(Path(bad), _what(raised), data_path)
