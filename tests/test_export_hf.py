"""Sharing checkpoints the way the ecosystem does (reproduce/export_hf.py, prism.export): a tiny
uniform and a tiny Prism run, trained here with the kit, exported as transformers folders that
give the kit's logits, its greedy generations (with and without the KV cache), its tokens and,
through lm_eval's `hf` backend, reproduce/evaluate.py's numbers; a model card written from the
run's own files; and one-sentence refusals that leave nothing behind."""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import conftest
import pytest
import torch
from conftest import load_script
from safetensors import safe_open

from prism.config.schema import load_config
from prism.core.model import VOCAB_SIZE
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.export import ExportError, export_hf
from prism.export.hf import staging
from prism.runs.checkpoint import export_safetensors, load_model
from prism.train.trainer import train

transformers = pytest.importorskip("transformers", reason="transformers (the `hf` extra) is not installed")
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reproduce" / "export_hf.py"
SHARED = os.environ.get("PRISM_SHARED_DATA")
DATA = Path(SHARED) / "eval" if SHARED else None
needs_data = pytest.mark.skipif(
    DATA is None or not DATA.is_dir(), reason="PRISM_SHARED_DATA is not set or holds no eval/ folder"
)
# 12 optimizer steps of 2 x 128 tokens: 128-token windows, so that the harness's multiple-choice
# continuations fit the context; validation at steps 0, 6 and 12.
SMALL = [
    "model.seq_len=128",
    "train.global_batch_tokens=256",
    "train.micro_batch=2",
    "train.tokens=3072",
    "train.lr=3e-3",
    "train.val_every_steps=6",
    "train.ckpt_every_steps=6",
    "train.log_every_steps=6",
    "data.val_tokens=512",
    "train.milestones=[10.0,9.0]",
]
EVAL_TASKS = ["piqa", "arc_easy", "hellaswag", "wikitext"]
EVAL_LIMIT = 3
# The remote code may import only these (and its sibling file): users load it without the kit.
REMOTE_IMPORTS = {"__future__", "math", "torch", "transformers"}
pytestmark = pytest.mark.usefixtures("one_thread")


def run_script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def leftovers(out: Path) -> list[Path]:
    """Hidden staging folders an export may have left beside `out`."""
    return sorted(out.parent.glob(f".{out.name}.*"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs/tiny/{uniform,prism}/seed0 trained by the kit in a project folder with the default
    relative runs_dir and results_dir, as `python reproduce/train.py` run there leaves them."""
    root, cwd = tmp_path_factory.mktemp("project"), os.getcwd()
    os.chdir(root)
    try:
        out = {s: root / train(load_config("tiny", [*SMALL, f"schedule={s}"])) for s in ("uniform", "prism")}
    finally:
        os.chdir(cwd)
    return root, out


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """The Prism run through the real script, the uniform run through the library."""
    _, run_dirs = runs
    base = tmp_path_factory.mktemp("hf")
    proc = run_script("--checkpoint", str(run_dirs["prism"]), "--out", str(base / "hf-prism"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(f"wrote {base / 'hf-prism'}")
    export_hf(run_dirs["uniform"], base / "hf-uniform")
    return {"prism": base / "hf-prism", "uniform": base / "hf-uniform"}


def load_both(runs, exported, schedule):
    kit, _ = load_model(runs[1][schedule])
    hf = AutoModelForCausalLM.from_pretrained(
        str(exported[schedule]), trust_remote_code=True, dtype=torch.float32
    ).eval()
    return kit.eval(), hf


# ----- the folder ----------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["uniform", "prism"])
@pytest.mark.slow
def test_folder_holds_config_weights_code_and_tokenizer(runs, exported, schedule):
    out, summary = exported[schedule], json.loads((runs[1][schedule] / "train_summary.json").read_text())
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "configuration_prism.py",
        "modeling_prism.py",
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "README.md",
    }
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "prism" and config["architectures"] == ["PrismForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_prism.PrismConfig",
        "AutoModelForCausalLM": "modeling_prism.PrismForCausalLM",
    }
    assert (
        config["heads"]
        == summary["heads"]
        == ([4] * 8 if schedule == "uniform" else [1, 1, 2, 2, 4, 4, 4, 4])
    )
    assert (config["vocab_size"], config["padded_vocab_size"]) == (50257, 50304)
    assert config["bos_token_id"] == config["eos_token_id"] == EOT_TOKEN
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # a tied head is stored once
        assert f.metadata() == {"format": "pt"} and "lm_head.weight" not in set(f.keys())
    assert not leftovers(out)


@pytest.mark.slow
def test_remote_code_imports_only_torch_and_transformers(exported):
    for name in ("configuration_prism.py", "modeling_prism.py"):
        text = (exported["prism"] / name).read_text()
        assert text == (resources.files("prism.export.remote") / name).read_text()
        tree = ast.parse(text)
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level
        }
        assert roots <= REMOTE_IMPORTS, (name, roots)


# ----- numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["uniform", "prism"])
@pytest.mark.slow
def test_logits_equal_the_kit(runs, exported, schedule):
    """Same weights, same float32 math, same batch shapes: within 1e-5 (in practice equal)."""
    kit, hf = load_both(runs, exported, schedule)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for shape in ((3, 128), (1, 17)):
            x = torch.randint(0, VOCAB_SIZE, shape, generator=g)
            want, got = kit(x), hf(x, use_cache=False).logits
            assert got.shape == want.shape == (*shape, VOCAB_SIZE)  # no padding ids to pick
            assert (got - want).abs().max().item() <= 1e-5
        # transformers' labels convention (shifted inside) gives the kit's training loss
        loss = hf(x, labels=x).loss.item()
        assert loss == pytest.approx(kit(x[:, :-1], x[:, 1:]).item(), abs=1e-5)


@pytest.mark.parametrize("schedule", ["uniform", "prism"])
@pytest.mark.slow
def test_kv_cache_continues_exactly(runs, exported, schedule):
    """Prefill, then one token, then chunks, through a DynamicCache: the logits of the whole
    sequence in one pass, up to float32 reordering (|logits| <= ~10, 64 roundings)."""
    _, hf = load_both(runs, exported, schedule)
    x = torch.randint(0, VOCAB_SIZE, (2, 60), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full, cache = hf(x, use_cache=False), DynamicCache()
        assert full.past_key_values is None and hf(x, use_cache=True).past_key_values.get_seq_length() == 60
        full = full.logits
        parts = [
            hf(x[:, a:b], past_key_values=cache, use_cache=True).logits
            for a, b in ((0, 20), (20, 21), (21, 25), (25, 60))
        ]
        assert cache.get_seq_length() == 60
    tol = 64 * conftest.FLOAT32_EPS * max(1.0, full.abs().max().item())
    assert (torch.cat(parts, 1) - full).abs().max().item() <= tol


def kit_greedy(kit, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with the kit's own forward pass over the whole sequence, stopping after
    EOT as transformers' generate does with eos_token_id = EOT."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            nxt = int(kit(torch.tensor([seq]))[0, -1].argmax())
            seq.append(nxt)
            if nxt == EOT_TOKEN:
                break
    return seq


@pytest.mark.parametrize("schedule", ["uniform", "prism"])
@pytest.mark.slow
def test_greedy_generate_matches_the_kit(runs, exported, schedule):
    kit, hf = load_both(runs, exported, schedule)
    tok = AutoTokenizer.from_pretrained(str(exported[schedule]), trust_remote_code=True)
    for text in ("The return value of the function is", "class Point:\n    def"):
        ids = tok(text, return_tensors="pt")
        on = hf.generate(**ids, max_new_tokens=24, do_sample=False, use_cache=True)
        off = hf.generate(**ids, max_new_tokens=24, do_sample=False, use_cache=False)
        assert on.tolist() == off.tolist() == [kit_greedy(kit, ids["input_ids"][0].tolist(), 24)]


def test_weights_file_with_every_option_gives_the_kits_logits(tmp_path):
    """A .safetensors folder outside any run, with the options the tiny runs do not use
    (RMSNorm, biases, an MLP width, another RoPE base, an untied head); norm gains and biases
    are moved off their init values so that a dropped or misplaced one shows."""
    kit = conftest.tiny_model(
        heads=(1, 2, 4, 4),
        d_model=64,
        h_base=4,
        seq_len=64,
        vocab_size=VOCAB_SIZE,
        norm="rmsnorm",
        bias=True,
        mlp_hidden=128,
        rope_base=500.0,
        tie_embeddings=False,
    ).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in kit.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    export_safetensors(kit, tmp_path / "weights", {"scale": "tiny", "schedule": "prism", "seed": 3})
    out = export_hf(tmp_path / "weights", tmp_path / "hf-options")
    card = (out / "README.md").read_text()
    assert "not the final weights of a finished run" in card and "seed 3" in card
    assert "| output head | separate matrix |" in card
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    assert (
        hf.config.norm_type,
        hf.config.use_bias,
        hf.config.intermediate_size,
        hf.config.rope_base,
        hf.config.tie_word_embeddings,
    ) == ("rmsnorm", True, 128, 500.0, False)
    x = torch.randint(0, VOCAB_SIZE, (2, 64), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert (hf(x, use_cache=False).logits - kit(x)).abs().max().item() <= 1e-5


def test_generate_with_cache_and_padding_decodes_as_the_kit(tmp_path):
    """Random untied weights, so that greedy paths move (the trained tiny models' repeat one
    token, a random tied model copies its input): generate with and without the cache, alone
    or left-padded in a batch, equals the kit's greedy decoding."""
    kit = conftest.tiny_model(
        heads=(1, 2, 4, 4), d_model=64, h_base=4, seq_len=64, vocab_size=VOCAB_SIZE, tie_embeddings=False
    ).eval()
    export_safetensors(kit, tmp_path / "weights")
    out = export_hf(tmp_path / "weights" / "model.safetensors", tmp_path / "hf-random")
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    prompts = [[464, 2163, 5860, 262, 1988], [40, 716]]
    want = [kit_greedy(kit, p, 20) for p in prompts]
    assert min(len(set(w[len(p) :])) for p, w in zip(prompts, want)) > 10  # paths that move
    for p, w in zip(prompts, want):
        for use_cache in (True, False):
            got = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, use_cache=use_cache)
            assert got.tolist() == [w]
    batch, mask = torch.full((2, 5), EOT_TOKEN), torch.zeros(2, 5, dtype=torch.long)
    for row, p in enumerate(prompts):  # left padding, as batched generation uses
        batch[row, 5 - len(p) :], mask[row, 5 - len(p) :] = torch.tensor(p), 1
    got = hf.generate(batch, attention_mask=mask, max_new_tokens=20, do_sample=False)
    for row, (p, w) in enumerate(zip(prompts, want)):
        assert got[row, 5 - len(p) :].tolist()[: len(w)] == w


@pytest.mark.slow
def test_tokenizer_encodes_as_the_kit(exported):
    # Without trust_remote_code: transformers 5 would ask about config.json's code; pytest's
    # stdin cannot answer, so it falls back to tokenizer_config.json, as a "no" does.
    tok = AutoTokenizer.from_pretrained(str(exported["prism"]))
    kit = GPT2Tokenizer()
    assert len(tok) == VOCAB_SIZE and tok.eos_token_id == tok.bos_token_id == EOT_TOKEN
    texts = [
        "Hello world",
        " leading space",
        "tabs\tand\n\nnewlines  ",
        "café 東京 🙂 1,234.5%",
        (ROOT / "README.md").read_text()[:3000],
    ]
    if DATA is not None and DATA.is_dir():
        with (DATA / "wikitext" / "test.jsonl").open() as f:
            texts.append(json.loads(f.readline())["page"])
    for text in texts:
        ids = kit.encode(text)
        assert tok(text)["input_ids"] == ids
        assert tok.decode(ids) == kit.decode(ids)


@pytest.mark.slow
def test_batched_tokenization_pads_with_eot_and_the_model_scores_as_unbatched(runs, exported):
    # GPT-2 has no pad token of its own; the export sets pad = EOT, so padding works as loaded
    tok = AutoTokenizer.from_pretrained(str(exported["prism"]))
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == EOT_TOKEN
    texts = ["A short one.", "A longer sentence, which needs more tokens than the first."]
    batch = tok(texts, padding=True, return_tensors="pt")
    alone = [tok(t)["input_ids"] for t in texts]
    width = batch["input_ids"].shape[1]
    assert len(alone[0]) < len(alone[1]) == width
    for row, ids in enumerate(alone):  # right padding with EOT, masked out
        assert batch["input_ids"][row].tolist() == ids + [EOT_TOKEN] * (width - len(ids))
        assert batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (width - len(ids))
    _, hf = load_both(runs, exported, "prism")
    with torch.inference_mode():
        padded = hf(**batch).logits
        for row, ids in enumerate(alone):
            one = hf(torch.tensor([ids])).logits[0]
            assert (padded[row, : len(ids)] - one).abs().max().item() <= 1e-5


# ----- the model card ------------------------------------------------------------------------
@pytest.mark.slow
def test_card_is_written_from_the_run(runs, exported):
    _, run_dirs = runs
    s = json.loads((run_dirs["prism"] / "train_summary.json").read_text())
    card = (exported["prism"] / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\nlicense: mit\n")
    assert "# Prism decoder: tiny, schedule `prism`, seed 0" in card
    assert "`1,1,2,2,4,4,4,4` (prism)" in card and "| head width d_h | 128 | 128 | 64 | 64 | 32 |" in card
    assert f"| tokens seen | {s['tokens_seen']:,} |" in card and s["tokens_seen"] == 3072
    assert f"| hardware | {s['throughput']['hardware']} × 1 |" in card
    assert f"| **final validation loss** | **{s['final_val_loss']:.4f}** |" in card
    assert f"`{s['config_hash']}`" in card
    assert "No evaluation of this checkpoint was found" in card
    assert f"- kit: `prism-repro` {metadata.version('prism-repro')}" in card
    assert (
        f"- command: `python {SCRIPT} --checkpoint {run_dirs['prism']} --out {exported['prism']}`"
    ) in card


# ----- lm_eval's hf backend against reproduce/evaluate.py ---------------------------------------
@pytest.fixture(scope="module")
def kit_eval(runs):
    """reproduce/evaluate.py on the Prism run, written where run_all puts it, plus the
    per-request log-likelihoods of the same library calls (one per task, the same batch size)."""
    import importlib.util

    from prism.eval import evaluate

    spec = importlib.util.spec_from_file_location("evaluate_script", ROOT / "reproduce" / "evaluate.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root, run_dirs = runs
    out = root / "results" / "tiny" / "eval" / "prism" / "seed0.json"
    assert (
        script.main(
            [
                "--checkpoint",
                str(run_dirs["prism"]),
                "--tasks",
                ",".join(EVAL_TASKS),
                "--data-dir",
                str(DATA),
                "--limit",
                str(EVAL_LIMIT),
                "--batch-size",
                "8",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    model, _ = load_model(run_dirs["prism"])
    samples = {}
    for task in EVAL_TASKS:
        res = evaluate(model, task, data_dir=DATA, limit=EVAL_LIMIT, batch_size=8, return_samples=True)
        assert res["tasks"][task] == record["tasks"][task]  # the script's own numbers
        samples[task] = res["samples"][task]
    return out, record, samples


def hf_tolerance(n_tokens: int, ll: float, window: int) -> float:
    """conftest.loglik_tolerance for the per-token log-probs, plus the hf backend's float32 sum
    of them (`float(logits.sum())` over at most `window` tokens per request): any order of
    n float32 additions is within (n - 1) * eps * sum|x| of the exact sum, and sum|x| = |ll|."""
    n = min(n_tokens, window)
    return conftest.loglik_tolerance(n_tokens) + max(n - 1, 0) * conftest.FLOAT32_EPS * abs(ll)


@pytest.mark.slow
@needs_data
def test_lm_eval_hf_backend_matches_evaluate_py(runs, exported, kit_eval, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from prism.eval.data import load_docs
    from prism.eval.harness import write_local_task_configs
    from prism.eval.requests import encode_pairs
    from prism.eval.tasks import TASKS

    _, record, samples = kit_eval
    manager = TaskManager(
        include_path=str(write_local_task_configs(DATA, tmp_path / "tasks")), include_defaults=False
    )
    ref = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={exported['prism']},trust_remote_code=True,dtype=float32",
        tasks=EVAL_TASKS,
        limit=EVAL_LIMIT,
        device="cpu",
        batch_size=8,
        task_manager=manager,
        log_samples=True,
    )
    tok, seq_len = GPT2Tokenizer(), 128
    for task in ["piqa", "arc_easy", "hellaswag"]:
        docs = load_docs(TASKS[task], DATA, EVAL_LIMIT)
        theirs = sorted(ref["samples"][task], key=lambda s: s["doc_id"])
        assert len(docs) == len(theirs) == len(samples[task]) == EVAL_LIMIT
        for doc, mine, other in zip(docs, samples[task], theirs):
            reqs = encode_pairs(tok, list(zip(doc.contexts, doc.continuations)))
            tols = [hf_tolerance(len(r.continuation), ll, seq_len) for r, ll in zip(reqs, mine["lls"])]
            for a, (b, _), tol in zip(mine["lls"], [r[0] for r in other["resps"]], tols):
                assert a == pytest.approx(b, rel=0, abs=tol), (task, a, b, tol)
            # acc / acc_norm are argmaxes: equal when no two choices are within the tolerance.
            for norm in (False, True):
                lengths = [len(c) if norm else 1 for c in doc.choices]
                scores = sorted((ll / n for ll, n in zip(mine["lls"], lengths)), reverse=True)
                assert scores[0] - scores[1] > 2 * max(tols), (task, "near tie")
            assert (mine["acc"], mine["acc_norm"]) == (other["acc"], other["acc_norm"])
        for metric in ("acc", "acc_norm"):
            assert record["tasks"][task][metric] == ref["results"][task][f"{metric},none"]
            assert record["tasks"][task][f"{metric}_stderr"] == pytest.approx(
                ref["results"][task][f"{metric}_stderr,none"], abs=1e-12
            )
    pages = load_docs(TASKS["wikitext"], DATA, EVAL_LIMIT)
    theirs = [s["resps"][0][0] for s in sorted(ref["samples"]["wikitext"], key=lambda s: s["doc_id"])]
    total = 0.0
    for page, mine, other in zip(pages, samples["wikitext"], theirs):
        tol = hf_tolerance(len(tok.encode(page.text)), mine["ll"], seq_len)
        assert mine["ll"] == pytest.approx(other, rel=0, abs=tol)
        total += tol
    words, nbytes = sum(p.words for p in pages), sum(p.bytes for p in pages)
    # exp(-ll / n) moves by a factor exp(dll / n) ~ 1 + dll / n
    bounds = {
        "word_perplexity": {"rel": total / words},
        "byte_perplexity": {"rel": total / nbytes},
        "bits_per_byte": {"abs": total / nbytes / math.log(2)},
    }
    for metric, bound in bounds.items():
        assert record["tasks"]["wikitext"][metric] == pytest.approx(
            ref["results"]["wikitext"][f"{metric},none"], **{"rel": 0, **bound}
        ), metric


@pytest.mark.slow
@needs_data
def test_card_shows_the_runs_evaluation(runs, kit_eval, tmp_path):
    """Found without --eval where run_all puts it (results/<scale>/eval/<schedule>/seed<k>.json,
    relative to the folder the run was trained in); an existing folder is replaced only with
    overwrite, and replaced whole."""
    _, run_dirs = runs
    path, record, _ = kit_eval
    out = tmp_path / "hf-prism"
    out.mkdir()
    (out / "stale.txt").write_text("from an older export")
    with pytest.raises(ExportError, match="already exists and is not empty"):
        export_hf(run_dirs["prism"], out)
    export_hf(run_dirs["prism"], out, overwrite=True)
    assert not (out / "stale.txt").exists() and not leftovers(out)
    card = (out / "README.md").read_text()
    assert f"From `{path}`" in card and f"first {EVAL_LIMIT} documents per task: not comparable" in card
    piqa = record["tasks"]["piqa"]
    assert (
        f"| piqa | acc_norm | {piqa['acc_norm']:.4f} | {piqa['acc_norm_stderr']:.4f} | {EVAL_LIMIT} |"
    ) in card
    ppl = record["tasks"]["wikitext"]["word_perplexity"]
    assert f"| wikitext | word_perplexity | {ppl:.4f} | — | {EVAL_LIMIT} |" in card


# ----- bad input -----------------------------------------------------------------------------
def test_a_failed_export_leaves_nothing(tmp_path):
    out = tmp_path / "hf"
    with pytest.raises(RuntimeError, match="disk full"):
        with staging(out, overwrite=False) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("disk full")
    assert not out.exists() and not leftovers(out)
    out.mkdir()
    (out / "README.md").write_text("the previous export")
    with pytest.raises(RuntimeError):
        with staging(out, overwrite=True) as tmp:
            raise RuntimeError("killed")
    assert (out / "README.md").read_text() == "the previous export" and not leftovers(out)


@pytest.mark.parametrize(
    "case", ["missing_run", "unfinished_run", "existing_out", "foreign_eval", "foreign_vocab"]
)
def test_bad_input_is_one_sentence_and_writes_nothing(runs, tmp_path, capfd, case):
    _, run_dirs = runs
    run, out = run_dirs["prism"], tmp_path / "hf"
    extra: list[str] = []
    if case == "missing_run":
        ckpt = tmp_path / "runs" / "tiny" / "prism" / "seed9"
        expected = f"error: checkpoint {ckpt} does not exist; pass a run folder"
    elif case == "unfinished_run":  # what a killed run leaves: its config and a checkpoint
        ckpt = tmp_path / "killed" / "seed0"
        (ckpt / "checkpoints").mkdir(parents=True)
        shutil.copy(run / "config.yaml", ckpt / "config.yaml")
        shutil.copy(run / "checkpoints" / "last.ckpt", ckpt / "checkpoints" / "last.ckpt")
        expected = f'error: run {ckpt} is not finished: it has no train_summary.json with "finished": true'
    elif case == "existing_out":
        ckpt = run
        out.mkdir()
        (out / "README.md").write_text("someone else's model")
        expected = f"error: output folder {out} already exists and is not empty"
    elif case == "foreign_eval":
        ckpt = run
        foreign = tmp_path / "seed0.json"
        foreign.write_text(
            json.dumps(
                {"scale": "tiny", "schedule": "uniform", "seed": 0, "tasks": {"piqa": {"acc": 0.5, "n": 2}}}
            )
        )
        extra = ["--eval", str(foreign)]
        expected = (
            f"error: evaluation file {foreign} is for schedule 'uniform', but the "
            f"checkpoint is schedule 'prism'"
        )
    else:
        ckpt = tmp_path / "small-vocab"
        export_safetensors(conftest.tiny_model(vocab_size=512), ckpt)
        expected = f"error: checkpoint {ckpt / 'model.safetensors'} has a 512-token vocabulary"
    argv = ["--checkpoint", str(ckpt), "--out", str(out), *extra]
    if case == "missing_run":  # a real process, as a user runs it: its exit code and whole stderr
        proc = run_script(*argv)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:  # the script's main() here (the same code after start-up); capfd holds all it writes
        capfd.readouterr()  # only what the script writes
        returncode = load_script("export_hf").main(argv)
        stdout, stderr = capfd.readouterr()
    lines = stderr.strip().splitlines()
    assert returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), stderr
    assert stdout == "" and not leftovers(out)
    if case == "existing_out":  # left exactly as it was
        assert [p.name for p in out.iterdir()] == ["README.md"]
        assert (out / "README.md").read_text() == "someone else's model"
    else:
        assert not out.exists()
