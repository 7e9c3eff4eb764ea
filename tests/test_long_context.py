"""The long-context evaluation (docs/evaluation.md, "Beyond the training context"): the bucketing
and Δ arithmetic on hand-made numbers, the block-by-block attention distance against the full
matrix, the stage in the plan, and on CPU two tiny runs trained at 128 tokens and read at 2x and
4x on the document-level WikiText-2 test pages under each RoPE choice, through the report
section; every bad input is one sentence, exit code 2 and nothing written."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import load_script, shared_data_dir, tiny_model

from prism.config.schema import load_config
from prism.measure.analysis import DistanceAccumulator, attention_distance
from prism.measure.long_context import LongContextError, bucket_edges, bucket_means, settings_for
from prism.measure.long_context.window import measure_window
from prism.report.collect import ScaleResults
from prism.report.long_context import delta, delta_cell, section
from prism.stats import t_two_sided_p, welch_test

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
main = load_script("long_context").main  # reproduce/long_context.py's


# ----- the arithmetic -----------------------------------------------------------------------------
def test_equal_width_buckets_and_their_means():
    assert bucket_edges(256, 4) == [0, 64, 128, 192, 256]
    assert bucket_edges(10, 3) == [0, 3, 6, 10]  # widths 3, 3, 4: every position in one bucket
    assert bucket_edges(3, 8) == [0, 1, 2, 3]  # never more buckets than positions
    assert bucket_means(np.arange(8.0), [0, 2, 8]) == [0.5, 4.5]
    with pytest.raises(ValueError, match="do not fill"):
        bucket_means(np.arange(7.0), [0, 2, 8])


def test_delta_over_seeds_by_hand():
    # uniform 3.0, 3.2 and prism 2.9, 3.0 on seeds 0 and 1; seed 2 has no prism run: left out
    d = delta({0: 3.0, 1: 3.2, 2: 9.9}, {0: 2.9, 1: 3.0})
    assert d.n == 2 and d.mean == pytest.approx(-0.15)
    assert d.sd == pytest.approx(math.sqrt(((-0.1 + 0.15) ** 2 + (-0.2 + 0.15) ** 2) / 1))
    # Welch: variances 0.02 and 0.005, se² = 0.0125, t = -0.15 / sqrt(0.0125), df from Satterthwaite
    se2 = 0.02 / 2 + 0.005 / 2
    df = se2**2 / ((0.02 / 2) ** 2 + (0.005 / 2) ** 2)
    assert d.p == pytest.approx(t_two_sided_p(0.15 / math.sqrt(se2), df))
    assert d.p == pytest.approx(welch_test([3.0, 3.2], [2.9, 3.0]).p)
    assert delta_cell(d) == f"−0.1500 ± {d.sd:.4f} (2), p {d.p:.3f}"
    one = delta({0: 3.0}, {0: 2.5})  # one seed a side: no s.d., no test
    assert (one.mean, one.sd, one.p) == (-0.5, None, None)
    assert delta_cell(one) == "−0.5000 (1), p n/a"
    assert delta({0: 1.0}, {1: 1.0}) is None and delta_cell(None) == "not run"


def test_settings_resolve_lengths_and_factors():
    lengths, choices = "long_context.lengths=[2x,1x,512,256]", "long_context.rope_scalings=[none,yarn]"
    cfg = load_config("cpu-s", [lengths, choices])
    s = settings_for(cfg.long_context, 128)
    assert s.lengths == [128, 256, 512]  # sorted, each once
    units = {(u.length, u.scaling): u for u in s.units()}
    assert units[(512, "yarn")].factor == 4.0 and units[(512, "none")].factor == 1.0
    # at factor 1 (the training length) every choice is plain RoPE: measured once
    assert units[(128, "yarn")].effective == units[(128, "none")].effective == ("none", 1.0)
    fixed = settings_for(load_config("cpu-s", ["long_context.rope_factor=2"]).long_context, 128)
    assert {u.factor for u in fixed.units() if u.scaling != "none"} == {2.0}


# ----- the window: block by block equals the full matrix ------------------------------------------
@pytest.mark.parametrize("T", [64, 160])  # the training length, and 2.5x past it
def test_block_distance_and_loss_equal_the_full_computation(T, one_thread):
    torch.manual_seed(0)
    model = tiny_model(heads=(1, 2, 4, 4), seq_len=64).eval()
    tokens = torch.randint(0, 512, (T + 1,))
    acc = DistanceAccumulator()
    loss = measure_window(model, tokens, acc, query_block=7, logit_chunk=50)
    full = DistanceAccumulator()
    with torch.no_grad():
        logits = model(tokens[None, :-1], attention_sink=full)  # the explicit (T, T) softmax
        expected = F.cross_entropy(logits[0].float(), tokens[1:], reduction="none").double()
    assert acc.per_layer() == pytest.approx(full.per_layer(), rel=1e-5)
    assert [len(h) for h in acc.per_head()] == [1, 2, 4, 4]
    assert torch.allclose(loss, expected, atol=1e-5) and loss.shape == (T,)
    if T == 64:  # and the analysis stage's own function gives the same D
        assert acc.per_layer() == pytest.approx(attention_distance(model, tokens[None])["D"], rel=1e-5)


# ----- the stage ----------------------------------------------------------------------------------
def test_the_stage_is_off_by_default_and_priced_in_the_dry_run(tmp_path):
    from prism.pipeline.plan import build_plan, default_scripts
    from prism.pipeline.stages import STAGES

    cfg = load_config("cpu-s", [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/res", "seeds=[0]"])
    assert "long_context" not in cfg.run_all.stages
    plan = build_plan(cfg, [], ["train", "long_context"], default_scripts(ROOT / "reproduce"), sys.executable)
    job = next(j for j in plan.jobs if j.label == "long_context prism seed0")
    train = next(j for j in plan.jobs if j.label == "train prism seed0")
    assert job.deps == [train] and job.config["checkpoint"] == train.hash
    assert job.output == tmp_path / "res" / "cpu-s" / "long_context" / "prism" / "seed0.json"
    argv = job.argv()
    assert argv[1].endswith("reproduce/long_context.py")
    assert 'long_context.lengths=["1x","2x","4x","8x"]' in argv
    line = STAGES["long_context"].cost(cfg)
    assert "2 runs x 13 measurements" in line and "forward tokens per run" in line
    bad = load_config("cpu-s", ["long_context.lengths=[0.5x]"])
    with pytest.raises(LongContextError, match="shorter than the training length model.seq_len=128"):
        build_plan(bad, [], ["long_context"], default_scripts(ROOT / "reproduce"), sys.executable)
    for words, said in (
        (
            ["long_context.lengths=[1000000000x]", "long_context.path=x.jsonl"],
            "longer than 64 x model.seq_len=128",
        ),
        (
            ["long_context.lengths=[1000000000x]"],
            "longer than the 1031 tokens of the run's validation documents",
        ),
        # the run's own documents are the 4 validation windows of 129 tokens: 515 tokens in all
        (["data.val_tokens=512", "long_context.lengths=[8x]"], "longer than the 515 tokens of the run's"),
        (["long_context.buckets=1000"], "long_context.buckets=1000 is more buckets than the 128 positions"),
        # cpu-s's heads 1 and 2 at d_model 4: widths 4 and 2, which NTK cannot scale
        (
            ["model.d_model=4", "long_context.rope_scalings=[none,ntk]"],
            "long_context.rope_scalings=ntk cannot",
        ),
    ):
        with pytest.raises(LongContextError, match=re.escape(said)):
            cfg = load_config("cpu-s", words)
            build_plan(cfg, [], ["long_context"], default_scripts(ROOT / "reproduce"), sys.executable)


def test_a_cpu_job_is_priced_at_this_machines_measured_rate_never_a_gpus(tmp_path):
    """A CPU plan was priced at an H100's FLOPs-estimated rate: "0.0 s per run" for jobs that took
    minutes. Without a benchmark on this machine the price is n/a, as training's measured column;
    with one, its forward rate prices every token."""
    from prism.pipeline.estimate import long_context_cost

    words = [f"results_dir={tmp_path}", "train.accelerator=cpu", "long_context.lengths=[1x]"]
    cfg = load_config("cpu-s", [*words, "long_context.rope_scalings=[none]"])
    cost = long_context_cost(cfg)
    assert cost.seconds is None and cost.rate_source.startswith("n/a until the benchmark has run")
    bench = tmp_path / "cpu-s" / "bench.json"
    bench.parent.mkdir(parents=True)
    bench.write_text(
        json.dumps(
            {
                "num_devices": 1,
                "hardware": "cpu",
                "schedules": {
                    "uniform": {"train_tokens_per_s": 300.0, "infer_tokens_per_s": 1000.0},
                    "prism": {"train_tokens_per_s": 280.0, "infer_tokens_per_s": 800.0},
                },
            }
        )
    )
    cost = long_context_cost(cfg)
    # one length at the training length (no slower attention): 16 documents x 128 tokens at the
    # slower schedule's 800 forward tokens/s
    assert cost.tokens == 16 * 128 and cost.seconds == pytest.approx(16 * 128 / 800, rel=1e-12)
    assert "the benchmark's forward rate, 800 tokens/s per device" in cost.rate_source
    # a benchmark without a forward pass: 3 x the measured training rate
    bench.write_text(
        json.dumps(
            {
                "num_devices": 1,
                "hardware": "cpu",
                "schedules": {
                    "uniform": {"train_tokens_per_s": 300.0, "infer_tokens_per_s": None},
                },
            }
        )
    )
    cost = long_context_cost(cfg)
    assert cost.seconds == pytest.approx(16 * 128 / 900, rel=1e-12)
    assert "3 x this machine's measured (1× cpu) 300 training tokens/s per device" in cost.rate_source


# ----- two tiny runs, end to end ------------------------------------------------------------------
WIKITEXT = ("eval", "wikitext", "test.jsonl")  # the 62 WikiText-2 test pages, field `page`


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """uniform and prism on cpu-s (seq_len 128), 4 steps each, trained in this process."""
    data = shared_data_dir()
    if data is None or not data.joinpath(*WIKITEXT).is_file():
        pytest.skip("real test data not found: set PRISM_SHARED_DATA to the shared data folder")
    from prism.train.trainer import train

    root = tmp_path_factory.mktemp("lc")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for schedule in ("uniform", "prism"):
            overrides = [f"runs_dir={root / 'runs'}", f"schedule={schedule}", "train.tokens=4096"]
            train(load_config("cpu-s", [*overrides, "data.val_tokens=512"]))
    finally:
        torch.set_num_threads(before)
    return {"root": root, "wikitext": data.joinpath(*WIKITEXT)}


def _args(trained, schedule: str, out: Path, *extra: str) -> list[str]:
    weights = trained["root"] / "runs" / "cpu-s" / schedule / "seed0" / "model.safetensors"
    return [
        "--checkpoint",
        str(weights),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--path",
        str(trained["wikitext"]),
        "--text-field",
        "page",
        "long_context.source=path",
        "long_context.documents=2",
        "long_context.buckets=4",
        *extra,
    ]


@pytest.mark.slow
def test_two_runs_at_2x_and_4x_under_each_rope_choice_then_the_report(trained, monkeypatch):
    results = trained["root"] / "results"
    docs = {}
    for schedule in ("uniform", "prism"):
        out = results / "cpu-s" / "long_context" / schedule / "seed0.json"
        assert main(_args(trained, schedule, out, "--lengths", "2x,4x")) == 0
        docs[schedule] = json.loads(out.read_text())
        assert not out.with_name("seed0.json.partial.json").exists()
    doc = docs["prism"]
    assert doc["complete"] and doc["seq_len"] == 128 and doc["settings"]["lengths"] == [256, 512]
    assert [(r["length"], r["rope_scaling"], r["rope_factor"]) for r in doc["results"]] == [
        (n, c, 1.0 if c == "none" else n / 128) for n in (256, 512) for c in ("none", "linear", "ntk", "yarn")
    ]
    for r in doc["results"]:
        assert r["documents"]["origin"] == "path" and r["documents"]["count"] == 2
        assert r["bucket_edges"] == [0, r["length"] // 4, r["length"] // 2, 3 * r["length"] // 4, r["length"]]
        assert all(math.isfinite(x) for x in [r["loss"], *r["bucket_loss"], *r["D"]]) and len(r["D"]) == 4
        assert r["query_positions_1based"] == [r["length"] // 2 + 1, r["length"]]
    # both runs read the same documents; the choices read them differently past the training length
    shas = {r["documents"]["sha256"] for d in docs.values() for r in d["results"] if r["length"] == 512}
    assert len(shas) == 1
    at_512 = {r["rope_scaling"]: r["loss"] for r in doc["results"] if r["length"] == 512}
    assert len(set(at_512.values())) == 4
    print("\nlong-context loss (nats/token), 2 WikiText-2 test pages, cpu-s trained at 128 tokens:")
    for schedule, d in docs.items():
        for r in d["results"]:
            print(f"  {schedule:7s} {r['length']:4d} {r['rope_scaling']:6s} loss {r['loss']:.4f} D {r['D']}")

    # a rerun measures nothing again: every (length, choice) is reused from the finished file
    out = results / "cpu-s" / "long_context" / "prism" / "seed0.json"
    import prism.measure.long_context.job as job

    again = lambda *a, **k: pytest.fail("a finished unit was measured again")  # noqa: E731
    monkeypatch.setattr(job, "measure_unit", again)
    assert main(_args(trained, "prism", out, "--lengths", "2x,4x")) == 0
    assert json.loads(out.read_text())["results"] == doc["results"]

    # killed after two units: those are kept in the partial file, and the rerun measures the rest
    uniform = results / "cpu-s" / "long_context" / "uniform" / "seed0.json"
    finished = json.loads(uniform.read_text())
    uniform.unlink()
    monkeypatch.undo()
    calls, measure, kill = [], job.measure_unit, [True]

    def killed_at_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3 and kill and kill.pop():
            raise KeyboardInterrupt
        return measure(*a, **k)

    monkeypatch.setattr(job, "measure_unit", killed_at_the_third)
    assert main(_args(trained, "uniform", uniform, "--lengths", "2x,4x")) == 130
    partial = json.loads(uniform.with_name("seed0.json.partial.json").read_text())
    assert len(partial["results"]) == 2 and not uniform.exists()  # 256 under none and linear
    calls.clear()
    assert main(_args(trained, "uniform", uniform, "--lengths", "2x,4x")) == 0
    assert len(calls) == 6  # the 6 units left, each once
    again = json.loads(uniform.read_text())["results"]
    assert [r["fingerprint"] for r in again] == [r["fingerprint"] for r in finished["results"]]
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in finished["results"]], abs=1e-9)

    res = ScaleResults("cpu-s")
    sec = section([res, ScaleResults("124m")], results)
    text = "\n".join(sec.lines)
    assert res.problems == [] and "### cpu-s" in text and "124m: not run." in text
    assert "Trained at 128 tokens; evaluated at 256, 512 tokens. Runs per schedule: uniform 1, prism 1." in (
        text
    )
    assert "| uniform | yarn |" in text and "Δ loss by position at 512 tokens, prism − uniform" in text
    assert "| 384–511 |" in text and "(1), p n/a" in text  # one seed a side: no s.d., no p
    assert "Attention distance D_l per layer (tokens), RoPE `ntk`:" in text
    expected = {f"cpu-s-long-context-loss-{n}.png" for n in (256, 512)}
    expected |= {f"cpu-s-long-context-distance-{c}.png" for c in ("none", "linear", "ntk", "yarn")}
    assert set(sec.plots) == expected and all(p.startswith(PNG_MAGIC) for p in sec.plots.values())
    assert all(f"(plots/{name})" in text for name in expected)
    # nothing measured: one line saying how to run it
    assert section([ScaleResults("cpu-s")], trained["root"] / "empty").lines[0].startswith("Not run.")


@pytest.mark.parametrize(
    "words, said",
    [
        (["long_context.lengths=[64]"], "long_context.lengths entry 64 is 64 tokens, shorter than"),
        # 64 x seq_len is the longest read a RoPE factor is made for: 1e9x was priced, not refused
        (["--lengths", "1000000000x"], "is 128,000,000,000 tokens, longer than 64 x model.seq_len=128"),
        (["--lengths", "20000"], "is 20,000 tokens, longer than 64 x model.seq_len=128, the longest"),
        # the model is the checkpoint's: an override of it was ignored without a word
        (["model.seq_len=4096"], "model.seq_len=4096 is not read by the long-context evaluation"),
        (["model.rope_scaling=linear"], "model.rope_scaling=linear is not read by the long-context"),
        (["train.lr=1"], "train.lr=1 is not read by the long-context evaluation"),
        (["long_context.rope_scalings=[none,rope2]"], "long_context.rope_scalings='rope2' is invalid: use"),
        (["long_context.rope_factor=0"], "long_context.rope_factor=0.0 is invalid: use null"),
        (["long_context.rope_factor=-2"], "long_context.rope_factor=-2.0 is invalid"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_sentence_exit_2_and_nothing_written(trained, capsys, words, said):
    out = trained["root"] / "refused" / "seed0.json"
    assert main(_args(trained, "prism", out, *words)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
    assert not out.parent.exists()


@pytest.mark.slow
def test_weights_trained_under_a_rope_scaling_are_refused(trained, tmp_path, capsys):
    """Each unit sets its own scaling and factor; weights trained under one (a context extension
    with linear x2) would be misread, so they are refused before anything is written."""
    run = tmp_path / "scaled"
    shutil.copytree(trained["root"] / "runs" / "cpu-s" / "prism" / "seed0", run)
    meta = json.loads((run / "model_config.json").read_text())
    meta["model"].update(rope_scaling="linear", rope_factor=2.0)
    (run / "model_config.json").write_text(json.dumps(meta))
    args = _args(trained, "prism", tmp_path / "out" / "seed0.json")
    args[1] = str(run / "model.safetensors")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was trained with model.rope_scaling=linear at factor 2" in err[0], err
    assert not (tmp_path / "out").exists()
