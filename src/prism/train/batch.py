"""The split of one optimizer step's global batch, which never changes with the hardware: micro_batch x
accumulation x world_size, the largest micro-batch up to train.micro_batch (docs/cluster.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prism.config.schema import ConfigError, RunConfig, load_config
from prism.hardware import wants_gpu


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int
    accumulation: int
    world_size: int
    seq_len: int

    @property
    def global_batch_tokens(self) -> int:
        return self.micro_batch * self.seq_len * self.accumulation * self.world_size

    def describe(self) -> str:
        return (
            f"micro_batch {self.micro_batch} x accumulation {self.accumulation} x "
            f"{self.world_size} device(s) x seq_len {self.seq_len}"
        )


def requested_devices(cfg: RunConfig) -> int:
    """Devices per node as the config asks for them ('auto' = every visible GPU, or 1 CPU process)."""
    devices = cfg.train.devices
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if str(devices) in ("auto", "-1"):
        return max(1, torch.cuda.device_count()) if wants_gpu(cfg.train.accelerator) else 1
    try:
        return int(devices)
    except (TypeError, ValueError):
        raise ConfigError(
            f"train.devices={devices!r} is invalid: use auto, a positive count or a list of device indices."
        ) from None


def world_size(cfg: RunConfig) -> int:
    """The world size the config asks for: devices per node x nodes."""
    return requested_devices(cfg) * int(cfg.train.num_nodes)


def auto_micro_batch(cfg: RunConfig) -> bool:
    """Whether the micro-batch is chosen from the memory plan at each start (train.micro_batch=auto)."""
    return cfg.train.micro_batch == "auto"


def split(sequences: int, ceiling: int, world_size: int) -> tuple[int, int] | None:
    """(micro_batch, accumulation) for `sequences` per step over `world_size` devices with a
    micro-batch of at most `ceiling`; None when the devices cannot share the batch evenly."""
    if world_size < 1 or sequences % world_size:
        return None
    share = sequences // world_size
    micro = max(m for m in range(1, min(ceiling, share) + 1) if share % m == 0)
    return micro, share // micro


def batch_plan(cfg: RunConfig, world_size: int) -> BatchPlan:
    """The split for this config on `world_size` devices, or one sentence why there is none (with
    train.micro_batch=auto, one micro-batch per device and step, until the memory plan lowers it)."""
    t, seq = cfg.train, cfg.model.seq_len
    sequences = t.global_batch_tokens // seq  # config validation checked the divisibility
    found = split(sequences, sequences if auto_micro_batch(cfg) else t.micro_batch, world_size)
    if found is None:
        fits = [w for w in range(1, sequences + 1) if sequences % w == 0]
        raise ConfigError(
            f"train.global_batch_tokens={t.global_batch_tokens} is {sequences} sequences of "
            f"{seq} tokens, which {world_size} device(s) cannot share evenly; use a device count "
            f"that divides {sequences}: {', '.join(map(str, fits))}."
        )
    return BatchPlan(found[0], found[1], world_size, seq)


def split_table(
    scales: tuple[str, ...] = ("124m", "354m", "757m"),
    nodes: tuple[int, ...] = (1, 2, 4, 8),
    gpus_per_node: int = 8,
) -> str:
    """A markdown table of the split the kit uses per scale and node count (docs/cluster.md)."""
    head = (
        "| scale | global batch | micro-batch ceiling | "
        + " | ".join(f"{n} node{'s' if n > 1 else ''} ({n * gpus_per_node} GPUs)" for n in nodes)
        + " |"
    )
    rows = [head, "|---|---:|---:|" + "---:|" * len(nodes)]
    for scale in scales:
        cfg = load_config(scale)
        seqs = cfg.train.global_batch_tokens // cfg.model.seq_len
        # auto: the ceiling is the memory plan's, at most the global batch
        ceiling = seqs if auto_micro_batch(cfg) else cfg.train.micro_batch
        found = [split(seqs, ceiling, n * gpus_per_node) for n in nodes]
        cells = [f"{f[0]} × {f[1]}" if f else "does not divide" for f in found]
        rows.append(
            f"| {scale} | {seqs} × {cfg.model.seq_len} | {cfg.train.micro_batch} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(rows) + "\n"
