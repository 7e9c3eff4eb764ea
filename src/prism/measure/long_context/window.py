"""One document window through the decoder: the loss at every position and Eq. 1's attention
distance, formed a block of query rows at a time beside the fused attention (docs/evaluation.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from prism.core.model import PrismDecoder, apply_rope
from prism.measure.analysis.attention_distance import DistanceAccumulator


@torch.no_grad()
def measure_window(
    model: PrismDecoder,
    tokens: torch.Tensor,
    acc: DistanceAccumulator,
    query_block: int = 256,
    logit_chunk: int = 1024,
) -> torch.Tensor:
    """Cross-entropy (nats, float64 on the CPU) at each position of one document of L+1 tokens, its
    queries' attention distance into `acc`; the output head runs `logit_chunk` positions at a time."""
    device = next(model.parameters()).device
    tokens = tokens.to(device=device, dtype=torch.long)
    idx, targets = tokens[None, :-1], tokens[1:]

    def hook(attn, args) -> None:  # an attention's rotated queries and keys from its input: Q's rows to acc
        x = args[0]
        B, T, _ = x.shape
        q, k, _v = attn.qkv(x).view(B, T, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4)
        rope = args[2] if len(args) > 2 else None  # the tables the decoder built once for this forward
        cos, sin = rope[attn.head_dim] if rope else attn.rope_tables(T)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scale = 1.0 / math.sqrt(attn.head_dim)
        for start in range(T // 2, T, query_block):
            end = min(start + query_block, T)
            # keys past the block's last query are masked for every row: leave them out
            scores = (q[:, :, start:end] @ k[:, :, :end].transpose(-2, -1)) * scale
            rows = torch.arange(start, end, device=x.device)[:, None]
            future = torch.arange(end, device=x.device)[None, :] > rows
            probs = scores.float().masked_fill(future, float("-inf")).softmax(dim=-1)
            acc.add_rows(attn.layer_idx, probs, start)

    hooks = [block.attn.register_forward_pre_hook(hook) for block in model.blocks]
    try:
        h = model.hidden_states(idx)[0]
    finally:
        for handle in hooks:
            handle.remove()
    losses = []
    for start in range(0, h.size(0), logit_chunk):
        logits = model.lm_head(h[start : start + logit_chunk])[:, : model.cfg.vocab_size].float()
        losses.append(F.cross_entropy(logits, targets[start : start + logit_chunk], reduction="none"))
    return torch.cat(losses).double().cpu()
