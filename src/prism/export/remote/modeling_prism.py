"""An exported Prism decoder as a transformers causal LM (remote code; imports only torch and
transformers): the reproduction kit's `prism.core.model.PrismDecoder` line for line, plus a
key/value cache, positions after the cached tokens and 2-D padding masks (kit: docs/export.md)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_prism import PrismConfig

# transformers 5.x renamed the cache argument and output field from `past_key_values` to `cache`
# (about 5.20); the forward pass accepts both names and the outputs use whichever field exists.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# ----- rotary position embedding -------------------------------------------------------------
def plain_inv_freq(base: float, head_dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_frequencies(base: float, head_dim: int, rope: dict) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of heads of width `head_dim` under the config's
    `rope_parameters` (empty: plain RoPE). The kit's prism.core.rope, operation for operation,
    so that the tables are bit-identical to the kit's."""
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return plain_inv_freq(base, head_dim), 1.0
    factor = rope["factor"]
    if kind == "linear":  # position interpolation: position p is read as p / factor
        return plain_inv_freq(base, head_dim) / factor, 1.0
    if kind == "ntk":  # static NTK-aware: the base grows by factor^(d/(d-2))
        return plain_inv_freq(base * factor ** (head_dim / (head_dim - 2)), head_dim), 1.0
    if kind != "yarn":
        raise ValueError(f"rope_type={kind!r} is not one this model implements: use linear, ntk or yarn.")
    if factor == 1:
        return plain_inv_freq(base, head_dim), 1.0
    # YaRN: pairs turning more than beta_fast times in the training length keep their frequency,
    # pairs turning fewer than beta_slow times are interpolated, a linear ramp between.
    train_len = rope["original_max_position_embeddings"]

    def pair_turning(rotations: float) -> float:
        return head_dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(rope.get("beta_fast", 32.0))), 0)
    high = min(math.ceil(pair_turning(rope.get("beta_slow", 1.0))), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    wavelength = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    trained, interpolated = 1.0 / wavelength, 1.0 / (factor * wavelength)
    inv_freq = interpolated * (1 - keep) + trained * keep
    return inv_freq, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)  # attention factor


def rope_tables(
    n_positions: int, head_dim: int, base: float, rope: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (n_positions, head_dim // 2) in float32, built on the CPU exactly as
    the kit builds them, so the rotated values are bit-identical to the trained model's. The
    attention factor (YaRN's) multiplies both tables, as transformers does."""
    inv_freq, attention_factor = rope_frequencies(base, head_dim, rope or {})
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq)
    return angles.cos() * attention_factor, angles.sin() * attention_factor  # x * 1.0 is exact


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (first half, second half) pairs of x (B, h, T, d); cos/sin broadcast to (.., T, d/2)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# ----- layers --------------------------------------------------------------------------------
class PrismNorm(nn.Module):
    def __init__(self, config: PrismConfig):
        super().__init__()
        self.kind, self.eps = config.norm_type, config.norm_eps
        self.weight = nn.Parameter(torch.ones(config.hidden_size))
        with_bias = config.use_bias and config.norm_type == "layernorm"
        self.bias = nn.Parameter(torch.zeros(config.hidden_size)) if with_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rmsnorm":
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


class PrismAttention(nn.Module):
    """The projections are hidden x 3*hidden and hidden x hidden in every layer; only the split
    into heads differs between layers (the point of a Prism schedule)."""

    def __init__(self, config: PrismConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.heads[layer_idx]
        self.head_dim = config.hidden_size // self.n_head
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.use_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.proj.residual_out = True  # initialised with std / sqrt(2L), as in the kit

    def forward(
        self, x: torch.Tensor, rope: tuple, mask: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:  # k, v become every cached position followed by these T
            k, v = cache.update(k, v, self.layer_idx)
        # Without a cache or padding this is the kit's own call (is_causal on a square score
        # matrix); otherwise `mask` says which keys each query may see.
        square = k.size(2) == T
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and square and T > 1
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class PrismMLP(nn.Module):
    def __init__(self, config: PrismConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.use_bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.down.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class PrismBlock(nn.Module):
    def __init__(self, config: PrismConfig, layer_idx: int):
        super().__init__()
        self.norm1 = PrismNorm(config)
        self.attn = PrismAttention(config, layer_idx)
        self.norm2 = PrismNorm(config)
        self.mlp = PrismMLP(config)

    def forward(self, x, rope, mask, cache):
        x = x + self.attn(self.norm1(x), rope, mask, cache)
        return x + self.mlp(self.norm2(x))


# ----- masks and positions -------------------------------------------------------------------
def attention_mask_4d(padding: torch.Tensor | None, past: int, T: int, device) -> torch.Tensor | None:
    """A boolean (B or 1, 1, T, past + T) mask, True where a query may attend, or None when plain
    causal attention (or a single query over the whole cache) is exact."""
    S = past + T
    if padding is None and (past == 0 or T == 1):
        return None
    query_at = torch.arange(past, S, device=device)[:, None]  # each query's index in the cache
    key_at = torch.arange(S, device=device)[None, :]
    mask = key_at <= query_at
    if padding is not None:
        # A query always sees itself: a padding position would otherwise have no key at all and
        # its softmax would be NaN, which the next layer's values would carry everywhere.
        mask = (mask & padding.bool()[:, None, None, :]) | (key_at == query_at)
    return mask[None, None] if mask.dim() == 2 else mask


class PrismPreTrainedModel(PreTrainedModel):
    config_class = PrismConfig
    base_model_prefix = "model"
    _no_split_modules = ["PrismBlock"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """The kit's GPT-2 init, used only for a model built from a config without weights:
        N(0, std), residual output projections scaled by 1/sqrt(2L), norms at one, biases zero."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear) and getattr(module, "residual_out", False):
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * self.config.num_hidden_layers))
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, PrismNorm):
            nn.init.ones_(module.weight)
        if isinstance(module, (nn.Linear, PrismNorm)) and module.bias is not None:
            nn.init.zeros_(module.bias)


class PrismModel(PrismPreTrainedModel):
    """Embedding -> blocks -> final norm: the hidden states before the output head."""

    def __init__(self, config: PrismConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(PrismBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = PrismNorm(config)
        # RoPE tables per (head_dim, device). Not buffers: they are a function of the config,
        # never stored with the weights, and must be built on the CPU for bit-exactness.
        self._rope: dict = {}
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.wte = value

    def _tables(self, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (head_dim, str(device))
        if key not in self._rope:
            rope = getattr(self.config, "rope_parameters", None)  # None: plain RoPE
            cos, sin = rope_tables(self.config.readable_positions, head_dim, self.config.rope_base, rope)
            self._rope[key] = (cos.to(device), sin.to(device))
        return self._rope[key]

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        past_key_values=None,
        **kwargs,
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds.")
        if cache is not None and past_key_values is not None:
            raise ValueError("give the key/value cache once, as `cache` or as `past_key_values`.")
        cache = cache if cache is not None else past_key_values
        # Unasked, no new cache: a scoring pass (lm_eval calls model(ids)) would otherwise keep
        # every layer's keys and values for the whole batch. generate() always says which.
        use_cache = cache is not None if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = DynamicCache()
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(
                f"the cache must be a transformers Cache (e.g. DynamicCache), not {type(cache).__name__}."
            )
        x = self.wte(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0

        padding = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.size(-1) != past + T:
                raise ValueError(
                    f"attention_mask must be (batch, {past + T}) covering the cached and "
                    f"new tokens; got shape {tuple(attention_mask.shape)}."
                )
            if not bool(attention_mask.all()):  # an all-ones mask is plain causal attention
                padding = attention_mask
        if position_ids is None and padding is not None:
            # Left padding: real tokens count from 0, as they would without the padding.
            position_ids = (padding.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
        last = int(position_ids.max()) if position_ids is not None else past + T - 1
        if last >= self.config.readable_positions:
            scaled = self.config.scaled_positions
            raise ValueError(
                f"position {last} is beyond the {self.config.readable_positions} positions the model "
                f"reads (max_position_embeddings={self.config.max_position_embeddings}, its training "
                f"context"
                + (f"; scaled_max_position_embeddings={scaled}, its RoPE-scaled read" if scaled else "")
                + "); shorten the input or max_new_tokens."
            )

        mask = attention_mask_4d(padding, past, T, x.device)
        ropes = {}
        for d in set(self.config.head_dims):
            cos, sin = self._tables(d, x.device)
            if position_ids is None:
                ropes[d] = (cos[past : past + T], sin[past : past + T])  # (T, d/2), as in the kit
            else:
                ropes[d] = (cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1))
        for block in self.blocks:
            x = block(x, ropes[block.attn.head_dim], mask, cache)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm_f(x), **{CACHE_FIELD: cache if use_cache else None}
        )


class PrismForCausalLM(PrismPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.wte.weight"}

    def __init__(self, config: PrismConfig):
        super().__init__(config)
        self.model = PrismModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.post_init()

    # explicit, public accessors: not left to transformers' private lookup by attribute name
    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        past_key_values=None,
        return_dict=None,
        **kwargs,
    ):
        """Logits over the real vocabulary (batch, positions, vocab_size), never the head's padding
        rows; other keyword inputs of generate() (cache_position) add nothing. `labels` as in
        transformers (-100 ignored): the mean cross-entropy of predicting token t+1 from t."""
        out = self.model(
            input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, past_key_values
        )
        # the last `logits_to_keep` positions (0: all of them), or a tensor of positions
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep])[..., : self.config.vocab_size]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().flatten(0, 1),
                labels[:, 1:].to(logits.device).flatten(),
                ignore_index=-100,
            )
        result = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: getattr(out, CACHE_FIELD)})
        return result if return_dict is not False else result.to_tuple()
