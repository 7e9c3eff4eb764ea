"""What the training framework costs, and what the real training path achieves.

Two measurements, both printed as JSON:

1. default — framework overhead: steady-state training tokens/s of the Lightning path (PrismLM,
   the Trainer's precision, clipping and accumulation, and the run's per-step callbacks: NaN guard,
   ThroughputMonitor, LR monitor, progress bar, TensorBoard) against a plain PyTorch loop with the
   same model, micro-batches, AdamW groups, LR schedule, clipping, precision and compile setting.
   Both consume the same pre-built micro-batches from the real data pipeline, run in one process
   and alternate round by round (L,P then P,L ...) so that load on a shared machine hits both
   alike. Validation and checkpointing are off in both: they are per-run, not per-step, costs.

       python dev/overhead.py [--scale tiny] [--steps 8] [--rounds 3] [key=value ...]

2. --compare-schedules — uniform vs Prism through the real `prism.train.trainer.train` path for a
   fixed number of steps (offline data, a short validation set), reading tokens/s and MFU from
   each run's train_summary.json. On a GPU box without internet:

       python dev/overhead.py --compare-schedules --scale 124m --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from prism.config.schema import RunConfig, load_config, to_dict
from prism.core.model import PrismDecoder
from prism.train.module import PrismLM
from prism.train.optim import auto_flag, make_optimizer


# ----- 1. framework overhead ---------------------------------------------------------------------
class _Timer(Callback):
    """Wall time of micro-batches [skip, end) inside the Lightning loop."""

    def __init__(self, skip: int) -> None:
        self.skip, self.t0, self.t1, self.n = skip, None, None, 0

    def _sync(self, trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.skip:
            self._sync(trainer)
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.skip:
            self.n += 1
            self._sync(trainer)
            self.t1 = time.perf_counter()


def _micro_batches(cfg: RunConfig, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from prism.data import TokenStreamDataModule

    dm = TokenStreamDataModule(cfg)
    it = iter(dm.train_dataset(rank=0, world_size=1))
    return [next(it) for _ in range(n)]


def _device(cfg: RunConfig) -> torch.device:
    from prism.train.strategy import on_gpu

    return torch.device("cuda" if on_gpu(cfg) else "cpu")


def _run_lightning(
    cfg: RunConfig, batches, accumulation: int, steps: int, warmup: int, logdir: Path
) -> float:
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import TensorBoardLogger

    from prism.train.callbacks import Preemption, PrismThroughputMonitor, StepProgressBar
    from prism.train.strategy import precision_args

    L.seed_everything(cfg.train.seed, verbose=False)
    module = PrismLM(
        model=cfg.model_config().to_dict(),
        run=to_dict(cfg),
        scale=cfg.scale,
        schedule=cfg.head_schedule().name,
        seed=cfg.train.seed,
    )
    timer = _Timer(warmup * accumulation)
    t = cfg.train
    trainer = L.Trainer(
        accelerator=t.accelerator,
        devices=1,
        **precision_args(cfg),
        max_steps=steps,
        max_epochs=-1,
        accumulate_grad_batches=accumulation,
        gradient_clip_val=t.grad_clip,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        log_every_n_steps=t.log_every_steps,
        enable_model_summary=False,
        logger=TensorBoardLogger(str(logdir), name="tb", version="", default_hp_metric=False),
        callbacks=[
            Preemption(t.val_every_steps),
            PrismThroughputMonitor(),
            LearningRateMonitor(logging_interval="step"),
            StepProgressBar(refresh_rate=t.log_every_steps),
            timer,
        ],
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    return timer.n * batches[0][0].numel() / (timer.t1 - timer.t0)


def _run_plain(cfg: RunConfig, batches, accumulation: int, steps: int, warmup: int) -> float:
    """nanoGPT's loop: the same math as PrismLM under the Trainer, nothing else."""
    from prism.train.strategy import precision_args

    t, device = cfg.train, _device(cfg)
    L.seed_everything(cfg.train.seed, verbose=False)
    model = PrismDecoder(cfg.model_config()).to(device)
    bf16 = "plugins" in precision_args(cfg)
    compile_on = auto_flag(t.compile, device)
    if compile_on:
        model.compile(dynamic=False)
    opt, sched = make_optimizer(model, to_dict(cfg)["train"], steps, device)
    model.train()
    t0 = None
    it = iter(batches)
    for step in range(steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        for _ in range(accumulation):
            x, y = (b.to(device, non_blocking=True) for b in next(it))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, y)
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        loss.item()  # nanoGPT reads the loss every step; Lightning's guard syncs once per step too
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (steps - warmup) * accumulation * batches[0][0].numel() / (time.perf_counter() - t0)


def measure_overhead(cfg: RunConfig, steps: int, warmup: int, rounds: int) -> dict:
    from prism.hardware import device_name
    from prism.train.batch import batch_plan

    plan = batch_plan(cfg, world_size=1)
    batches = _micro_batches(cfg, steps * plan.accumulation)
    lightning_tps, plain_tps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ("lightning", "plain") if r % 2 == 0 else ("plain", "lightning")
            for which in order:
                if which == "lightning":
                    lightning_tps.append(
                        _run_lightning(cfg, batches, plan.accumulation, steps, warmup, Path(tmp) / f"r{r}")
                    )
                else:
                    plain_tps.append(_run_plain(cfg, batches, plan.accumulation, steps, warmup))
    lt, pt = statistics.median(lightning_tps), statistics.median(plain_tps)
    pairs = [a / b for a, b in zip(lightning_tps, plain_tps)]
    device = _device(cfg)
    return {
        "benchmark": "framework_overhead",
        "scale": cfg.scale,
        "schedule": cfg.head_schedule().name,
        "hardware": device_name(device),
        "threads": torch.get_num_threads(),
        "micro_batch": plan.micro_batch,
        "accumulation": plan.accumulation,
        "seq_len": plan.seq_len,
        "steps": steps,
        "warmup_steps": warmup,
        "rounds": rounds,
        "compile": auto_flag(cfg.train.compile, device),
        "lightning_tokens_per_s": lightning_tps,
        "plain_tokens_per_s": plain_tps,
        "lightning_median": lt,
        "plain_median": pt,
        "ratio_of_medians": lt / pt,
        # each round's pair ran back to back, so its ratio is the least disturbed by load drift;
        # the headline is their median. Their spread says how much to trust it on this machine.
        "round_ratios": pairs,
        "ratio": statistics.median(pairs),
    }


# ----- 2. uniform vs Prism through the real path ------------------------------------------------
def compare_schedules(scale: str, steps: int, overrides: list[str], runs_dir: str | None) -> dict:
    from prism.train.trainer import train

    base = load_config(scale, overrides)
    tokens = steps * base.train.global_batch_tokens
    fixed = [
        f"train.tokens={tokens}",
        f"train.val_every_steps={steps}",
        f"train.ckpt_every_steps={steps}",
        "data.source=offline",
        f"data.val_tokens={8 * base.model.seq_len * 4}",
        *overrides,
    ]
    out: dict = {"benchmark": "schedule_throughput", "scale": scale, "steps": steps, "schedules": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("uniform", "prism"):
            cfg = load_config(scale, [*fixed, f"schedule={name}", f"runs_dir={runs_dir or tmp}"])
            run = train(cfg, overwrite=True)
            s = json.loads((run / "train_summary.json").read_text())
            out["schedules"][name] = {
                "heads": s["heads"],
                **s["throughput"],
                "final_val_loss": s["final_val_loss"],
            }
    u, p = out["schedules"]["uniform"], out["schedules"]["prism"]
    out["prism_over_uniform_tokens_per_s"] = p["tokens_per_s"] / u["tokens_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="overhead.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", default="tiny")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per run (default 8; 30 with --compare-schedules)",
    )
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    p.add_argument("--rounds", type=int, default=3, help="alternating Lightning/plain rounds")
    p.add_argument(
        "--compare-schedules",
        action="store_true",
        help="uniform vs prism tokens/s and MFU through prism.train.trainer.train",
    )
    p.add_argument("--runs-dir", default=None, help="keep the --compare-schedules runs here")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = p.parse_args(argv)
    from prism.config.schema import ConfigError

    try:
        # The runs' progress bars and Lightning's notices go to stderr so that stdout carries
        # nothing but the JSON result (rich looks up sys.stdout when it writes).
        with contextlib.redirect_stdout(sys.stderr):
            result = _run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _run(args: argparse.Namespace) -> dict:
    from prism.config.schema import ConfigError

    if args.compare_schedules:
        return compare_schedules(args.scale, args.steps or 30, args.overrides, args.runs_dir)
    steps = args.steps or 8
    if not 0 <= args.warmup < steps:
        raise ConfigError(f"--warmup={args.warmup} is invalid: use 0 <= warmup < --steps={steps}.")
    cfg = load_config(args.scale, args.overrides)
    return measure_overhead(cfg, steps, args.warmup, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
