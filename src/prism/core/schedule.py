"""Per-layer attention-head schedules (paper §2): how many heads each decoder layer splits its Q/K/V
into. Hard constraints (§2.1) raise ScheduleError; the design rules (§2.2-2.3) are diagnostics."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Iterator, Mapping, Sequence

from prism.errors import PrismError

# FlashAttention kernels (FA2/FA3 and PyTorch's flash backend) handle head dims up to 256; wider
# heads fall back to slower kernels, which is the 4-8 % cost the paper measures for d_h = 384.
FLASH_MAX_HEAD_DIM = 256


class ScheduleError(PrismError, ValueError):
    """A head schedule that breaks a hard constraint, or text that is not a schedule."""


@dataclass(frozen=True)
class ModelShape:
    """The three numbers a schedule depends on."""

    n_layer: int
    d_model: int
    h_base: int

    def __post_init__(self) -> None:
        for field in ("n_layer", "d_model", "h_base"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{field}={value!r} is invalid: it must be a positive integer.")
        if self.d_model % self.h_base:
            raise ScheduleError(
                f"h_base={self.h_base} does not divide d_model={self.d_model}; "
                f"valid h_base values are {divisors(self.d_model)}."
            )


@dataclass(frozen=True)
class Diagnostic:
    """One design-rule finding: `rule` is a stable id, `message` is for people."""

    rule: str
    severity: str  # "info" or "warning"
    message: str
    layers: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "layers": list(self.layers)}


def _span(first: int, n: int) -> str:
    return f"layer {first}" if n == 1 else f"layers {first}-{first + n - 1}"


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass(frozen=True)
class HeadSchedule:
    """Head counts per layer for one model shape, validated on construction."""

    heads: tuple[int, ...]
    shape: ModelShape
    name: str = "custom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(int(h) for h in self.heads))
        self.validate()

    # ----- construction -------------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str, shape: ModelShape) -> "HeadSchedule":
        """Parse "3x2,6x2,8x2,12x6", "3,3,6,6,8,8,12x6" or "12x12" (also '×' and '*')."""
        heads = parse_heads(text)
        return cls(tuple(heads), shape, compact_text(heads))

    @classmethod
    def resolve(
        cls, spec: str, shape: ModelShape, named: Mapping[str, str | Sequence[int]] | None = None
    ) -> "HeadSchedule":
        """Build a schedule from a name in `named` (or "uniform") or a compact text."""
        key = spec.strip()
        named = named or {}
        if key.lower() == "uniform":
            return cls((shape.h_base,) * shape.n_layer, shape, "uniform")
        for registered, value in named.items():
            if registered.lower() == key.lower():
                heads = parse_heads(value) if isinstance(value, str) else list(value)
                return cls(tuple(heads), shape, registered)
        if re.fullmatch(r"[\d\sx×*,]+", key):
            return cls.from_text(key, shape)
        known = ", ".join(["uniform", *named])
        raise ScheduleError(
            f"unknown schedule {spec!r}: use one of the names {known}, or a head list such as "
            f"'3x2,6x2,8x2,12x6'."
        )

    # ----- derived values -----------------------------------------------------------------
    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(self.shape.d_model // h for h in self.heads)

    @property
    def is_uniform(self) -> bool:
        return all(h == self.shape.h_base for h in self.heads)

    def text(self) -> str:
        return compact_text(self.heads)

    # ----- §2.1 hard constraints ----------------------------------------------------------
    def validate(self) -> None:
        s = self.shape
        if len(self.heads) != s.n_layer:
            raise ScheduleError(
                f"schedule {compact_text(self.heads)!r} has {len(self.heads)} layers but the model "
                f"has n_layer={s.n_layer}; give exactly one head count per layer."
            )
        for layer, h in enumerate(self.heads):
            if h < 1 or s.d_model % h:
                raise ScheduleError(
                    f"layer {layer}: {h} heads does not divide d_model={s.d_model} (divisibility, "
                    f"§2.1); valid head counts are {divisors(s.d_model)}."
                )
            if (s.d_model // h) % 2:
                # RoPE rotates dimension pairs, so every head needs an even width.
                raise ScheduleError(
                    f"layer {layer}: {h} heads gives head dim {s.d_model // h}, which is odd; RoPE "
                    f"needs an even head dim."
                )
        for layer in range(1, len(self.heads)):
            if self.heads[layer] < self.heads[layer - 1]:
                raise ScheduleError(
                    f"layer {layer}: {self.heads[layer]} heads after {self.heads[layer - 1]} at "
                    f"layer {layer - 1} breaks monotonicity (§2.1): head counts must not decrease."
                )
        if self.heads[-1] != s.h_base:
            raise ScheduleError(
                f"layer {s.n_layer - 1}: the last layer has {self.heads[-1]} heads but must have "
                f"h_base={s.h_base} (boundary convergence, §2.1)."
            )

    # ----- §2.2-2.3 design rules ----------------------------------------------------------
    def diagnostics(self) -> list[Diagnostic]:
        s = self.shape
        found: list[Diagnostic] = []
        early = [(h, first, n) for h, first, n in _runs(self.heads) if h != s.h_base]
        for h, first, n in early:
            if not 2 <= n <= 4:
                message = (
                    f"{h} heads (d_h={s.d_model // h}) is kept for {n} layer(s) at "
                    f"{_span(first, n)}; the paper keeps each head dim for 2-4 layers (§2.2a)."
                )
                found.append(
                    Diagnostic("staircase_smoothness", "warning", message, tuple(range(first, first + n)))
                )
        n_base = sum(h == s.h_base for h in self.heads)
        if n_base < s.n_layer / 2:
            message = (
                f"only {n_base} of {s.n_layer} layers use h_base={s.h_base}; the paper keeps at "
                f"least L/2 = {s.n_layer / 2:g} (§2.2b)."
            )
            found.append(Diagnostic("baseline_preservation", "warning", message))
        for h, first, n in early:
            dh = s.d_model // h
            layers = tuple(range(first, first + n))
            if dh > FLASH_MAX_HEAD_DIM:
                message = (
                    f"d_h={dh} at {_span(first, n)} exceeds {FLASH_MAX_HEAD_DIM}, the "
                    f"widest FlashAttention head; Table 5 measures a 4-8 % throughput cost."
                )
                found.append(Diagnostic("flash_head_dim", "warning", message, layers))
            elif dh & (dh - 1):
                message = (
                    f"early d_h={dh} at {_span(first, n)} is not a power of two "
                    f"(§2.3 prefers 256, 128 for tensor-core tiling)."
                )
                found.append(Diagnostic("power_of_two_head_dim", "info", message, layers))
        return found


# ----- the Prism rule: a schedule for any shape ---------------------------------------------------
def prism_rule(shape: ModelShape) -> HeadSchedule:
    """The Prism schedule of any shape (name "prism"), by the one rule that reproduces Table 4
    exactly (docs/scales.md): power-of-two early phases, at most one bridge phase, each 2-4 layers
    long, at least L/2 layers at h_base; a shape left with no phase gets the uniform schedule."""
    L, d, h_base = shape.n_layer, shape.d_model, shape.h_base
    base_dh = d // h_base
    early: list[int] = []  # head counts of the power-of-two phases, fewest first
    dh = FLASH_MAX_HEAD_DIM
    while dh > base_dh:
        if d % dh == 0:
            early.append(d // dh)
        dh //= 2
    bridge: list[int] = []
    if early:
        last_dh = d // early[-1]
        middle = (last_dh * base_dh) ** 0.5
        between = [h for h in range(early[-1] + 1, h_base) if d % h == 0 and (d // h) % 2 == 0]
        # nearest in ratio (log distance), then fewer heads
        bridge = sorted(between, key=lambda h: (abs(math.log(d / h / middle)), h))[:1]
    p = min(max((2 * L + 8) // 16, 2), 4)  # floor(L/8 + 1/2) in integers
    budget = L // 2
    while early and (len(early) + len(bridge)) * p > budget:
        if p > 2:
            p -= 1
        elif bridge:
            bridge = []
        else:
            early = early[1:]
    heads = [h for h in early + bridge for _ in range(p)]
    heads += [h_base] * (L - len(heads))
    return HeadSchedule(tuple(heads), shape, "prism")


def parse_heads(text: str) -> list[int]:
    """Expand compact schedule text into one head count per layer."""
    if not isinstance(text, str) or not text.strip():
        raise ScheduleError(f"schedule text {text!r} is empty; write e.g. '3x2,6x2,8x2,12x6'.")
    heads: list[int] = []
    for item in text.replace("×", "x").replace("*", "x").split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)\s*(?:x\s*(\d+))?", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ScheduleError(
                f"cannot read {item!r} in schedule {text!r}: each item is HEADS or HEADSxREPEAT "
                f"with positive integers, e.g. '3x2,6x2,8x2,12x6'."
            )
        heads.extend([int(m.group(1))] * int(m.group(2) or 1))
    return heads


def _runs(heads: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs of equal head count as (heads, first_layer, length)."""
    runs: list[tuple[int, int, int]] = []
    for h, group in itertools.groupby(heads):
        first = runs[-1][1] + runs[-1][2] if runs else 0
        runs.append((h, first, len(list(group))))
    return runs


def compact_text(heads: Sequence[int]) -> str:
    return ",".join(f"{h}x{n}" if n > 1 else str(h) for h, _, n in _runs(heads))


def path_safe(name: str) -> str:
    """A schedule's name as a folder name: a head list's commas (and any other character a path
    should not hold) become '-', so 3x2,6x2,12x8 trains in 3x2-6x2-12x8/."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def split_schedules(text: str) -> list[str]:
    """ "uniform,3x2,6x2,12x8" -> [uniform, "3x2,6x2,12x8"]: numeric items run together into one
    head list; ';' separates two head lists ("uniform,prism;2x2,4x6" is three schedules)."""
    if ";" in text:
        return [s for part in text.split(";") for s in split_schedules(part)]
    out: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        numeric = all(c.isdigit() or c in "x×* " for c in item)
        if numeric and out and all(c.isdigit() or c in "x×*, " for c in out[-1]):
            out[-1] += "," + item
        else:
            out.append(item)
    return out


# ----- enumeration for grid searches -----------------------------------------------------------
@dataclass(frozen=True)
class ScheduleFilter:
    """Optional design rules applied while enumerating (all off by default = every valid one)."""

    smooth: bool = False  # every non-baseline phase lasts 2-4 layers
    baseline_preservation: bool = False  # at least L/2 layers at h_base
    power_of_two: bool = False  # every early d_h a power of two
    max_head_dim: int | None = None  # e.g. 256 to stay on FlashAttention
    min_heads: int = 1


def _phase_lengths(f: ScheduleFilter, remaining: int) -> range:
    return range(2, min(4, remaining) + 1) if f.smooth else range(1, remaining + 1)


def _early_and_min_base(shape: ModelShape, f: ScheduleFilter) -> tuple[list[int], int]:
    """The head counts an early phase may have, and how many layers at least keep h_base."""
    early = [
        h
        for h in divisors(shape.d_model)
        if f.min_heads <= h < shape.h_base
        and (dh := shape.d_model // h) % 2 == 0
        and not (f.power_of_two and dh & (dh - 1))
        and (f.max_head_dim is None or dh <= f.max_head_dim)
    ]
    return early, -(-shape.n_layer // 2) if f.baseline_preservation else 1


def iter_schedules(shape: ModelShape, rules: ScheduleFilter = ScheduleFilter()) -> Iterator[HeadSchedule]:
    """Yield every valid schedule of `shape` passing `rules`, lazily, uniform first."""
    early, min_base = _early_and_min_base(shape, rules)

    def prefixes(start: int, remaining: int) -> Iterator[list[int]]:
        # A prefix is a non-decreasing run of early head counts; the rest is filled with h_base.
        if remaining >= min_base:
            yield []
        for idx in range(start, len(early)):
            for n in _phase_lengths(rules, remaining - min_base):
                for tail in prefixes(idx + 1, remaining - n):
                    yield [early[idx]] * n + tail

    for prefix in prefixes(0, shape.n_layer):
        heads = prefix + [shape.h_base] * (shape.n_layer - len(prefix))
        yield HeadSchedule(tuple(heads), shape, compact_text(heads))


def count_schedules(shape: ModelShape, rules: ScheduleFilter = ScheduleFilter()) -> int:
    """How many schedules :func:`iter_schedules` would yield, without building them."""
    early, min_base = _early_and_min_base(shape, rules)

    @lru_cache(maxsize=None)
    def count(start: int, remaining: int) -> int:
        total = 1 if remaining >= min_base else 0
        for idx in range(start, len(early)):
            for n in _phase_lengths(rules, remaining - min_base):
                total += count(idx + 1, remaining - n)
        return total

    return count(0, shape.n_layer)
