"""The run plan (prism.train.plan): a real training start through reproduce/train.py runs every
check of its config once and decides each thing once; a context extension reads its source run
once; several problems are reported together, one sentence a line."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import pytest
from conftest import load_script

from prism.config.schema import ConfigError, load_config
from prism.train.plan import PlanRefused, plan_run

main = load_script("train").main

# 2 optimizer steps of 4 sequences x 32 tokens; one validation of 8 windows at the start and end
QUICK = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=256",
    "train.val_every_steps=2",
    "train.ckpt_every_steps=2",
    "data.val_tokens=256",
]

# every check a training start makes, and the decisions that each had a second home
CHECKS = {
    "prism.cluster": ["check_accelerator_visible", "check_training_launch"],
    "prism.config.values": ["check_values"],
    "prism.data.sources": ["check_data_section", "check_source_reachable"],
    "prism.eval.tasks": ["check_task_config"],
    "prism.train.extension": ["check_extension"],
    "prism.train.trackers.build": ["check_trackers", "check_installed", "check_store"],
    "prism.train.callbacks.zeroshot": ["check_zeroshot_config"],
    "prism.train.strategy": ["check_strategy"],
    "prism.train.batch": ["batch_plan"],
    "prism.runs.identity": ["config_hash"],
    "prism.train.plan": ["run_status"],
}


def count_calls(monkeypatch, functions: dict[str, list[str]]) -> Counter:
    """Wrap each named function so that every call of it, under whatever name a module imported
    it, is counted; the real function runs."""
    calls: Counter = Counter()
    for module_name, names in functions.items():
        module = importlib.import_module(module_name)
        for name in names:
            real = getattr(module, name)

            def counted(*args, _real=real, _key=f"{module_name}.{name}", **kwargs):
                calls[_key] += 1
                return _real(*args, **kwargs)

            for loaded in list(sys.modules.values()):  # every module that holds the same function
                kit = getattr(loaded, "__name__", "").startswith("prism")
                if kit and getattr(loaded, name, None) is real:
                    monkeypatch.setattr(loaded, name, counted)
    return calls


def test_a_training_start_runs_each_check_once(monkeypatch, tmp_path, capsys):
    import prism.cli.train  # noqa: F401  the modules a start imports, so their names are counted too
    import prism.train.trainer  # noqa: F401

    calls = count_calls(monkeypatch, CHECKS)
    argv = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *QUICK, f"runs_dir={tmp_path}"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "finished: " in capsys.readouterr().out
    expected = {f"{m}.{n}": 1 for m, names in CHECKS.items() for n in names}
    assert dict(calls) == expected


@pytest.mark.slow
def test_an_auto_micro_batch_start_estimates_memory_once(monkeypatch, tmp_path, capsys, caplog):
    import prism.cli.train  # noqa: F401
    import prism.train.memory  # noqa: F401  imported by the plan only when train.micro_batch=auto
    import prism.train.trainer  # noqa: F401

    checks = {**CHECKS, "prism.train.memory": ["fit_micro_batch"]}
    calls = count_calls(monkeypatch, checks)
    quick = [o for o in QUICK if not o.startswith("train.micro_batch=")]
    argv = ["--scale", "tiny", "--seed", "0", *quick, "train.micro_batch=auto", f"runs_dir={tmp_path}"]
    with caplog.at_level("INFO"):
        assert main(argv) == 0, capsys.readouterr().err
    assert "train.micro_batch=auto, the memory plan's choice: micro_batch 4 x accumulation 1" in caplog.text
    assert dict(calls) == {f"{m}.{n}": 1 for m, names in checks.items() for n in names}


def test_a_job_that_does_not_fit_at_micro_batch_one_is_refused_before_anything(tmp_path, capsys):
    quick = [o for o in QUICK if not o.startswith("train.micro_batch=")]
    argv = ["--scale", "tiny", *quick, "train.micro_batch=auto", "train.gpu_memory_gib=0.0001"]
    assert main([*argv, f"runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count(". ") == 0, err
    # one device: sharding and more devices change nothing there, so the refusal does not name them;
    # the device's GiB is named with the setting it came from
    assert "fsdp" not in err and "more devices" not in err, err
    assert "0.0001 GiB (train.gpu_memory_gib)" in err, err
    assert not any(tmp_path.iterdir())


def test_several_problems_are_refused_together_one_sentence_each(tmp_path):
    cfg = load_config("tiny", ["data.source=ftp", "eval.tasks=[nosuch]", f"runs_dir={tmp_path}"])
    with pytest.raises(PlanRefused) as err:
        plan_run(cfg, launch=False, reach_data=False)
    lines = str(err.value).splitlines()
    assert len(lines) == 2, lines
    assert "data.source" in lines[0] and "ftp" in lines[0], lines
    assert "eval.tasks" in lines[1] and "nosuch" in lines[1], lines
    assert isinstance(err.value, ConfigError) and err.value.exit_code == 2
    assert not any(tmp_path.iterdir())


def test_the_plan_is_immutable(tmp_path):
    plan = plan_run(load_config("tiny", [f"runs_dir={tmp_path}"]))
    assert plan.status == "new" and plan.config_hash == "cd053005c4d02873"
    with pytest.raises(AttributeError):
        plan.steps = 1


@pytest.mark.slow
def test_a_search_trial_plans_its_run_once_and_a_finished_one_is_not_trained_again(monkeypatch, tmp_path):
    import optuna

    import prism.train.trainer  # noqa: F401
    from prism.search.budget import parse_rungs
    from prism.search.trial import run_trial

    calls = count_calls(monkeypatch, {**CHECKS, "prism.train.trainer": ["build_trainer"]})
    cfg = load_config("tiny", [*QUICK, f"runs_dir={tmp_path}"])
    rungs = parse_rungs("256", cfg)
    study = optuna.create_study(direction="minimize")
    first = run_trial(study.ask(), cfg, rungs, protected=True, earlier={})
    assert first.state == "complete" and first.value is not None, first
    assert dict(calls) == {f"{m}.{n}": 1 for m, names in CHECKS.items() for n in names} | {
        "prism.train.trainer.build_trainer": 1
    }
    calls.clear()  # a retried trial whose run had finished: planned once more, nothing built or trained
    again = run_trial(study.ask(), cfg, rungs, protected=True, earlier={})
    assert again == first
    assert calls["prism.runs.identity.config_hash"] == 1 and calls["prism.train.plan.run_status"] == 1
    assert "prism.train.trainer.build_trainer" not in calls
