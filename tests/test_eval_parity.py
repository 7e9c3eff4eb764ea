"""Parity with lm-evaluation-harness itself: the harness (its own task YAMLs, request building and
metrics, our `prism` model adapter) and prism.eval on the same checkpoint and the same real data
give the same requests, the same per-example log-likelihoods and the same acc / acc_norm.

Needs the shared data (PRISM_SHARED_DATA) and lm_eval (the `harness` extra)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

from prism.core.model import PrismDecoder
from prism.data.tokenizer import GPT2Tokenizer
from prism.eval import evaluate
from prism.eval.data import load_docs
from prism.eval.requests import encode_pairs
from prism.eval.tasks import TASKS
from prism.runs.checkpoint import export_safetensors

SHARED = os.environ.get("PRISM_SHARED_DATA")
DATA = Path(SHARED) / "eval" if SHARED else None
pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        DATA is None or not DATA.is_dir(), reason="PRISM_SHARED_DATA is not set or holds no eval/ folder"
    ),
]
lm_eval = pytest.importorskip("lm_eval", reason="lm_eval (the `harness` extra) is not installed")

CHOICE_TASKS = ["hellaswag", "piqa", "arc_easy", "winogrande", "blimp"]
LIMIT = 3  # documents per task and per BLiMP paradigm
WIKITEXT_LIMIT = 1  # one page: 1,299 tokens = 10 full 128-token windows and a short last one


def tiny_model() -> PrismDecoder:
    return conftest.tiny_model(heads=(2, 4), seq_len=128, vocab_size=50257, seed=0).eval()


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from lm_eval.tasks import TaskManager

    from prism.eval.harness import PrismHarnessLM, write_local_task_configs

    model = tiny_model()
    configs = write_local_task_configs(DATA, tmp_path_factory.mktemp("harness-tasks"))
    manager = TaskManager(include_path=str(configs), include_defaults=False)
    adapter = PrismHarnessLM(model=model, batch_size=16, device="cpu")
    ours, theirs = {"tasks": {}, "samples": {}}, {"results": {}, "samples": {}}
    for tasks, limit in ((CHOICE_TASKS, LIMIT), (["wikitext"], WIKITEXT_LIMIT)):
        mine = evaluate(model, tasks, data_dir=DATA, limit=limit, batch_size=16, return_samples=True)
        ref = lm_eval.simple_evaluate(
            model=adapter, tasks=tasks, limit=limit, task_manager=manager, log_samples=True
        )
        for key in ("tasks", "samples"):
            ours[key].update(mine[key])
        for key in ("results", "samples"):
            theirs[key].update(ref[key])
    return ours, theirs


def harness_samples(theirs, task):
    return sorted(theirs["samples"][task], key=lambda s: s["doc_id"])


@pytest.mark.parametrize(
    "task", ["hellaswag", "piqa", "arc_easy", "winogrande", "blimp_adjunct_island", "blimp_wh_island"]
)
@pytest.mark.slow
def test_requests_loglikelihoods_and_accuracy_match(both, task):
    ours, theirs = both
    docs = load_docs(TASKS[task], DATA, LIMIT)
    samples = harness_samples(theirs, task)
    assert len(samples) == len(docs) == len(ours["samples"][task]) == LIMIT
    tok = GPT2Tokenizer()
    for doc, mine, ref in zip(docs, ours["samples"][task], samples):
        assert [tuple(a) for a in ref["arguments"]] == list(zip(doc.contexts, doc.continuations))
        ref_lls = [r[0][0] for r in ref["resps"]]
        ref_greedy = [bool(r[0][1]) for r in ref["resps"]]
        # Two float32 paths (full-row log_softmax in the harness's batches, gather - logsumexp in
        # ours): the gap grows ~1e-6 per continuation token (conftest.loglik_tolerance).
        pairs = list(zip(doc.contexts, doc.continuations))
        tols = [conftest.loglik_tolerance(len(r.continuation)) for r in encode_pairs(tok, pairs)]
        for choice, (a, b, tol) in enumerate(zip(mine["lls"], ref_lls, tols)):
            assert a == pytest.approx(b, rel=0, abs=tol), (choice, a, b, tol)
        assert mine["is_greedy"] == ref_greedy
        # acc / acc_norm are argmaxes over the choices, exactly equal while no two choices are
        # within the tolerance of each other (here the closest top two are ~28x apart).
        assert mine["acc"] == ref["acc"]
        if "acc_norm" in ref:
            assert mine["acc_norm"] == ref["acc_norm"]


@pytest.mark.slow
def test_aggregates_match(both):
    ours, theirs = both
    for task in ["hellaswag", "piqa", "arc_easy", "winogrande", "blimp"]:
        mine, ref = ours["tasks"][task], theirs["results"][task]
        for metric in TASKS["blimp_wh_island" if task == "blimp" else task].metrics:
            assert mine[metric] == pytest.approx(ref[f"{metric},none"], abs=1e-12), (task, metric)
            assert mine[f"{metric}_stderr"] == pytest.approx(ref[f"{metric}_stderr,none"], abs=1e-12)
    assert ours["tasks"]["blimp"]["n"] == 67 * LIMIT


@pytest.mark.slow
def test_wikitext_rolling_loglikelihood_matches(both):
    ours, theirs = both
    refs = [s["resps"][0][0] for s in harness_samples(theirs, "wikitext")]
    samples = ours["samples"]["wikitext"]
    docs = load_docs(TASKS["wikitext"], DATA, WIKITEXT_LIMIT)
    tok = GPT2Tokenizer()
    # Every token of a page is scored once (rolling windows): the bound on a page's sum grows
    # with its token count, and the corpus metrics inherit it through -sum(ll) / count.
    tols = [conftest.loglik_tolerance(len(tok.encode(d.text))) for d in docs]
    assert len(samples) == len(refs) == len(tols) == WIKITEXT_LIMIT
    for s, ref, tol in zip(samples, refs, tols):
        assert s["ll"] == pytest.approx(ref, rel=0, abs=tol)
    total = sum(tols)
    words, nbytes = sum(s["words"] for s in samples), sum(s["bytes"] for s in samples)
    # exp(-ll / n) moves by a factor exp(dll / n) ~ 1 + dll / n
    bounds = {
        "word_perplexity": {"rel": total / words},
        "byte_perplexity": {"rel": total / nbytes},
        "bits_per_byte": {"abs": total / nbytes / math.log(2)},
    }
    for metric, bound in bounds.items():
        assert ours["tasks"]["wikitext"][metric] == pytest.approx(
            theirs["results"]["wikitext"][f"{metric},none"], **{"rel": 0, **bound}
        ), metric


@pytest.mark.slow
def test_harness_command_line_with_the_prism_model(tmp_path):
    """`python -m prism.eval.harness --model prism ... --local-data DIR` runs lm_eval's own CLI."""
    ckpt = tmp_path / "ckpt"
    model = tiny_model()
    export_safetensors(model, ckpt, {"scale": "tiny", "schedule": "uniform", "seed": 0})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prism.eval.harness",
            "--model",
            "prism",
            "--model_args",
            f"checkpoint={ckpt}",
            "--tasks",
            "arc_easy",
            "--limit",
            "4",
            "--batch_size",
            "4",
            "--local-data",
            str(DATA),
            "--output_path",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:  # ours, here, while the harness runs in its own process
        mine = evaluate(model, "arc_easy", data_dir=DATA, limit=4)["tasks"]["arc_easy"]
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    (result_file,) = list((tmp_path / "out").rglob("results*.json"))
    ref = json.loads(result_file.read_text())["results"]["arc_easy"]
    assert mine["acc"] == ref["acc,none"] and mine["acc_norm"] == ref["acc_norm,none"]


def test_full_sets_load_with_their_published_sizes():
    """Every row of the real sets becomes a document (no row is rejected by the checks)."""
    sizes = {"hellaswag": 10042, "piqa": 1838, "arc_easy": 2376, "winogrande": 1267, "wikitext": 62}
    for task, n in sizes.items():
        assert len(load_docs(TASKS[task], DATA)) == n, task
    arc = load_docs(TASKS["arc_easy"], DATA)
    assert {len(d.choices) for d in arc} == {3, 4, 5}
    blimp = [t for t in TASKS if t.startswith("blimp_")]
    assert len(blimp) == 67 and sum(len(load_docs(TASKS[t], DATA)) for t in blimp) == 67000


def test_the_harness_adapter_refuses_a_window_past_the_training_length():
    """The decoder reads inputs past seq_len (RoPE extrapolation, for the long-context stage);
    zero-shot scores are defined at the trained context, so the adapter refuses a longer one."""
    from prism.eval.harness import PrismHarnessLM

    model = tiny_model()
    with pytest.raises(ValueError, match=rf"max_length={model.cfg.seq_len + 1} is invalid: use 1 to"):
        PrismHarnessLM(model=model, max_length=model.cfg.seq_len + 1, device="cpu")
    assert (
        PrismHarnessLM(model=model, max_length=model.cfg.seq_len, device="cpu").max_length
        == model.cfg.seq_len
    )
