"""PrismLM: the LightningModule that trains a PrismDecoder with the paper's recipe (§3.1): only what
the Trainer does not do. Its hyperparameters are plain dicts, so a `.ckpt` opens weights_only."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchmetrics.aggregation import MeanMetric

from prism.compat import is_step_boundary
from prism.core.model import ModelConfig, PrismDecoder, flops_per_token
from prism.train.optim import auto_flag, make_optimizer
from prism.train.strategy import shard_model


class PrismLM(L.LightningModule):
    """A PrismDecoder trained with AdamW, warmup + cosine, and exact validation loss; `model` is
    ModelConfig.to_dict(), `run` the resolved RunConfig as a dict, the rest name the run."""

    def __init__(
        self, model: dict, run: dict, scale: str, schedule: str, seed: int, config_hash: str = ""
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model_cfg = ModelConfig(**model)
        self.train_cfg: dict[str, Any] = dict(run["train"])
        # built here, not in configure_model, so that seeding right before fixes the initial weights
        self.model = PrismDecoder(self.model_cfg)
        self.model.loss_chunk = int(self.train_cfg.get("loss_chunk_tokens", 0))  # same math either way
        self.model.checkpoint_blocks = bool(self.train_cfg.get("activation_checkpointing", False))
        self.n_params = self.model.num_params()
        self.flops_per_token = flops_per_token(self.model_cfg, self.model.flop_params())
        self.flops_per_batch = 0  # read by PrismThroughputMonitor after each batch
        # token-weighted mean, all-reduced over ranks on compute, in float64 (float32 would round)
        self.val_loss = MeanMetric().set_dtype(torch.float64)
        self.last_val_loss: float | None = None
        self._nonfinite: torch.Tensor | None = None
        self._step_loss: torch.Tensor | None = None  # sum of this optimizer step's micro-batch losses
        self._step_micro_batches = 0
        self._step_mean: torch.Tensor | None = None  # the finished step's train/loss, for the trackers
        self._compiled = False

    def configure_model(self) -> None:
        """Shard the decoder under FSDP, then torch.compile it in place (state-dict keys stay free of
        `_orig_mod.`); once, though Lightning calls this for fit and validate alike."""
        trainer = self.attached_trainer()
        if trainer is not None:
            shard_model(trainer.strategy, self.model)
        device = trainer.strategy.root_device if trainer is not None else self.device
        # train.compile: true/false, or None = auto = on for CUDA (eager is faster for tiny CPU runs)
        if self._compiled or not auto_flag(self.train_cfg.get("compile"), device):
            return
        # fixed shapes: every batch is (micro_batch, seq_len); no dynamic-shape graphs
        self.model.compile(dynamic=False)
        self._compiled = True

    def attached_trainer(self) -> L.Trainer | None:
        """The Trainer running this module, or None outside one (Lightning's `trainer` raises)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def configure_optimizers(self):
        trainer = self.trainer
        optimizer, scheduler = make_optimizer(
            self.model, self.train_cfg, trainer.max_steps, trainer.strategy.root_device
        )
        # "step": one scheduler step per optimizer step, i.e. after each full accumulation
        schedule = {"scheduler": scheduler, "interval": "step", "frequency": 1}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.model(x, y)
        self.flops_per_batch = self.flops_per_token * x.numel()
        # a non-finite loss, kept without a host sync for the ranks' one agreement per step (Preemption)
        bad = (~torch.isfinite(loss.detach())).to(torch.int32)
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite + bad
        # train/loss: the mean over the step's micro-batches, once per step; not prog_bar=True,
        # whose values Lightning reads (a host sync) after every micro-batch
        detached = loss.detach()
        self._step_loss = detached if self._step_loss is None else self._step_loss + detached
        self._step_micro_batches += 1
        trainer = self.attached_trainer()
        if trainer is None or is_step_boundary(trainer):
            self._step_mean = self._step_loss / self._step_micro_batches
            # logger=False: Lightning would log it one step early; on_train_batch_end sends it
            self.log("train/loss", self._step_mean, logger=False)
            self._step_loss, self._step_micro_batches = None, 0
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """train/loss to the trackers at trainer.global_step, every log_every_n_steps and at the end."""
        loss, self._step_mean = self._step_mean, None
        trainer = self.trainer
        if loss is None or not trainer.is_global_zero or not trainer.loggers:
            return
        step, every = trainer.global_step, trainer.log_every_n_steps
        if not (0 < trainer.max_steps <= step or trainer.should_stop or (every and step % every == 0)):
            return
        value = float(loss)  # the one host read of the logged loss per logging interval
        for logger in trainer.loggers:
            logger.log_metrics({"train/loss": value}, step=step)

    def pop_nonfinite(self) -> torch.Tensor:
        """How many losses since the last call were NaN or inf, as a tensor on the model's device."""
        flag, self._nonfinite = self._nonfinite, None
        return flag if flag is not None else torch.zeros((), dtype=torch.int32, device=self.device)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss = self.model(x, y)
        self.flops_per_batch = self.flops_per_token * x.numel() // 3  # forward only
        # each batch's mean weighted by its scored targets: the mean over all tokens on all ranks
        self.val_loss.update(loss.detach().double(), weight=(y != -1).sum().double())

    def on_validation_epoch_end(self) -> None:
        value = self.val_loss.compute()  # all-reduces the weighted sums across ranks
        self.val_loss.reset()
        self.last_val_loss = float(value)
        if not self.trainer.sanity_checking:
            # for the progress bar and callback_metrics; the trackers get it from LossMilestones
            self.log("val/loss", value.float(), prog_bar=True, sync_dist=False, logger=False)
