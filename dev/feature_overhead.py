"""What a feature costs a training run: tokens/s with it on vs off, measured in one run.

    python dev/feature_overhead.py --feature trackers [--scale tiny] [--steps 40] [--rounds 3] [key=value ...]
    python dev/feature_overhead.py --feature health --rounds 5

Features (FEATURES): `trackers`, all four trackers (W&B offline, MLflow on its sqlite store, both
in a temporary folder) vs TensorBoard alone; `health`, the hang watchdog and, with several processes
(`train.devices=2` on the CPU), the straggler line gathering every step, the most often it can, vs
both off. Each round trains the same short run
twice through the real `prism.train.trainer.train` path, on and off; the order alternates round by
round, so load on a shared machine hits both alike. The figure is the steady-state training
tokens/s the kit itself measures (train_summary.json's throughput: validation, start-up and the
end of the run left out). Prints one JSON line per run, then the medians of each arm, the median
of the rounds' ratios (on / off; the two runs of a round ran back to back) and their spread."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# feature: (overrides on, overrides off)
FEATURES = {
    "trackers": (
        ["train.loggers=[tensorboard,csv,wandb,mlflow]", "train.wandb.mode=offline"],
        ["train.loggers=[tensorboard]"],
    ),
    "health": (
        ["train.hang_timeout_s=300", "train.straggler_every_steps=1"],
        ["train.hang_timeout_s=0", "train.straggler_every_steps=0"],
    ),
}
# the tiny model on 32-token windows, 128 tokens per step (4 x 32, micro-batch 2 x accumulation
# 2), so a CPU run takes seconds; validation only at the start and the end
SHORT = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.log_every_steps=2",
    "data.val_tokens=256",
    "train.milestones=[]",
]
TOKENS_PER_STEP = 128


def run_once(scale: str, steps: int, arm: list[str], extra: list[str]) -> dict:
    from prism.config.schema import load_config
    from prism.train.trainer import train

    with tempfile.TemporaryDirectory(prefix="feature-overhead-") as tmp:
        overrides = [
            *SHORT,
            f"train.tokens={steps * TOKENS_PER_STEP}",
            f"train.val_every_steps={steps}",
            f"train.ckpt_every_steps={steps}",
            *arm,
            *extra,
            f"runs_dir={tmp}",
        ]
        out = train(load_config(scale, overrides))
        summary = json.loads((Path(out) / "train_summary.json").read_text())
    return {"tokens_per_s": summary["throughput"]["tokens_per_s"], "steps": summary["steps"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--feature", choices=sorted(FEATURES), default="trackers")
    p.add_argument("--scale", default="tiny")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("overrides", nargs="*", help="config overrides for both arms, key=value")
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_SILENT", "true")
    figures: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        for arm in order:
            got = run_once(args.scale, args.steps, FEATURES[args.feature][arm == "off"], args.overrides)
            figures[arm].append(got["tokens_per_s"])
            print(json.dumps({"round": r, args.feature: arm, **got}), flush=True)
    on, off = statistics.median(figures["on"]), statistics.median(figures["off"])
    # the two runs of a round ran back to back: their ratio cancels load that drifts over minutes
    paired = [a / b for a, b in zip(figures["on"], figures["off"])]
    result = {
        "feature": args.feature,
        "tokens_per_s_on": on,
        "tokens_per_s_off": off,
        "ratio": statistics.median(paired),
        "ratio_of_medians": on / off,
        "round_ratios": paired,
        "ratio_spread": [min(paired), max(paired)],
        "rounds": args.rounds,
        "steps": args.steps,
        "on": figures["on"],
        "off": figures["off"],
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
