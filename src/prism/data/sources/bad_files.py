"""Local data files that cannot be read: which file, and what is wrong with it, in one sentence.

Two moments. Before anything is read, `check_data_file` makes the checks that cost a few bytes
per file: the file opens, is not empty, a `.gz` is gzip data, a parquet file has its footer and
a `text` column, a JSON Lines file's first record is a JSON object with a `text` field. What
only reading the whole file shows (a gzip stream cut short, a line further down that is not
JSON) surfaces from `datasets` mid-stream, as the library's own exception; `file_error` then
finds which of the data files it came from (the only one, or the first that fails when each is
read on its own) and says what that exception means.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Callable

from prism.data.errors import DataError
from prism.data.text import MissingText

GZIP_MAGIC = b"\x1f\x8b"
BLOCK_ROW = re.compile(r" in row \d+")  # pyarrow's row number counts within a block, not the file
FIRST_LINE_LIMIT = 1 << 20  # bytes of leading blank lines read before a file counts as blank


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
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot be read ({exc.strerror})"
    text = _first(exc)
    if "JSON parse error" in text:
        # pyarrow counts rows within the block it parsed, not within the file: leave them out
        return f"holds a line that is not JSON ({BLOCK_ROW.sub('', text)})"
    if "parquet" in text.lower() or type(exc).__name__ in ("ArrowInvalid", "ArrowIOError"):
        return f"cannot be decoded ({text}); it is cut short or corrupt"
    return f"could not be read ({text})"


def failing_file(
    exc: BaseException, files: list[str], read_file: Callable[[str], object]
) -> tuple[str, BaseException] | None:
    """Which of `files` failed, and what reading it raised: the only file and `exc`, else the
    first file whose own full read (`read_file`, on the error path only) raises; None when every
    file reads (the failure was not a file's)."""
    if len(files) == 1:
        return files[0], exc
    for f in files:
        try:
            read_file(f)
        except Exception as raised:
            return f, raised
    return None


def file_error(
    exc: BaseException, files: list[str], data_path: str, read_file: Callable[[str], object]
) -> DataError | None:
    """A DataError naming the data file `exc` came from and what is wrong with it, or None when
    the file cannot be told. `read_file(f)` reads file `f` in full as the stream reads it, and
    raises MissingText at a record without text, as the stream does."""
    if isinstance(exc, DataError):
        return exc
    found = failing_file(exc, files, read_file)
    if found is None:
        return None
    bad, raised = found
    return _bad(Path(bad), _what(raised), data_path)
