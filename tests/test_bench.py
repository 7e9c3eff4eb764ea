"""The throughput benchmark: its reported figures follow from its own measured step times and
the FLOPs formula, the command line writes bench.json per docs/outputs.md, bad input stops."""

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

from prism.core.model import ModelConfig, flops_per_token
from prism.core.schedule import split_schedules
from prism.measure.bench import BenchSettings, layer_backends, run_benchmark

BENCH_SCRIPT = load_script("benchmark")  # reproduce/benchmark.py
main = BENCH_SCRIPT.main

ROOT = Path(__file__).resolve().parents[1]


def small(heads):
    return ModelConfig(
        n_layer=2, d_model=32, h_base=4, heads=heads, vocab_size=256, vocab_multiple=64, seq_len=32
    )


@pytest.fixture(scope="module")
def result():
    s = BenchSettings(
        steps=3, warmup=1, infer_steps=2, micro_batch=2, seq_len=32, device="cpu", peak_tflops=1.0
    )
    return run_benchmark({"uniform": small([4, 4]), "prism": small([2, 4])}, s, progress=lambda m: None)


@pytest.mark.slow
def test_tokens_per_s_and_mfu_follow_from_measured_step_times(result):
    # Parameters by hand: tied embedding 256x32; per layer 2 norms, qkv 32x96, proj 32x32,
    # SwiGLU gate_up 32x128 and down 64x32 (hidden = 8*32/3 rounded to 64 = 64); final norm.
    n_params = 256 * 32 + 2 * (32 + 32 * 96 + 32 * 32 + 32 + 32 * 128 + 64 * 32) + 32
    fpt = 6 * n_params + 12 * 2 * 32 * 32
    assert fpt == flops_per_token(small([4, 4]), n_params, 32) == 197568
    for r in result["schedules"].values():
        assert r["n_params"] == n_params and r["flops_per_token"] == fpt
        assert len(r["step_times_s"]) == 3 and all(t > 0 for t in r["step_times_s"])
        median = statistics.median(r["step_times_s"])
        assert r["step_time_s_median"] == pytest.approx(median)
        tps = 2 * 32 / median
        assert r["train_tokens_per_s"] == pytest.approx(tps)
        assert r["mfu"] == pytest.approx(tps * fpt / 1e12)
        lo, hi = r["step_time_s_spread"]
        assert min(r["step_times_s"]) <= lo <= median <= hi <= max(r["step_times_s"])
        assert r["infer_tokens_per_s"] == pytest.approx(2 * 32 / r["infer_step_time_s_median"])
    u, p = result["schedules"]["uniform"], result["schedules"]["prism"]
    assert u["ratio_to_uniform"] == 1.0
    assert p["ratio_to_uniform"] == pytest.approx(u["step_time_s_median"] / p["step_time_s_median"])
    assert p["ratio_to_uniform_min"] == pytest.approx(min(u["step_times_s"]) / min(p["step_times_s"]))
    assert p["ratio_to_uniform_cpu_time"] == pytest.approx(u["cpu_time_s_median"] / p["cpu_time_s_median"])
    rounds = [a / b for a, b in zip(u["step_times_s"], p["step_times_s"])]
    assert min(rounds) <= p["ratio_to_uniform_spread"][0] <= p["ratio_to_uniform_spread"][1] <= max(rounds)


@pytest.mark.slow
def test_result_shape_and_backends(result):
    assert result["reference"] == "uniform" and result["device_type"] == "cpu"
    assert result["dtype"] == "float32" and result["compile"] is False
    p = result["schedules"]["prism"]
    assert p["heads"] == [2, 4] and p["head_dims"] == [16, 8]
    assert len(p["attention_backends"]) == 2
    assert set(p["attention_backends"]) <= {"flash", "efficient", "cudnn", "math"}
    assert p["peak_memory_bytes"] is None  # only measured on CUDA
    # the profiler sees the fused CPU kernel the dispatcher promised (not the math path)
    if p["attention_backends"][0] == "flash":
        assert any("flash_attention" in k for k in p["attention_kernels"])


def test_layer_backends_reuse_one_probe_per_head_count():
    names = layer_backends(small([4, 4]), 1, 32, torch.device("cpu"), torch.float32)
    assert len(names) == 2 and names[0] == names[1] != "none"


def test_split_schedules():
    assert split_schedules("uniform,prism") == ["uniform", "prism"]
    assert split_schedules("uniform,3x2,6x2,12x8,prism") == ["uniform", "3x2,6x2,12x8", "prism"]
    assert split_schedules("3x2,12x10;6x4,12x8") == ["3x2,12x10", "6x4,12x8"]
    # with ';' each part is read the same way: names apart, a head list whole
    assert split_schedules("uniform,prism;2x2,4x6") == ["uniform", "prism", "2x2,4x6"]


@pytest.mark.slow
def test_cli_writes_bench_json(tmp_path):
    out = tmp_path / "bench.json"
    rc = main(
        [
            "--scale",
            "tiny",
            "--schedules",
            "prism",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--infer-steps",
            "1",
            "--micro-batch",
            "1",
            "--seq-len",
            "32",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["scale"] == "tiny" and res["micro_batch"] == 1 and res["seq_len"] == 32
    assert set(res["schedules"]) == {"uniform", "prism"}  # the reference is always added
    assert res["reference"] == "uniform"
    for key in (
        "heads",
        "train_tokens_per_s",
        "step_time_s_median",
        "step_time_s_spread",
        "mfu",
        "peak_memory_bytes",
        "infer_tokens_per_s",
        "attention_backends",
        "ratio_to_uniform",
    ):
        assert key in res["schedules"]["prism"]
    assert res["schedules"]["prism"]["mfu"] is None  # no peak for a CPU


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scale", "nope"], "unknown scale"),
        (["--scale", "tiny", "--schedules", "uniform,bogus"], "unknown schedule 'bogus'"),
        (["--scale", "tiny", "--steps", "0"], "--steps=0 is invalid"),
        (["--scale", "tiny", "--seq-len", "4096"], "exceeds model.seq_len"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, capsys, args, message):
    out = tmp_path / "b.json"
    assert main(args + ["--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


DEV_TOOLS = ["overhead.py", "data_benchmark.py", "eval_speed.py", "gpu_check.py"]


@pytest.mark.parametrize("tool", DEV_TOOLS)
def test_the_developer_tools_start(tool, capsys):
    """dev/ holds the tools that measure the kit itself; each one imports and parses its command
    line. Loaded from its file and run here, as `python dev/TOOL --help` runs it (the imports
    are this process's already, which a process of its own would spend seconds repeating)."""
    spec = importlib.util.spec_from_file_location(f"dev_{Path(tool).stem}", ROOT / "dev" / tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and "usage:" in out, err[-2000:]


@pytest.mark.slow
def test_a_round_times_back_to_back_steps():
    """round_steps steps of each schedule run back to back per timed round (one synchronise per
    round on a GPU); step_times_s holds each round's time per step. Optimizer steps are counted
    with torch's global step hook: warm-up + rounds x round_steps + the profiled step."""

    steps_run = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda opt, *_: steps_run.append(id(opt)))
    try:
        s = BenchSettings(
            steps=2, round_steps=3, warmup=1, infer_steps=0, micro_batch=2, seq_len=32, device="cpu"
        )
        out = run_benchmark({"uniform": small([4, 4]), "prism": small([2, 4])}, s, progress=lambda m: None)
    finally:
        handle.remove()
    assert out["round_steps"] == 3
    assert sorted(steps_run.count(o) for o in set(steps_run)) == [1 + 2 * 3 + 1] * 2
    for r in out["schedules"].values():
        assert len(r["step_times_s"]) == 2 and all(t > 0 for t in r["step_times_s"])
