"""How long the memory plan (prism.train.memory) takes per scale on this machine: the first
estimate of a scale (two simulated optimizer steps plus the zero-shot forward, nothing cached)
and a second one of the same settings (from the process's cache), at the config's micro-batch on
8 devices (DDP) and on one.

    python dev/memory_benchmark.py                       # tiny, 124m, 354m, 757m
    python dev/memory_benchmark.py --scales 757m
"""

from __future__ import annotations

import argparse
import time

import torch

from prism.config.schema import load_config
from prism.train.memory import estimate_memory, simulate_forward, simulate_step


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--scales", default="tiny,124m,354m,757m")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for scale in args.scales.split(","):
        simulate_step.cache_clear()
        simulate_forward.cache_clear()
        cfg = load_config(scale)
        t0 = time.perf_counter()
        plan = estimate_memory(cfg, 8)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        estimate_memory(cfg, 8)
        cached = time.perf_counter() - t0
        print(
            f"{scale:>5}: {first:6.1f} s first estimate, {cached * 1e3:6.1f} ms cached; "
            f"8 devices: {plan.line()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
