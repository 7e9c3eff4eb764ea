"""The few Lightning, torch and Optuna internals the kit relies on: each named, checked and tested here.
Why each is needed: docs/design.md, "Internals the kit relies on"."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # Lightning is imported where used: reading weights needs none of its imports
    import lightning

SIGTERM_BROADCAST = "_broadcast_sigterm_tensor"
BATCH_PROGRESS = "epoch_loop.batch_progress"  # key of the epoch loop's counters in the fit loop's state
PROGRESS_PARTS = ("total", "current")
PROGRESS_COUNTS = ("ready", "started", "processed", "completed")


class CompatError(RuntimeError):
    """A Lightning or torch internal the kit relies on is not where it used to be."""


def _missing(what: str, needed_for: str, library: Any = None) -> CompatError:
    """The sentence for an internal that `library` (torch; None: Lightning) no longer has."""
    if library is None:
        import lightning as library
    name = "torch" if library is torch else "Lightning"
    return CompatError(
        f"{name} {library.__version__} has no {what}, which the kit needs for {needed_for}; "
        f"install a {name.lower()} version within the range pyproject.toml gives."
    )


# ----- Lightning: the per-micro-batch SIGTERM broadcast ------------------------------------------
def silence_sigterm_broadcast(trainer: lightning.Trainer) -> None:
    """Stop Lightning's SIGTERM broadcast before every micro-batch (Preemption agrees once a step)."""
    loop = trainer.fit_loop.epoch_loop
    if not callable(getattr(type(loop), SIGTERM_BROADCAST, None)):
        raise _missing(
            f"{type(loop).__name__}.{SIGTERM_BROADCAST}",
            "one SIGTERM agreement per optimizer step instead of a broadcast per micro-batch",
        )
    setattr(loop, SIGTERM_BROADCAST, lambda: None)


# ----- Lightning: the fit loop's progress counters -----------------------------------------------
def batch_progress(fit_loop_state: dict) -> dict:
    """The epoch loop's micro-batch counters inside a fit loop state dict (a checkpoint's
    `loops.fit_loop` or `trainer.fit_loop.state_dict()`), changed in place by the callers."""
    progress = fit_loop_state.get(BATCH_PROGRESS) if isinstance(fit_loop_state, dict) else None
    if not isinstance(progress, dict) or any(
        not isinstance(progress.get(part), dict) or any(c not in progress[part] for c in PROGRESS_COUNTS)
        for part in PROGRESS_PARTS
    ):
        raise _missing(
            f"fit-loop state '{BATCH_PROGRESS}' with "
            f"{'/'.join(PROGRESS_PARTS)} x {'/'.join(PROGRESS_COUNTS)}",
            "checkpoints at optimizer-step boundaries and resuming on another batch split",
        )
    return progress


def step_boundary_state(trainer: lightning.Trainer) -> dict:
    """The fit loop's state as a checkpoint of the current step boundary holds it, taken at an
    optimizer step's first micro-batch (counted `ready` by then, not yet `started`)."""
    state = copy.deepcopy(trainer.fit_loop.state_dict())
    progress = batch_progress(state)
    for part in PROGRESS_PARTS:
        progress[part]["ready"] = progress[part]["started"]
    return state


def shift_batch_progress(fit_loop_state: dict, shift: int) -> None:
    """Move every micro-batch counter by `shift` (resume with another accumulation)."""
    progress = batch_progress(fit_loop_state)
    for part in PROGRESS_PARTS:
        for count in PROGRESS_COUNTS:
            progress[part][count] += shift


def processed_micro_batches(fit_loop_state: dict) -> int:
    return int(batch_progress(fit_loop_state)["total"]["processed"])


def is_step_boundary(trainer: lightning.Trainer) -> bool:
    """Whether the micro-batch now running ends an optimizer step: its accumulation is complete,
    or it is the epoch's last batch (unless the strategy accumulates by itself)."""
    loop = trainer.fit_loop.epoch_loop
    ready = loop.batch_progress.current.ready
    if ready % trainer.accumulate_grad_batches == 0:
        return True
    last = ready == trainer.num_training_batches or loop.batch_progress.is_last_batch
    return last and not trainer.strategy.handles_gradient_accumulation


def registered_accelerators() -> list[str]:
    """The accelerator names Lightning's registry holds (its built-ins and any a plugin added)."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    if not hasattr(AcceleratorRegistry, "available_accelerators"):
        raise _missing("AcceleratorRegistry.available_accelerators", "checking train.accelerator")
    return sorted(AcceleratorRegistry.available_accelerators())


def registered_strategies() -> list[str]:
    """The strategy names Lightning's registry holds (its own strategy classes' names)."""
    from lightning.pytorch.strategies import StrategyRegistry

    if not hasattr(StrategyRegistry, "available_strategies"):
        raise _missing("StrategyRegistry.available_strategies", "checking train.strategy")
    return sorted(StrategyRegistry.available_strategies())


def check_trainer(trainer: lightning.Trainer) -> None:
    """Every Lightning internal above is in place on this Trainer (one sentence otherwise)."""
    loop = trainer.fit_loop.epoch_loop
    if not callable(getattr(type(loop), SIGTERM_BROADCAST, None)):
        raise _missing(f"{type(loop).__name__}.{SIGTERM_BROADCAST}", "one SIGTERM agreement per step")
    batch_progress(trainer.fit_loop.state_dict())
    if not hasattr(loop, "batch_progress"):
        raise _missing(f"{type(loop).__name__}.batch_progress", "knowing where an optimizer step ends")
    if not all(hasattr(loop.batch_progress.current, c) for c in PROGRESS_COUNTS):
        raise _missing("batch_progress.current counters", "knowing where an optimizer step ends")


# ----- torch (benchmark only) ------------------------------------------------------------------
def sdpa_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any | None:
    """The backend id torch's SDPA dispatcher picks for a causal call, or None where it cannot say."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return None
    try:
        return choose(q, k, v, is_causal=True)
    except (RuntimeError, TypeError):
        return None


def raise_recompile_limit(at_least: int) -> None:
    """Let torch.compile keep `at_least` compiled entries per code object (regional compilation)."""
    import torch._dynamo.config as dynamo_config

    knobs = [k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)]
    if not knobs:
        raise _missing("torch._dynamo.config.recompile_limit", "regional compilation in the benchmark", torch)
    for knob in knobs:
        setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), at_least))


COMPILE_WRAPPER = "_orig_mod."


def without_compile_wrapper(key: str) -> str:
    """A state-dict key without torch.compile's wrapper segment."""
    return key.replace(COMPILE_WRAPPER, "")


def uncompile(module: torch.nn.Module) -> None:
    """Undo `module.compile()` (torch has no public inverse); a module never compiled stays as it is."""
    if not hasattr(module, "_compiled_call_impl"):
        raise _missing("nn.Module._compiled_call_impl", "timing a compiled block eagerly", torch)
    module._compiled_call_impl = None


# ----- torch: the CUDA caching allocator's history (train.profile_steps) -------------------------
MEMORY_HISTORY = ("_record_memory_history", "_dump_snapshot")  # in torch.cuda.memory


def check_memory_history() -> Any:
    """torch.cuda.memory, with both names there: checked when a profiled run starts on CUDA, before
    any step, and before each use."""
    import torch.cuda.memory as cuda_memory

    for name in MEMORY_HISTORY:
        if not callable(getattr(cuda_memory, name, None)):
            raise _missing(f"torch.cuda.memory.{name}", "the memory snapshot of train.profile_steps", torch)
    return cuda_memory


def record_memory_history(max_entries: int) -> None:
    """Record the CUDA caching allocator's last `max_entries` allocations and frees, with stacks."""
    check_memory_history()._record_memory_history(max_entries=max_entries)


def stop_memory_history() -> None:
    check_memory_history()._record_memory_history(enabled=None)


def dump_memory_snapshot(path: str) -> None:
    """The allocator's segments and recorded history as a pickle (pytorch.org/memory_viz)."""
    check_memory_history()._dump_snapshot(path)


# Optuna's SuccessiveHalvingPruner files a trial's loss at rung k as this system attribute
OPTUNA_RUNG_KEY = re.compile(r"completed_rung_\d+")


def is_rung_key(key: str) -> bool:
    return OPTUNA_RUNG_KEY.fullmatch(key) is not None


# ----- torch: fake tensors and dispatch modes (the memory plan, prism.train.memory) ---------------
def fake_tensor_mode() -> Any:
    """A fresh FakeTensorMode: tensors made under it have shapes, dtypes and storages, no data."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:
        raise _missing("torch._subclasses.fake_tensor.FakeTensorMode", "the memory plan", torch) from None
    return FakeTensorMode()


def dispatch_mode() -> type:
    """torch's TorchDispatchMode: a subclass's __torch_dispatch__ sees every aten op and its outputs."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        raise _missing("torch.utils._python_dispatch.TorchDispatchMode", "the memory plan", torch) from None
    return TorchDispatchMode


# ----- torch: the collective timeout after the first steps, and the flight recorder ---------------
PG_TIMEOUT = "_set_pg_timeout"  # in torch.distributed.distributed_c10d
FR_DUMP = "_dump_fr_trace"  # in torch._C._distributed_c10d (called _dump_nccl_trace before 2.7)


def set_collective_timeout(timeout: Any) -> None:
    """The default process group's timeout (a timedelta) for every collective from now on."""
    import torch.distributed.distributed_c10d as c10d

    setter = getattr(c10d, PG_TIMEOUT, None)
    if not callable(setter):
        raise _missing(f"torch.distributed.distributed_c10d.{PG_TIMEOUT}", "train.hang_timeout_s", torch)
    setter(timeout)


def flight_recorder_dump() -> bytes | None:
    """The flight recorder's record of this process's collectives (a pickle that torch's
    `torchfrtrace` reads), or None where this torch has none to give."""
    try:
        import torch._C._distributed_c10d as c10d_c
    except ImportError:
        return None
    dump = getattr(c10d_c, FR_DUMP, None) or getattr(c10d_c, "_dump_nccl_trace", None)
    if not callable(dump):
        return None
    return dump(includeCollectives=True, includeStackTraces=True, onlyActive=False)


def partitioned_graphs(module: torch.nn.Module, args: tuple) -> tuple[Any, Any]:
    """The forward and backward FX graphs torch.compile's AOT autograd makes of `module(*args)`
    (a tuple), traced on the (fake) tensors given; the backward is None without gradients."""
    try:
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.decomposition import select_decomp_table
    except ImportError:
        raise _missing(
            "AOT autograd's aot_module_simplified", "the memory plan of compiled runs", torch
        ) from None
    graphs: dict[str, Any] = {}

    def keep(name: str):
        def compiler(gm, example_inputs):
            graphs[name] = gm

            def run(*inputs):  # a boxed call passes one list, which the graph's code clears
                return gm(*inputs[0]) if len(inputs) == 1 and isinstance(inputs[0], list) else gm(*inputs)

            run._boxed_call = True
            return run

        return compiler

    run = aot_module_simplified(
        module,
        args,
        fw_compiler=keep("forward"),
        bw_compiler=keep("backward"),
        inference_compiler=keep("forward"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    out = run(*args)
    if torch.is_grad_enabled() and out[0].requires_grad:
        out[0].backward()
    return graphs.get("forward"), graphs.get("backward")


# ----- torch: aten op names in the memory plan's walk of traced graphs ------------------------------
def op_name(target: Any) -> str:
    """The aten op's name of a graph node's target (`mm`, `scatter`), or its text for anything else."""
    return getattr(target, "_opname", str(target)).split(".")[0]


def is_dtype_copy(func: Any) -> bool:
    """Whether a dispatched op is aten's dtype/device copy (autocast's copy of a weight)."""
    return func is torch.ops.aten._to_copy.default
