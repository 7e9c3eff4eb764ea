"""train.micro_batch=auto (prism.train.memory, prism.train.plan): the value the config accepts, the
identity it leaves alone, the split the plan takes from the memory plan, and the start's warning
when another process holds the memory the plan counted on."""

from __future__ import annotations

import pytest

from prism.config.schema import ConfigError, load_config
from prism.runs.identity import config_hash
from prism.train.memory import GIB, estimate_memory, occupied_warning
from prism.train.plan import plan_run

TINY_HASH = "cd053005c4d02873"


def test_auto_is_a_micro_batch_that_leaves_the_identity_alone():
    assert config_hash(load_config("tiny", ["train.micro_batch=auto"])) == TINY_HASH
    assert config_hash(load_config("tiny", ["train.micro_batch=2"])) == TINY_HASH
    for bad in ("0", "2.5", "most", "true"):
        with pytest.raises(ConfigError) as err:
            load_config("tiny", [f"train.micro_batch={bad}"])
        assert "train.micro_batch=" in str(err.value) and "auto" in str(err.value)
        assert err.value.exit_code == 2 and len(str(err.value).splitlines()) == 1


@pytest.mark.slow
def test_the_plan_holds_the_choice_and_keeps_the_global_batch(tmp_path):
    fixed = plan_run(load_config("tiny", [f"runs_dir={tmp_path}"]), launch=False, reach_data=False)
    assert fixed.memory is None and "memory" not in fixed.info  # no estimate unless asked for
    # tiny's step of 8 sequences: the device gets room for the peak at 4 but not at 8
    cfg = load_config("tiny", [f"runs_dir={tmp_path}", "train.micro_batch=auto"])
    at4, at8 = estimate_memory(cfg, 1, 4), estimate_memory(cfg, 1, 8)
    assert at4.job_peak_bytes < at8.job_peak_bytes
    between = (at4.job_peak_bytes + at8.job_peak_bytes) / 2 / GIB / at4.fraction + at4.overhead_gib
    auto = [f"runs_dir={tmp_path}", "train.micro_batch=auto"]
    cfg = load_config("tiny", [*auto, f"train.gpu_memory_gib={between}"])
    plan = plan_run(cfg, launch=False, reach_data=False)
    assert (plan.batch.micro_batch, plan.batch.accumulation) == (4, 2)
    assert plan.batch.global_batch_tokens == fixed.batch.global_batch_tokens
    assert plan.memory.micro_batch == 4 and plan.memory.fits and plan.memory.device_gib == between
    assert plan.info["memory"]["auto"] is True and plan.info["batch_split"]["micro_batch"] == 4
    assert plan.config_hash == fixed.config_hash == TINY_HASH


def test_the_start_warns_when_another_process_holds_the_memory_the_plan_counted_on(tmp_path):
    cfg = load_config("tiny", [f"runs_dir={tmp_path}", "train.gpu_memory_gib=80"])
    estimate = estimate_memory(cfg, 1, 8)
    peak, total = estimate.job_peak_bytes, 80 * GIB
    need = (peak / GIB / estimate.fraction + estimate.overhead_gib) * GIB  # free memory the peak needs
    assert occupied_warning(estimate, total, total) is None  # an idle device
    assert occupied_warning(estimate, int(need) + 1, total) is None  # just enough left
    warning = occupied_warning(estimate, int(need) - 1, total)  # another process holds the rest
    assert warning is not None and len(warning.splitlines()) == 1
    assert f"{(total - int(need) + 1) / GIB:,.1f} GiB" in warning and "micro_batch 8" in warning


def test_auto_refuses_no_plan_that_trains_nothing(tmp_path, capsys):
    # an execution key never refuses what needs no training: with the train stage not selected, a
    # device too small for even one sequence still plans the evaluation's jobs
    from tests.conftest import load_script

    run_all = load_script("run_all")
    small = ["train.micro_batch=auto", "train.gpu_memory_gib=0.01", f"runs_dir={tmp_path}"]
    assert run_all.main(["--scale", "tiny", "--dry-run", *small]) == 2  # training would not fit
    assert "GiB per device at its lowest" in capsys.readouterr().out  # run_all says it on its console
    assert run_all.main(["--scale", "tiny", "--dry-run", "--stages", "eval,report", *small]) == 0
