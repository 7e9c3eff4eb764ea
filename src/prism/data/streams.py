"""The training streams: iterable datasets that yield ready micro-batches (x, y).

Every DataLoader worker of every rank is one *reader*. Two kinds:

* `WindowStream` (offline, shards): windows are addressable, so the stream is defined globally:
  global micro-batch i holds windows [i*B, (i+1)*B) of the seeded epoch permutation, and it goes
  to rank i % world_size, worker (i // world_size) % num_workers. The DataLoader interleaves its
  workers round-robin, so each rank sees its micro-batches in global order and the set of windows
  per optimizer step is the same for 2 ranks x 1 accumulation as for 1 rank x 2 accumulations.
* `DocumentStream` (hub, local): documents arrive as a stream, so each reader gets a disjoint
  share through `datasets.split_dataset_by_node` and packs its own windows. The order then
  depends on world_size x num_workers (not on anything else); an exact resume needs the same
  layout.

Both are unbounded (epochs repeat with a fresh shuffle), so every rank always has a next batch
and DDP never waits on an uneven tail; the trainer stops by max_steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from prism.data import shards as shard_io
from prism.data.errors import DataError
from prism.data.sources import fingerprint, iter_text_batches, open_text_dataset
from prism.data.tokenizer import GPT2Tokenizer
from prism.data.windows import EpochShuffledWindows, TokenWindows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """Where this rank stands and where the stream resumes."""
    rank: int
    world_size: int
    micro_batch: int
    start_window: int = 0       # window-stream position (global windows already consumed)
    rank_batches: int = 0       # document-stream position (micro-batches this rank consumed)


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def to_pair(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(windows.astype(np.int64))
    return t[:, :-1], t[:, 1:]


class WindowStream(IterableDataset):
    def __init__(self, layout: Layout, seq_len: int, seed: int, shuffle: bool,
                 tokens: np.ndarray | None = None, shard_paths: list[str] | None = None) -> None:
        self.layout, self.window, self.seed, self.shuffle = layout, seq_len + 1, seed, shuffle
        self.tokens, self.shard_paths = tokens, shard_paths
        self._stream: EpochShuffledWindows | None = None

    def stream(self) -> EpochShuffledWindows:
        if self._stream is None:  # opened lazily: memory maps are made in the worker process
            arrays = [self.tokens] if self.tokens is not None else \
                [shard_io.open_shard(p) for p in self.shard_paths]
            self._stream = EpochShuffledWindows(TokenWindows(arrays, self.window), self.seed, self.shuffle)
        return self._stream

    ahead = 64  # micro-batches whose window ids are computed in one vectorized call

    def __iter__(self):
        w, n_workers = _worker()
        lay, b = self.layout, self.layout.micro_batch
        stream = self.stream()
        j = w  # this rank's local micro-batch index; worker w owns j = w, w + W, ...
        while True:
            global_batch = lay.rank + lay.world_size * (j + n_workers * np.arange(self.ahead))
            positions = lay.start_window + global_batch[:, None] * b + np.arange(b)
            ids = stream.window_ids(positions.ravel()).reshape(self.ahead, b)
            for row in ids:
                yield to_pair(stream.windows.gather(row))
            j += n_workers * self.ahead


class DocumentStream(IterableDataset):
    def __init__(self, layout: Layout, data, seq_len: int, heldout_fingerprints: frozenset) -> None:
        self.layout, self.data, self.window = layout, data, seq_len + 1
        self.skip_fps = heldout_fingerprints

    def _reader_dataset(self, reader: int, n_readers: int):
        from datasets.distributed import split_dataset_by_node

        ds = open_text_dataset(self.data)
        if n_readers == 1:
            return ds
        if ds.num_shards < n_readers:
            try:  # parquet row groups become shards, often enough to give every reader its own
                ds = ds.reshard()
            except Exception:  # not every format can be resharded; fall through to examples
                pass
        if ds.num_shards >= n_readers:
            # Whole shards per reader: nobody reads another reader's bytes. Shard counts need not
            # divide evenly: the stream is unbounded, so a reader with one shard more just
            # repeats its epoch a little later (datasets' "auto" would instead make every reader
            # download everything and keep 1/n of it whenever the division is uneven).
            return split_dataset_by_node(ds, rank=reader, world_size=n_readers, strategy="shards")
        if reader == 0:
            log.warning("data: %d shard(s) for %d readers; every reader reads all of it and keeps "
                        "every %d-th document (correct but %dx the reading; use more files or shards)",
                        ds.num_shards, n_readers, n_readers, n_readers)
        return split_dataset_by_node(ds, rank=reader, world_size=n_readers, strategy="examples")

    def _windows(self, ds, reader: int, n_readers: int):
        """This reader's packed windows, forever: its documents in order, EOT-joined, cut into
        windows of seq_len+1, passed through a seeded shuffle buffer of windows."""
        d = self.data
        tok = GPT2Tokenizer()
        rng = np.random.Generator(np.random.PCG64([d.seed, reader, n_readers]))
        cap = d.shuffle_buffer if d.shuffle else 0
        buf = np.empty((cap, self.window), dtype=np.uint16)
        filled = 0
        carry = np.zeros(0, dtype=np.uint16)
        where = f"data reader {reader} of {n_readers}"
        epoch = 0
        while True:
            # datasets shuffles the shard order whenever the epoch is non-zero, before the
            # split across readers, so all readers agree; seeded by (data.seed, epoch)
            ds.set_epoch(1 + d.seed * 100_003 + epoch if d.shuffle else 0)
            docs_seen = 0
            for texts in iter_text_batches(ds, d.doc_batch, d.stall_timeout_s, where):
                texts = [t for t in texts if fingerprint(t) not in self.skip_fps]
                docs_seen += len(texts)
                if not texts:
                    continue
                flat = np.concatenate([carry, tok.encode_documents(texts, d.tokenizer_threads)])
                n = len(flat) // self.window
                carry = flat[n * self.window:]
                for win in flat[:n * self.window].reshape(n, self.window):
                    if filled < cap:
                        buf[filled] = win
                        filled += 1
                    elif cap:
                        j = int(rng.integers(cap))
                        out = buf[j].copy()
                        buf[j] = win
                        yield out
                    else:
                        yield win
            if docs_seen == 0:
                raise DataError(f"{where} received no training documents: the data has too few "
                                "documents for world_size x data.num_workers readers; use fewer "
                                "workers or more data.")
            epoch += 1

    def __iter__(self):
        w, n_workers = _worker()
        lay = self.layout
        # The DataLoader asks worker 0 first, so after c consumed batches worker w plays the role
        # of the reader that owned local batches j = c + w, c + w + W, ...; it re-reads its share
        # and skips the batches of that role which were already used.
        role = (w + lay.rank_batches) % n_workers
        reader, n_readers = lay.rank * n_workers + role, lay.world_size * n_workers
        skip = max(0, -(-(lay.rank_batches - role) // n_workers))
        windows = self._windows(self._reader_dataset(reader, n_readers), reader, n_readers)
        b = lay.micro_batch
        batch = np.empty((b, self.window), dtype=np.uint16)
        while True:
            for row in range(b):
                batch[row] = next(windows)
            if skip:
                skip -= 1
                continue
            yield to_pair(batch)
