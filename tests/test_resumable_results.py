"""The one resumable-results helper (prism.runs.resumable) that zero-shot evaluation, the attention
analysis and the long-context evaluation share: a job killed mid-way (SIGKILL, no clean-up) leaves
a partial file that the same command resumes from, scoring only what is left and ending with the
numbers of an uninterrupted run; a partial file that cannot be read back is one warning sentence
and its units are computed again; the final file is written whole or not at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, load_script
from pydantic_core import PydanticSerializationError

from prism.core.model import ModelConfig, PrismDecoder
from prism.runs.checkpoint import export_safetensors
from prism.runs.records import LongContext
from prism.runs.resumable import ATTENTION, LONG_CONTEXT, ZERO_SHOT

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
TASKS = "piqa,winogrande,arc_easy"
pytestmark = pytest.mark.usefixtures("one_thread")

# evaluate.py, killed by SIGKILL as it starts its second task: what it kept is on disk, nothing else
KILLED_AT_THE_SECOND_TASK = """
import os, signal, sys
import prism.eval.job as job
real, calls = job.evaluate, []
def evaluate(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
job.evaluate = evaluate
from prism.cli.evaluate import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    model = PrismDecoder(
        ModelConfig(n_layer=2, d_model=64, h_base=4, heads=[2, 4], seq_len=32, schedule_name="prism")
    ).eval()
    out = tmp_path_factory.mktemp("weights")
    export_safetensors(model, out, {"scale": "tiny", "schedule": "prism", "seed": 1})
    return out


def eval_argv(weights: Path, out: Path) -> list[str]:
    return ["--checkpoint", str(weights), "--tasks", TASKS, "--data-dir", str(FIXTURES)] + [
        "--out",
        str(out),
        "--no-progress",
    ]


def scored_units(monkeypatch) -> list[list[str]]:
    """The units the in-process evaluation scores from now on, in order."""
    import prism.eval.job as job

    calls, real = [], job.evaluate

    def counting(model, unit, **kwargs):
        calls.append(list(unit))
        return real(model, unit, **kwargs)

    monkeypatch.setattr(job, "evaluate", counting)
    return calls


@pytest.mark.slow
def test_a_killed_evaluation_resumes_from_its_partial_file(weights, tmp_path, monkeypatch):
    straight = tmp_path / "straight.json"
    assert load_script("evaluate").main(eval_argv(weights, straight)) == 0
    expected = json.loads(straight.read_text())

    out = tmp_path / "seed1.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", KILLED_AT_THE_SECOND_TASK, *eval_argv(weights, out)]
    killed = subprocess.run(argv, env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    partial = ZERO_SHOT.partial(out)
    assert partial == Path(f"{out}.partial.json") and not out.exists()
    assert list(json.loads(partial.read_text())["tasks"]) == ["piqa"]  # the first task, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    calls = scored_units(monkeypatch)
    assert load_script("evaluate").main(eval_argv(weights, out)) == 0
    assert calls == [["winogrande"], ["arc_easy"]]  # piqa was not scored again
    assert not partial.exists()
    # the same process count and thread count compute the same sums: equal, not close
    assert json.loads(out.read_text()) == expected


def test_a_damaged_partial_file_is_one_warning_and_computed_again(weights, tmp_path, monkeypatch, capsys):
    out = tmp_path / "seed1.json"
    ZERO_SHOT.partial(out).write_text('{"key": {"checkpoint": ')  # cut short
    calls = scored_units(monkeypatch)
    assert load_script("evaluate").main(eval_argv(weights, out)) == 0
    assert calls == [["piqa"], ["winogrande"], ["arc_easy"]]
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        f"warning: {out}.partial.json cannot be read back (JSONDecodeError: Expecting value: line 1 "
        f"column 24 (char 23)); what it held is not reused but computed again."
    ]
    assert set(json.loads(out.read_text())["tasks"]) == {"piqa", "winogrande", "arc_easy"}
    assert not ZERO_SHOT.partial(out).exists()


@pytest.mark.parametrize(
    "kind", [ZERO_SHOT, LONG_CONTEXT, ATTENTION], ids=["eval", "long_context", "analysis"]
)
@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        ("[1, 2]", "not a JSON object whose '{units}' is a {holder}"),
        ('{"{units}": 3}', "not a JSON object whose '{units}' is a {holder}"),
    ],
    ids=["empty", "a list", "wrong entry"],
)
def test_each_kind_sets_a_damaged_file_aside_in_one_sentence(kind, text, problem, tmp_path, capsys):
    out = tmp_path / "result.json"
    holder = "list" if kind.holder is list else "object"
    kind.partial(out).write_text(text.replace("{units}", kind.units))
    assert kind.earlier(out) == []
    problem = problem.format(units=kind.units, holder=holder)
    assert capsys.readouterr().err == (
        f"warning: {kind.partial(out)} cannot be read back ({problem}); what it held is not reused but "
        f"computed again.\n"
    )
    assert kind.earlier(out, warn=False) == [] and capsys.readouterr().err == ""  # other ranks: silent


def test_the_result_then_the_partial_file_are_read_back(tmp_path):
    out = tmp_path / "analysis.json"
    second = {"sequences_sha256": "b", "checkpoints": [{"path": "second"}]}
    ATTENTION.keep(out, second)
    assert ATTENTION.partial(out).name == "analysis.json.partial"  # docs/outputs.md
    assert LONG_CONTEXT.partial(out).name == ZERO_SHOT.partial(out).name == "analysis.json.partial.json"
    assert ATTENTION.earlier(out, result_too=True) == [second]
    first = {"sequences_sha256": "a", "checkpoints": [{"path": "first"}]}
    out.write_text(json.dumps(first))
    assert ATTENTION.earlier(out, result_too=True) == [first, second]
    assert ATTENTION.earlier(out) == [second]


def test_the_final_file_is_written_whole_or_not_at_all(tmp_path):
    """A final write that fails (here: a value JSON cannot hold, found half-way through the
    document) leaves the earlier result's bytes, the kept units and no temporary."""
    out = tmp_path / "seed0.json"
    out.write_text('{"earlier": true}\n')
    LONG_CONTEXT.keep(out, {"results": [{"length": 256}]})
    kept = LONG_CONTEXT.partial(out).read_bytes()
    unit = {
        "length": 256,
        "rope_scaling": "none",
        "loss": 3.0,
        "bucket_loss": [3.0],
        "bucket_edges": [0, 256],
    }
    unit |= {"D": [1.0], "documents": {"sha256": "a", "count": 1, "where": "x"}}
    whole = {"results": [unit], "complete": True, "seq_len": 128}
    with pytest.raises(PydanticSerializationError):
        LONG_CONTEXT.finish(out, LongContext(**whole, zz=object()))
    assert out.read_text() == '{"earlier": true}\n' and LONG_CONTEXT.partial(out).read_bytes() == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed0.json", "seed0.json.partial.json"]
    LONG_CONTEXT.finish(out, LongContext(**whole))
    assert json.loads(out.read_text())["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed0.json"]
