"""Random access to fixed-length token windows, a seeded, memory-free shuffle of them (the
order is a function of seed and epoch only) and the document readers' shuffle buffer."""

from __future__ import annotations

import numpy as np


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a cheap, well-mixing hash of uint64 values."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class IndexPermutation:
    """A bijection of range(n) chosen by `seed`: a 4-round Feistel network on the smallest
    even-bit power of two >= n, with cycle-walking back into range; no permutation table, which
    would need hundreds of MB per DataLoader worker at the 100BT scale."""

    rounds = 4

    def __init__(self, n: int, seed: int) -> None:
        if n <= 0:
            raise ValueError("IndexPermutation needs n > 0")
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.low_mask = np.uint64((1 << self.half) - 1)
        keys = np.random.Generator(np.random.PCG64(seed)).integers(0, 2**63, size=self.rounds, dtype=np.int64)
        self.keys = keys.astype(np.uint64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & self.low_mask
        for k in self.keys:
            left, right = right, left ^ (_mix64(right ^ k) & self.low_mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        x = self._feistel(np.asarray(idx, dtype=np.uint64))
        out_of_range = x >= np.uint64(self.n)
        while out_of_range.any():  # cycle-walking: expected < 4 extra rounds, domain < 4n
            x[out_of_range] = self._feistel(x[out_of_range])
            out_of_range = x >= np.uint64(self.n)
        return x.astype(np.int64)


class TokenWindows:
    """Non-overlapping windows of `window` tokens cut from each token array in turn (a shard's
    tail shorter than one window is left unused, < 1 window per shard)."""

    def __init__(self, arrays: list[np.ndarray], window: int) -> None:
        self.arrays = arrays
        self.window = window
        counts = np.array([len(a) // window for a in arrays], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # first global window of each array
        self.n = int(self.starts[-1])

    def __len__(self) -> int:
        return self.n

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Windows `ids` (global indices) as a (len(ids), window) uint16 array."""
        out = np.empty((len(ids), self.window), dtype=np.uint16)
        which = np.searchsorted(self.starts, ids, side="right") - 1
        offsets = (np.asarray(ids) - self.starts[which]) * self.window
        for row, (a, off) in enumerate(zip(which.tolist(), offsets.tolist())):
            out[row] = self.arrays[a][off : off + self.window]
        return out


class EpochShuffledWindows:
    """The unbounded training stream: position g is window perm_e(g mod n) of epoch e = g // n,
    with an independent permutation per epoch derived from (seed, epoch)."""

    def __init__(self, windows: TokenWindows, seed: int, shuffle: bool = True) -> None:
        self.windows = windows
        self.seed = seed
        self.shuffle = shuffle
        self._perms: dict[int, IndexPermutation] = {}

    def _perm(self, epoch: int) -> IndexPermutation:
        if epoch not in self._perms:
            self._perms.clear()  # at most the current epoch (and its successor) are live
            seed = int(_mix64(np.array([(self.seed * 1_000_003 + epoch) % 2**64], dtype=np.uint64))[0])
            self._perms[epoch] = IndexPermutation(len(self.windows), seed)
        return self._perms[epoch]

    def window_ids(self, positions: np.ndarray) -> np.ndarray:
        n = len(self.windows)
        epochs, local = np.divmod(np.asarray(positions, dtype=np.int64), n)
        if not self.shuffle:
            return local
        out = np.empty_like(local)
        for e in np.unique(epochs).tolist():
            sel = epochs == e
            out[sel] = self._perm(e)(local[sel])
        return out


class WindowShuffleBuffer:
    """The hub/local readers' seeded shuffle buffer of windows (each new one evicts a random slot;
    cap 0 passes them through). The reader reports `changes()` with every micro-batch and the
    training process mirrors them with `apply()`, so a checkpoint holds it as last consumed."""

    def __init__(
        self, cap: int, window: int, seed: list[int] | None = None, state: dict | None = None
    ) -> None:
        self.cap, self.window = cap, window
        self.buf = np.empty((cap, window), dtype=np.uint16)
        self.filled = 0
        self.rng = np.random.Generator(np.random.PCG64(seed))
        if state is not None:
            held = np.asarray(state["windows"], dtype=np.uint16).reshape(-1, window)
            self.filled = len(held)
            self.buf[: self.filled] = held
            self.rng.bit_generator.state = state["rng"]
        self._logging = False  # the first report is the whole buffer; deltas are logged after it
        self._slots: list[int] = []
        self._windows: list[np.ndarray] = []

    def push(self, win: np.ndarray) -> np.ndarray | None:
        """Put a window in; returns the window that comes out (None while the buffer fills)."""
        if not self.cap:
            return win
        if self.filled < self.cap:
            slot, out = self.filled, None
            self.filled += 1
        else:
            slot = int(self.rng.integers(self.cap))
            out = self.buf[slot].copy()
        self.buf[slot] = win
        if self._logging:
            self._slots.append(slot)
            self._windows.append(win)
        return out

    def state(self) -> dict:
        return {"windows": self.buf[: self.filled].copy(), "rng": self.rng.bit_generator.state}

    def changes(self) -> dict:
        """What a mirror needs to equal this buffer now: everything at the first call (the
        mirror may hold anything), afterwards the slots written since the previous call."""
        rng = self.rng.bit_generator.state
        if not self._logging:
            self._logging = True
            return {"slots": None, "windows": self.buf[: self.filled].copy(), "rng": rng}
        windows = np.stack(self._windows) if self._windows else np.empty((0, self.window), np.uint16)
        slots, self._slots, self._windows = self._slots, [], []
        return {"slots": slots, "windows": windows, "rng": rng}

    def apply(self, changes: dict) -> None:
        """Mirror side of `changes()`."""
        if changes["slots"] is None:
            self.filled = len(changes["windows"])
            self.buf[: self.filled] = changes["windows"]
        else:  # in order: a slot written twice keeps its last window
            for slot, win in zip(changes["slots"], changes["windows"]):
                self.buf[slot] = win
                self.filled = max(self.filled, slot + 1)  # while filling, slots are appended
        self.rng.bit_generator.state = changes["rng"]
