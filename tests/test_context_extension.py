"""Context extension (prism.train.extension, docs/training.md#context-extension): a cpu-s run at
128 tokens, then an extension of it to 256 that starts from its final weights, in its own folder,
with its own identity that records the source; killed mid-run and resumed, it ends where an
uninterrupted extension does. Each refusal is one sentence, exit 2, with nothing written."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from conftest import file_stamps, load_script, tiny_model
from test_train import CrashAt, Recorder

from prism.config.schema import load_config
from prism.runs.checkpoint import load_model
from prism.runs.identity import config_hash, saved_identity, stable_hash
from prism.train import extension
from prism.train.trainer import train

main = load_script("train").main  # reproduce/train.py's

# cpu-s (4 x 64, 1,024 tokens a step) for 4 steps at 128 tokens
SOURCE = ["schedule=prism", "train.tokens=4096", "train.milestones=[]"]
# the extension: 4 steps of 4 x 256 tokens, its own LR, validations and checkpoints every 2 steps
EXTEND = [
    "schedule=prism",
    "model.seq_len=256",
    "model.rope_scaling=linear",
    "model.rope_factor=2.0",
    "train.tokens=4096",
    "train.lr=1e-3",
    "train.warmup_frac=0.0",
    "train.val_every_steps=2",
    "train.ckpt_every_steps=2",
    "train.milestones=[]",
]


def cfg_of(runs, *overrides):
    return load_config("cpu-s", [*overrides, f"runs_dir={runs}"])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    runs = tmp_path_factory.mktemp("source")
    return train(cfg_of(runs, *SOURCE))


@pytest.fixture(scope="module")
def extended(source, tmp_path_factory):
    """The uninterrupted extension (with activation checkpointing: an execution key, so the same
    run as the one below without it) and what it saw."""
    runs, rec = tmp_path_factory.mktemp("extended"), Recorder()
    cfg = cfg_of(runs, *EXTEND, f"train.init_from.run={source}", "train.activation_checkpointing=true")
    with pytest.MonkeyPatch.context() as patch:  # count the reads of the source run (the real one runs)
        reads, weight_reads = [], []
        real, real_load = extension.read_source, extension.load_model
        patch.setattr(extension, "read_source", lambda folder: reads.append(folder) or real(folder))
        patch.setattr(extension, "load_model", lambda path: weight_reads.append(path) or real_load(path))
        out = train(cfg, extra_callbacks=[rec])
    rec.source_reads, rec.weight_reads = reads, weight_reads
    return out, rec


@pytest.mark.slow
def test_an_extension_reads_its_source_run_once(source, extended):
    assert extended[1].source_reads == [str(source)]
    # its weights too: the plan checks them from the file's header, the start reads them
    assert extended[1].weight_reads == [source / "model.safetensors"]


@pytest.mark.slow
def test_an_extension_starts_from_the_source_and_records_it(source, extended):
    out, rec = extended
    assert out.parent.name == "prism-ctx256" and out.name == "seed0"  # beside the source's prism/
    src_summary = json.loads((source / "train_summary.json").read_text())
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 4 and summary["tokens_seen"] == 4096
    assert summary["init_from"] == {
        "run": str(source),
        "config_hash": src_summary["config_hash"],
        "scale": "cpu-s",
        "schedule": "prism",
        "seed": 0,
        "steps": 4,
        "tokens_seen": 4096,
        "seq_len": 128,
    }
    # the identity holds the source's hash (not its folder), and config.yaml holds it too
    ident = saved_identity(out)
    assert ident["train"]["init_from"] == {"config_hash": src_summary["config_hash"]}
    assert stable_hash(ident) == summary["config_hash"] != src_summary["config_hash"]
    # the first step starts from the source's final weights
    src_model, _ = load_model(source)
    for key, value in src_model.state_dict().items():
        assert torch.equal(rec.init[key], value), key
    # the export is a 256-token model with the RoPE choice; its metadata names the source
    model, meta = load_model(out)
    assert (model.cfg.seq_len, model.cfg.rope_scaling, model.cfg.rope_factor) == (256, "linear", 2.0)
    assert meta["init_from"]["config_hash"] == src_summary["config_hash"]
    assert [p["step"] for p in summary["val_curve"]] == [0, 2, 4]
    # the source's weights read 256 tokens from the start: at step 0 far below a fresh model's
    assert summary["val_curve"][0]["val_loss"] < src_summary["val_curve"][0]["val_loss"] - 0.2


@pytest.mark.slow
def test_the_export_of_an_extension_gives_the_context_it_was_trained_at(extended, tmp_path):
    """A linear x2 extension trained at 256 tokens: 256 is max_position_embeddings and the card's
    context; the 512 positions its scaling reads are a separate setting, named as never trained
    (max_position_embeddings was 512 and the card gave both)."""
    pytest.importorskip("transformers")
    from prism.export import export_hf

    out = export_hf(extended[0], tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 256 and config["scaled_max_position_embeddings"] == 512
    assert config["rope_parameters"]["rope_type"] == "linear" and config["rope_parameters"]["factor"] == 2.0
    card = " ".join((out / "README.md").read_text().split())
    assert "The context is 256 tokens, the length the weights were trained at." in card
    assert (
        "reads up to 512 positions (config.json's scaled_max_position_embeddings); positions past 256" in card
    )
    # as a token count of its own (the card also gives a throughput in tokens/s, e.g. "1512 tokens/s")
    assert not re.search(r"(?<![\d,.])512 tokens\b(?!/)", card)


@pytest.mark.slow
def test_a_killed_extension_resumes_to_the_uninterrupted_loss(source, extended, tmp_path):
    out, rec = extended
    cfg = cfg_of(tmp_path, *EXTEND, f"train.init_from.run={source}")
    assert config_hash(cfg) == json.loads((out / "train_summary.json").read_text())["config_hash"]
    first = Recorder()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, extra_callbacks=[first, CrashAt(3)])  # 1 step after the step-2 checkpoint
    second = Recorder()
    resumed_out = train(cfg, resume=True, extra_callbacks=[second])
    assert resumed_out == tmp_path / "cpu-s" / "prism-ctx256" / "seed0"
    resumed = json.loads((resumed_out / "train_summary.json").read_text())
    reference = json.loads((out / "train_summary.json").read_text())
    # as test_train's resume: the same micro-batches in the same order, the same curve
    assert [b for b in first.batches if b[0] < 2] + second.batches == rec.batches
    assert [p["step"] for p in resumed["val_curve"]] == [0, 2, 4]
    assert abs(resumed["final_val_loss"] - reference["final_val_loss"]) < 1e-4
    assert [p["val_loss"] for p in resumed["val_curve"]] == pytest.approx(
        [p["val_loss"] for p in reference["val_curve"]], abs=1e-4
    )
    assert resumed["config_hash"] == reference["config_hash"]


@pytest.fixture(scope="module")
def unfinished(source, tmp_path_factory):
    """The source's folder as a run killed before its summary was written (the finished marker)."""
    run = tmp_path_factory.mktemp("unfinished") / "seed0"
    shutil.copytree(source, run)
    (run / "train_summary.json").unlink()
    return run


@pytest.fixture(scope="module")
def corrupt(source, tmp_path_factory):
    """The source's folder with its final weights cut short, as a full disk or a killed copy leaves them."""
    run = tmp_path_factory.mktemp("corrupt") / "seed0"
    shutil.copytree(source, run)
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return run


@pytest.mark.parametrize(
    "case,message",
    [
        ("unfinished", "is not a finished run (its training has not finished: it holds no train_summary"),
        # read at the start, not after config.yaml and trackers.json were written into the new folder
        ("corrupt", "has final weights that cannot be read: "),
        ("missing", "is not a finished run (the folder does not exist)"),
        ("schedule=uniform", "heads [1, 1, 2, 2] (schedule prism), not this run's [2, 2, 2, 2]"),
        ("model.d_model=128", "has model.d_model=64, this run 128; an extension keeps the source's shape"),
        ("model.seq_len=128", "model.seq_len=128 is not longer than the 128 tokens"),
        ("train.init_from.config_hash=0123456789abcdef", "is not the hash of"),
        ("model.rope_scaling=yarn", "treats 256 tokens as the pretrained length, but"),
    ],
)
@pytest.mark.slow
def test_a_bad_extension_is_refused_in_one_sentence_with_nothing_written(
    source, unfinished, corrupt, tmp_path, capsys, case, message
):
    run = {"unfinished": unfinished, "corrupt": corrupt, "missing": tmp_path / "no-such-run"}.get(
        case, source
    )
    extra = [] if case in ("unfinished", "corrupt", "missing") else [case]
    given = [o for o in EXTEND if o.split("=")[0] not in {e.split("=")[0] for e in extra}]
    before = file_stamps(source.parents[2], with_folders=True)
    args = ["--scale", "cpu-s", *given, f"train.init_from.run={run}", *extra, f"runs_dir={tmp_path}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert file_stamps(source.parents[2], with_folders=True) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # not even the run's folder or lock


def test_activation_checkpointing_is_the_same_math(one_thread):
    model = tiny_model()
    x = torch.randint(0, 512, (2, 64))
    grads = []
    for recompute in (False, True):
        model.zero_grad()
        model.checkpoint_blocks = recompute
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))
