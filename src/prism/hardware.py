"""The devices a run uses: whether it asks for a GPU, their names, and their dense peak FLOP/s (the one
place MFU's denominator comes from; why not Lightning's: docs/design.md, "One home for each concern")."""

from __future__ import annotations

import platform

import torch

# (substring of torch.cuda.get_device_name(), dense bf16 TFLOP/s). Order matters: the first
# matching entry wins, so specific names precede generic ones.
DENSE_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.4),  # same SXM5 tensor cores as H100 SXM
    ("GH200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM5, the paper's hardware
    ("H800", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
    ("V100", 125.0),  # fp16; V100 has no bf16
)


def device_name(device: torch.device | str | None = None) -> str:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def peak_flops(name: str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Dense peak FLOP/s for a device name, or None when unknown (CPUs included)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None  # tf32/fp32 peaks differ; we only report MFU for the bf16 training recipe
    for key, tflops in DENSE_BF16_TFLOPS:
        if key in name:
            return tflops * 1e12
    return None


def wants_gpu(accelerator: str) -> bool:
    """train.accelerator names a GPU, or is `auto` on a machine that has one."""
    accel = str(accelerator).lower()
    return accel in ("gpu", "cuda") or (accel == "auto" and torch.cuda.is_available())


def pick_device(device: str, error: type[Exception]) -> str:
    """--device: auto is CUDA where a CUDA device is visible, else the CPU; CUDA asked for where
    none is visible raises `error`."""
    name = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(name).type == "cuda" and not torch.cuda.is_available():
        raise error(f"--device {device} was asked for but no CUDA device is visible; use --device cpu.")
    return name
