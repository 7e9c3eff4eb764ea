"""One search.py invocation below its command line (prism.cli.search): the plan, the study, the
workers it starts or the trials it trains itself, the report and, with --final, the full-budget
stage; and its exit code. The command line and how each ending is said are prism.cli.search."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from contextlib import suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from prism import processes
from prism.cluster import (
    EXIT_CRASHED,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    Preempted,
    single_process_env,
    this_launch,
)
from prism.config.overrides import nested_overrides
from prism.config.schema import ConfigError
from prism.errors import EXIT_REFUSED, PrismError
from prism.io import os_error_message
from prism.runs.layout import WORKERS_DIR
from prism.search.final import FINAL_ATTR, final_hint, final_set, pending
from prism.search.plan import Search, SearchArgs

# what the workers --workers starts run: the command, as its script (prism.pipeline finds the
# stages' scripts the same way)
WORKER_SCRIPT = Path(__file__).resolve().parents[3] / "reproduce" / "search.py"


class Refused(PrismError):
    """The search cannot go on: its disk is full (the same command continues once there is space;
    train.py's code for a disk it cannot write), or --final finds nothing to train."""

    exit_code = EXIT_REFUSED


class RankLost(PrismError):
    """A rank of this worker's trial group died: the group goes down with it (a crash)."""

    exit_code = EXIT_CRASHED


def print_settings(args: SearchArgs) -> tuple[dict, dict]:
    """What --print_config shows: the search's own settings with the trials' overrides, and what
    the search and its first trial derive (no study is opened)."""
    plan = Search(replace(args, dry_run=True))  # plans for data it may not reach from here
    own = {k: v for k, v in vars(args).items() if k not in _SHOWN_ELSEWHERE and v not in (None, [], False)}
    derived = plan.trial_plan.derived()  # the first trial's: every other is it with another schedule or seed
    derived["derived"] = {
        "trials": plan.budget.trials,
        "rungs": ", ".join(map(str, plan.rungs.tokens)),
        "study_dir": str(plan.study_dir),
        "devices_per_trial": plan.devices,
        **derived["derived"],
    }
    # the overrides as given: the search sets train.devices, val_every_steps and others per trial
    return {**own, "seeds": plan.seeds, **nested_overrides(args.overrides)}, derived


_SHOWN_ELSEWHERE = ("overrides", "worker", "top_k", "final_stages", "seeds", "print_config")


# ----- running ---------------------------------------------------------------------------------------
def run_one(search: Search, group=None):
    """How this worker trains and tells one trial; `group`: its rank group (prism.search.group),
    whose rank 0 runs this while the other ranks train alongside."""
    import optuna
    from optuna.trial import TrialState

    from prism.search.stops import at_once
    from prism.search.study import full_disk
    from prism.search.trial import TrialOutcome, crashed, run_trial

    keys = [c.key for c in search.candidates]
    base = search.candidates[0].key
    states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
    train = run_trial
    if group is not None:  # rank 0 of a rank group: run_trial's signature, every rank training
        from prism.search.group import lead_trial

        train = partial(lead_trial, group)

    def run(trial: optuna.Trial) -> None:
        key = trial.suggest_categorical("schedule", keys)
        seed = trial.suggest_categorical("seed", search.seeds)
        earlier = {int(k): float(v) for k, v in trial.user_attrs.get("earlier", {}).items()}
        attempt = trial.user_attrs.get("attempt", 1)
        print(f"trial {trial.number}: {key} seed {seed} (attempt {attempt})", flush=True)
        try:
            outcome = train(trial, search.trial_config(key, seed), search.rungs, key == base, earlier)
        except ConfigError as exc:
            outcome = TrialOutcome("failed", None, f"ConfigError: {exc}")
        except Preempted:
            raise  # left running: the next worker to look resumes it from its checkpoints
        except Exception as exc:  # a crash of this trial; the worker goes on with the next
            stop = at_once(exc)
            if stop is not None:  # a second Ctrl-C cut a call short: a stop (work() says so)
                raise stop from exc
            if full_disk(exc) is not None:  # not the schedule's fault: the worker stops (work())
                raise
            outcome = crashed(exc)
        if outcome.state == "failed":
            trial.set_user_attr("fail_reason", outcome.reason)
        # Optuna gives a pruned trial its last rung's loss
        search.study.tell(
            trial, outcome.value if outcome.state == "complete" else None, state=states[outcome.state]
        )
        why = f" ({outcome.reason})" if outcome.reason else ""
        print(f"trial {trial.number}: {outcome.state}{why}", flush=True)

    return run


def start_workers(search: Search, argv: list[str]) -> list[int]:
    """--workers K local workers, each pulling trials: one process on one GPU where there are GPUs,
    or with --devices-per-trial N a group of N processes under torchrun on N GPUs of its own."""
    import torch

    workers, n = search.args.workers, search.devices
    gpus = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
    visible = [g for g in gpus if g.strip()] or list(map(str, range(torch.cuda.device_count())))
    if visible and workers * n > len(visible):
        raise ConfigError(
            f"--workers {workers} needs one GPU each, and {len(visible)} are visible."
            if n == 1
            else f"--workers {workers} x --devices-per-trial {n} needs {workers * n} GPUs, and "
            f"{len(visible)} are visible."
        )
    started: list[processes.Launched] = []
    with tempfile.TemporaryDirectory(prefix="prism-search-") as codes_dir:
        for i in range(workers):
            # not one of an allocation's tasks (prism.cluster.check_training_launch)
            env = single_process_env()
            if visible:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[i * n : (i + 1) * n])
            launcher, code_file = [sys.executable], None
            if n > 1:  # a rank group under torchrun: docs/search.md, "Multi-GPU trials"
                launcher += ["-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
                launcher.append(f"--nproc-per-node={n}")
                code_file = Path(codes_dir) / f"group-{i}"  # torchrun exits 1 whenever it stops
                # torchrun kills its ranks 30 s after a stop by default: time for the stop's checkpoint
                env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(GROUP_STOP_GRACE_S))
                # torchrun passes on only the signals it handles, and Slurm's warning is not one of them
                env.setdefault("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
            command = [*launcher, str(WORKER_SCRIPT), *argv, "--worker"]
            started.append(processes.start(command, env, code_file=code_file))
        # a Ctrl-C already reaches every worker from the terminal: it is only waited out here
        return processes.wait(started, pass_on=(signal.SIGTERM, signal.SIGUSR1), wait_out=(signal.SIGINT,))


GROUP_STOP_GRACE_S = 300  # as long as Slurm's warning comes before the end (--signal=B:USR1@300)


def exit_code(done: bool, codes: list[int]) -> int:
    """search.py's exit code from the study's state and its workers' codes: a complete study is
    0 whatever a worker met on the way; else 130 after a Ctrl-C, 1 after a full disk (the
    worker said so: Refused), 70 after a crash, else 75."""
    if done:
        return 0
    for code in (EXIT_INTERRUPTED, EXIT_REFUSED):
        if code in codes:
            return code
    return EXIT_CRASHED if any(c not in (0, EXIT_PREEMPTED) for c in codes) else EXIT_PREEMPTED


def run_search(argv: list[str], args: SearchArgs, final_stage: Callable[[Search, Any], int]) -> int:
    """search.py's work from its parsed arguments to its exit code; `final_stage(search, study)`:
    how the command runs the full-budget stage (full_budget_stage, under its own ending)."""
    try:
        import optuna
    except ImportError:
        raise PrismError("reproduce/search.py needs Optuna: pip install -e '.[search]'.") from None

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from prism.search.study import JOURNAL_NAME, full_disk

    study_dir: list[Path] = []  # the study's folder, once _main knows it
    try:
        return _main(argv, args, study_dir, final_stage)
    except Exception as exc:
        disk = full_disk(exc)
        if disk is None:
            raise
        # train.py's sentence (Optuna's journal appends name no file: the journal stands in);
        # the trial is left running, to resume from its newest checkpoint once there is space
        where = disk.filename or (study_dir[0] / JOURNAL_NAME if study_dir else None)
        raise Refused(
            f"{os_error_message(disk, where).rstrip('.')}; free some space and run the same "
            f"command to continue the search."
        ) from exc


def _main(
    argv: list[str], args: SearchArgs, study_dir: list[Path], final_stage: Callable[[Search, Any], int]
) -> int:
    from prism.search.report import write_study_report
    from prism.search.study import check_definition, check_locks, existing_study, open_study, progress, work

    group_lost: tuple = ()  # GroupLost once this worker is a rank group (torch.distributed: only then)
    try:
        search = Search(args)
        study_dir.append(search.study_dir)
        study = existing_study(search.study_dir, search.rungs)
        if study is not None:
            search.continue_from(study.user_attrs.get("definition", {}))
        if args.dry_run:
            search.show(Console())
            return 0
        group = None
        if this_launch().world_size > 1:  # torchrun or srun started this worker as a rank group
            from prism.search.group import GroupLost, follow, join_group

            group, group_lost = join_group(search.cfg), (GroupLost,)
            if not group.is_leader:
                return follow(group, search)  # trains what rank 0 sends; rank 0 does all the rest
        check_locks(search.study_dir)
        # a study whose maker has not yet recorded its definition is being made: open_study waits
        if study is not None and not args.worker and "definition" in study.user_attrs:
            check_definition(study, search.definition, search.study_dir)
            state = progress(study)
            if state.done and study.user_attrs.get("enqueued") == len(search.order):
                # unchanged files are not rewritten: only other search.* settings change the report
                report = write_study_report(study, search.study_dir, search.definition)
                if args.final:
                    print(f"the search in {search.study_dir} is complete ({state.describe()})")
                    return final_stage(search, study)
                print(
                    f"the search in {search.study_dir} is complete ({state.describe()}); nothing to do. "
                    f"Report: {report}" + (f"; {final_hint(study)}" if final_hint(study) else "")
                )
                return 0
        search.study = open_study(search.study_dir, search.definition, search.rungs, search.order)
        if (args.workers > 1 or search.devices > 1) and not args.worker and group is None:
            codes = start_workers(search, [a for a in argv if a != "--worker"])
        else:
            work(search.study, search.study_dir, run_one(search, group), search.cfg.search)
            codes = [0]
            if group is not None:
                group.release()  # the other ranks leave too
    except group_lost as exc:  # a rank of this worker's trial group died: the group goes down with it
        raise RankLost(f"{exc}; its trial is left to the next worker to look.") from exc
    if args.worker:
        return 0
    with suppress(OSError):
        (search.study_dir / WORKERS_DIR).rmdir()  # the worker locks' folder, once they are all gone
    state = progress(search.study)
    report = write_study_report(search.study, search.study_dir, search.definition)
    code = exit_code(state.done, codes)
    # a worker killed by a signal (Popen's negative code) is named with it
    killed = "".join(f"; worker {i} was {processes.how_it_ended(c)}" for i, c in enumerate(codes, 1) if c < 0)
    if code:
        print(
            f"the search in {search.study_dir} is not complete ({state.describe()}; worker exit codes "
            f"{codes}{killed}); run the same command to continue it. Report so far: {report}",
            file=sys.stderr,
        )
        return code
    crashed = f"; worker exit codes {codes}{killed}" if any(codes) else ""
    print(f"the search in {search.study_dir} is complete ({state.describe()}{crashed}). Report: {report}")
    if args.final:
        return final_stage(search, search.study)
    if final_hint(search.study):
        print(final_hint(search.study))
    return 0


def full_budget_stage(search: Search, study) -> int:
    """The full-budget stage of `search` once its study is complete: the same command again
    continues it, or says it is done."""
    from prism.search.report import collect, write_study_report

    d, args = search.definition, search.args
    recorded = study.user_attrs.get(FINAL_ATTR)
    k = search.top_k(recorded)
    ranking = collect(study, d["candidates"], search.cfg.search.alpha)["ranking"]
    schedules = final_set(ranking, d["candidates"][0]["key"], k)
    if len(schedules) < 2:
        raise Refused(
            f"no schedule besides uniform reached the last rung of the search in {search.study_dir}, "
            f"so there is nothing to train at the full budget."
        )
    seeds = ", ".join(map(str, search.cfg.seeds))
    what = f"{', '.join(schedules)} with seeds {seeds} at train.tokens={search.cfg.train.tokens:,}"
    todo = pending(args.scale, args.overrides, schedules)
    final = {"top_k": k, "schedules": schedules}
    if recorded != final:
        if recorded:
            print(f"--top-k {k}, not {recorded['top_k']}: the full-budget stage now covers {what}")
        study.set_user_attr(FINAL_ATTR, final)
    if not todo:
        report = write_study_report(study, search.study_dir, d)
        if "report" in search.cfg.run_all.stages:
            # runs trained before (by run_all.py, say) leave no job, yet RESULTS.md should link
            # this search; it is rewritten only where its bytes change
            from prism.report import write_report

            write_report(None, search.cfg.runs_dir, search.cfg.results_dir)
        print(f"the full-budget stage ({what}) is done; nothing to do. Report: {report}")
        return 0
    print(f"full budget: {what}, through the pipeline ({len(todo)} job(s) to run)", flush=True)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    from prism.pipeline import run_all
    from prism.pipeline.runner import sigterm_stops_stages

    with sigterm_stops_stages():
        code = run_all(args.scale, args.overrides, schedules=schedules, console=console)
    report = write_study_report(study, search.study_dir, d)
    state = "done" if code == 0 else f"not done (exit code {code}): the same command continues it"
    print(f"the full-budget stage ({what}) is {state}. Report: {report}")
    return code
