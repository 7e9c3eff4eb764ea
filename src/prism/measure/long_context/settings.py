"""What one long-context evaluation measures: its lengths in tokens, its RoPE choices and the
factor each reads a length with, checked against the training length of the weights it reads.
Every refusal is one sentence naming the bad value and what is valid (exit code 2)."""

from __future__ import annotations

from dataclasses import dataclass

from prism.config.values import LENGTH_EXAMPLE, ROPE_FACTOR_RANGE, context_length
from prism.core.rope import SCALINGS, check_head_width
from prism.data.heldout import n_val_windows
from prism.errors import PrismError


class LongContextError(PrismError, ValueError):
    """Input a long-context evaluation cannot use; the message names it."""


@dataclass(frozen=True)
class Unit:
    """One (length, RoPE choice) measurement: the unit a rerun resumes by."""

    length: int
    scaling: str
    factor: float

    @property
    def effective(self) -> tuple[str, float]:
        """What the decoder computes: at factor 1 every choice is plain RoPE (prism.core.rope), and
        `none` ignores the factor, so such units are measured once and shared."""
        return ("none", 1.0) if self.scaling == "none" or self.factor == 1 else (self.scaling, self.factor)


@dataclass(frozen=True)
class Settings:
    seq_len: int  # the training length of the weights
    lengths: list[int]
    scalings: list[str]
    rope_factor: float | None  # None: length / seq_len
    documents: int
    buckets: int
    source: str
    path: str | None
    text_field: str

    def units(self) -> list[Unit]:
        return [
            Unit(length, s, 1.0 if s == "none" else float(self.rope_factor or length / self.seq_len))
            for length in self.lengths
            for s in self.scalings
        ]


def head_widths(model) -> list[int]:
    """The distinct head widths of a decoder config (prism.core.model.ModelConfig)."""
    return sorted({model.d_model // h for h in model.heads})


def settings_for(
    section, seq_len: int, val_tokens: int | None = None, head_dims: tuple[int, ...] = ()
) -> Settings:
    """The long_context section resolved for weights trained at `seq_len` tokens, heads `head_dims`
    wide; with `val_tokens`, a length past the run's own documents is refused if they are the only source."""
    longest = ROPE_FACTOR_RANGE[1] * seq_len  # the longest read a RoPE factor is made for
    what = f"{ROPE_FACTOR_RANGE[1]} x model.seq_len={seq_len}, the longest read a RoPE factor is made for"
    own_only = section.source == "own" or (section.source == "auto" and not section.path)
    if val_tokens is not None and own_only:
        # the held-out windows are the validation documents cut into one stream (documents.py)
        stream = n_val_windows(val_tokens, seq_len) * (seq_len + 1) - 1
        if stream < longest:
            longest = stream
            what = (
                f"the {stream} tokens of the run's validation documents (data.val_tokens={val_tokens}), "
                f"the only documents long_context.source={section.source} reads here "
                f"(long_context.path=<jsonl> adds longer ones)"
            )
    lengths = set()
    for item in section.lengths:
        length = context_length(item, seq_len)
        if length < seq_len:
            raise LongContextError(
                f"long_context.lengths entry {item!r} is {length} tokens, shorter than the training "
                f"length model.seq_len={seq_len}; give lengths of at least {seq_len} tokens, "
                f"{LENGTH_EXAMPLE}."
            )
        if length > longest:
            raise LongContextError(
                f"long_context.lengths entry {item!r} is {length:,} tokens, longer than {what}; give "
                f"lengths of at most {longest:,} tokens."
            )
        lengths.add(length)
    if section.buckets > min(lengths):
        raise LongContextError(
            f"long_context.buckets={section.buckets} is more buckets than the {min(lengths)} positions "
            f"of the shortest window (long_context.lengths); use at most {min(lengths)}."
        )
    for name in section.rope_scalings:
        if name not in SCALINGS:
            raise LongContextError(
                f"long_context.rope_scalings entry {name!r} is not a RoPE scaling choice: use one or "
                f"more of {', '.join(SCALINGS)}."
            )
    factor = section.rope_factor
    if factor is not None and not ROPE_FACTOR_RANGE[0] <= factor <= ROPE_FACTOR_RANGE[1]:
        raise LongContextError(
            f"long_context.rope_factor={factor!r} is invalid: use null (length / model.seq_len at "
            f"each length) or a factor in [{ROPE_FACTOR_RANGE[0]}, {ROPE_FACTOR_RANGE[1]}], e.g. 2."
        )
    settings = Settings(
        seq_len,
        sorted(lengths),
        list(dict.fromkeys(section.rope_scalings)),
        None if factor is None else float(factor),
        int(section.documents),
        int(section.buckets),
        str(section.source),
        section.path,
        str(section.text_field),
    )
    for unit in settings.units():
        for width in sorted(set(head_dims)):
            try:
                check_head_width(*unit.effective, width, key="long_context.rope_scalings")
            except ValueError as exc:
                raise LongContextError(str(exc)) from None
    return settings
