"""What a stage is to the pipeline: its jobs, their identity, the check of their output and how
they are launched. One class per stage (train.py, eval.py, ...) implements it; the ordered
registry in __init__.py is what the plan and the runner iterate."""

from __future__ import annotations

import shlex
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from prism.data.sources import identity_keys_not_read
from prism.errors import ConfigError
from prism.pipeline.records import StageRecord
from prism.runs.identity import stable_hash
from prism.runs.layout import logs_dir, scale_results_dir, stage_log_name, stage_record
from prism.runs.records import Record

if TYPE_CHECKING:
    from rich.console import Console

    from prism.config.schema import RunConfig


def launch_prefix(launcher: str, python: str) -> list[str]:
    """`python`, or `torchrun ...` (which takes the script itself), or `srun ... python`."""
    words = shlex.split(launcher or "")
    return words if words and Path(words[0]).name == "torchrun" else [*words, python]


class Placement(Enum):
    """Where a stage's program runs inside a Slurm allocation of N nodes x G GPUs."""

    all_nodes = "all_nodes"  # one task per GPU on every node (training: DDP over all of them)
    one_node = "one_node"  # one task per GPU of one node (evaluation shards its requests)
    one_device = "one_device"  # one task
    here = "here"  # in run_all.py's own allocation step, no srun (the report: a few seconds)

    def tasks(self, nodes: int, per_node: int) -> tuple[int, int] | None:
        """(nodes, tasks per node) of its srun step, or None when it runs without one."""
        return {
            Placement.all_nodes: (nodes, per_node),
            Placement.one_node: (1, per_node),
            Placement.one_device: (1, 1),
            Placement.here: None,
        }[self]


class Phase(Enum):
    """Where a stage's jobs go in the plan, which runs its jobs in order."""

    before_runs = "before_runs"  # once per scale, ahead of the training runs
    per_run = "per_run"  # one job per (schedule, seed), a seed's jobs together, stage by stage
    after_runs = "after_runs"  # once per scale, after every run


@dataclass
class Job:
    stage: "Stage"
    label: str  # "train prism seed0"
    output: Path
    config: dict  # what decides the output: its hash is the job's identity
    log: Path
    argv: Callable[[], list[str]]  # built when the job starts (checkpoint paths exist by then)
    deps: list["Job"] = field(default_factory=list)
    run_dir: Path | None = None  # per-run jobs whose output is a folder (training)
    run: "PlannedRun | None" = None  # the run a per-run job is for (set by the plan)
    status: str = "run"  # done | run | resume | rerun | conflict | blocked | skipped | unselected
    reason: str = ""

    @property
    def hash(self) -> str:
        return stable_hash(self.config)

    @property
    def record_path(self) -> Path:
        if self.run_dir is not None:
            return stage_record(self.run_dir, folder=True)
        return stage_record(self.output)

    def output_valid(self) -> bool:
        return self.stage.output_valid(self)

    def write_record(self, status: str, returncode: int | None = None) -> None:
        """The stage record beside the output, saying `status` (a stage that keeps none: nothing)."""
        if self.stage.recorded:
            record = StageRecord(
                self.stage.name, self.label, self.hash, self.config, status, self.argv(), returncode
            )
            record.write(self.record_path)


@dataclass(frozen=True)
class PlannedRun:
    """One training run of the plan; per-run stages make one job for each."""

    schedule: str
    seed: int


@dataclass
class PlanContext:
    """What every stage builds its jobs from, and the jobs built so far (a stage's jobs may need
    an earlier stage's: evaluation reads the weights its training run writes)."""

    cfg: "RunConfig"
    full: dict  # to_dict(cfg)
    passed: list[str]  # the overrides every stage script is given (run_all's own left out)
    scripts: dict[str, str]  # stage name -> its program
    python: str
    planned: list[Job] = field(default_factory=list)

    @property
    def results(self) -> Path:
        return scale_results_dir(self.cfg)

    @property
    def logs(self) -> Path:
        return logs_dir(self.cfg)

    def command(self, stage: "Stage", **options) -> list[str]:
        """The launcher and program of `stage`, then `--<name> <value>` (a list: its values) for
        each option that is not None, an underscore in its name written as a dash."""
        words = [*launch_prefix(stage.launcher(self.cfg), self.python), self.scripts[stage.name]]
        for name, value in options.items():
            values = value if isinstance(value, list) else [value]
            if value is not None:
                words += [f"--{name.replace('_', '-')}", *map(str, values)]
        return words

    def job(self, stage: str, run: PlannedRun) -> Job:
        """The job of `stage` for `run` (a stage earlier in the registry)."""
        return next(j for j in self.planned if j.stage.name == stage and j.run == run)

    def of(self, stage: str) -> list[Job]:
        """The jobs of `stage` built so far, in plan order."""
        return [j for j in self.planned if j.stage.name == stage]

    def data_identity(self) -> dict:
        """The data keys that decide the held-out text a stage reads (the revision only where the
        source reads one)."""
        data, unread = self.full["data"], identity_keys_not_read(self.full["data"])
        return {k: data[k] for k in DATA_KEYS if k not in unread}


DATA_KEYS = ("source", "path", "hub_name", "subset", "revision", "val_tokens", "seed")


class Stage(ABC):
    """One stage of the reproduction. Subclasses set the class attributes and implement jobs();
    the rest has the behaviour of a stage whose output is one JSON file per job, read through
    its record (`output_record`, prism.runs.records)."""

    name: ClassVar[str]
    script: ClassVar[str]  # its program under reproduce/
    # the record of the JSON file each job writes: an output it refuses is not done
    output_record: ClassVar[type[Record]]
    nonempty: ClassVar[str | None] = None  # a field of the output that is empty in an incomplete one
    phase: ClassVar[Phase] = Phase.after_runs
    recorded: ClassVar[bool] = True  # a stage record beside the output (False: always runs)
    always_note: ClassVar[str] = ""  # why an unrecorded stage runs every time
    # a changed config is a conflict unless --redo-changed: the old output cost GPU hours
    keeps_changed: ClassVar[bool] = False
    placement: ClassVar[Placement] = Placement.one_device
    reads_training_data: ClassVar[bool] = False  # then the data source is checked before planning
    # a crash (a killed rank, a collective error; prism.pipeline.crashes) is retried up to
    # run_all.train_retries times: the program resumes from what the crashed attempt left behind
    retries_crashes: ClassVar[bool] = False
    # exit code 75 (EXIT_PREEMPTED) means it stopped with a checkpoint: the next invocation resumes it
    preemptible: ClassVar[bool] = False
    # in run_all.stages' default selection (prism.config.schema.RunAllSection); a stage that is
    # not runs only when --stages or run_all.stages names it
    selected_by_default: ClassVar[bool] = True

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:  # what a Job's repr shows of it in a test's failure
        return f"<stage {self.name}>"

    # ----- planning --------------------------------------------------------------------------
    def check(self, cfg: "RunConfig") -> None:
        """Raise ConfigError when the stage is selected but cannot run with `cfg` (by default
        any config can run it)."""
        return None

    @abstractmethod
    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        """The stage's jobs: for `run` when the stage is per-run, else for the scale."""

    def one_job(
        self, ctx: PlanContext, run: PlannedRun | None, output: Path, config: dict, argv, **kw
    ) -> list[Job]:
        """The stage's one job for `run` (or for the scale), labelled and logged by its name and run."""
        if run is None:
            return [Job(self, self.name, output, config, ctx.logs / stage_log_name(self.name), argv, **kw)]
        label = f"{self.name} {run.schedule} seed{run.seed}"
        log = ctx.logs / stage_log_name(self.name, run.schedule, run.seed)
        return [Job(self, label, output, config, log, argv, **kw)]

    def launcher(self, cfg: "RunConfig") -> str:
        """The command prefix the stage's program runs under (run_all.launcher.<stage>, which
        run_all.py fills in from the allocation and `placement` unless it is given)."""
        return "" if self.placement is Placement.here else getattr(cfg.run_all.launcher, self.name)

    def check_launcher(self, cfg: "RunConfig") -> None:
        """Raise ConfigError when the stage's launcher names a program that cannot be started
        here, before any job of the plan runs."""
        line = self.launcher(cfg)
        words = shlex.split(line or "")
        if words and shutil.which(words[0]) is None:
            raise ConfigError(
                f"run_all.launcher.{self.name}={line!r} is invalid: its program {words[0]!r} is not "
                f"found (neither on PATH nor an executable file); give a launcher that exists here, "
                f"such as srun or torchrun, or leave it empty to run python directly."
            )

    def cost(self, cfg: "RunConfig") -> str | None:
        """One line of what the stage's jobs cost, for the dry run, or None (training, the
        benchmark and the in-loop evaluation are priced by prism.pipeline.estimate)."""
        return None

    # ----- state -------------------------------------------------------------------------------
    def complete(self, output: Record) -> bool:
        """Whether an output its record accepts is a complete result of the stage, where the
        record does not say so itself (by default: its `nonempty` field is not empty)."""
        return not self.nonempty or bool(getattr(output, self.nonempty))

    def output_valid(self, job: Job) -> bool:
        output = self.output_record.read(job.output, [])
        return output is not None and self.complete(output)

    def resumable(self, job: Job) -> bool:
        """Whether an unfinished job continues from what it left behind."""
        return False

    def adopt(self, job: Job) -> tuple[str, str] | None:
        """(status, reason) of an output that exists without a stage record, when the stage can
        judge it (a run trained by hand); None: it is recomputed."""
        return None

    def skip_reason(self, job: Job, cfg: "RunConfig", hub_offline: Callable[[], str | None]) -> str | None:
        """Why a selected job cannot run here (then it is skipped), else None. `hub_offline()`
        says why the Hugging Face hub is unreachable (asked once per plan), or None."""
        return None

    # ----- running -----------------------------------------------------------------------------
    def before_rerun(self, job: Job, console: "Console") -> None:
        """Called before a job reruns with changed settings (by default nothing to do)."""
        return None
