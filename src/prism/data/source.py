"""What a data source is: one class per kind of training data, delivering addressable windows
(`WindowSource`) or a stream of documents (`DocumentSource`); docs/data.md, "Adding a source"."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from functools import partial
from typing import ClassVar

import numpy as np
from torch.utils.data import IterableDataset

from prism.data.errors import DataError
from prism.data.heldout import Heldout, n_val_windows, split_heldout
from prism.data.streams import DocumentStream, StreamPosition, WindowStream
from prism.data.text import iter_text_batches, read_failure

log = logging.getLogger(__name__)


class DataSource(ABC):
    """One kind of training data, for one data section (`self.data`)."""

    # data.* keys this source cannot do without, each with what it holds (for the refusal)
    needs: ClassVar[dict[str, str]] = {}
    # data.* keys that say which data this source reads (hub: the dataset, subset and revision;
    # local/shards: the path): what a record of the run must hold to name its data
    identity_keys: ClassVar[tuple[str, ...]] = ()
    # whether the resume state holds each reader's own state (DocumentSource), not one position
    reader_states: ClassVar[bool] = False

    def __init__(self, data) -> None:
        self.data = data

    @property
    def name(self) -> str:
        return str(self.data.source)

    # ----- what it reads --------------------------------------------------------------------
    @abstractmethod
    def describe(self) -> str:
        """What this source reads, in a few words (the run's log and the dry-run plan)."""

    def where(self) -> str:
        """What this source reads, as the subject of an error message: the keys that say which
        data it is (`data.path='...'`), or its description."""
        keys = [f"data.{k}={getattr(self.data, k)!r}" for k in self.identity_keys]
        return ", ".join(keys) or self.describe()

    def identity(self) -> dict:
        """What a run read, independent of the machine (train_summary.json's `data`)."""
        return {"source": self.name}

    def unreachable(self) -> str | None:
        """Why this source cannot be read from this process (one sentence), or None."""
        return None

    # ----- what training reads ----------------------------------------------------------------
    @abstractmethod
    def build_heldout(self, seq_len: int) -> Heldout:
        """The fixed validation windows of this data (see prism.data.heldout for the rule)."""

    @abstractmethod
    def training_stream(
        self, position: StreamPosition, seq_len: int, heldout: Heldout, report: bool = False
    ) -> IterableDataset:
        """One rank's unbounded stream of (x, y) micro-batches, starting at `position`;
        report=True (reader_states only): (x, y, report) for the resume tracker."""


class WindowSource(DataSource):
    """A source whose tokens are all addressable: a seeded permutation of windows per epoch, the same
    for any number of ranks and workers, resumed from one global count of the windows consumed."""

    @abstractmethod
    def train_arrays(self, heldout: Heldout) -> list[np.ndarray]:
        """The training token arrays (uint16), windows cut from each in turn. Called in every
        reading process (a memory map is made by the DataLoader worker that reads it)."""

    def training_stream(
        self, position: StreamPosition, seq_len: int, heldout: Heldout, report: bool = False
    ) -> IterableDataset:
        arrays = partial(self.train_arrays, heldout)
        return WindowStream(position, seq_len, self.data.seed, self.data.shuffle, arrays)


class DocumentSource(DataSource):
    """A source of documents read as a `datasets` stream with a `text` column. The held-out set
    is the stream's leading documents; training skips them by fingerprint."""

    reader_states = True

    @abstractmethod
    def open_documents(self):
        """The streaming datasets.IterableDataset of all documents, only the `text` column, in
        the source's natural order (files in name order, rows in file order)."""

    def read_error(self, exc: BaseException, who: str) -> DataError:
        """The sentence for an exception met while reading this source's documents (`who`: the
        reader); a source of files names the file."""
        return read_failure(exc, who)

    def reader_documents(self, reader: int, n_readers: int):
        """Reader `reader`'s share of the documents: its own shards when there are enough (the
        units it reads and resumes one by one), else every n-th document."""
        from datasets.distributed import split_dataset_by_node

        ds = self.open_documents()
        try:  # parquet: one shard per row group, so a resume re-reads at most one row group
            ds = ds.reshard()
        except Exception:  # not every format can be resharded; whole files stay the shards
            pass
        if ds.num_shards >= n_readers:
            # Whole shards per reader (r, r+n, ...). Shard counts need not divide evenly: the
            # stream is unbounded, so a reader with one shard more repeats its epoch later.
            return ds.shard(num_shards=n_readers, index=reader, contiguous=False)
        if reader == 0:
            log.warning(
                f"data: {ds.num_shards} shard(s) for {n_readers} readers; every reader reads all of it and "
                f"keeps every {n_readers}-th document (correct but {n_readers}x the reading; use more files "
                "or shards)"
            )
        return split_dataset_by_node(ds, rank=reader, world_size=n_readers, strategy="examples")

    def build_heldout(self, seq_len: int) -> Heldout:
        d = self.data
        where = self.where()
        on_error = partial(self.read_error, who=where)
        batches = iter_text_batches(
            self.open_documents(), d.doc_batch, d.stall_timeout_s, where, on_error=on_error
        )
        held, rest = split_heldout(batches, n_val_windows(d.val_tokens, seq_len), seq_len + 1, where)
        rest.close()  # stops the reader thread
        return held

    def training_stream(
        self, position: StreamPosition, seq_len: int, heldout: Heldout, report: bool = False
    ) -> IterableDataset:
        return DocumentStream(position, self, seq_len, heldout.fingerprints, report=report)
