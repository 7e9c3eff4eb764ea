"""How a run uses its hardware: the device kind, the precision plugin and the distributed strategy.

The one place that answers "is this run on a GPU" and turns `train.precision` / `train.strategy`
into Trainer arguments (prism.train.trainer builds the Trainer from them). How `fsdp` keeps the
paper's recipe, and why Lightning's own FSDPStrategy is not used: docs/cluster.md, "Processes and
devices"."""

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
from prism.train.batch import requested_devices

FSDP = "fsdp"  # train.strategy value: FSDP2 through ModelParallelStrategy

if TYPE_CHECKING:
    from prism.config.schema import RunConfig


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


def resolved_precision(cfg: RunConfig) -> str:
    """train.precision with `auto` resolved: bf16-mixed on GPU (§3.1), 32-true on CPU."""
    precision = str(cfg.train.precision)
    if precision == "auto":
        return "bf16-mixed" if on_gpu(cfg) else "32-true"
    return precision


def precision_args(cfg: RunConfig) -> dict[str, Any]:
    """`auto` = bf16-mixed on GPU (§3.1), 32-true on CPU. bf16-mixed goes through
    BF16MixedPrecision so that the Trainer may clip a fused AdamW's gradients (under DDP and
    FSDP alike: the plugin is Lightning's plain autocast, which ModelParallelStrategy accepts)."""
    gpu = on_gpu(cfg)
    precision = resolved_precision(cfg)
    if precision == "bf16-mixed":
        return {"plugins": [BF16MixedPrecision("cuda" if gpu else "cpu")]}
    return {"precision": precision}


def fsdp2_available() -> bool:
    """This torch has FSDP2 under its public name (torch.distributed.fsdp.fully_shard, 2.6+)."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def check_strategy(cfg: RunConfig) -> None:
    """Refuse, with one sentence, a strategy setting that cannot train correctly. Called by the
    dry run (prism.pipeline) and by training, before any process group exists."""
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
    """How long a collective waits for a peer (train.ddp_timeout_s). A rank that hangs rather
    than dies (a stuck GPU, a lost link) then fails the run on every rank after this, as a crash
    that run_all.py retries, instead of after Lightning's default 30 minutes."""
    return timedelta(seconds=float(cfg.train.ddp_timeout_s))


def world_size(cfg: RunConfig) -> int:
    return requested_devices(cfg) * int(cfg.train.num_nodes)


def _lightning_names(kit: list[str]) -> str:
    """The valid train.strategy values as the registry's refusal lists them: the kit's, then
    the names Lightning's own registry resolves (used as they are)."""
    return ", ".join([*kit, *(n for n in StrategyRegistry.available_strategies() if n not in kit)])


# train.strategy -> what builds the Trainer's `strategy=` from the config; a name not here that
# Lightning's own registry knows goes to Lightning unchanged (strategy_arg). prism.config.values
# keeps a copy of these names, to refuse a bad one without importing Lightning
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
        # the only buffers are the RoPE tables, the same on every rank: no broadcast at each
        # forward, which would also make every rank's forward wait for the slowest one
        broadcast_buffers=False,
        timeout=process_group_timeout(cfg),
    )


@STRATEGIES.register(FSDP)
def fsdp2_strategy(cfg: RunConfig):
    # Pure data parallelism: every rank in one sharding group (no tensor parallelism).
    # save_distributed_checkpoint=False: one checkpoint file, gathered on rank 0.
    return ShardedDataParallel(
        data_parallel_size=world_size(cfg),
        tensor_parallel_size=1,
        save_distributed_checkpoint=False,
        timeout=process_group_timeout(cfg),
    )


def strategy_arg(cfg: RunConfig):
    """The Trainer's `strategy=` for train.strategy: the registered builder's (FSDP2 for `fsdp`,
    DDP with the kit's settings for `ddp` or a several-device `auto`), else the name itself for
    Lightning to resolve."""
    name = str(cfg.train.strategy)
    if name not in STRATEGIES and name in StrategyRegistry.available_strategies():
        return name
    return STRATEGIES.get(name)(cfg)


def shards_parameters(strategy: Strategy) -> bool:
    """The run shards its parameters across ranks (train.strategy=fsdp)."""
    return isinstance(strategy, ModelParallelStrategy)


def shard_model(strategy: Strategy, decoder: torch.nn.Module) -> None:
    """Under FSDP, shard the decoder in place, once (`shard_decoder` over every rank); nothing
    to do under any other strategy. Called from LightningModule.configure_model, before
    torch.compile: FSDP2's hooks are excluded from compilation and run eagerly between the
    compiled blocks."""
    if not shards_parameters(strategy):
        return
    from torch.distributed.fsdp import FSDPModule  # torch >= 2.6 (check_strategy)

    if not isinstance(decoder, FSDPModule):
        shard_decoder(decoder, strategy.device_mesh["data_parallel"])


def shard_decoder(decoder: torch.nn.Module, mesh) -> None:
    """fully_shard a PrismDecoder over a 1-D device mesh: each transformer block is its own unit
    (its weights are gathered for its forward and its backward only, then freed), and the root
    unit holds the rest (embedding, tied output head, final norm)."""
    from torch.distributed.fsdp import fully_shard

    for block in decoder.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(decoder, mesh=mesh)


def join_process_group(strategy: Strategy) -> None:
    """Join the process group before fit, in a launch whose ranks already run (torchrun, srun),
    so that they can agree on what to resume (prism.train.resume.agree); fit reuses the group.

    DDP's setup_environment does just that. ModelParallelStrategy's also builds the device mesh
    and hands it to the LightningModule, which does not exist yet at this point; so the group is
    joined directly, as Lightning would join it: the strategy's device, the backend for that
    device, and the cluster environment's rank, world size and rendezvous address."""
    if not shards_parameters(strategy):
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
