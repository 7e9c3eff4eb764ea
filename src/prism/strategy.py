"""How a run uses its hardware: the device kind, the precision plugin and the distributed strategy.

The one place that answers "is this run on a GPU" and turns `train.precision` / `train.strategy`
into Trainer arguments (prism.training builds the Trainer from them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType

from prism.batch import requested_devices

if TYPE_CHECKING:
    from prism.config import RunConfig


def wants_gpu(accelerator: str) -> bool:
    """train.accelerator names a GPU, or is `auto` on a machine that has one."""
    accel = str(accelerator).lower()
    return accel in ("gpu", "cuda") or (accel == "auto" and torch.cuda.is_available())


def on_gpu(cfg: RunConfig) -> bool:
    return wants_gpu(cfg.train.accelerator)


class BF16MixedPrecision(MixedPrecision):
    """bf16 autocast that lets the Trainer clip gradients of a fused AdamW.

    Lightning's MixedPrecision refuses to clip when the optimizer "handles unscaling" (fused
    AdamW sets `_step_supports_amp_scaling`), because with an fp16 GradScaler the gradients would
    still be scaled at clipping time. bf16 never uses a scaler, so plain clipping is exact."""

    def __init__(self, device: str = "cuda") -> None:
        super().__init__("bf16-mixed", device)

    def clip_gradients(
        self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM
    ) -> None:
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


def precision_args(cfg: RunConfig) -> dict[str, Any]:
    """`auto` = bf16-mixed on GPU (§3.1), 32-true on CPU. bf16-mixed goes through
    BF16MixedPrecision so that the Trainer may clip a fused AdamW's gradients."""
    gpu = on_gpu(cfg)
    precision = str(cfg.train.precision)
    if precision == "auto":
        precision = "bf16-mixed" if gpu else "32-true"
    if precision == "bf16-mixed":
        return {"plugins": [BF16MixedPrecision("cuda" if gpu else "cpu")]}
    return {"precision": precision}


def strategy_arg(cfg: RunConfig):
    """train.strategy, or DDP with the kit's settings where the run has several devices."""
    t = cfg.train
    world = requested_devices(cfg) * int(t.num_nodes)
    if str(t.strategy) == "ddp" or (str(t.strategy) == "auto" and world > 1):
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(
            bucket_cap_mb=int(t.ddp_bucket_cap_mb),
            static_graph=bool(t.ddp_static_graph),
            gradient_as_bucket_view=bool(t.ddp_gradient_as_bucket_view),
        )
    return t.strategy
