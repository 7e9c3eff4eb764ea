"""train.py's command line (docs/commands.md#trainpy, docs/training.md#exit-codes); training: prism.train."""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Optional

# the light modules only: a value the config refuses never waits for Lightning's import
from prism.cli.command import Key, command, show_config
from prism.cluster import InterruptedAtOnce
from prism.config.schema import load_config, to_dict
from prism.errors import ConfigError

EPILOG = "Outputs: docs/commands.md#trainpy. Exit codes: docs/training.md#exit-codes."
AT_ONCE = (
    "stopped at once outside the training steps, so no step was lost; run the same command again to continue"
)


def train(
    scale: Optional[str] = None,
    schedule: Annotated[Optional[str], Key("schedule")] = None,
    seed: Annotated[Optional[int], Key("train.seed")] = None,
    resume: bool = False,
    overwrite: bool = False,
    overrides: list[str] = (),
    print_config: bool = False,
) -> int:
    """Train one Prism/uniform run.

    Args:
        scale: any configs/scale/<scale>.yaml, e.g. tiny or 124m (or a --config file's scale)
        schedule: uniform, prism, a named schedule (e.g. config-6) or a head list such as 3x2,6x2,8x2,12x6
        resume: require checkpoints/last.ckpt and continue it
        overwrite: delete the run directory and start again
        overrides: config overrides key=value, e.g. train.devices=8
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; give one.")
    if scale is None:
        raise ConfigError("give --scale, or a --config file that sets scale.")
    cfg = load_config(scale, overrides)
    from prism.train.plan import plan_run  # torch only: Lightning once the light checks have passed

    if print_config:
        return show_config(to_dict(cfg), plan_run(cfg, launch=False, reach_data=False).derived())
    plan = plan_run(cfg, overwrite=overwrite, resume=True if resume else None)
    from prism.train import trainer as training

    # the imports are done: an interrupt swallowed by one of them has surfaced by now, so a later
    # failure (a lost peer hours in) is judged on its own
    _STOPPED_AT_ONCE.clear()
    out = training.run(plan)  # a finished run says so, and is left alone
    if not plan.finished:
        print(f"finished: {out}")
    return 0


def _stop_at_once(_signum, _frame) -> None:
    _STOPPED_AT_ONCE.append(InterruptedAtOnce(AT_ONCE))
    raise _STOPPED_AT_ONCE[-1]


# a Ctrl-C swallowed by an import leaves a later error that is its doing (docs/training.md)
_STOPPED_AT_ONCE: list[InterruptedAtOnce] = []


def _train_or_stop(**args) -> int:
    """train(), where a Ctrl-C outside the training steps stops at once (InterruptedAtOnce, never
    Lightning's KeyboardInterrupt handling); during them prism.train.callbacks.Preemption has it."""
    _STOPPED_AT_ONCE.clear()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _stop_at_once) if on_main_thread else None
    try:
        return train(**args)
    except Exception as exc:
        if _STOPPED_AT_ONCE:
            raise _STOPPED_AT_ONCE[-1] from exc
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


# an unexpected exception is a crash (exit code 70), which run_all.py retries
main = command(train, epilog=EPILOG, interrupted=AT_ONCE, crashes=True, work=_train_or_stop)
