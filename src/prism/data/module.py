"""TokenStreamDataModule, the Lightning face of the data pipeline for any source: training micro-batches,
held-out windows split over ranks, and the resume state (docs/data.md, "Resuming a stream")."""

from __future__ import annotations

import logging
from functools import partial

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, IterableDataset

from prism.data.errors import DataError
from prism.data.heldout import cached_heldout
from prism.data.sources import source_for
from prism.data.streams import (
    ReportingLoader,
    ResumeTracker,
    StreamPosition,
    TrainLoader,
    from_plain,
    to_pair,
    to_plain,
)

log = logging.getLogger(__name__)
STATE_FORMAT = 2
READABLE_FORMATS = (1, 2)
OLD_STATE_KEYS = ("FineWebDataModule",)  # the data module's class name in older checkpoints


class _ValStream(IterableDataset):
    """This rank's share of the validation batches: global val batch i goes to rank i % world."""

    def __init__(self, windows: np.ndarray, batch: int, rank: int, world: int) -> None:
        self.windows, self.batch, self.rank, self.world = windows, batch, rank, world
        self.n_batches = (len(windows) // batch) // world * world

    def __len__(self) -> int:
        return self.n_batches // self.world

    def __iter__(self):
        for i in range(self.rank, self.n_batches, self.world):
            yield to_pair(self.windows[i * self.batch : (i + 1) * self.batch])


def _worker_init(worker_id: int) -> None:
    """Lightning's worker seeding, plus: a worker ignores the scheduler's stop signals, which
    Slurm sends to every process of a step; the training process handles them (Preemption)."""
    from lightning.fabric.utilities.seed import pl_worker_init_function

    from prism.cluster import worker_stop_signals

    worker_stop_signals()
    pl_worker_init_function(worker_id)


class TokenStreamDataModule(L.LightningDataModule):
    """Training and validation micro-batches of token windows from the run's data source."""

    def __init__(self, cfg, micro_batch: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.data = cfg.data
        self.source = source_for(cfg.data)
        self.seq_len = cfg.model.seq_len
        # the values were checked with the config (prism.config.values), the split by the run's plan
        self.micro_batch = int(micro_batch or cfg.train.micro_batch)
        self._rank_batches = 0  # training micro-batches this rank has consumed
        self._start_window = 0  # window streams: global windows consumed before this run
        self._resume_rank_batches = 0
        self._saved_readers: dict | None = None  # reader states: reader id -> state to resume from
        self._exact = True  # False: resume by re-reading (see load_state_dict)
        self._tracker: ResumeTracker | None = None
        self._heldout = None
        self.stalled: str | None = None  # a reader's stall message, once a stand-in batch was used

    # ----- where am I -------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return int(trainer.global_rank), int(trainer.world_size)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    # ----- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._heldout is None:
            rank, _ = self._rank_world()
            if rank == 0:
                rank_zero_info(f"data: source = {self.source.describe()}")
            self._heldout = cached_heldout(self.source, self.seq_len)

    @property
    def heldout(self):
        self.setup()
        return self._heldout

    def _reader_ids(self, rank: int) -> range:
        """Global ids of this rank's readers (one per DataLoader worker, one without workers)."""
        n = max(1, self.data.num_workers)
        return range(rank * n, (rank + 1) * n)

    def _rank_readers(self, rank: int) -> dict:
        """Reader id -> state this rank's readers start from (None: fresh); empty when resuming
        by re-reading (a reader's state is unknown until it delivers a batch)."""
        if not self._exact:
            return {}
        saved = self._saved_readers or {}
        return {r: saved.get(r) for r in self._reader_ids(rank)}

    def train_dataset(
        self, rank: int | None = None, world_size: int | None = None, report: bool = False
    ) -> IterableDataset:
        """This rank's training stream from the resume point (report=True: batches carry reader
        reports); the held-out set is built first, so bad data fails before any worker starts."""
        rank, world = (rank, world_size) if world_size is not None else self._rank_world()
        readers = self._rank_readers(rank) if self._exact else None
        position = StreamPosition(
            rank, world, self.micro_batch, self._start_window, self._resume_rank_batches, readers
        )
        return self.source.training_stream(position, self.seq_len, self.heldout, report=report)

    def train_dataloader(self) -> DataLoader:
        workers = self.data.num_workers
        dataset = self.train_dataset(report=self.source.reader_states)
        loader = TrainLoader
        if self.source.reader_states:  # track reader states of the batches consumed
            rank, _ = self._rank_world()
            cap = self.data.shuffle_buffer if self.data.shuffle else 0
            accumulation = int(getattr(self.trainer, "accumulate_grad_batches", 1))
            self._tracker = ResumeTracker(self._rank_readers(rank), cap, self.seq_len + 1, accumulation)
            loader = partial(ReportingLoader, tracker=self._tracker, on_pass=self._new_pass)
        return loader(
            dataset,
            batch_size=None,
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),
            worker_init_fn=_worker_init,
            persistent_workers=workers > 0,
            prefetch_factor=self.data.prefetch_factor if workers > 0 else None,
        )

    def _new_pass(self) -> None:
        self._rank_batches = 0  # a new pass over the loader starts again at the resume point

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_dataset(), batch_size=None, num_workers=0, pin_memory=torch.cuda.is_available()
        )

    def val_dataset(self, rank: int | None = None, world_size: int | None = None) -> IterableDataset:
        """This rank's validation batches (default rank/world: the trainer's or process group's)."""
        rank, world = (rank, world_size) if world_size is not None else self._rank_world()
        windows = self.heldout.windows
        batch = min(self.micro_batch, max(1, len(windows) // world))  # a tiny set: one batch per rank
        ds = _ValStream(windows, batch, rank, world)
        dropped = len(windows) - ds.n_batches * batch
        if dropped and rank == 0:
            log.warning(
                f"data: {dropped} of {len(windows)} validation windows do not fill a batch on every rank and "
                "are not evaluated"
            )
        return ds

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        trainer = getattr(self, "trainer", None)
        if trainer is None or (trainer.training and not trainer.sanity_checking):
            self._rank_batches += 1
            if self._tracker is not None:
                self.stalled = self._tracker.consumed() or self.stalled
        return batch

    def drop_step(self, micro_batches: int) -> None:
        """Take back the `micro_batches` of the optimizer step in progress, which training drops
        (a stalled reader fed it stand-ins): the next checkpoint resumes before them."""
        self._rank_batches -= micro_batches
        if self._tracker is not None:
            self._tracker.drop_step()

    # ----- resume -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        rank, world = self._rank_world()
        consumed = self._rank_batches
        state = {
            "format": STATE_FORMAT,
            "source": str(self.data.source),  # a plain str: checkpoints load with weights_only
            "seed": int(self.data.seed),
            "seq_len": int(self.seq_len),
            "micro_batch": int(self.micro_batch),
            "world_size": int(world),
            "num_workers": int(self.data.num_workers),
            # window streams: every rank consumed the same count, so the global position is
            # the resume point plus this many windows (valid for any new world size/micro-batch)
            "windows_consumed": int(self._start_window + consumed * world * self.micro_batch),
            "rank_batches": int(self._resume_rank_batches + consumed),
        }
        if self.source.reader_states:
            state["readers"] = self._all_reader_states(rank, world)
        return state

    def _all_reader_states(self, rank: int, world: int) -> dict | None:
        """Reader id -> state for the readers of every rank, gathered on rank 0, which alone
        writes the checkpoint; None if one rank cannot say, and on the other ranks."""
        # no loader in this process yet: still the states it would start from
        local = self._tracker.states() if self._tracker is not None else self._rank_readers(rank)
        parts = [local]
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            parts = [None] * world if rank == 0 else None
            torch.distributed.gather_object(local, parts, dst=0)  # numpy pickles; uint16 tensors not
            if rank != 0:
                return None
        if any(p is None for p in parts):
            return None
        return to_plain({r: s for p in parts for r, s in p.items()})

    def load_state_dict(self, state: dict) -> None:
        fmt = state.get("format")
        if fmt not in READABLE_FORMATS:
            raise DataError(
                f"data state format {fmt!r} is not one of {READABLE_FORMATS}; the "
                "checkpoint was written by another version of the data pipeline."
            )
        for key, now in (("source", self.data.source), ("seed", self.data.seed), ("seq_len", self.seq_len)):
            if state[key] != now:
                raise DataError(
                    f"the checkpoint's data {key}={state[key]!r} differs from this run's "
                    f"{now!r}; resuming would not continue the same token stream."
                )
        self._rank_batches = 0
        self._start_window = int(state["windows_consumed"])
        self._resume_rank_batches = int(state["rank_batches"])
        self._saved_readers, self._exact = None, True
        if not self.source.reader_states:
            return
        rank, world = self._rank_world()
        layout = (world, self.data.num_workers, self.micro_batch)
        saved = (state["world_size"], state["num_workers"], state["micro_batch"])
        readers, ids = state.get("readers"), self._reader_ids(rank)
        if layout == saved and readers is not None and all(r in readers for r in ids):
            self._saved_readers = {r: from_plain(s) for r, s in readers.items() if r in ids}
            return
        # re-read up to the same token count: each reader's share depends on the layout
        self._exact = False
        self._resume_rank_batches = state["windows_consumed"] // (world * self.micro_batch)
        if layout != saved:
            why = "world_size x num_workers x micro_batch = {} x {} x {} instead of {} x {} x {}".format(
                *layout, *saved
            )
        elif fmt == 1:
            why = "a checkpoint of data state format 1, written before readers saved their state"
        else:
            why = "a checkpoint without the state of every reader"
        log.warning(
            f"data: resuming a {self.data.source} stream ({why}): re-reading up to the same token count "
            "(slow) and the batch order is not the uninterrupted run's"
        )


def heldout_windows(cfg, n: int) -> torch.Tensor:
    """The first n validation windows, (n, seq_len+1) LongTensor: same sequences every call."""
    windows = cached_heldout(source_for(cfg.data), cfg.model.seq_len).windows
    if not 0 < n <= len(windows):
        raise DataError(
            f"heldout_windows(n={n}) is invalid: the validation set of data.val_tokens="
            f"{cfg.data.val_tokens} holds {len(windows)} windows."
        )
    return torch.from_numpy(windows[:n].astype(np.int64))


def data_state(checkpoint: dict) -> dict | None:
    """The data module's state in a Lightning checkpoint (a loaded dict), under its present or
    an older class name; None when the checkpoint holds none."""
    for key in (TokenStreamDataModule.__qualname__, *OLD_STATE_KEYS):
        if key in checkpoint:
            return checkpoint[key]
    return None


class RenamedDataState(Callback):
    """Resumes checkpoints that hold the data state under an older class name, which Lightning
    (handing a data module only the state filed under its own) would leave unloaded."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        dm = trainer.datamodule
        if isinstance(dm, TokenStreamDataModule) and type(dm).__qualname__ not in checkpoint:
            state = data_state(checkpoint)
            if state is not None:
                dm.load_state_dict(state)
