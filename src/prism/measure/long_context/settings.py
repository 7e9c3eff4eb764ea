"""What one long-context evaluation measures: its lengths in tokens, its RoPE choices and the
factor each reads a length with, checked against the training length of the weights it reads.
Every refusal is one sentence naming the bad value and what is valid (exit code 2)."""

from __future__ import annotations

from dataclasses import dataclass

from prism.config.values import LENGTH_EXAMPLE, context_length
from prism.core.rope import SCALINGS
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

    def factor(self, length: int) -> float:
        return float(self.rope_factor) if self.rope_factor is not None else length / self.seq_len

    def units(self) -> list[Unit]:
        return [
            Unit(length, s, 1.0 if s == "none" else self.factor(length))
            for length in self.lengths
            for s in self.scalings
        ]

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def settings_for(section, seq_len: int) -> Settings:
    """The long_context section resolved for weights trained at `seq_len` tokens."""
    lengths = []
    for item in section.lengths:
        length = context_length(item, seq_len)
        if length < seq_len:
            raise LongContextError(
                f"long_context.lengths entry {item!r} is {length} tokens, shorter than the training "
                f"length model.seq_len={seq_len}; give lengths of at least {seq_len} tokens, "
                f"{LENGTH_EXAMPLE}."
            )
        if length not in lengths:
            lengths.append(length)
    for name in section.rope_scalings:
        if name not in SCALINGS:
            raise LongContextError(
                f"long_context.rope_scalings entry {name!r} is not a RoPE scaling choice: use one or "
                f"more of {', '.join(SCALINGS)}."
            )
    factor = section.rope_factor
    if factor is not None and not factor > 0:
        raise LongContextError(
            f"long_context.rope_factor={factor!r} is invalid: use null (length / model.seq_len at "
            f"each length) or a positive factor, e.g. 2."
        )
    return Settings(
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
