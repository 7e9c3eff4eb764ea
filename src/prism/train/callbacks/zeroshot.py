"""Zero-shot scores along training, at identical token milestones (train.eval_every_tokens), through
reproduce/evaluate.py's engine on every rank (docs/training.md, "Zero-shot scores during training")."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from prism.compat import is_step_boundary
from prism.config.schema import ConfigError, RunConfig
from prism.eval.evaluator import evaluate, overlong_task
from prism.eval.job import EvalJob, check_inputs, task_data_identity, task_units
from prism.eval.tasks import SEMANTICS, EvalInputError, resolve_tasks
from prism.runs import records
from prism.runs.layout import ZEROSHOT_NAME
from prism.train.callbacks.preemption import Preemption
from prism.train.callbacks.priority import SCORES
from prism.train.strategy import FSDP


def check_zeroshot_config(cfg: RunConfig) -> None:
    """The refusals of an in-loop evaluation that need no data: before any step, in one sentence."""
    t = cfg.train
    every, per_step = int(t.eval_every_tokens), int(t.global_batch_tokens)
    if every == 0:
        return
    if every % per_step:
        up = math.ceil(every / per_step) * per_step
        raise ConfigError(
            f"train.eval_every_tokens={every} is not a multiple of train.global_batch_tokens={per_step}; "
            f"milestones fall on optimizer steps, so use a multiple of it (e.g. {up}) or 0 (off)."
        )
    if every > int(t.tokens):
        raise ConfigError(
            f"train.eval_every_tokens={every} exceeds train.tokens={t.tokens}, so no milestone would be "
            f"scored; use a multiple of train.global_batch_tokens={per_step} up to {t.tokens}, or 0 (off)."
        )
    if str(t.strategy) == FSDP:
        raise ConfigError(
            f"train.eval_every_tokens={every} cannot run with train.strategy={FSDP}: the scoring engine "
            f"runs each rank's own batches through the decoder directly, which sharded parameters do "
            f"not allow; use train.strategy=ddp or auto, or set train.eval_every_tokens=0 and score "
            f"the step checkpoints with reproduce/evaluate.py."
        )


def plain_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers a tracker can plot: every float metric and its stderr (not the count `n`)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, float) and k != "n"}


def load_zeroshot_docs(cfg: RunConfig) -> tuple[dict[str, list], str]:
    """The documents an in-loop evaluation scores, each row validated, and their data identity; a
    ConfigError naming the setting otherwise. Also run_all's check before any job is queued."""
    t = cfg.train
    job = EvalJob(
        checkpoint="",
        out="",
        tasks=",".join(str(n) for n in t.eval_tasks),
        data_dir=cfg.eval.data_dir,
        limit=t.eval_limit,
        batch_size=cfg.eval.batch_size,
    )
    try:
        docs = check_inputs(job)
        source = task_data_identity(job.data_dir, resolve_tasks(job.tasks))
    except (EvalInputError, OSError) as exc:
        reason = str(exc).rstrip(".").replace("--data-dir", "eval.data_dir")
        raise ConfigError(
            f"train.eval_every_tokens={t.eval_every_tokens} scores train.eval_tasks from "
            f"eval.data_dir={cfg.eval.data_dir}, but {reason}; fix that or set train.eval_every_tokens=0."
        ) from None
    # every continuation must fit the model's context (reproduce/evaluate.py's check), found now
    found = overlong_task(docs, cfg.model.seq_len)
    if found is not None:
        name, longest, n_docs = found
        raise ConfigError(
            f"train.eval_tasks: task {name} has a continuation of {longest} tokens in its first "
            f"{n_docs} documents (train.eval_limit), longer than model.seq_len={cfg.model.seq_len}; "
            f"leave {name} out of train.eval_tasks or use a longer model.seq_len."
        )
    return docs, source


class ZeroShotEval(Callback):
    priority = SCORES

    def __init__(self, cfg: RunConfig, out: Path, throughput: Any = None) -> None:
        """The callback for a run, its documents loaded (and so every row validated) now, before
        any step; its settings were checked by the run's plan (check_zeroshot_config)."""
        t = cfg.train
        self.every_tokens, self.tokens_per_step = int(t.eval_every_tokens), int(t.global_batch_tokens)
        self.tasks = [str(n) for n in t.eval_tasks]
        self.limit, self.batch_size = int(t.eval_limit), int(cfg.eval.batch_size)
        self.data_dir = cfg.eval.data_dir
        self.path = Path(out) / ZEROSHOT_NAME
        self.docs, self.data_source = load_zeroshot_docs(cfg)
        self.throughput = throughput  # PrismThroughputMonitor: evaluation time is not training time
        self.on_batch: Callable[[int], None] | None = None  # the hang watchdog's: each batch is progress
        self.milestones: list[dict[str, Any]] = []
        # milestones an earlier session scored with other settings: kept apart, never mixed in
        self.earlier: list[dict[str, Any]] = []

    def key(self) -> dict[str, Any]:
        """Milestones saved by an earlier session are kept only when scored the same way."""
        return {
            "every_tokens": self.every_tokens,
            "tasks": sorted(self.tasks),  # the order they are given in changes no score
            "limit": self.limit,
            "data_source": self.data_source,
            "batch_size": self.batch_size,
            "semantics": SEMANTICS,
        }

    def record(self) -> records.ZeroShotCurve:
        milestones = sorted(self.milestones, key=lambda m: m["step"])
        earlier = {"earlier": self.earlier} if self.earlier else {}
        # the tasks in the order given, not the key's sorted list
        return records.ZeroShotCurve(**{**self.key(), "tasks": self.tasks}, milestones=milestones, **earlier)

    def due(self, trainer: L.Trainer) -> bool:
        step = trainer.global_step
        done = {m["step"] for m in self.milestones}
        return step > 0 and (step * self.tokens_per_step) % self.every_tokens == 0 and step not in done

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the file holds exactly the checkpointed state: later milestones of a killed session go
        if trainer.is_global_zero:
            self.record().write(self.path)
        # a checkpoint at a milestone's step without its scores (a stop there skips them): scored now
        if self.due(trainer):
            self.run_milestone(trainer, pl_module, timed=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not is_step_boundary(trainer) or not self.due(trainer):
            return
        if any(isinstance(c, Preemption) and c.stops_at(trainer.global_step) for c in trainer.callbacks):
            # every rank agreed to stop here: the resumed run scores these weights at its start
            rank_zero_info(f"zero-shot at step {trainer.global_step}: left to the resumed run (stopping)")
            return
        self.run_milestone(trainer, pl_module, timed=True)

    def run_milestone(self, trainer: L.Trainer, pl_module: L.LightningModule, timed: bool) -> None:
        step, tokens = trainer.global_step, trainer.global_step * self.tokens_per_step
        rank_zero_info(
            f"zero-shot at step {step} ({tokens:,} tokens): scoring {', '.join(self.tasks)} "
            f"(first {self.limit} documents each) on {trainer.world_size} rank(s)"
        )
        clock = self.throughput if timed else None
        if clock is not None:
            clock.pause(trainer)
        try:
            t0 = time.perf_counter()
            scores = self.score(pl_module.model, pl_module.device)
            seconds = time.perf_counter() - t0
        finally:
            if clock is not None:
                clock.unpause()
        done = {"step": step, "tokens": tokens, "seconds": round(seconds, 3), "tasks": scores}
        self.milestones.append(done)
        if trainer.is_global_zero:
            metrics = {
                f"zeroshot/{task}/{k}": v for task, m in scores.items() for k, v in plain_metrics(m).items()
            }
            metrics["zeroshot/tokens"] = float(tokens)
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=step)
            self.record().write(self.path)
        shown = ", ".join(
            f"{task} {k} {v:.4f}"
            for task, m in scores.items()
            for k, v in plain_metrics(m).items()
            if not k.endswith("_stderr")
        )
        # the seconds as the file holds them: unrounded, 0.2501 would print 0.3 beside a stored 0.25
        rank_zero_info(f"zero-shot at step {step} ({tokens:,} tokens): {shown} ({done['seconds']:.1f} s)")

    def score(self, model: torch.nn.Module, device: torch.device) -> dict[str, dict]:
        """Every task unit scored as reproduce/evaluate.py scores it, the decoder's mode kept."""
        was_training = model.training
        results: dict[str, dict] = {}
        try:
            with torch.inference_mode():
                for unit in task_units(",".join(self.tasks)):
                    res = evaluate(
                        model,
                        unit,
                        data_dir=self.data_dir,
                        limit=self.limit,
                        docs={n: self.docs[n] for n in unit},
                        batch_size=self.batch_size,
                        device=device,
                        progress=self.on_batch,
                    )
                    results.update(res["tasks"])
        finally:
            model.train(was_training)
        return results

    def state_dict(self) -> dict[str, Any]:
        return {"key": self.key(), "milestones": [dict(m) for m in self.milestones], "earlier": self.earlier}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.earlier = [dict(e) for e in state_dict.get("earlier", [])]
        saved = dict(state_dict.get("key") or {})
        if isinstance(saved.get("tasks"), list):
            saved["tasks"] = sorted(saved["tasks"])
        if saved != self.key():
            changed = ", ".join(
                f"{k} {saved.get(k)!r} -> {v!r}" for k, v in self.key().items() if saved.get(k) != v
            )
            rank_zero_info(
                f"zero-shot milestones in the checkpoint were scored with other settings ({changed}); "
                f"they are kept apart under 'earlier' in {self.path.name}, and the milestones from here "
                f"on are scored with the present settings."
            )
            if state_dict.get("milestones"):
                self.earlier.append({"key": saved, "milestones": [dict(m) for m in state_dict["milestones"]]})
            self.milestones = []
            return
        self.milestones = [dict(m) for m in state_dict["milestones"]]
