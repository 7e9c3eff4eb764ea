#!/usr/bin/env python
"""Search head schedules of a scale: successive halving over validation loss at token rungs, on
Optuna with journal file storage, every trial a normal kit training run (docs/search.md).

    python reproduce/search.py --scale 124m --space rules --smooth --baseline-preservation \\
        --rungs 1%,3%,9% --workers 8 --dry-run
    python reproduce/search.py --scale 124m --space table5 --rungs 1%,3%,9% --workers 8
    python reproduce/search.py --scale tiny --space uniform --space prism --space 2x2,4x6 \\
        --rungs 768,1536 model.seq_len=32 train.global_batch_tokens=128

--space (repeatable): a schedule group (table5), `rules` (every valid schedule under §2.1 and the
filter flags, as describe.py --enumerate lists them), or a schedule name or head list. Uniform is
always searched: it is the baseline. The budget: --trials N, --tokens T (proxy tokens in all) or
--gpu-hours H; default the whole space. --rungs: token counts (1536, 25M, 1%) in a geometric
series; the last is each trial's training budget, and its LR schedule spans it.

Writes <study-dir> (default results/<scale>/search): study.journal (the Optuna study), runs/
(one run folder per trial), SEARCH.md and search.json. The same command again continues the
study, or says it is complete; other arguments on the same folder are refused.

Exit codes: 0 the study is complete; 2 bad input (nothing written); 70 a rank of a multi-GPU
worker was lost; 75 the study is not complete (a worker stopped): the same command continues it.
With --final, run_all.py's once the study is complete.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from prism.cluster import EXIT_CRASHED, EXIT_INTERRUPTED, EXIT_PREEMPTED, Interrupted, Preempted, this_launch
from prism.config import ConfigError, load_config
from prism.schedule import ScheduleFilter
from prism.search import STUDY_DIR


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="search.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scale", required=True, help="tiny, 124m, 354m or 757m")
    p.add_argument(
        "--space", action="append", default=[], help="table5 | rules | a schedule name or head list"
    )
    p.add_argument("--smooth", action="store_true", help="--space rules: early phases of 2-4 layers (§2.2a)")
    p.add_argument(
        "--baseline-preservation", action="store_true", help="--space rules: at least L/2 layers at h_base"
    )
    p.add_argument("--power-of-two", action="store_true", help="--space rules: early d_h powers of two")
    p.add_argument("--max-head-dim", type=int, default=None, help="--space rules: largest early d_h")
    p.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="train seeds (default: the scale's first)"
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--trials", type=int, default=None, help="budget: this many trials")
    budget.add_argument("--tokens", default=None, help="budget: proxy training tokens in all (e.g. 20B)")
    budget.add_argument("--gpu-hours", type=float, default=None, help="budget: GPU-hours in all")
    p.add_argument("--rungs", required=True, help="token rungs, e.g. 768,1536 or 1%%,3%%,9%% of train.tokens")
    p.add_argument("--workers", type=int, default=1, help="local worker processes (one per GPU)")
    p.add_argument(
        "--devices-per-trial",
        type=int,
        default=None,
        help="GPUs per trial: each worker is this many processes under torchrun (default 1, or a "
        "torchrun/srun launch's processes)",
    )
    p.add_argument("--study-dir", default=None, help="default: <results_dir>/<scale>/search")
    p.add_argument("--seed", type=int, default=0, help="study seed: the order of the trials")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost; write nothing")
    p.add_argument(
        "--final",
        action="store_true",
        help="once the study is complete: train the best --top-k schedules and uniform at the full "
        "budget with the scale's seeds through the pipeline (run_all.py's stages), rank them in SEARCH.md",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="--final: schedules besides uniform (default: the last --final's, else search.top_k, 3)",
    )
    p.add_argument(
        "--final-stages", default=None, help="--final: comma-separated stages (default: run_all.stages)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a process --workers started
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every trial")
    return p.parse_intermixed_args(argv)


class Search:
    """Everything the arguments define, checked before anything is written."""

    def __init__(self, args: argparse.Namespace) -> None:
        from prism.search.budget import parse_rungs, parse_token_count, trials_for_budget
        from prism.search.space import build_space
        from prism.search.study import trial_order
        from prism.search.trial_config import trial_config, trial_devices

        self.args = args
        self.cfg = cfg = load_config(args.scale, args.overrides)
        if args.workers < 1:
            raise ConfigError(f"--workers {args.workers} is invalid: give 1 or more.")
        if args.max_head_dim is not None and args.max_head_dim < 1:
            raise ConfigError(f"--max-head-dim {args.max_head_dim} is invalid: give a positive head dim.")
        from prism.search.final import final_stages, top_k

        # checked now; the study may record another k (--final)
        self.top_k = top_k(args.top_k, None, cfg.search.top_k)
        # checked before the study runs, which may take days; the workers never run the final stage
        self.final_stages = final_stages(args.final_stages) if args.final and not args.worker else None
        self.rules = ScheduleFilter(
            smooth=args.smooth,
            baseline_preservation=args.baseline_preservation,
            power_of_two=args.power_of_two,
            max_head_dim=args.max_head_dim,
        )
        self.candidates = build_space(cfg, args.space, self.rules)
        self.seeds = list(dict.fromkeys(args.seeds if args.seeds else cfg.seeds[:1]))
        self.rungs = parse_rungs(args.rungs, cfg)
        self.costs = None
        if args.dry_run or args.gpu_hours is not None:  # prism.pipeline imports Lightning: seconds
            from prism.pipeline.estimate import estimate

            self.costs = estimate(cfg)
        rate = self.costs and (self.costs.measured.get("uniform") or self.costs.paper_tps_per_gpu)
        tokens = parse_token_count(args.tokens, cfg.train.tokens) if args.tokens is not None else None
        self.budget = trials_for_budget(
            self.rungs,
            len(self.candidates) * len(self.seeds),
            len(self.seeds),
            args.trials,
            tokens,
            args.gpu_hours,
            rate,
        )
        self.study_dir = Path(args.study_dir or Path(cfg.results_dir) / cfg.scale / STUDY_DIR)
        self.runs_dir = self.study_dir / "runs"
        keys = [c.key for c in self.candidates]
        self.order = trial_order(keys, self.seeds, self.budget.trials, args.seed)
        self.devices = trial_devices(args, cfg)  # train.devices of every trial
        for params in self.order[:1]:  # every trial's config is this one with another schedule/seed
            trial_config(
                args.scale,
                args.overrides,
                self.rungs,
                self.runs_dir,
                params["schedule"],
                params["seed"],
                self.devices,
            )
        self.definition = {
            "scale": cfg.scale,
            "space": [c.text for c in self.candidates],
            "candidates": [c.to_dict() for c in self.candidates],
            "seeds": self.seeds,
            "rungs": list(self.rungs.tokens),
            "factor": self.rungs.factor,
            "trials": self.budget.trials,
            "study_seed": args.seed,
            "overrides": list(args.overrides),
        }

    # ----- the plan ----------------------------------------------------------------------------
    def show(self) -> None:
        from prism.pipeline.estimate import human_bytes

        cfg, r, n = self.cfg, self.rungs, self.budget.trials
        print(
            f"scale {cfg.scale}: L={cfg.model.n_layer}, d_model={cfg.model.d_model}, "
            f"h_base={cfg.model.h_base}, "
            f"{self.costs.n_params:,} parameters; full budget train.tokens={cfg.train.tokens:,}"
        )
        marked = [c for c in self.candidates if c.marks]
        print(
            f"space: {len(self.candidates)} schedules (uniform included)"
            + (f", of them {', '.join(f'{c.key} ({c.marks[0]})' for c in marked)}" if marked else "")
        )
        print(f"seeds: {', '.join(map(str, self.seeds))}; trials: {n} ({self.budget.why})")
        paper = self.costs.paper_tps_per_gpu
        measured = self.costs.measured.get("uniform")
        print(
            f"rungs: successive halving keeps 1/{r.factor} of the trials at each rung; uniform is never "
            f"stopped; each trial's LR warmup and cosine span the last rung"
        )
        print(
            f"{'rung':>4} {'tokens':>16} {'steps':>8} {'runs':>5} {'GPU-h (paper)':>14} "
            f"{'GPU-h (measured)':>17}"
        )
        runs = r.runs_at(n, min(n, len(self.seeds)))
        tot_p = tot_m = 0.0
        for i, (tokens, steps, k, seg) in enumerate(zip(r.tokens, r.steps, runs, r.segment_tokens())):
            gp = k * seg / paper / 3600 if paper else None
            gm = k * seg / measured / 3600 if measured else None
            tot_p += gp or 0.0
            tot_m += gm or 0.0
            print(f"{i:>4} {tokens:>16,} {steps:>8,} {k:>5} {_h(gp):>14} {_h(gm):>17}")
        print(
            f"{'all':>4} {r.cost_tokens(n, min(n, len(self.seeds))):>16,} {'':>8} {n:>5} "
            f"{_h(tot_p if paper else None):>14} {_h(tot_m if measured else None):>17}"
        )
        print(
            "paper rate: "
            + (
                f"{paper:,.0f} tokens/s per H100 (Table 2 / 8)"
                if paper
                else f"n/a (no {cfg.scale} in the paper)"
            )
            + "; measured rate: "
            + (
                f"{measured:,.0f} tokens/s per device on {self.costs.measured_hardware}"
                if measured
                else f"n/a until the benchmark has run ({cfg.results_dir}/{cfg.scale}/bench.json)"
            )
            + f"; with {self.args.workers} worker(s) the wall time is about GPU-h / {self.args.workers}"
        )
        ckpt, export = self.costs.ckpt_bytes, self.costs.export_bytes
        kept = runs[-1]
        peak = kept * (ckpt + export) + min(self.args.workers, n) * ckpt
        print(
            f"disk: {human_bytes(ckpt)} per checkpoint, {human_bytes(export)} exported weights; a trial "
            f"keeps last.ckpt only, a stopped trial deletes it, so the {kept} trial(s) of the last rung keep "
            f"{human_bytes(kept * (ckpt + export))}, about {human_bytes(peak)} at most while "
            f"{min(self.args.workers, n)} train"
        )
        self.show_final(paper, measured)
        exists = (self.study_dir / "study.journal").exists()
        print(f"study: {self.study_dir} ({'exists' if exists else 'new'})")
        print("trial order (study seed %d):" % self.args.seed)
        for i, params in enumerate(self.order[:20]):
            print(f"  {i:>3} {params['schedule']} seed {params['seed']}")
        if len(self.order) > 20:
            print(f"  ... and {len(self.order) - 20} more")

    def show_final(self, paper: float | None, measured: float | None) -> None:
        """The cost of --final: top-k + uniform x the scale's seeds at the full budget."""
        cfg, k = self.cfg, self.top_k
        runs = (min(k, len(self.candidates) - 1) + 1) * len(cfg.seeds)
        tokens = runs * cfg.train.tokens
        print(
            f"full budget (--final{'' if self.args.final else ', not given'}): the best {k} of the last "
            f"rung besides uniform, and uniform, each with seeds {', '.join(map(str, cfg.seeds))} at "
            f"train.tokens={cfg.train.tokens:,} through the pipeline: {runs} runs, {tokens:,} tokens, "
            f"GPU-h {_h(tokens / paper / 3600 if paper else None)} (paper), "
            f"{_h(tokens / measured / 3600 if measured else None)} (measured), plus evaluation"
        )


def _h(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.2f}"


# ----- running ---------------------------------------------------------------------------------------
def run_one(search: Search, group=None):
    """How this worker trains and tells one trial; `group`: its rank group (prism.search.group),
    whose rank 0 runs this while the other ranks train alongside."""
    import optuna

    from prism.search.trial import TrialOutcome, run_trial
    from prism.search.trial_config import trial_config

    keys = [c.key for c in search.candidates]
    base = search.candidates[0].key

    def run(trial: optuna.Trial) -> None:
        key = trial.suggest_categorical("schedule", keys)
        seed = trial.suggest_categorical("seed", search.seeds)
        earlier = {int(k): float(v) for k, v in trial.user_attrs.get("earlier", {}).items()}
        attempt = trial.user_attrs.get("attempt", 1)
        print(f"trial {trial.number}: {key} seed {seed} (attempt {attempt})", flush=True)
        try:
            a = search.args
            cfg = trial_config(a.scale, a.overrides, search.rungs, search.runs_dir, key, seed, search.devices)
            if group is not None:
                from prism.search.group import GroupLeader

                outcome = GroupLeader(group).run_trial(trial, cfg, search.rungs, key == base, earlier)
            else:
                outcome = run_trial(trial, cfg, search.rungs, key == base, earlier)
        except ConfigError as exc:
            outcome = TrialOutcome("failed", None, f"ConfigError: {exc}")
        except Preempted:
            raise  # left running: the next worker to look resumes it from its checkpoints
        except Exception as exc:  # a crash of this trial; the worker goes on with the next
            first = (str(exc).splitlines() or [""])[0][:300]
            outcome = TrialOutcome("failed", None, f"crashed: {type(exc).__name__}: {first}")
        if outcome.state == "complete":
            search.study.tell(trial, outcome.value)
        elif outcome.state == "pruned":
            search.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_user_attr("fail_reason", outcome.reason)
            search.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        why = f" ({outcome.reason})" if outcome.reason else ""
        print(f"trial {trial.number}: {outcome.state}{why}", flush=True)

    return run


def start_workers(search: Search, argv: list[str]) -> list[int]:
    """--workers K local workers, each pulling trials: one process on one GPU where there are GPUs,
    or with --devices-per-trial N a group of N processes under torchrun on N GPUs of its own."""
    import torch

    workers, n = search.args.workers, search.devices
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus:
        visible = [g for g in gpus.split(",") if g.strip()]
    else:
        visible = [str(i) for i in range(torch.cuda.device_count())]
    if visible and workers * n > len(visible):
        raise ConfigError(
            f"--workers {workers} needs one GPU each, and {len(visible)} are visible."
            if n == 1
            else f"--workers {workers} x --devices-per-trial {n} needs {workers * n} GPUs, and "
            f"{len(visible)} are visible."
        )
    script = str(Path(__file__).resolve())
    procs = []
    for i in range(workers):
        env = dict(os.environ)
        if visible:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[i * n : (i + 1) * n])
        launcher = [sys.executable]
        if n > 1:  # a rank group on this node (prism.search.group); each with a free rendezvous port
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={n}"]
        procs.append(subprocess.Popen([*launcher, script, *argv, "--worker"], env=env))
    return [p.wait() for p in procs]


def _group_lost() -> tuple[type[BaseException], ...]:
    """(prism.search.group.GroupLost,) where a launcher started this worker as a rank group, else
    nothing to catch: that module imports torch.distributed, which no other worker needs."""
    if this_launch().world_size == 1:
        return ()
    from prism.search.group import GroupLost

    return (GroupLost,)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        import optuna
    except ImportError:
        print("error: reproduce/search.py needs Optuna: pip install -e '.[search]'.", file=sys.stderr)
        return 2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from prism.search.report import write_report
    from prism.search.study import check_locks, existing_study, open_study, progress, work

    group_lost = _group_lost()
    try:
        search = Search(args)
        if args.dry_run:
            search.show()
            return 0
        group = None
        if this_launch().world_size > 1:  # torchrun or srun started this worker as a rank group
            from prism.search.group import follow, join_group

            group = join_group(search.cfg)
            if not group.is_leader:
                return follow(group, search)  # trains what rank 0 sends; rank 0 does all the rest
        check_locks(search.study_dir)
        study = existing_study(search.study_dir, search.rungs)
        if study is not None and not args.worker:
            from prism.search.study import definition_change

            change = definition_change(study.user_attrs.get("definition", {}), search.definition)
            if change:
                raise ConfigError(
                    f"{change}; {search.study_dir} holds a search of other arguments: run the same command "
                    f"to continue it, or give another --study-dir."
                )
            state = progress(study)
            if state.done and study.user_attrs.get("enqueued") == len(search.order):
                # unchanged files are not rewritten: only other search.* settings change the report
                report = write_report(study, search.study_dir, search.definition)
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
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except group_lost as exc:  # a rank of this worker's trial group died: the group goes down with it
        print(f"error: {exc}; its trial is left to the next worker to look.", file=sys.stderr)
        return EXIT_CRASHED
    except Preempted as exc:  # SIGTERM, Slurm's warning signal or Ctrl-C during a trial
        print(
            f"{exc.label}: {exc}; its trial is left to the next worker, which resumes it from its "
            f"checkpoints: run the same command to continue the search.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if isinstance(exc, Interrupted) else EXIT_PREEMPTED
    if args.worker:
        return 0
    try:
        (search.study_dir / "workers").rmdir()  # the worker locks' folder, once they are all gone
    except OSError:
        pass
    state = progress(search.study)
    report = write_report(search.study, search.study_dir, search.definition)
    if not state.done:
        print(
            f"the search in {search.study_dir} is not complete ({state.describe()}; worker exit codes "
            f"{codes}); run the same command to continue it. Report so far: {report}",
            file=sys.stderr,
        )
        return EXIT_PREEMPTED
    print(f"the search in {search.study_dir} is complete ({state.describe()}). Report: {report}")
    if args.final:
        return final_stage(search, search.study)
    if final_hint(search.study):
        print(final_hint(search.study))
    return 0


def final_hint(study) -> str:
    from prism.search.final import FINAL_ATTR

    if study.user_attrs.get(FINAL_ATTR):
        return ""
    return (
        "next: the same command with --final trains the best --top-k schedules and uniform at the "
        "full budget with the scale's seeds."
    )


def final_stage(search: Search, study) -> int:
    """The full-budget stage once the study is complete (prism.search.final): the same command
    again continues it, or says it is done."""
    from prism.search.final import FINAL_ATTR, final_set, pending, run_final, top_k
    from prism.search.report import collect, write_report

    d, args = search.definition, search.args
    recorded = study.user_attrs.get(FINAL_ATTR)
    k = top_k(args.top_k, recorded, search.cfg.search.top_k)
    ranking = collect(study, d["candidates"], search.cfg.search.alpha)["ranking"]
    schedules = final_set(ranking, d["candidates"][0]["key"], k)
    if len(schedules) < 2:
        print(
            f"error: no schedule besides uniform reached the last rung of the search in {search.study_dir}, "
            f"so there is nothing to train at the full budget.",
            file=sys.stderr,
        )
        return 1
    seeds = ", ".join(map(str, search.cfg.seeds))
    what = f"{', '.join(schedules)} with seeds {seeds} at train.tokens={search.cfg.train.tokens:,}"
    try:
        todo = pending(args.scale, args.overrides, schedules, search.final_stages)
        final = {"top_k": k, "schedules": schedules}
        if recorded != final:
            if recorded:
                print(f"--top-k {k}, not {recorded['top_k']}: the full-budget stage now covers {what}")
            study.set_user_attr(FINAL_ATTR, final)
        if not todo:
            report = write_report(study, search.study_dir, d)
            print(f"the full-budget stage ({what}) is done; nothing to do. Report: {report}")
            return 0
        print(f"full budget: {what}, through the pipeline ({len(todo)} job(s) to run)", flush=True)
        code = run_final(args.scale, args.overrides, schedules, search.final_stages)
    except ValueError as exc:  # ConfigError, DataError: one sentence, as run_all.py
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume the full-budget stage.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        from prism.io import os_error_message

        print(f"error: {os_error_message(exc)}", file=sys.stderr)
        return 1
    report = write_report(study, search.study_dir, d)
    state = "done" if code == 0 else f"not done (exit code {code}): the same command continues it"
    print(f"the full-budget stage ({what}) is {state}. Report: {report}")
    return code


if __name__ == "__main__":
    sys.exit(main())
