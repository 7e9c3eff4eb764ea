"""data.source=hub: a Hugging Face hub dataset (FineWeb) at a pinned revision, streamed."""

from __future__ import annotations

import logging
import os
import random
import time

from prism.data.errors import DataError
from prism.data.hub_offline import hub_offline_switch
from prism.data.source import DocumentSource
from prism.data.text import text_column
from prism.errors import cause, exception_chain

log = logging.getLogger(__name__)
# httpx / requests / aiohttp transport errors, named without importing them
TRANSPORT_ERRORS = frozenset(
    """ConnectError ConnectTimeout ReadTimeout ReadError RemoteProtocolError ProxyError
    ChunkedEncodingError ServerDisconnectedError ClientConnectorError""".split()
)


def transient(exc: BaseException) -> bool:
    """Whether an error opening a hub dataset can pass if tried again later: a refused, reset or
    timed-out connection, or an HTTP 429/5xx, anywhere in its chain of causes."""
    for e in exception_chain(exc):
        if isinstance(e, (ConnectionError, TimeoutError)):  # datasets' "Couldn't reach ... on the Hub"
            return True
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        if type(e).__name__ in TRANSPORT_ERRORS:
            return True
    return False


def open_with_backoff(
    open_fn, what: str, attempts: int, first_delay_s: float, max_delay_s: float = 300.0, sleep=time.sleep
):
    """open_fn(), tried up to `attempts` times while it fails transiently, the waits doubling up to
    max_delay_s, jittered so that the readers of a multi-node run do not come back in lockstep."""
    jitter = random.Random(os.getpid() ^ time.time_ns())  # distinct per reader process
    for attempt in range(1, attempts + 1):
        try:
            return open_fn()
        except Exception as exc:  # connection errors come in many types; keep the cause visible
            why = cause(exc)
            if not transient(exc):
                raise DataError(f"cannot open {what} ({why}).") from exc
            if attempt == attempts:
                raise DataError(
                    f"cannot open {what} after {attempts} attempt(s) ({why}); without "
                    "internet use data.source=local or data.source=shards."
                ) from exc
            delay = min(max_delay_s, first_delay_s * 2 ** (attempt - 1)) * jitter.uniform(0.5, 1.0)
            log.warning(
                f"data: opening {what} failed ({why}); attempt {attempt + 1} of {attempts} in {delay:.1f} s"
            )
            sleep(delay)


class HubSource(DocumentSource):
    """data.hub_name / data.subset at data.revision, streamed from the Hugging Face hub."""

    identity_keys = ("hub_name", "subset", "revision")

    def describe(self) -> str:
        return f"Hugging Face hub {self.where()}, streamed"

    def where(self) -> str:
        d = self.data
        return f"{d.hub_name} ({d.subset}@{d.revision})"

    def identity(self) -> dict:
        d = self.data
        return {"source": self.name, "name": d.hub_name, "subset": d.subset, "revision": d.revision}

    def unreachable(self) -> str | None:
        """The hub switched off can only fail, after the job was queued and the GPUs held."""
        switch = hub_offline_switch()
        if switch is None:
            return None
        var, value = switch
        d = self.data
        return (
            f"data.source=hub streams {d.hub_name} from the Hugging Face hub, but {var}={value} "
            f"switches the hub off; where the hub is reachable run `python reproduce/prepare_fineweb.py "
            f"--source hub --subset {d.subset} --out DIR` and pass data.source=shards data.path=DIR, "
            f"or pass data.source=local data.path=FILES for a local copy (docs/data.md), or unset {var}."
        )

    def open_documents(self):
        import datasets
        import datasets.config as dc

        d = self.data
        # datasets' streaming retry budget raised: a long run should ride out hub hiccups
        dc.STREAMING_READ_MAX_RETRIES = dc.STREAMING_OPEN_MAX_RETRIES = d.hub_retries
        dc.STREAMING_READ_RETRY_INTERVAL = dc.STREAMING_OPEN_RETRY_INTERVAL = d.hub_retry_interval_s
        where = f"{d.hub_name}/{d.subset}@{d.revision}"
        ds = open_with_backoff(
            lambda: datasets.load_dataset(
                d.hub_name, name=d.subset, split="train", streaming=True, revision=d.revision
            ),
            f"{where} on the Hugging Face hub",
            1 if hub_offline_switch() else d.hub_open_attempts,  # offline mode never passes
            d.hub_retry_interval_s,
        )
        return text_column(ds, where)
