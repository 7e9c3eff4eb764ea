"""The refusals of a config before any step, each in one sentence: every component that knows a
part of the config checks it here (the config layer checks only types and ranges). Training, the
dry run and plan of run_all.py (prism.pipeline) and the schedule search's trials call `preflight`.
"""

from __future__ import annotations

from prism import cluster
from prism.config.schema import RunConfig
from prism.data.sources import check_data_section, check_source_reachable
from prism.eval.tasks import check_task_config
from prism.train import trackers
from prism.train.batch import requested_devices
from prism.train.callbacks.profile import check_profile_config
from prism.train.callbacks.zeroshot import check_zeroshot_config
from prism.train.extension import check_extension
from prism.train.strategy import check_strategy


def preflight(
    cfg: RunConfig, *, settings_only: bool = False, launch: bool = False, reach_data: bool = False
) -> None:
    """Raise the first refusal of `cfg`: its data source, task lists, the run a context extension
    starts from, the profiled steps, strategy, in-loop evaluation and trackers; with `launch`
    (this process is about to train) also this process's layout and devices, and with
    `reach_data` whether the data source can be reached from here. `settings_only`: only what the
    settings themselves get wrong (the data section, task lists, an extension's source run, the
    profiled steps and tracker settings), nothing this machine's packages or devices decide: what
    a command that trains nothing (describe, a finished run) refuses."""
    check_data_section(cfg.data)
    check_task_config(cfg)
    check_extension(cfg)
    check_profile_config(cfg)
    if settings_only:
        trackers.check_trackers(cfg)
        return
    if launch:
        cluster.check_training_launch(requested_devices(cfg), int(cfg.train.num_nodes))
        cluster.check_accelerator_visible(cfg.train.accelerator)
    check_strategy(cfg)
    check_zeroshot_config(cfg)
    trackers.check_trackers(cfg)
    trackers.check_installed(cfg.train.loggers)
    trackers.check_store(cfg)
    if reach_data:
        check_source_reachable(cfg.data)


__all__ = ["preflight"]
