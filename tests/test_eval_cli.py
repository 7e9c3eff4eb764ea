"""reproduce/evaluate.py end to end on the hand-written fixture data: the docs/outputs.md JSON,
checkpoint metadata, and one-sentence errors that leave nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import torch

from prism.core.model import ModelConfig, PrismDecoder
from prism.eval import SEMANTICS, evaluate, resolve_tasks
from prism.eval.job import resume_key, task_data_identity
from prism.runs.checkpoint import export_safetensors, load_model

ROOT = Path(__file__).parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "eval"
TASKS = "hellaswag,piqa,arc_easy,winogrande,blimp_adjunct_island,wikitext"
pytestmark = pytest.mark.usefixtures("one_thread")


def load_script():
    return conftest.load_script("evaluate")  # prism.cli.evaluate, which reproduce/evaluate.py runs


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = PrismDecoder(
        ModelConfig(n_layer=2, d_model=64, h_base=4, heads=[2, 4], seq_len=32, schedule_name="prism")
    ).eval()
    out = tmp_path_factory.mktemp("ckpt")
    export_safetensors(model, out, {"scale": "tiny", "schedule": "prism", "seed": 1})
    return out, model


def test_writes_the_documented_json(checkpoint, tmp_path):
    ckpt, model = checkpoint
    out = tmp_path / "eval" / "prism" / "seed1.json"
    rc = load_script().main(
        [
            "--checkpoint",
            str(ckpt),
            "--tasks",
            TASKS,
            "--data-dir",
            str(FIXTURES),
            "--batch-size",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    record = json.loads(out.read_text())
    assert set(record) == {
        "checkpoint",
        "scale",
        "schedule",
        "seed",
        "semantics",
        "data_source",
        "limit",
        "batch_size",
        "tasks",
    }
    assert (record["scale"], record["schedule"], record["seed"], record["batch_size"]) == (
        "tiny",
        "prism",
        1,
        5,
    )
    assert record["semantics"] == SEMANTICS == "lm-evaluation-harness 0.4.x"
    assert (
        record["data_source"] == task_data_identity(FIXTURES, resolve_tasks(TASKS))
        and record["limit"] is None
    )
    tasks = record["tasks"]
    assert set(tasks["hellaswag"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n"}
    assert set(tasks["winogrande"]) == {"acc", "acc_stderr", "n"}
    assert tasks["arc_easy"]["n"] == 2 and tasks["blimp_adjunct_island"]["n"] == 2
    assert {"word_perplexity", "byte_perplexity", "bits_per_byte"} <= set(tasks["wikitext"])
    # The script reports what the library computes for the same model. float32 scores depend on
    # the batch shapes (batch size 1 vs 5 moves word perplexity by ~2e-8), so the library runs
    # exactly as the script does: the weights it loads (bit-equal to `model`), one evaluate()
    # call per task, batch size 5. Same shapes, same kernels: every number must match exactly.
    loaded, _ = load_model(ckpt)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    direct = {}
    for task in TASKS.split(","):  # each of these is its own unit in the script
        direct.update(evaluate(loaded, task, data_dir=FIXTURES, batch_size=5)["tasks"])
    assert tasks == direct
    assert not list(out.parent.glob(".*tmp"))  # atomic write left no temp file


@pytest.mark.slow
def test_the_script_exits_non_zero(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "reproduce" / "evaluate.py"),
            "--checkpoint",
            str(tmp_path),
            "--tasks",
            "piqa,hellaswag_v2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == (
        "error: unknown task 'hellaswag_v2'; valid tasks are hellaswag, piqa, "
        "arc_easy, winogrande, blimp, wikitext or one BLiMP paradigm as "
        "blimp_<UID> (e.g. blimp_adjunct_island)."
    )


def _bad_data(tmp_path, rows):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data)
    (data / "piqa" / "validation.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return data


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown_task", "error: unknown task 'hellaswag_v2'; valid tasks are hellaswag, piqa"),
        ("missing_data", "error: task arc_easy: no data at {tmp}/data/arc_easy/test.jsonl"),
        (
            "gold_out_of_range",
            "error: task piqa, row 1 of {tmp}/data/piqa/validation.jsonl: gold label 3 is out of range "
            "for 2 choices (valid: 0 to 1).",
        ),
        (
            "empty_choice",
            "error: task piqa, row 0 of {tmp}/data/piqa/validation.jsonl: choice 0 is empty (''); "
            "every choice needs text to score.",
        ),
        ("bad_checkpoint", "error: checkpoint {tmp}/nothing.ckpt does not exist."),
        (
            "too_long",  # arc_easy comes first and fits: refused before it is scored
            "error: task piqa has a continuation of 38 tokens, longer than the seq_len=32 of {ckpt}, so "
            "that model cannot score it; leave piqa out of --tasks or evaluate a model with a longer "
            "model.seq_len.",
        ),
    ],
)
def test_bad_input_stops_with_one_sentence(checkpoint, tmp_path, capsys, case, expected):
    ckpt = str(checkpoint[0])
    good = {"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
    args = {  # built lazily: each case writes its own data folder
        "unknown_task": lambda: [
            "--checkpoint",
            ckpt,
            "--tasks",
            "piqa,hellaswag_v2",
            "--data-dir",
            str(FIXTURES),
        ],
        "missing_data": lambda: [
            "--checkpoint",
            ckpt,
            "--tasks",
            "piqa,arc_easy",
            "--data-dir",
            str(_bad_data(tmp_path, [good])),
        ],
        "gold_out_of_range": lambda: [
            "--checkpoint",
            ckpt,
            "--tasks",
            "piqa",
            "--data-dir",
            str(_bad_data(tmp_path, [good, {**good, "label": 3}])),
        ],
        "empty_choice": lambda: [
            "--checkpoint",
            ckpt,
            "--tasks",
            "piqa",
            "--data-dir",
            str(_bad_data(tmp_path, [{**good, "sol1": ""}])),
        ],
        "bad_checkpoint": lambda: [
            "--checkpoint",
            str(tmp_path / "nothing.ckpt"),
            "--tasks",
            "piqa",
            "--data-dir",
            str(FIXTURES),
        ],
        "too_long": lambda: [  # 37 tokens " word" and one of the trailing space: 38
            "--checkpoint",
            ckpt,
            "--tasks",
            "arc_easy,piqa",
            "--data-dir",
            str(_bad_data(tmp_path, [good, {**good, "sol2": "word " * 37}])),
        ],
    }[case]()
    if case == "missing_data":
        shutil.rmtree(tmp_path / "data" / "arc_easy")
    out = tmp_path / "out.json"
    assert load_script().main([*args, "--out", str(out), "--no-progress"]) == 2
    assert not out.exists() and not Path(f"{out}.partial.json").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected.format(tmp=tmp_path, ckpt=ckpt)), lines


def test_lightning_ckpt_metadata_and_resume(checkpoint, tmp_path):
    """A weights-only .ckpt gives scale/schedule/seed; finished tasks saved in <out>.partial.json
    are reused for the same weights, data and limit, and recomputed when the limit changes."""
    _, model = checkpoint
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {
                "model": model.cfg.to_dict(),
                "scale": "tiny",
                "schedule": "prism",
                "seed": 2,
            },
            "global_step": 7,
        },
        ckpt,
    )
    script = load_script()
    out = tmp_path / "seed2.json"
    argv = [
        "--checkpoint",
        str(ckpt),
        "--tasks",
        "piqa,winogrande",
        "--data-dir",
        str(FIXTURES),
        "--out",
        str(out),
        "--no-progress",
    ]
    args = conftest.eval_job(argv)
    marker = {"acc": 0.123, "acc_stderr": None, "acc_norm": 0.456, "acc_norm_stderr": None, "n": 2}
    partial = Path(f"{out}.partial.json")
    partial.write_text(json.dumps({"key": resume_key(args), "tasks": {"piqa": marker}}))
    assert script.main(argv) == 0
    record = json.loads(out.read_text())
    assert (record["scale"], record["schedule"], record["seed"]) == ("tiny", "prism", 2)
    assert record["tasks"]["piqa"] == marker  # resumed, not recomputed
    assert record["tasks"]["winogrande"]["n"] == 2 and not partial.exists()
    partial.write_text(json.dumps({"key": resume_key(args), "tasks": {"piqa": marker}}))
    assert script.main([*argv, "--limit", "1"]) == 0  # another limit: the saved result is stale
    assert json.loads(out.read_text())["tasks"]["piqa"]["n"] == 1


def test_the_data_is_named_by_its_content_not_its_place(tmp_path):
    """A committed result must not carry a path of the machine that made it: the same files in
    another folder have the same identity, and one changed byte gives another."""
    names = resolve_tasks("piqa,winogrande,blimp_adjunct_island")
    here = task_data_identity(FIXTURES, names)
    assert here.startswith("local files, sha256 ") and str(FIXTURES) not in here
    copy = shutil.copytree(FIXTURES, tmp_path / "elsewhere")
    assert task_data_identity(copy, names) == here
    piqa = copy / "piqa" / "validation.jsonl"
    piqa.write_text(piqa.read_text().replace("a", "b", 1))
    assert task_data_identity(copy, names) != here
    assert task_data_identity(None, names) == "hub"
