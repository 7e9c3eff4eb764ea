"""Mean attention distance per layer and head, exactly as the paper's Eq. 1 (§4.1). The formula,
the 0-based rows of its queries Q and the float64 reduction: docs/evaluation.md, "Attention distance"."""

from __future__ import annotations

import torch

from prism.core.model import PrismDecoder


def query_positions(seq_len: int) -> range:
    """0-based rows of the queries in Q = {⌊T/2⌋+1, …, T} (1-based)."""
    return range(seq_len // 2, seq_len)


def distance_matrix(seq_len: int, device=None) -> torch.Tensor:
    """(|Q|, T) float32 matrix of |t − s| for the query rows of Q and every key s."""
    rows = torch.arange(seq_len // 2, seq_len, device=device, dtype=torch.float32)
    cols = torch.arange(seq_len, device=device, dtype=torch.float32)
    return (rows[:, None] - cols[None, :]).abs()


class DistanceAccumulator:
    """An `attention_sink` that accumulates Σ_{t∈Q} Σ_s A_{t,s}|t−s| per layer and head from its
    calls (layer, probs of shape (B, h_l, T, T)); read `per_head()` and `per_layer()` afterwards."""

    def __init__(self) -> None:
        self.sums: dict[int, torch.Tensor] = {}  # layer -> (h_l,) float64 on the CPU
        self.queries: dict[int, int] = {}  # layer -> number of (sequence, query) pairs

    def __call__(self, layer: int, probs: torch.Tensor) -> None:
        _, _, T, T2 = probs.shape
        if T != T2:
            raise ValueError(
                f"attention probabilities must be square (B, h, T, T), got {tuple(probs.shape)}."
            )
        self.add_rows(layer, probs[:, :, T // 2 :, :], T // 2)

    def add_rows(self, layer: int, probs: torch.Tensor, first_row: int) -> None:
        """Accumulate a block of query rows first_row.. (0-based, all in Q) of probabilities
        (B, h, R, T): long windows are measured a block at a time, never as a (T, T) matrix."""
        B, h, R, T = probs.shape
        rows = torch.arange(first_row, first_row + R, device=probs.device, dtype=torch.float32)
        dist = (rows[:, None] - torch.arange(T, device=probs.device, dtype=torch.float32)[None, :]).abs()
        head_sums = (probs.float() * dist).sum(-1).sum(dim=(0, 2)).double().cpu()
        self.sums[layer] = self.sums.get(layer, torch.zeros(h, dtype=torch.float64)) + head_sums
        self.queries[layer] = self.queries.get(layer, 0) + B * R

    def per_head(self) -> list[list[float]]:
        """D per layer and head, in tokens: [layer][head]."""
        return [(self.sums[l] / self.queries[l]).tolist() for l in sorted(self.sums)]

    def per_layer(self) -> list[float]:
        """D_l: the mean over heads of the per-head values (heads weigh equally, as in Eq. 1)."""
        return [float((self.sums[l] / self.queries[l]).mean()) for l in sorted(self.sums)]


@torch.no_grad()
def attention_distance(
    model: PrismDecoder,
    windows: torch.Tensor,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress=None,
) -> dict:
    """{"D": D_l, "D_per_head": [[D]]} of `model` over token windows (N, T) or (N, T+1) (a training
    window's trailing target is dropped); `progress(done, total)`, when given, after every batch."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    T = model.cfg.seq_len
    if windows.dim() != 2 or windows.size(1) not in (T, T + 1):
        raise ValueError(
            f"windows of shape {tuple(windows.shape)} do not fit the model: "
            f"expected (N, {T}) or (N, {T + 1})."
        )
    idx_all = windows[:, :T]
    acc = DistanceAccumulator()
    was_training = model.training
    model.eval()
    try:
        for start in range(0, idx_all.size(0), batch_size):
            idx = idx_all[start : start + batch_size].to(device=device, dtype=torch.long)
            model.hidden_states(idx, attention_sink=acc)  # the output head is not needed
            if progress is not None:
                progress(min(start + batch_size, idx_all.size(0)), idx_all.size(0))
    finally:
        model.train(was_training)
    return {"D": acc.per_layer(), "D_per_head": acc.per_head()}
