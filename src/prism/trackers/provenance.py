"""Where a run's code came from and what it ran on, for the trackers' run pages: the kit's
version and git commit, and the hardware. Best effort: none of it may fail a run."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parents[3]  # src/prism/trackers -> the checkout's root


def kit_version() -> str:
    from prism.export.hf import kit_version as version  # the one place that reads it

    return version()


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


def hardware(trainer) -> dict:
    """The device name (prism.hardware, as the throughput numbers use) and how many of them."""
    from prism.hardware import device_name

    return {"hardware": device_name(trainer.strategy.root_device), "num_devices": trainer.world_size}
