"""Where documents come from: Python's own docs (offline), the Hugging Face hub, or local files.

`hub` and `local` share one path: `datasets.load_dataset(..., streaming=True)` restricted to the
`text` column, so a local copy of FineWeb behaves exactly like the hub stream.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from prism.data.errors import DataError, StreamStalled

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

# file suffix -> datasets builder; .txt files are one document per file
_BUILDERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".jsonl.gz": "json",
    ".json.gz": "json",
    ".txt": "text",
}


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
            raise DataError(
                f"data.path entry {part!r} does not exist; give a .parquet/.jsonl/.txt file "
                "or a folder of them."
            )
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _suffix(f) in _BUILDERS)
            if not found:
                raise DataError(f"data.path folder {part!r} holds no .parquet, .jsonl, .json or .txt files.")
            files.extend(found)
        else:
            if _suffix(p) not in _BUILDERS:
                raise DataError(
                    f"data.path file {part!r} has an unsupported type; use .parquet, .jsonl, "
                    ".json(.gz) or .txt."
                )
            files.append(p)
    if not files:
        raise DataError(f"data.path={path_spec!r} names no files.")
    builders = {_BUILDERS[_suffix(f)] for f in files}
    if len(builders) > 1:
        raise DataError(
            f"data.path={path_spec!r} mixes file types ({', '.join(sorted(builders))}); "
            "point it at files of one type."
        )
    return builders.pop(), [str(f) for f in files]


HUB_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_switched_off() -> str | None:
    """The environment variable that switches the Hugging Face hub off, if one does."""
    return next(
        (v for v in HUB_SWITCHES if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")), None
    )


def check_source_reachable(data) -> None:
    """data.source=hub with the hub switched off can only fail, after the job was queued and the
    GPUs held: say so before anything starts."""
    switch = hub_switched_off()
    if data.source == "hub" and switch:
        raise DataError(
            f"data.source=hub streams {data.hub_name} from the Hugging Face hub, but {switch}="
            f"{os.environ[switch]} switches the hub off; use data.source=shards or local with "
            f"data.path (README, Data), or unset {switch}."
        )


def data_identity(data) -> dict:
    """What a run read, independent of the machine: the hub dataset at its revision, or the
    source kind and the names (not the paths) of local files."""
    if data.source == "hub":
        return {"source": "hub", "name": data.hub_name, "subset": data.subset, "revision": data.revision}
    if data.source == "local" and data.path:
        return {"source": "local", "files": [Path(f).name for f in local_data_files(data.path)[1]]}
    return {"source": str(data.source)}


def configure_hub_retries(retries: int, interval_s: float) -> None:
    """Raise datasets' streaming retry budget: a long run should ride out hub hiccups."""
    import datasets.config as dc

    dc.STREAMING_READ_MAX_RETRIES = retries
    dc.STREAMING_READ_RETRY_INTERVAL = interval_s
    dc.STREAMING_OPEN_MAX_RETRIES = retries
    dc.STREAMING_OPEN_RETRY_INTERVAL = interval_s


def transient(exc: BaseException) -> bool:
    """Whether an error opening a hub dataset can pass if tried again later: a refused, reset or
    timed-out connection, or an HTTP 429/5xx, anywhere in its chain of causes. A missing dataset,
    subset or revision is not, and fails at once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)):  # datasets' "Couldn't reach ... on the Hub"
            return True
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        if type(exc).__name__ in (
            "ConnectError",
            "ConnectTimeout",
            "ReadTimeout",
            "ReadError",
            "RemoteProtocolError",
            "ProxyError",
            "ChunkedEncodingError",
            "ServerDisconnectedError",
            "ClientConnectorError",
        ):
            return True  # httpx / requests / aiohttp transport errors, named without importing them
        exc = exc.__cause__ or exc.__context__
    return False


def open_with_backoff(
    open_fn, what: str, attempts: int, first_delay_s: float, max_delay_s: float = 300.0, sleep=time.sleep
):
    """open_fn(), tried up to `attempts` times while it fails transiently. The waits double from
    first_delay_s up to max_delay_s and are jittered (x0.5..1), so the hundreds of readers of a
    multi-node run that lost the hub together do not come back in lockstep."""
    jitter = random.Random(os.getpid() ^ time.time_ns())  # distinct per reader process
    for attempt in range(1, attempts + 1):
        try:
            return open_fn()
        except Exception as exc:  # connection errors come in many types; keep the cause visible
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if not transient(exc):
                raise DataError(f"cannot open {what} ({cause}).") from exc
            if attempt == attempts:
                raise DataError(
                    f"cannot open {what} after {attempts} attempt(s) ({cause}); without "
                    "internet use data.source=local or data.source=shards."
                ) from exc
            delay = min(max_delay_s, first_delay_s * 2 ** (attempt - 1)) * jitter.uniform(0.5, 1.0)
            log.warning(
                "data: opening %s failed (%s); attempt %d of %d in %.1f s",
                what,
                cause,
                attempt + 1,
                attempts,
                delay,
            )
            sleep(delay)


def open_text_dataset(data) -> "datasets.IterableDataset":
    """The streaming dataset (only the `text` column) for data.source hub or local."""
    import datasets

    if data.source == "hub":
        configure_hub_retries(data.hub_retries, data.hub_retry_interval_s)
        where = f"{data.hub_name}/{data.subset}@{data.revision}"
        ds = open_with_backoff(
            lambda: datasets.load_dataset(
                data.hub_name, name=data.subset, split="train", streaming=True, revision=data.revision
            ),
            f"{where} on the Hugging Face hub",
            1 if hub_switched_off() else data.hub_open_attempts,  # offline mode never passes
            data.hub_retry_interval_s,
        )
    elif data.source == "local":
        if not data.path:
            raise DataError("data.source=local needs data.path, the file(s) or folder to read.")
        builder, files = local_data_files(data.path)
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        ds = datasets.load_dataset(
            builder, data_files={"train": files}, split="train", streaming=True, **kwargs
        )
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
        raise DataError(
            f"{where} has no 'text' column (it has: {', '.join(columns)}); FineWeb-style data "
            "needs one text field per document."
        )
    return ds.select_columns(["text"])


def iter_text_batches(
    ds, batch_size: int, stall_timeout_s: float, where: str, key: str | None = "text"
) -> Iterator:
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
                raise StreamStalled(
                    f"no data arrived from {where} for {stall_timeout_s:.0f} s (network stall or hub outage)"
                ) from None
            if item is done:
                return
            if isinstance(item, BaseException):
                if isinstance(item, DataError):
                    raise item
                raise DataError(
                    f"reading {where} failed: {type(item).__name__}: "
                    f"{str(item).splitlines()[0] if str(item) else ''}"
                ) from item
            yield item
    finally:
        stop.set()
