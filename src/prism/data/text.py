"""Reading documents (hub and local sources): their identity, the `text` column, and a reader
thread that cannot hang."""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Callable, Iterator

from prism.data.errors import DataError, StreamStalled
from prism.errors import cause

# what a source makes of an exception met while reading it: a DataError naming the file, if it can
OnError = Callable[[BaseException], DataError]


class MissingText(Exception):
    """A document whose text is missing or null (the stream's schema has the column, this record
    has no value); the reader turns it into a DataError naming where it is."""


def read_failure(exc: BaseException, where: str) -> DataError:
    """The sentence for an exception met while reading `where`, when the source can say no more."""
    if isinstance(exc, DataError):
        return exc
    if isinstance(exc, MissingText):
        return DataError(
            f"{where} holds a document without text (its 'text' field is missing or null); "
            "FineWeb-style data needs one text string per document."
        )
    return DataError(f"reading {where} failed: {cause(exc)}")


def fingerprint(text: str) -> bytes:
    """A stable 64-bit document identity (Python's hash() is salted per process)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def text_column(ds, where: str, on_error: OnError | None = None):
    """`ds` (a streaming datasets.IterableDataset) restricted to its `text` column, or a
    DataError naming what `where` holds instead (`on_error` names the file that failed)."""
    columns = list(ds.features) if ds.features is not None else None
    if columns is None:  # json schemas are inferred from the first record
        try:
            first = next(iter(ds.take(1)), None)
        except Exception as exc:
            raise (on_error or (lambda e: read_failure(e, where)))(exc) from None
        if first is None:
            raise DataError(f"{where} holds no documents.")
        columns = list(first)
    if "text" not in columns:
        raise DataError(
            f"{where} has no 'text' column (it has: {', '.join(columns)}); FineWeb-style data "
            "needs one text field per document."
        )
    return ds.select_columns(["text"])


def iter_text_batches(
    ds,
    batch_size: int,
    stall_timeout_s: float,
    where: str,
    key: str | None = "text",
    on_error: OnError | None = None,
) -> Iterator:
    """Lists of document texts from `ds` (key=None: whole batches), read by a background thread; a
    silence of `stall_timeout_s` raises StreamStalled, a failed read or textless document `on_error`."""
    on_error = on_error or (lambda exc: read_failure(exc, where))
    q: queue.Queue = queue.Queue(maxsize=8)
    stop = threading.Event()
    done = object()

    def reader() -> None:
        try:
            for batch in ds.iter(batch_size=batch_size):
                while not stop.is_set():
                    try:
                        q.put(batch if key is None else batch[key], timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            q.put(exc)

    thread = threading.Thread(target=reader, daemon=True, name="prism-data-reader")
    thread.start()
    try:
        while True:
            try:
                item = q.get(timeout=stall_timeout_s)
            except queue.Empty:
                raise StreamStalled(
                    f"no data arrived from {where} for {stall_timeout_s:.0f} s (network stall or hub outage)"
                ) from None
            if item is done:
                return
            if isinstance(item, BaseException):
                if isinstance(item, DataError):
                    raise item
                raise on_error(item) from item
            if any(t is None for t in (item if key is not None else item["text"])):
                raise on_error(MissingText(where)) from None
            yield item
    finally:
        stop.set()
