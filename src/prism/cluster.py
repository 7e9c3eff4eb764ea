"""What the scheduler and the launcher say, the one place that reads SLURM_* and torchrun variables:
`Allocation`, `Launch` and the guards against a wrong launch (docs/cluster.md, "How a launch is read")."""

from __future__ import annotations

import os
import re
import signal
import socket
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from prism.errors import ConfigError
from prism.io import atomic_write_json

# The tasks of an allocation or step: hidden from a process that is not one (Lightning reads
# SLURM_NTASKS as its world size).
TASK_VARS = tuple(
    (
        "SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE SLURM_PROCID SLURM_LOCALID "
        "SLURM_NODEID SLURM_STEP_ID SLURM_STEPID SLURM_STEP_NUM_TASKS SLURM_STEP_NUM_NODES "
        "SLURM_STEP_NODELIST SLURM_STEP_TASKS_PER_NODE SLURM_STEP_LAUNCHER_PORT SLURM_SRUN_COMM_PORT "
        "SLURM_SRUN_COMM_HOST"
    ).split()
)
EXIT_PREEMPTED = 75  # stopped on the scheduler's signal with a checkpoint (EX_TEMPFAIL)
EXIT_CRASHED = 70  # ended by an unexpected exception (EX_SOFTWARE): run_all.py retries the stage
# The folder where each process of a stage leaves how it ended (JSON, one file per process), set
# by prism.pipeline's runner for every stage it starts and read after it.
ENDINGS_DIR_ENV = "PRISM_ENDINGS_DIR"


def leave_ending(kind: str, exit_code: int, sentence: str) -> None:
    """Write how this process ended (kind: error, crashed, hung, preempted or interrupted) into the
    folder ENDINGS_DIR_ENV names, when a pipeline runner set it."""
    folder = os.environ.get(ENDINGS_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / f"{socket.gethostname()}-{os.getpid()}.json"
    with suppress(OSError):  # a full disk: the runner then judges by the exit code and the log, as for a kill
        atomic_write_json(path, {"kind": kind, "exit_code": exit_code, "sentence": sentence})


class Preempted(RuntimeError):
    """Stopped on the scheduler's signal with a checkpoint written: training raises it at a step
    boundary (train.py then exits EXIT_PREEMPTED), run_all.py when a stage exits so."""

    label = "preempted"
    exit_code = EXIT_PREEMPTED


EXIT_INTERRUPTED = 130  # 130, what a shell reports for a process a Ctrl-C ended


class Interrupted(Preempted):
    """A Ctrl-C stopped training at a step boundary, with last.ckpt written (exit 130)."""

    label = "interrupted"
    exit_code = EXIT_INTERRUPTED


class InterruptedAtOnce(BaseException):
    """A Ctrl-C that stops the process at once (a second one, or one outside the training steps).
    No `except Exception` swallows it, and Lightning does not turn it into exit code 1 as it does
    a KeyboardInterrupt."""

    label = "interrupted"


# Job names with which Lightning ignores Slurm (an interactive shell started with srun).
INTERACTIVE_JOB_NAMES = ("bash", "interactive")


class LaunchError(ConfigError):
    """A process layout that cannot run as asked; the message says how to launch instead."""


def _first_int(text: str | None) -> int | None:
    """The count in Slurm's forms '8', 'h100:8', 'gpu:a100:4', '8(x4)', '2,1' (first node)."""
    if not text:
        return None
    head = text.split(",")[0].split("(")[0]
    m = re.search(r"(\d+)$", head)
    return int(m.group(1)) if m else None


def in_slurm_step(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "SLURM_STEP_ID" in env


@dataclass(frozen=True)
class Allocation:
    """A Slurm allocation as its batch script (or salloc shell) sees it."""

    job_id: str
    nodes: int
    gpus_per_node: int  # 0 on an allocation without GPUs
    tasks_per_node: int | None  # --ntasks-per-node, when given
    cpus_on_node: int | None  # CPUs allocated on each node

    @property
    def procs_per_node(self) -> int:
        """Training processes per node: one per GPU, else one per task (CPU allocations)."""
        return self.gpus_per_node or self.tasks_per_node or 1

    @property
    def cpus_per_proc(self) -> int:
        return self.cpus_per_task(self.procs_per_node)

    def cpus_per_task(self, tasks_per_node: int) -> int:
        """The node's CPUs shared evenly by `tasks_per_node` tasks (at least one each)."""
        return max(1, (self.cpus_on_node or tasks_per_node) // tasks_per_node)

    def describe(self) -> str:
        gpus = f"{self.gpus_per_node} GPU(s)" if self.gpus_per_node else "no GPU"
        return (
            f"Slurm job {self.job_id}: {self.nodes} node(s) x {gpus}, "
            f"{self.cpus_on_node or '?'} CPU(s) per node"
        )

    def srun(self, nodes: int, tasks_per_node: int) -> str:
        """An srun prefix for one stage inside this allocation, every count explicit (docs/cluster.md)."""
        words = [
            f"srun --nodes={nodes} --ntasks={nodes * tasks_per_node} --ntasks-per-node={tasks_per_node}",
            f"--cpus-per-task={self.cpus_per_task(tasks_per_node)}",
        ]
        if self.gpus_per_node:
            words.append(f"--gpus-per-node={tasks_per_node}")
        return " ".join(words + ["--kill-on-bad-exit=1"])


def allocation(env: Mapping[str, str] | None = None) -> Allocation | None:
    """The Slurm allocation this process runs in but outside of any job step, else None."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env or in_slurm_step(env):
        return None
    gpus = _first_int(env.get("SLURM_GPUS_PER_NODE")) or _first_int(env.get("SLURM_GPUS_ON_NODE"))
    tasks = _first_int(env.get("SLURM_NTASKS_PER_NODE")) or _first_int(env.get("SLURM_TASKS_PER_NODE"))
    return Allocation(
        job_id=env["SLURM_JOB_ID"],
        nodes=_first_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")) or 1,
        gpus_per_node=gpus or 0,
        tasks_per_node=tasks,
        cpus_on_node=_first_int(env.get("SLURM_CPUS_ON_NODE")),
    )


@dataclass(frozen=True)
class Launch:
    kind: str  # plain | srun | torchrun
    rank: int
    world_size: int
    local_rank: int

    def describe(self) -> str:
        return {
            "plain": "one process",
            "srun": f"{self.world_size} tasks of an srun step",
            "torchrun": f"{self.world_size} torchrun ranks",
        }[self.kind]


def this_launch(env: Mapping[str, str] | None = None) -> Launch:
    """How this process was started: one rank of torchrun, one task of an srun step, or plain (a
    one-task step of an interactive shell counts as plain; docs/cluster.md)."""
    env = os.environ if env is None else env
    if {"RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"} <= env.keys():
        return Launch("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    tasks = _first_int(env.get("SLURM_NTASKS")) or 0
    if in_slurm_step(env) and tasks and (tasks > 1 or env.get("SLURM_JOB_NAME") not in INTERACTIVE_JOB_NAMES):
        return Launch(
            "srun",
            int(env.get("SLURM_PROCID", 0)),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
        )
    return Launch("plain", 0, 1, 0)


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This process's node as the scheduler names it (Slurm's node name), else the host name."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def attempt_id(env: Mapping[str, str] | None = None) -> str:
    """A name every rank of this launch derives alike and the next launch (a retry, a requeue, a
    torchrun restart) does not: Slurm's job and step, torchrun's run id and restart count."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" in env and in_slurm_step(env):
        return f"slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    if "TORCHELASTIC_RUN_ID" in env:
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    port = env.get("MASTER_PORT")  # Lightning's own launcher: the port its ranks share
    return f"local-{port}" if port else "local"


def inherited_tasks(env: Mapping[str, str] | None = None) -> int:
    """SLURM_NTASKS seen outside any job step (batch script, salloc shell), else 0."""
    env = os.environ if env is None else env
    if in_slurm_step(env) or env.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES:
        return 0
    return _first_int(env.get("SLURM_NTASKS")) or 0


def single_process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment for a process that is not one of the allocation's tasks."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in TASK_VARS}


def require_single_process(program: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse to run a one-process program as several tasks (each would redo the work and write
    the same output)."""
    env = os.environ if env is None else env
    launch = this_launch(env)
    if launch.world_size > 1:
        raise LaunchError(
            f"{program} runs as one process but was started as {launch.describe()}; start it "
            f"once (srun --ntasks=1, or without a launcher)."
        )


def check_training_launch(devices: int, num_nodes: int, env: Mapping[str, str] | None = None) -> Launch:
    """The process layout must be exactly the one the config asks for (devices per node x
    nodes), before Lightning builds a process group that would hang or silently shrink."""
    env = os.environ if env is None else env
    requested = devices * num_nodes
    inherited = inherited_tasks(env)
    launch = this_launch(env)
    if launch.kind == "plain" and inherited > 1:
        raise LaunchError(
            f"training runs as one process inside a Slurm allocation of {inherited} tasks "
            f"(SLURM_NTASKS={inherited}) outside any job step, where it would wait for tasks that "
            f"never start; launch it with srun (one task per device) or through run_all.py, which "
            f"starts every stage itself."
        )
    if launch.kind == "plain" and num_nodes > 1:
        raise LaunchError(
            f"train.num_nodes={num_nodes} needs a launcher that starts the processes on every "
            f"node (srun inside a Slurm allocation, or torchrun on each node); this is one process "
            f"started without one."
        )
    if launch.kind != "plain" and launch.world_size != requested:
        raise LaunchError(
            f"this launch started {launch.describe()} but the config asks for {requested} "
            f"(train.devices={devices} x train.num_nodes={num_nodes}); make them equal, e.g. "
            f"train.devices={max(1, launch.world_size // max(1, num_nodes))} "
            f"train.num_nodes={num_nodes}, or change the launcher."
        )
    return launch


def check_accelerator_visible(accelerator: str, env: Mapping[str, str] | None = None) -> None:
    """A GPU that train.accelerator asks for must be visible to this process (else Lightning's
    traceback would read as a crash that run_all.py retries)."""
    env = os.environ if env is None else env
    import torch

    accel = str(accelerator)
    if accel in ("gpu", "cuda") and not torch.cuda.is_available():
        mask = env.get("CUDA_VISIBLE_DEVICES")
        why = f" (CUDA_VISIBLE_DEVICES={mask!r})" if mask is not None else ""
        raise LaunchError(
            f"train.accelerator={accel} asks for a GPU, but no GPU is visible on this machine{why}; "
            f"set train.accelerator=auto (a GPU where there is one, else the CPU) or train.accelerator=cpu."
        )
    if accel == "mps" and not torch.backends.mps.is_available():
        raise LaunchError(
            "train.accelerator=mps asks for an Apple GPU, but torch sees none on this machine; set "
            "train.accelerator=auto or train.accelerator=cpu."
        )


def lightning_environment(env: Mapping[str, str] | None = None):
    """The Lightning cluster environment for this launch, chosen here rather than by Lightning's
    detection; Slurm's auto-requeue is off (prism.train.callbacks.Preemption checkpoints instead)."""
    env = os.environ if env is None else env
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    kind = this_launch(env).kind
    if kind == "torchrun":
        return TorchElasticEnvironment()
    if kind == "srun":
        return SLURMEnvironment(auto_requeue=False)
    return None


WORKER_GRACE_S = 30  # how long a DataLoader worker outlives a SIGTERM (Slurm's default KillWait)


def worker_stop_signals(*_args) -> None:
    """For DataLoader workers: ignore the warning signal and Ctrl-C, and outlive a SIGTERM by
    WORKER_GRACE_S, so that the training process reaches its checkpoint (docs/cluster.md)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: signal.alarm(WORKER_GRACE_S))  # SIGALRM's default: exit
