"""Where documents come from: Python's own docs (offline), the Hugging Face hub, or local files.

`hub` and `local` share one path: `datasets.load_dataset(..., streaming=True)` restricted to the
`text` column, so a local copy of FineWeb behaves exactly like the hub stream.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from prism.data.errors import DataError

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

# file suffix -> datasets builder; .txt files are one document per file
_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".jsonl.gz": "json",
             ".json.gz": "json", ".txt": "text"}


def offline_documents() -> list[str]:
    """The English reference text every CPython ships (`pydoc_data.topics`, ~110k GPT-2 tokens):
    real prose and code that needs no network and no files. Sorted by topic for a fixed order."""
    from pydoc_data.topics import topics
    return [topics[k] for k in sorted(topics)]


def fingerprint(text: str) -> bytes:
    """A stable 64-bit document identity (Python's hash() is salted per process)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suf in sorted(_BUILDERS, key=len, reverse=True):
        if name.endswith(suf):
            return suf
    return path.suffix.lower()


def local_data_files(path_spec: str) -> tuple[str, list[str]]:
    """Resolve data.path (a file, a folder searched recursively, or a comma-separated list of
    them) into one datasets builder name and a sorted list of files."""
    files: list[Path] = []
    for part in [p.strip() for p in str(path_spec).split(",") if p.strip()]:
        p = Path(part).expanduser()
        if not p.exists():
            raise DataError(f"data.path entry {part!r} does not exist; give a .parquet/.jsonl/.txt file "
                            "or a folder of them.")
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _suffix(f) in _BUILDERS)
            if not found:
                raise DataError(f"data.path folder {part!r} holds no .parquet, .jsonl, .json or .txt files.")
            files.extend(found)
        else:
            if _suffix(p) not in _BUILDERS:
                raise DataError(f"data.path file {part!r} has an unsupported type; use .parquet, .jsonl, "
                                ".json(.gz) or .txt.")
            files.append(p)
    if not files:
        raise DataError(f"data.path={path_spec!r} names no files.")
    builders = {_BUILDERS[_suffix(f)] for f in files}
    if len(builders) > 1:
        raise DataError(f"data.path={path_spec!r} mixes file types ({', '.join(sorted(builders))}); "
                        "point it at files of one type.")
    return builders.pop(), [str(f) for f in files]


HUB_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_switched_off() -> str | None:
    """The environment variable that switches the Hugging Face hub off, if one does."""
    return next((v for v in HUB_SWITCHES if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")),
                None)


def check_source_reachable(data) -> None:
    """data.source=hub with the hub switched off can only fail, after the job was queued and the
    GPUs held: say so before anything starts."""
    switch = hub_switched_off()
    if data.source == "hub" and switch:
        raise DataError(
            f"data.source=hub streams {data.hub_name} from the Hugging Face hub, but {switch}="
            f"{os.environ[switch]} switches the hub off; use data.source=shards or local with "
            f"data.path (README, Data), or unset {switch}.")


def configure_hub_retries(retries: int, interval_s: float) -> None:
    """Raise datasets' streaming retry budget: a long run should ride out hub hiccups."""
    import datasets.config as dc
    dc.STREAMING_READ_MAX_RETRIES = retries
    dc.STREAMING_READ_RETRY_INTERVAL = interval_s
    dc.STREAMING_OPEN_MAX_RETRIES = retries
    dc.STREAMING_OPEN_RETRY_INTERVAL = interval_s


def open_text_dataset(data) -> "datasets.IterableDataset":
    """The streaming dataset (only the `text` column) for data.source hub or local."""
    import datasets

    if data.source == "hub":
        configure_hub_retries(data.hub_retries, data.hub_retry_interval_s)
        try:
            ds = datasets.load_dataset(data.hub_name, name=data.subset, split="train", streaming=True)
        except Exception as exc:  # connection errors come in many types; keep the cause visible
            raise DataError(f"cannot open {data.hub_name} (subset {data.subset}) on the Hugging Face hub "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                            "without internet use data.source=local or data.source=shards.") from exc
        where = f"{data.hub_name}/{data.subset}"
    elif data.source == "local":
        if not data.path:
            raise DataError("data.source=local needs data.path, the file(s) or folder to read.")
        builder, files = local_data_files(data.path)
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        ds = datasets.load_dataset(builder, data_files={"train": files}, split="train", streaming=True,
                                   **kwargs)
        where = data.path
    else:
        raise DataError(f"data.source={data.source!r} is not a streaming text source (hub or local).")
    columns = list(ds.features) if ds.features is not None else None
    if columns is None:  # json schemas are inferred from the first record
        try:
            first = next(iter(ds.take(1)), None)
        except Exception as exc:
            raise DataError(f"cannot read {where}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
        if first is None:
            raise DataError(f"{where} holds no documents.")
        columns = list(first)
    if "text" not in columns:
        raise DataError(f"{where} has no 'text' column (it has: {', '.join(columns)}); FineWeb-style data "
                        "needs one text field per document.")
    return ds.select_columns(["text"])


def iter_text_batches(ds, batch_size: int, stall_timeout_s: float, where: str,
                      key: str | None = "text") -> Iterator:
    """Lists of document texts from `ds`, read by a background thread so network/parquet decoding
    overlaps tokenization; a source silent for `stall_timeout_s` raises instead of hanging.
    key=None hands over each batch whole (the training readers tag batches with resume state)."""
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
                raise DataError(f"no data arrived from {where} for {stall_timeout_s:.0f} s (network stall "
                                "or hub outage); check connectivity or raise data.stall_timeout_s.") from None
            if item is done:
                return
            if isinstance(item, BaseException):
                if isinstance(item, DataError):
                    raise item
                raise DataError(f"reading {where} failed: {type(item).__name__}: "
                                f"{str(item).splitlines()[0] if str(item) else ''}") from item
            yield item
    finally:
        stop.set()
