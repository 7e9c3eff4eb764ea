"""The training streams, iterable datasets of ready micro-batches (x, y): `WindowStream` for a
`WindowSource`, `DocumentStream` for a `DocumentSource`; every DataLoader worker of every rank is
one reader (docs/data.md, "Ranks, workers and the order of windows", "Resuming a stream")."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from prism.data.errors import DataError, StreamStalled, from_worker
from prism.data.text import fingerprint, iter_text_batches
from prism.data.tokenizer import GPT2Tokenizer
from prism.data.windows import EpochShuffledWindows, TokenWindows, WindowShuffleBuffer


@dataclass(frozen=True)
class StreamPosition:
    """Which rank reads, in micro-batches of what size, and where its stream resumes."""

    rank: int
    world_size: int
    micro_batch: int
    start_window: int = 0  # window-stream position (global windows already consumed)
    rank_batches: int = 0  # document-stream position (micro-batches this rank consumed)
    # document streams: reader id -> saved reader state (None: the reader had not started), for
    # an exact resume; None = no saved states, so re-read and skip rank_batches micro-batches
    readers: dict | None = field(default=None, compare=False)


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def to_pair(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a (B, T+1) window batch, each contiguous: the DataLoader can pin
    them and the copy to the GPU runs asynchronously (a strided view would copy synchronously)."""
    w = windows.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(w[:, :-1])), torch.from_numpy(np.ascontiguousarray(w[:, 1:]))


@dataclass(eq=False)
class WindowStream(IterableDataset):
    """Micro-batches of windows cut from token arrays: `arrays()` returns them, and is called
    in the reader's own process (a memory map is made in the DataLoader worker that reads it)."""

    position: StreamPosition
    seq_len: int
    seed: int
    shuffle: bool
    arrays: Callable[[], list[np.ndarray]]
    _stream: EpochShuffledWindows | None = field(default=None, init=False, repr=False)

    def stream(self) -> EpochShuffledWindows:
        if self._stream is None:  # opened lazily, in the reading process
            windows = TokenWindows(self.arrays(), self.seq_len + 1)
            self._stream = EpochShuffledWindows(windows, self.seed, self.shuffle)
        return self._stream

    ahead = 64  # micro-batches whose window ids are computed in one vectorized call

    def __iter__(self):
        w, n_workers = _worker()
        lay, b = self.position, self.position.micro_batch
        stream = self.stream()
        j = w  # this rank's local micro-batch index; worker w owns j = w, w + W, ...
        while True:
            global_batch = lay.rank + lay.world_size * (j + n_workers * np.arange(self.ahead))
            positions = lay.start_window + global_batch[:, None] * b + np.arange(b)
            ids = stream.window_ids(positions.ravel()).reshape(self.ahead, b)
            for row in ids:
                yield to_pair(stream.windows.gather(row))
            j += n_workers * self.ahead


@dataclass(eq=False)
class _EpochUnits:
    """One epoch of a reader's shards ("units") in this epoch's order, for `iter_text_batches`;
    every batch is tagged with its unit and the datasets state *before* it (None at a unit's
    start), from which the unit reads the same batch again."""

    rds: object  # the reader's datasets.IterableDataset
    order: np.ndarray
    first_unit: int
    first_state: dict | None

    def iter(self, batch_size: int):
        n = len(self.order)
        for u in range(self.first_unit, n):
            unit = self.rds.shard(num_shards=n, index=int(self.order[u]))
            before = None
            if u == self.first_unit and self.first_state is not None:
                unit.load_state_dict(self.first_state)
                before = self.first_state
            for batch in unit.iter(batch_size=batch_size):
                yield {"text": batch["text"], "unit": u, "before": before}
                before = unit.state_dict()  # the unit's generator still waits right after `batch`


@dataclass(eq=False)
class DocumentStream(IterableDataset):
    """Micro-batches packed from a DocumentSource, one reader per DataLoader worker, each reading its
    share unit after unit in a seeded order per epoch; report=True yields (x, y, report)."""

    position: StreamPosition
    source: object  # a DocumentSource
    seq_len: int
    skip_fps: frozenset  # the held-out documents' fingerprints
    report: bool = False

    def __post_init__(self) -> None:
        self.data, self.window = self.source.data, self.seq_len + 1

    def _unit_order(self, n_units: int, reader: int, n_readers: int, epoch: int) -> np.ndarray:
        if not self.data.shuffle:
            return np.arange(n_units)
        # 7919 keeps this seed sequence apart from the shuffle buffer's [seed, reader, n_readers]
        return np.random.Generator(
            np.random.PCG64([self.data.seed, reader, n_readers, 7919, epoch])
        ).permutation(n_units)

    def _windows(self, rds, reader: int, n_readers: int, at: dict | None, shuffle: WindowShuffleBuffer):
        """This reader's windows, forever, through the shuffle buffer. Yields (window, where, taken):
        the reader's position after it is `where` (epoch, unit, datasets state before the current
        document batch, tokens carried into it, documents seen this epoch) plus `taken`."""
        d, w = self.data, self.window
        tok = GPT2Tokenizer()
        who = f"data reader {reader} of {n_readers}"
        at = at or {}
        epoch, unit, state = at.get("epoch", 0), at.get("unit", 0), at.get("datasets")
        carry = np.asarray(at.get("carry", ()), dtype=np.uint16)
        taken, docs = at.get("taken", 0), at.get("docs", 0)
        while True:
            units = _EpochUnits(rds, self._unit_order(rds.num_shards, reader, n_readers, epoch), unit, state)
            on_error = partial(self.source.read_error, who=who)
            for item in iter_text_batches(units, d.doc_batch, d.stall_timeout_s, who, None, on_error):
                where = dict(epoch=epoch, unit=item["unit"], datasets=item["before"], carry=carry, docs=docs)
                texts = [t for t in item["text"] if fingerprint(t) not in self.skip_fps]
                docs += len(texts)
                if texts:
                    flat = np.concatenate([carry, tok.encode_documents(texts, d.tokenizer_threads)])
                    n = len(flat) // w
                    carry = flat[n * w :].copy()
                    for k in range(taken, n):  # taken > 0 only for the batch a resume re-reads
                        out = shuffle.push(flat[k * w : (k + 1) * w])
                        if out is not None:
                            yield out, where, k + 1
                taken = 0
            if docs == 0:
                raise DataError(
                    f"{who} received no training documents: the data has too few "
                    "documents for world_size x data.num_workers readers; use fewer "
                    "workers or more data."
                )
            epoch, unit, state, docs = epoch + 1, 0, None, 0

    def __iter__(self):
        w, n_workers = _worker()
        lay, d = self.position, self.data
        # The DataLoader asks worker 0 first, so after c consumed batches worker w plays the role
        # of the reader that owned local batches j = c + w, c + w + W, ...
        role = (w + lay.rank_batches) % n_workers
        reader, n_readers = lay.rank * n_workers + role, lay.world_size * n_workers
        if lay.readers is not None:  # exact resume from where this reader stood
            saved, skip = lay.readers.get(reader), 0
        else:  # no saved state: re-read this role's share and skip the batches already used
            saved, skip = None, max(0, -(-(lay.rank_batches - role) // n_workers))
        cap = d.shuffle_buffer if d.shuffle else 0
        shuffle = WindowShuffleBuffer(
            cap, self.window, [d.seed, reader, n_readers], saved and saved["shuffle"]
        )
        rds = self.source.reader_documents(reader, n_readers)
        windows = self._windows(rds, reader, n_readers, saved and saved["position"], shuffle)
        b = lay.micro_batch
        batch = np.empty((b, self.window), dtype=np.uint16)
        while True:
            try:
                for row in range(b):
                    batch[row], where, taken = next(windows)
            except StreamStalled as exc:
                if not self.report:
                    raise
                # no stop mid-step, with the other ranks heading for its all-reduce: stand-ins until the
                # ranks agree to stop at its end, drop it and checkpoint the boundary (callbacks.preemption)
                x, y = to_pair(np.zeros_like(batch))
                while True:
                    yield x, y, {"reader": reader, "stalled": exc.args[0]}
            if skip:
                skip -= 1
                continue
            x, y = to_pair(batch)
            if self.report:
                position = {**where, "taken": taken}
                yield x, y, {"reader": reader, "position": position, "shuffle": shuffle.changes()}
            else:
                yield x, y


# ----- resume bookkeeping in the training process ---------------------------------------------
def to_plain(obj):
    """numpy arrays -> tensors, recursively: what torch.load(weights_only=True) reads back."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(obj):
    """The inverse of to_plain: tensors -> numpy arrays."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj


class ResumeTracker:
    """Each reader's state as of the last micro-batch the trainer consumed, mirrored from the reports
    that batches carry (readers run ahead in DataLoader workers): docs/data.md, "Resuming a stream"."""

    def __init__(self, saved: dict, cap: int, window: int, accumulation: int) -> None:
        self.saved = saved  # reader id -> state this stream starts from (None: fresh)
        self.cap, self.window, self.accumulation = cap, window, accumulation
        self.restart()

    def restart(self) -> None:
        """A new pass over the loader restarts every reader at `saved`."""
        self.pending: deque = deque()
        self.step: list[dict] = []  # reports of the optimizer step in progress
        self.positions: dict[int, dict] = {}
        self.buffers: dict[int, WindowShuffleBuffer] = {}
        self.lost = False

    def consumed(self) -> str | None:
        """One more micro-batch used by the trainer (the stall message of a stand-in); reports are
        applied a whole optimizer step at a time, so that `drop_step` can still take one back."""
        if not self.pending:  # a batch that did not come through the loader: states unknown
            self.lost = True
            return None
        self._commit_complete_step()
        self.step.append(self.pending.popleft())
        return self.step[-1].get("stalled")

    def drop_step(self) -> None:
        """Forget the micro-batches of the optimizer step in progress: it will not be applied."""
        self.step = []

    def _commit_complete_step(self) -> None:
        if len(self.step) == self.accumulation:
            for report in self.step:
                self._apply(report)
            self.step = []

    def _apply(self, report: dict) -> None:
        if "stalled" in report:  # a stand-in batch moved no reader (its step is never applied)
            return
        report = from_plain(report)  # the DataLoader made its arrays tensors
        r = report["reader"]
        if r not in self.buffers:  # a reader's first report holds its whole buffer
            self.buffers[r] = WindowShuffleBuffer(self.cap, self.window)
        self.buffers[r].apply(report["shuffle"])
        self.positions[r] = report["position"]

    def states(self) -> dict | None:
        """reader id -> state (None: not started; numpy form, see to_plain); None if tracking
        was lost."""
        if self.lost:
            return None
        # Checkpoints are written at step boundaries (a pass starts at one): after a complete
        # step, or after drop_step. A step cut short is not part of the state.
        self._commit_complete_step()
        now = {
            r: {"position": where, "shuffle": self.buffers[r].state()} for r, where in self.positions.items()
        }
        return {**self.saved, **now}


class TrainLoader(DataLoader):
    """A DataLoader whose workers' DataErrors arrive as their own sentence (torch re-raises them
    wrapped in the worker's traceback text; see errors.from_worker)."""

    def __iter__(self):
        try:
            yield from super().__iter__()
        except DataError as exc:
            raise from_worker(exc) from None


class ReportingLoader(TrainLoader):
    """A DataLoader over a DocumentStream(report=True): yields (x, y) like any other and hands
    every batch's report to the tracker, in delivery order."""

    def __init__(self, *args, tracker: ResumeTracker, on_pass, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tracker, self.on_pass = tracker, on_pass

    def __iter__(self):
        self.tracker.restart()
        self.on_pass()
        for x, y, report in super().__iter__():
            self.tracker.pending.append(report)  # stand-ins for a stalled reader too, in order
            yield x, y
