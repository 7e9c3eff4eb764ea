"""data.source=shards: prepare_fineweb.py's uint16 token shards, memory-mapped."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from prism.data import shards as shard_io
from prism.data.errors import DataError
from prism.data.heldout import Heldout, n_val_windows
from prism.data.source import WindowSource
from prism.data.windows import TokenWindows

log = logging.getLogger(__name__)


class ShardSource(WindowSource):
    """The `*_val_*.bin` and `*_train_*.bin` shards of the folder data.path."""

    needs = {"path": "the folder that reproduce/prepare_fineweb.py wrote"}
    identity_keys = ("path",)

    def describe(self) -> str:
        return f"pre-tokenized shards in {self.data.path}"

    def build_heldout(self, seq_len: int) -> Heldout:
        """The first val windows; also checks that the train shards hold a window, so that a
        bad folder fails before any worker starts."""
        path, window = self.data.path, seq_len + 1
        n = n_val_windows(self.data.val_tokens, seq_len)
        val_paths = shard_io.find_shards(path, "val")
        _check_manifest(path, seq_len)
        windows = TokenWindows([shard_io.open_shard(p) for p in val_paths], window)
        total = sum(len(a) for a in windows.arrays)
        if total < window:
            raise DataError(
                f"the val shards in {path} hold {total} tokens, fewer than one window of "
                f"model.seq_len+1={window}; lower model.seq_len or prepare with a larger --seq-len."
            )
        if len(windows) < n:
            raise DataError(
                f"the val shards in {path} hold {len(windows)} windows of {window} tokens, "
                f"fewer than the {n} that data.val_tokens={self.data.val_tokens} asks for; lower "
                "data.val_tokens or re-run prepare_fineweb.py with a larger --val-tokens."
            )
        if len(TokenWindows(self.train_arrays(None), window)) == 0:
            raise DataError(
                f"the train shards in {path} hold no window of model.seq_len+1={window} "
                "tokens; lower model.seq_len or prepare more data."
            )
        return Heldout(windows.gather(np.arange(n)), frozenset(), 0, None)

    def train_arrays(self, heldout: Heldout | None) -> list[np.ndarray]:
        return [shard_io.open_shard(p) for p in shard_io.find_shards(self.data.path, "train")]


def _check_manifest(folder, seq_len: int) -> None:
    """Shards prepared for another seq_len still work, but their val windows then differ from
    the ones hub/local would hold out; say so rather than compare silently different numbers."""
    path = Path(folder) / "manifest.json"
    if path.is_file():
        try:
            prepared = json.loads(path.read_text()).get("settings", {}).get("seq_len")
        except (OSError, ValueError, AttributeError) as exc:
            raise DataError(
                f"{path} cannot be read ({type(exc).__name__}: {exc}); re-run "
                "reproduce/prepare_fineweb.py with the same --out to rewrite it, or delete it."
            ) from None
        if prepared not in (None, seq_len):
            log.warning(
                f"data: shards in {folder} were prepared for seq_len {prepared}, this run uses {seq_len}; "
                "the held-out windows are re-cut and differ from the hub/local ones"
            )
