"""How a run uses its hardware: `train.precision` and `train.strategy` as Trainer arguments (why
not Lightning's FSDPStrategy: docs/cluster.md, "Processes and devices")."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry
from lightning.pytorch.utilities import GradClipAlgorithmType

from prism.config.schema import ConfigError
from prism.hardware import wants_gpu
from prism.registry import Registry
from prism.train.batch import world_size

FSDP = "fsdp"  # train.strategy value: FSDP2 through ModelParallelStrategy

if TYPE_CHECKING:
    from prism.config.schema import RunConfig


def on_gpu(cfg: RunConfig) -> bool:
    return wants_gpu(cfg.train.accelerator)


class BF16MixedPrecision(MixedPrecision):
    """bf16 autocast that lets the Trainer clip gradients of a fused AdamW, which Lightning refuses
    for fear of a GradScaler's scaled gradients; bf16 never uses a scaler."""

    def __init__(self, device: str = "cuda") -> None:
        super().__init__("bf16-mixed", device)

    def clip_gradients(
        self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM
    ) -> None:
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


def resolved_precision(cfg: RunConfig) -> str:
    """train.precision with `auto` resolved: bf16-mixed on GPU (§3.1), 32-true on CPU."""
    precision = str(cfg.train.precision)
    if precision == "auto":
        return "bf16-mixed" if on_gpu(cfg) else "32-true"
    return precision


def precision_args(cfg: RunConfig) -> dict[str, Any]:
    """The Trainer's precision; bf16-mixed through BF16MixedPrecision, under DDP and FSDP alike."""
    precision = resolved_precision(cfg)
    if precision == "bf16-mixed":
        return {"plugins": [BF16MixedPrecision("cuda" if on_gpu(cfg) else "cpu")]}
    return {"precision": precision}


def fsdp2_available() -> bool:
    """This torch has FSDP2 (torch.distributed.fsdp.fully_shard, public in the torch>=2.6 the kit
    requires): a build with torch.distributed."""
    return torch.distributed.is_available()


def check_strategy(cfg: RunConfig) -> None:
    """Refuse, with one sentence, a strategy setting that cannot train correctly."""
    strategy, precision = str(cfg.train.strategy), resolved_precision(cfg)
    lightning_fsdp = [name for name in FSDPStrategy.get_registered_strategies() if name != FSDP]
    if strategy in lightning_fsdp:
        raise ConfigError(
            f"train.strategy={strategy!r} is Lightning's FSDP1 strategy, which refuses the kit's "
            f"precision plugin and norm clipping; use train.strategy={FSDP} (FSDP2), auto or ddp."
        )
    if strategy == FSDP and not fsdp2_available():
        raise ConfigError(
            f"train.strategy={FSDP} needs torch>=2.6, whose torch.distributed.fsdp has the public "
            f"fully_shard; this is torch {torch.__version__}: upgrade torch or use ddp."
        )
    if strategy == FSDP and precision == "16-mixed":
        raise ConfigError(
            f"train.precision=16-mixed is invalid with train.strategy={FSDP}: its loss scaler looks "
            f"for inf only in each rank's own gradient shard, so ranks could skip different steps; "
            f"use bf16-mixed (the paper's recipe) or 32-true."
        )


class ShardedDataParallel(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy, which also keeps its process-group timeout where
    join_process_group, which starts that group itself, can read it."""

    def __init__(self, *args: Any, timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(*args, timeout=timeout, **kwargs)
        self.group_timeout = timeout


def process_group_timeout(cfg: RunConfig) -> timedelta:
    """How long a collective waits for a peer (train.ddp_timeout_s), not Lightning's 30 minutes."""
    return timedelta(seconds=float(cfg.train.ddp_timeout_s))


def _lightning_names(kit: list[str]) -> str:
    """The valid train.strategy values: the kit's, then those Lightning's own registry resolves."""
    return ", ".join([*kit, *(n for n in StrategyRegistry.available_strategies() if n not in kit)])


# train.strategy -> what builds the Trainer's `strategy=`; another name Lightning knows goes to it
# unchanged (strategy_arg); prism.config.values keeps a copy of these names
STRATEGIES: Registry[Callable[[RunConfig], Any]] = Registry(
    "strategy", key="train.strategy", listed=_lightning_names
)


@STRATEGIES.register("auto")
def auto_strategy(cfg: RunConfig):
    """DDP with the kit's settings where the run has several devices, else Lightning's choice."""
    return ddp_strategy(cfg) if world_size(cfg) > 1 else "auto"


@STRATEGIES.register("ddp")
def ddp_strategy(cfg: RunConfig):
    from lightning.pytorch.strategies import DDPStrategy

    t = cfg.train
    return DDPStrategy(
        bucket_cap_mb=int(t.ddp_bucket_cap_mb),
        static_graph=bool(t.ddp_static_graph),
        gradient_as_bucket_view=bool(t.ddp_gradient_as_bucket_view),
        # the only buffers are the RoPE tables, the same on every rank: no broadcast at each forward
        broadcast_buffers=False,
        timeout=process_group_timeout(cfg),
    )


@STRATEGIES.register(FSDP)
def fsdp2_strategy(cfg: RunConfig):
    # pure data parallelism; save_distributed_checkpoint=False: one checkpoint file, gathered on rank 0
    return ShardedDataParallel(
        data_parallel_size=world_size(cfg),
        tensor_parallel_size=1,
        save_distributed_checkpoint=False,
        timeout=process_group_timeout(cfg),
    )


def strategy_arg(cfg: RunConfig):
    """The Trainer's `strategy=` for train.strategy: the registered builder's, else the name itself."""
    name = str(cfg.train.strategy)
    if name not in STRATEGIES and name in StrategyRegistry.available_strategies():
        return name
    return STRATEGIES.get(name)(cfg)


def shard_model(strategy: Strategy, decoder: torch.nn.Module) -> None:
    """Under FSDP, shard the decoder in place, once (before torch.compile, which leaves FSDP2's hooks
    eager); nothing under any other strategy."""
    if not isinstance(strategy, ModelParallelStrategy):  # only FSDP shards the parameters
        return
    from torch.distributed.fsdp import FSDPModule  # torch >= 2.6 (check_strategy)

    if not isinstance(decoder, FSDPModule):
        shard_decoder(decoder, strategy.device_mesh["data_parallel"])


def shard_decoder(decoder: torch.nn.Module, mesh) -> None:
    """fully_shard a PrismDecoder over a 1-D device mesh: a unit per block, the root holding the rest."""
    from torch.distributed.fsdp import fully_shard

    for block in decoder.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(decoder, mesh=mesh)


def join_process_group(strategy: Strategy) -> None:
    """Join the process group before fit, in a launch whose ranks already run, so that they can agree
    on what to resume; under FSDP directly, as Lightning would, since its setup needs the module."""
    if not isinstance(strategy, ModelParallelStrategy):
        strategy.setup_environment()
        return
    import torch.distributed as dist

    if dist.is_initialized():
        return
    env, device = strategy.cluster_environment, strategy.root_device
    if device.type == "cuda":
        torch.cuda.set_device(device)  # each rank's collectives on its own GPU
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = env.main_address, str(env.main_port)
    dist.init_process_group(
        strategy.process_group_backend or ("nccl" if device.type == "cuda" else "gloo"),
        rank=env.global_rank(),
        world_size=env.world_size(),
        timeout=getattr(strategy, "group_timeout", None),  # train.ddp_timeout_s (strategy_arg)
    )
