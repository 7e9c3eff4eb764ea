"""The Prism decoder: a nanoGPT-style causal transformer with RoPE, SwiGLU and a per-layer head
count (paper §3.1), in plain PyTorch. Top to bottom: config, RoPE, attention, MLP, block, output
loss, decoder; reading past the training length (rope_scaling) is prism.core.rope's."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from prism.core.rope import check_head_width, check_scaling, rope_frequencies
from prism.core.schedule import HeadSchedule, ModelShape

# The GPT-2 BPE's ids (prism.data.tokenizer encodes with it): the embedding needs a row for each.
VOCAB_SIZE = 50257


@dataclass
class ModelConfig:
    """Architecture hyperparameters. The paper leaves the ones marked (open) unstated; the
    defaults follow nanoGPT where it has an answer."""

    n_layer: int = 12
    d_model: int = 768
    h_base: int = 12
    heads: list[int] | None = None  # per-layer head counts; None = uniform h_base
    vocab_size: int = VOCAB_SIZE
    vocab_multiple: int = 64  # pad the embedding rows for tensor-core friendly shapes
    seq_len: int = 1024
    mlp_hidden: int | None = None  # (open) None = 8*d/3 rounded to a multiple of 64
    norm: str = "layernorm"  # (open) "layernorm" or "rmsnorm"
    norm_eps: float = 1e-5
    bias: bool = False  # (open) nanoGPT's bias=False option
    dropout: float = 0.0  # (open) nanoGPT's pretraining default
    init_std: float = 0.02  # (open) GPT-2 / nanoGPT init
    rope_base: float = 10000.0
    rope_scaling: str = "none"  # how positions past seq_len are read (prism.core.rope)
    rope_factor: float = 1.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_train_len: Optional[int] = None  # the length pretrained at, for YaRN's ramp; None = seq_len
    tie_embeddings: bool = True  # the paper's parameter counts imply tying (PAPER.md)
    schedule_name: str = "uniform"

    def __post_init__(self) -> None:
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"model.norm={self.norm!r} is invalid: use 'layernorm' or 'rmsnorm'.")
        check_scaling(self.rope_scaling, self.rope_factor, self.rope_beta_fast, self.rope_beta_slow)
        train_len = self.rope_train_len
        if train_len is not None and (type(train_len) is not int or train_len < 1):
            raise ValueError(
                f"model.rope_train_len={self.rope_train_len!r} is invalid: give the length the weights "
                f"were pretrained at (a positive integer), or null for model.seq_len."
            )
        if self.heads is None:
            self.heads = [self.h_base] * self.n_layer
        self.heads = [int(h) for h in self.heads]
        _ = self.schedule  # validates the head list against the shape
        for width in sorted({self.d_model // h for h in self.heads}):
            check_head_width(self.rope_scaling, self.rope_factor, width)

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.n_layer, self.d_model, self.h_base)

    @property
    def train_len(self) -> int:
        """The length the weights were pretrained at: rope_train_len, else seq_len."""
        return self.rope_train_len or self.seq_len

    @property
    def scaled_context(self) -> int:
        """The positions a RoPE-scaled read reaches: seq_len, or with RoPE scaled the pretrained
        length times the factor, never below seq_len."""
        if self.rope_scaling == "none":
            return self.seq_len
        return max(self.seq_len, int(self.train_len * self.rope_factor))

    @property
    def schedule(self) -> HeadSchedule:
        return HeadSchedule(tuple(self.heads), self.shape, self.schedule_name)

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or int(64 * max(1, round(8 * self.d_model / 3 / 64)))

    def to_dict(self) -> dict:
        return asdict(self)


# ----- rotary position embedding -------------------------------------------------------------
def rope_cache(
    seq_len: int,
    head_dim: int,
    base: float,
    scaling: str = "none",
    factor: float = 1.0,
    train_len: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin tables (seq_len, head_dim // 2) under a prism.core.rope scaling of a model trained
    at `train_len` positions (default seq_len), times the attention factor, as transformers does."""
    inv_freq, attention_factor = rope_frequencies(
        scaling, base, head_dim, train_len or seq_len, factor, beta_fast, beta_slow
    )
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def model_rope_cache(cfg: ModelConfig, head_dim: int, n_positions: int | None = None):
    """The cos/sin tables of a model's heads of width `head_dim`, for n_positions (default
    cfg.seq_len), under the model's RoPE scaling."""
    return rope_cache(
        n_positions or cfg.seq_len,
        head_dim,
        cfg.rope_base,
        scaling=cfg.rope_scaling,
        factor=cfg.rope_factor,
        train_len=cfg.train_len,
        beta_fast=cfg.rope_beta_fast,
        beta_slow=cfg.rope_beta_slow,
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (first half, second half) pairs of x: (B, h, T, d_h)."""
    T = x.size(-2)
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# ----- layers --------------------------------------------------------------------------------
def norm_layer(cfg: ModelConfig) -> nn.Module:
    """RMSNorm, or LayerNorm with a bias only under cfg.bias, over d_model."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


AttentionSink = Callable[[int, torch.Tensor], None]


class CausalSelfAttention(nn.Module):
    """Fused QKV -> n_head heads of width d_model / n_head -> RoPE -> causal SDPA -> W_O. The weights
    are the same whatever n_head is: it only changes how the projections are reshaped (Prism's point)."""

    def __init__(self, cfg: ModelConfig, n_head: int, layer_idx: int):
        super().__init__()
        self.n_head, self.head_dim, self.layer_idx = n_head, cfg.d_model // n_head, layer_idx
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.cfg = cfg
        cos, sin = model_rope_cache(cfg, self.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope_tables(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables covering T positions: the buffers up to seq_len; past it, tables built for T as the
        buffers were (CPU, float32) and not kept."""
        if T <= self.rope_cos.size(0):
            return self.rope_cos, self.rope_sin
        cos, sin = model_rope_cache(self.cfg, self.head_dim, T)
        return cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    def forward(
        self, x: torch.Tensor, sink: AttentionSink | None = None, rope: dict | None = None
    ) -> torch.Tensor:
        """`rope`: head width -> tables past seq_len, built once per forward by the decoder."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope[self.head_dim] if rope else self.rope_tables(T)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if sink is None:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        else:
            # Explicit softmax, used only by the attention analysis: it materialises the
            # (B, h, T, T) probabilities that the fused kernel never stores.
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            probs = scores.float().masked_fill(~causal, float("-inf")).softmax(dim=-1)
            sink(self.layer_idx, probs)
            y = probs.to(v.dtype) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        return F.dropout(self.proj(y), self.dropout, self.training)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return F.dropout(self.down(F.silu(gate) * up), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, n_head: int, layer_idx: int):
        super().__init__()
        self.norm1 = norm_layer(cfg)
        self.attn = CausalSelfAttention(cfg, n_head, layer_idx)
        self.norm2 = norm_layer(cfg)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, sink: AttentionSink | None = None, rope: dict | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), sink, rope)
        return x + self.mlp(self.norm2(x))


# ----- the output layer + cross-entropy, chunked ------------------------------------------------
class ChunkedOutputLoss(torch.autograd.Function):
    """mean cross-entropy of (h @ W[:vocab].T) against `targets` (-1 = ignored), `chunk` rows at a time
    so the (tokens, vocab) logits never exist whole; the gradient is formed in forward (docs/training.md)."""

    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int, chunk: int
    ) -> torch.Tensor:
        w = weight[:vocab]  # padded rows are never a target nor a prediction
        scored = targets != -1
        n = scored.sum().clamp(min=1).to(torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, h.size(0), chunk):
            rows = slice(start, start + chunk)
            hc, tc, keep = h[rows], targets[rows], scored[rows]
            logits = (hc @ w.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, tc.clamp(min=0).unsqueeze(1)).squeeze(1)
            loss = loss + torch.where(keep, lse - picked, 0.0).sum()
            d_logits = torch.exp(logits - lse.unsqueeze(1))  # softmax
            d_logits.scatter_add_(1, tc.clamp(min=0).unsqueeze(1), -torch.ones_like(lse).unsqueeze(1))
            d_logits = (d_logits * (keep.unsqueeze(1) / n)).to(hc.dtype)
            grad_h[rows] = d_logits @ w
            grad_w[:vocab] += (d_logits.t() @ hc).float()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None


# ----- the decoder ---------------------------------------------------------------------------
class PrismDecoder(nn.Module):
    # How, not what, it computes (outside ModelConfig)
    loss_chunk: int = 0  # train.loss_chunk_tokens: rows per ChunkedOutputLoss chunk; 0 = the plain path
    checkpoint_blocks: bool = False  # train.activation_checkpointing: recompute blocks in backward

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, h, i) for i, h in enumerate(cfg.heads))
        self.norm_f = norm_layer(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, std) everywhere, residual output projections scaled by 1/sqrt(2L), in
        registration order: one seed gives every schedule of a shape the same weights."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")) or name == "norm_f.weight":
                nn.init.ones_(p)
            elif p.dim() == 1:
                nn.init.zeros_(p)
            elif name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, 0.0, std)

    def num_params(self, include_embedding: bool = True) -> int:
        """Unique parameters (a tied embedding counts once)."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.wte.weight.numel()

    def flop_params(self) -> int:
        """N in 6N: every matmul weight. The embedding lookup is free, the output head is not;
        with tied embeddings the one shared matrix is the head, so all unique parameters count."""
        return self.num_params(include_embedding=self.cfg.tie_embeddings)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        attention_sink: AttentionSink | None = None,
    ):
        """Return logits over the real vocabulary (B, T, vocab_size), or the mean cross-entropy
        loss when `targets` is given. `attention_sink(layer, probs)` receives each layer's
        (B, h_l, T, T) attention probabilities through the explicit-softmax path."""
        h = self.hidden_states(idx, attention_sink)
        if targets is not None and self.loss_chunk > 0 and torch.is_grad_enabled():
            return ChunkedOutputLoss.apply(
                h.flatten(0, 1), self.lm_head.weight, targets.flatten(), self.cfg.vocab_size, self.loss_chunk
            )
        # Padded rows exist only to make the matmul tile-friendly; they are never real tokens.
        logits = self.lm_head(h)[..., : self.cfg.vocab_size]
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)

    def hidden_states(self, idx: torch.Tensor, attention_sink: AttentionSink | None = None) -> torch.Tensor:
        """The trunk before the output head: final-normed states (B, T, d_model), to which scorers
        apply `lm_head` at the positions they need."""
        x = self.drop(self.wte(idx))
        T = idx.size(1)
        # past seq_len each head width's tables are built once for all its layers, not per layer
        attns = {b.attn.head_dim: b.attn for b in self.blocks} if T > self.cfg.seq_len else {}
        rope = {width: attn.rope_tables(T) for width, attn in attns.items()}
        recompute = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute and attention_sink is None:
                x = torch.utils.checkpoint.checkpoint(block, x, None, rope, use_reentrant=False)
            else:
                x = block(x, attention_sink, rope)
        return self.norm_f(x)

    def attention_probs(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits plus a list of per-layer (B, h_l, T, T) attention probabilities."""
        probs: list[torch.Tensor] = []
        logits = self.forward(idx, attention_sink=lambda layer, p: probs.append(p))
        return logits, probs


def flops_per_token(cfg: ModelConfig, n_params: int, seq_len: int | None = None) -> int:
    """Training FLOPs per token, 6N + 12*L*d*T (PaLM appendix B; the paper's MFU convention): N as
    flop_params counts it, and the attention score and value matmuls, which no head split changes."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.d_model * (seq_len or cfg.seq_len)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's rule: decay every parameter with two or more dimensions (matmul weights and the
    tied embedding), never the 1-D ones (norm gains, biases)."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight appears once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
