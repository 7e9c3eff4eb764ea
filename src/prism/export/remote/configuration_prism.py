"""Configuration of an exported Prism checkpoint (transformers remote code; imports only
transformers): a decoder whose layer i has `heads[i]` heads (the keys: the kit's docs/export.md;
rope_scaling "ntk" is the kit's static NTK-aware scaling)."""

from __future__ import annotations

from transformers import PretrainedConfig

EOT_TOKEN = 50256  # GPT-2's <|endoftext|>: the kit puts it before every document
ROPE_TYPES = ("linear", "ntk", "yarn")  # the kit's rope_scaling choices besides "none"


class PrismConfig(PretrainedConfig):
    model_type = "prism"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 50257,
        padded_vocab_size: int | None = None,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        heads: list[int] | None = None,
        intermediate_size: int | None = None,
        max_position_embeddings: int = 1024,
        scaled_max_position_embeddings: int | None = None,
        norm_type: str = "layernorm",
        norm_eps: float = 1e-5,
        use_bias: bool = False,
        rope_base: float = 10000.0,
        rope_parameters: dict | None = None,
        initializer_range: float = 0.02,
        schedule_name: str = "uniform",
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        bos_token_id: int = EOT_TOKEN,
        eos_token_id: int = EOT_TOKEN,
        **kwargs,
    ):
        heads = [int(h) for h in (heads or [num_attention_heads] * num_hidden_layers)]
        if len(heads) != num_hidden_layers:
            raise ValueError(
                f"heads has {len(heads)} entries but num_hidden_layers={num_hidden_layers}; "
                f"give one head count per layer."
            )
        for i, h in enumerate(heads):
            if h < 1 or hidden_size % h or (hidden_size // h) % 2:
                raise ValueError(
                    f"heads[{i}]={h} does not split hidden_size={hidden_size} into heads of "
                    f"an even width (RoPE rotates pairs of dimensions)."
                )
        if norm_type not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm_type={norm_type!r} is invalid: use 'layernorm' or 'rmsnorm'.")
        if rope_parameters and rope_parameters.get("rope_type", "default") != "default":
            if rope_parameters["rope_type"] not in ROPE_TYPES:
                raise ValueError(
                    f"rope_parameters' rope_type={rope_parameters['rope_type']!r} is invalid: use one "
                    f"of {', '.join(ROPE_TYPES)}, or no rope_parameters for plain RoPE."
                )
            # set before PretrainedConfig.__init__, which then checks it
            self.rope_parameters = dict(rope_parameters)
        self.vocab_size = vocab_size
        # The embedding matrix keeps the kit's padded row count (tile-friendly on GPUs); rows at
        # and above vocab_size are never produced by the tokenizer and never returned as logits.
        self.padded_vocab_size = max(padded_vocab_size or vocab_size, vocab_size)
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        # The baseline head count of the shape (h_base); the real per-layer counts are `heads`.
        self.num_attention_heads = num_attention_heads
        self.heads = heads
        # The kit's default MLP width: 8/3 of the model width rounded to a multiple of 64.
        self.intermediate_size = intermediate_size or 64 * max(1, round(8 * hidden_size / 3 / 64))
        self.max_position_embeddings = max_position_embeddings  # the context trained at
        if scaled_max_position_embeddings is not None:  # a RoPE-scaled read; absent without one
            self.scaled_max_position_embeddings = scaled_max_position_embeddings
        self.norm_type = norm_type
        self.norm_eps = norm_eps
        self.use_bias = use_bias
        self.rope_base = rope_base
        self.initializer_range = initializer_range
        self.schedule_name = schedule_name
        self.use_cache = use_cache
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def _validate_ntk_rope_parameters(self, rope_parameters: dict, ignore_keys=None) -> None:
        """transformers looks up a checker per rope_type; the static NTK-aware one is the kit's."""
        factor = rope_parameters.get("factor")
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise ValueError(f"rope_parameters' factor={factor!r} is invalid: it must be positive.")

    @property
    def readable_positions(self) -> int:
        """The positions the model reads: the trained context, or the RoPE-scaled read past it."""
        return max(self.max_position_embeddings, self.scaled_positions or 0)

    @property
    def scaled_positions(self) -> int | None:
        """scaled_max_position_embeddings, or None for a model read only as trained."""
        return getattr(self, "scaled_max_position_embeddings", None)

    @property
    def head_dims(self) -> list[int]:
        return [self.hidden_size // h for h in self.heads]
