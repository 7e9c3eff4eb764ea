"""Where a run's code came from and what it ran on: the kit's version and git commit, the versions
of the libraries that affect its numbers, and the hardware. Best effort: none of it may fail a run
(a missing value reads "unknown" or None). Recorded in train_summary.json and on tracker pages."""

from __future__ import annotations

import functools
import platform
import subprocess
from contextlib import suppress
from importlib import metadata
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parents[2]  # src/prism -> the checkout's root

# The distributions whose versions can change a run's numbers or its data (docs/outputs.md).
VERSIONED = ("torch", "lightning", "datasets", "tiktoken", "numpy")


def kit_version() -> str:
    return _version("prism-repro")  # "unknown" for a source tree on sys.path, not installed


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The kit's git commit, with "-dirty" when tracked files differ from it; "unknown" outside a
    git checkout (an installed wheel) or without git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(KIT_ROOT), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != KIT_ROOT:
            return "unknown"  # the kit sits inside someone else's repository
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def _version(dist: str) -> str:
    """The installed version of `dist`, or "unknown"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def software() -> dict:
    """The kit, Python and the library versions of this process, and the CUDA stack torch was
    built with and sees (None on a CPU-only build)."""
    import torch

    cuda = torch.version.cuda
    nccl = None
    if cuda and torch.cuda.is_available():
        with suppress(RuntimeError, AttributeError):  # a build without NCCL
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "kit_version": kit_version(),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        **{name: _version(name) for name in VERSIONED},
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
    }


def hardware(trainer) -> dict:
    """The device name (prism.hardware, as the throughput numbers use) and how many of them."""
    from prism.hardware import device_name

    return {"hardware": device_name(trainer.strategy.root_device), "num_devices": trainer.world_size}


def environment(trainer) -> dict:
    """software() and hardware(trainer) together: what train_summary.json records."""
    return {**software(), **hardware(trainer), "platform": platform.platform(terse=True)}
