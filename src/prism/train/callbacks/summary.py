"""train_summary.json: what one finished run measured (fields documented in docs/outputs.md)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from prism import provenance
from prism.runs import records
from prism.train.callbacks.milestones import LossMilestones
from prism.train.callbacks.priority import RECORD
from prism.train.callbacks.throughput import PrismThroughputMonitor


def ddp_settings(trainer: L.Trainer) -> dict | None:
    """The DistributedDataParallel wrapper's settings as it runs (None without DDP)."""
    model = getattr(trainer.strategy, "model", None)
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None
    return {
        "bucket_cap_mb": model.bucket_bytes_cap / 2**20,
        "static_graph": bool(model.static_graph),
        "gradient_as_bucket_view": bool(model.gradient_as_bucket_view),
    }


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: allocated CUDA memory on a GPU, resident set on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


class TrainSummary(Callback):
    """Collects what the summary needs while training; `write`, once the run is done (after the final
    validation, checkpoint and export), makes the file the run's 'finished' marker."""

    priority = RECORD

    def __init__(
        self, path: str | Path, milestones: LossMilestones, throughput: PrismThroughputMonitor, info: dict
    ) -> None:
        self.path = Path(path)
        self.milestones = milestones
        self.throughput = throughput
        self.info = dict(info)  # scale, schedule, heads, seed, config_hash
        # software and hardware of each attempt that differed from the one before (in the checkpoints)
        self.environments: list[dict] = []
        self.stragglers = None  # a StragglerLine, whose per-rank means the summary records

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.info["ddp"] = ddp_settings(trainer)  # the wrapper is gone by the time fit returns
        env = provenance.environment(trainer)
        if not self.environments or self.environments[-1] != env:
            self.environments.append(env)

    def state_dict(self) -> dict[str, Any]:
        return {"environments": self.environments}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.environments = list(state_dict.get("environments", []))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    def build(self, trainer: L.Trainer, pl_module: L.LightningModule) -> records.TrainSummary:
        curve = self.milestones.curve
        minimum = self.milestones.minimum()
        # the straggler line's per-rank means, from runs of several processes
        per_rank = self.stragglers.per_rank() if self.stragglers is not None else None
        tput = {
            **dict.fromkeys(("tokens_per_s", "tokens_per_s_per_device", "step_time_s", "mfu")),
            **self.throughput.summary(trainer),
            "peak_memory_bytes": peak_memory_bytes(trainer.strategy.root_device),
            "hardware": self.throughput.hardware,
            "num_devices": trainer.world_size,
        }
        return records.TrainSummary(
            **{k: self.info[k] for k in ("scale", "schedule", "heads", "seed", "config_hash")},
            n_params=pl_module.n_params,
            flops_per_token=pl_module.flops_per_token,
            steps=trainer.global_step,
            tokens_seen=trainer.global_step * self.milestones.tokens_per_step,
            final_val_loss=curve[-1]["val_loss"] if curve else None,
            min_val_loss=minimum["val_loss"],
            min_val_step=minimum["step"],
            min_val_tokens=minimum["tokens"],
            val_curve=curve,
            **{k: self.info.get(k) for k in ("batch_split", "data", "ddp")},
            throughput=tput,
            wall_clock_s=round(self.milestones.elapsed(), 3),
            environment=self.environments[-1] if self.environments else None,
            earlier_environments=self.environments[:-1],
            finished=True,
            # a context extension's source run; train.micro_batch=auto's memory estimate (prism.train.plan)
            **{k: self.info[k] for k in ("init_from", "memory") if k in self.info},
            **({"per_rank": per_rank} if per_rank else {}),
        )

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> records.TrainSummary:
        summary = self.build(trainer, pl_module)
        if trainer.is_global_zero:
            summary.write(self.path)
        return summary
