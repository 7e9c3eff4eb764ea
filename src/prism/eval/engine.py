"""The scoring engine: token requests -> (sum of continuation log-probs, greedy flag); why it is
fast and rank-independent: docs/evaluation.md, "Zero-shot evaluation"."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from prism.core.model import PrismDecoder
from prism.eval.requests import TokenRequest

HEAD_CHUNK = 512  # output-head rows per step
Progress = Callable[[int], None]  # called with the number of requests just finished


def model_input(req: TokenRequest, max_len: int) -> tuple[list[int], int]:
    """Input ids (left-truncated to max_len, as the harness does) and the continuation length."""
    if len(req.continuation) == 0 or len(req.context) == 0:
        raise ValueError("a request needs a non-empty context and continuation")
    if len(req.continuation) > max_len:
        raise ValueError(
            f"continuation of {len(req.continuation)} tokens exceeds the model's seq_len={max_len}"
        )
    full = list(req.context) + list(req.continuation)
    return full[-(max_len + 1) :][:-1], len(req.continuation)


def autocast(device: torch.device):
    """bfloat16 autocast on a GPU; none elsewhere (a surrounding CPU autocast stays in effect)."""
    return torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")


@torch.inference_mode()
def score_batch(
    model: PrismDecoder, reqs: Sequence[TokenRequest], device: torch.device
) -> list[tuple[float, bool]]:
    """One padded forward pass for a list of requests."""
    inputs = [model_input(r, model.cfg.seq_len) for r in reqs]
    # right padding (with zeros): causal attention ignores it
    idx = pad_sequence([torch.tensor(ids) for ids, _ in inputs], batch_first=True)
    rows, cols, targets = [], [], []  # rows: the request each continuation token belongs to
    for b, ((ids, n_cont), req) in enumerate(zip(inputs, reqs)):
        start = len(ids) - n_cont  # logits at positions start.. predict the continuation
        rows += [b] * n_cont
        cols += range(start, len(ids))
        targets += req.continuation
    with autocast(device):
        h = model.hidden_states(idx.to(device))
        h_cont = h[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]
        tgt = torch.tensor(targets, device=device)
        token_lp = torch.empty(len(targets), dtype=torch.float64, device=device)
        hit = torch.empty(len(targets), dtype=torch.bool, device=device)
        # The (positions x vocabulary) logits are the largest tensor here; building them a few
        # hundred rows at a time keeps memory flat however long the batch is.
        for a in range(0, len(targets), HEAD_CHUNK):
            logits = model.lm_head(h_cont[a : a + HEAD_CHUNK])[..., : model.cfg.vocab_size].float()
            t = tgt[a : a + HEAD_CHUNK, None]
            token_lp[a : a + HEAD_CHUNK] = (logits.gather(1, t) - logits.logsumexp(1, keepdim=True))[:, 0]
            hit[a : a + HEAD_CHUNK] = logits.argmax(dim=-1) == t.squeeze(1)
    own = torch.tensor(rows, device=device)
    sums = torch.zeros(len(reqs), dtype=torch.float64, device=device).index_add_(0, own, token_lp)
    misses = torch.zeros(len(reqs), dtype=torch.long, device=device).index_add_(0, own, (~hit).long())
    return [(float(s), int(m) == 0) for s, m in zip(sums.cpu(), misses.cpu())]


def length_order(reqs: Sequence[TokenRequest], max_len: int) -> list[int]:
    """Request indices, longest model input first: consecutive requests then batch with little
    padding, memory problems show up at once, and the time estimate errs on the long side."""
    return sorted(
        range(len(reqs)), key=lambda i: -min(len(reqs[i].context) + len(reqs[i].continuation) - 1, max_len)
    )


def _dist():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def score_requests(
    model: PrismDecoder,
    reqs: Sequence[TokenRequest],
    batch_size: int = 32,
    device: torch.device | str | None = None,
    progress: Progress | None = None,
) -> list[tuple[float, bool]]:
    """Score every request (sharded over the ranks of a process group), in the order of `reqs`."""
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size} is invalid; use a positive number")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    # Identical requests (e.g. repeated choices) are scored once.
    unique = list(dict.fromkeys(reqs))
    rank, world = _dist()
    order = length_order(unique, model.cfg.seq_len)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    results: dict[int, tuple[float, bool]] = {}
    # Batch k goes to rank k % world: consecutive (similar-length) batches land on different
    # ranks, so each rank gets a similar token load. Progress counts a whole round of batches.
    for k in range(rank, len(batches), world):
        results.update(zip(batches[k], score_batch(model, [unique[i] for i in batches[k]], device)))
        if progress is not None:
            progress(sum(len(b) for b in batches[k - rank : k - rank + world]))
    if world > 1:
        gathered: list[dict] = [None] * world  # type: ignore[list-item]
        torch.distributed.all_gather_object(gathered, results)
        results = {k: v for part in gathered for k, v in part.items()}
    by_req = {req: results[i] for i, req in enumerate(unique)}
    return [by_req[r] for r in reqs]
