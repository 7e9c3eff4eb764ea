"""The model card (README.md) of an exported checkpoint, written from the run's own files; a
missing fact is said to be missing, never shown as zero."""

from __future__ import annotations

from pathlib import Path

from prism.core.model import ModelConfig
from prism.export.source import Source, checkpoint_identity
from prism.runs.records import EvalResult, Throughput

PAPER = (
    '"Prism Transformer: Progressive Head Schedules for Hierarchical Attention Processing" '
    "(S. Aggarwal, arXiv:2606.27449, 2026)"
)
MAX_CURVE_ROWS = 12  # validation-curve rows shown; a long run's curve is thinned evenly


def _num(x, digits: int = 4) -> str:
    if x is None:
        return "not recorded"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:.{digits}f}"


def _data(source: Source) -> dict:
    """What the run read (train_summary.json's `data`, a key its record keeps as it is), else
    what the weights' metadata says."""
    data = source.meta.get("data") if source.summary is None else getattr(source.summary, "data", None)
    return data if isinstance(data, dict) else {}


def _front_matter(source: Source, who: dict) -> str:
    data = _data(source)
    lines = [
        "---",
        "library_name: transformers",
        "license: mit",
        "pipeline_tag: text-generation",
        "language:",
        "- en",
        "tags:",
        "- prism",
        "- head-schedule",
        "- causal-lm",
        "- custom_code",
    ]
    if who.get("scale"):
        lines.append(f"- scale-{who['scale']}")
    if data.get("source") == "hub" and data.get("name"):
        lines += ["datasets:", f"- {data['name']}"]
    return "\n".join(lines + ["---", ""])


def _context(cfg: ModelConfig) -> str:
    """The card's sentence on context: the length trained at first, a scaled read apart from it."""
    text = f"The context is {cfg.seq_len} tokens, the length the weights were trained at"
    if cfg.scaled_context > cfg.seq_len:
        return text + (
            f". Its {cfg.rope_scaling} RoPE scaling by {cfg.rope_factor:g} reads up to "
            f"{cfg.scaled_context} positions (config.json's scaled_max_position_embeddings); positions "
            f"past {cfg.seq_len} were never seen in training. Longer inputs are refused. "
        )
    return text + (": longer inputs are refused, not extrapolated. ")


def _shape_section(cfg: ModelConfig, n_params: int) -> list[str]:
    heads = list(cfg.heads)
    rope = f"; {cfg.rope_scaling} RoPE scaling by {cfg.rope_factor:g} (config.json's rope_parameters)"
    return [
        "## Model",
        "",
        "| | |",
        "|---|---|",
        f"| layers × width | {cfg.n_layer} × {cfg.d_model} |",
        f"| head schedule (heads per layer) | `{','.join(str(h) for h in heads)}` ({cfg.schedule_name}) |",
        f"| baseline heads (uniform model) | {cfg.h_base} per layer, d_h = {cfg.d_model // cfg.h_base} |",
        f"| MLP | SwiGLU, hidden {cfg.hidden} |",
        f"| norm | {cfg.norm} (eps {cfg.norm_eps:g}), pre-norm, bias {'on' if cfg.bias else 'off'} |",
        f"| positions | RoPE (base {cfg.rope_base:g}, rotating first-half/second-half pairs), "
        f"context {cfg.seq_len} tokens{rope if cfg.rope_scaling != 'none' else ''} |",
        f"| vocabulary | GPT-2 BPE, {cfg.vocab_size:,} tokens (embedding rows padded to "
        f"{cfg.padded_vocab:,}; logits cover the real {cfg.vocab_size:,}) |",
        f"| output head | {'tied to the token embedding' if cfg.tie_embeddings else 'separate matrix'} |",
        f"| parameters | {n_params:,} (a tied embedding counted once) |",
        "",
        "| layer | " + " | ".join(str(i) for i in range(len(heads))) + " |",
        "|---|" + "---:|" * len(heads),
        "| heads | " + " | ".join(str(h) for h in heads) + " |",
        "| head width d_h | " + " | ".join(str(cfg.d_model // h) for h in heads) + " |",
        "",
    ]


def _training_section(source: Source) -> list[str]:
    s, lines = source.summary, ["## Training", ""]
    if s is None:
        return lines + [
            f"These weights are a checkpoint file at step {_num(source.meta.get('step'))}, not the final "
            f"weights of a finished run, so no final validation loss is reported.",
            "",
        ]
    tput = s.throughput or Throughput()
    devices = f" × {tput.num_devices}" if tput.num_devices else ""
    data = _data(source)
    data_text = ", ".join(f"{k} {v}" for k, v in data.items()) if data else "not recorded"
    lines += [
        "| | |",
        "|---|---|",
        f"| optimizer steps | {_num(s.steps)} |",
        f"| tokens seen | {_num(s.tokens_seen)} |",
        f"| training data | {data_text} |",
        f"| hardware | {tput.hardware or 'not recorded'}{devices} |",
        f"| throughput | {_num(tput.tokens_per_s, 0)} tokens/s |",
        f"| wall clock | {_num(s.wall_clock_s, 1)} s |",
        f"| **final validation loss** | **{_num(s.final_val_loss)}** |",
        f"| lowest validation loss | {_num(s.min_val_loss)} at step {_num(s.min_val_step)} |",
        f"| config hash | `{_num(s.config_hash)}` |",
        "",
    ]
    curve = s.val_curve or []
    if curve:
        lines += [
            "Validation loss (held-out documents, identical for every schedule and seed):",
            "",
            "| step | tokens | val loss |",
            "|---:|---:|---:|",
        ]
        # evenly spaced picks: every point of a curve of up to MAX_CURVE_ROWS, a long one thinned
        picks = sorted({round(i * (len(curve) - 1) / (MAX_CURVE_ROWS - 1)) for i in range(MAX_CURVE_ROWS)})
        lines += [
            f"| {_num(p.step)} | {_num(p.tokens)} | {_num(p.val_loss)} |" for p in [curve[i] for i in picks]
        ]
        lines.append("")
    return lines


def _eval_section(result: EvalResult | None, path: Path | None) -> list[str]:
    lines = ["## Zero-shot evaluation", ""]
    if result is None:
        return lines + [
            "No evaluation of this checkpoint was found (run `reproduce/evaluate.py` and "
            "export again with `--eval`).",
            "",
        ]
    limit = result.limit
    semantics = "unknown semantics" if result.semantics is None else result.semantics
    lines += [
        f"From `{path}` ({semantics}, data "
        f"{'not recorded' if result.data_source is None else result.data_source}"
        f"{f', first {limit} documents per task: not comparable with full-set numbers' if limit else ''}).",
        "",
        "| task | metric | value | ± stderr | documents |",
        "|---|---|---:|---:|---:|",
    ]
    for task, score in result.tasks.items():
        metrics = score.as_json()  # every metric the file holds, each with its `<name>_stderr`
        for name, value in sorted(metrics.items()):
            if name in ("n", "paradigms") or name.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            err = metrics.get(f"{name}_stderr")
            lines.append(
                f"| {task} | {name} | {value:.4f} | {'—' if err is None else f'{err:.4f}'} | "
                f"{_num(score.n)} |"
            )
    return lines + [""]


def _usage_section(cfg: ModelConfig) -> list[str]:
    return [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)',
        'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
        'ids = tokenizer("The capital of France is", return_tensors="pt")',
        "print(tokenizer.decode(model.generate(**ids, max_new_tokens=20, do_sample=False)[0]))",
        "```",
        "",
        "`trust_remote_code=True` runs `modeling_prism.py` and `configuration_prism.py` from this "
        "folder (plain PyTorch; they import only torch and transformers). The tokenizer is plain "
        "GPT-2 BPE (`tokenizer.json`, no custom code); transformers 5 reads `config.json` before "
        "it, so without the flag `AutoTokenizer` first asks whether to run the custom code and, "
        "told no, loads the same tokenizer. Zero-shot scores with lm-evaluation-harness:",
        "",
        "```bash",
        "lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True,dtype=float32 \\",
        "    --tasks hellaswag,piqa,arc_easy,winogrande,blimp,wikitext",
        "```",
        "",
        _context(cfg) + "Weights "
        "are float32, as trained. The tokenizer adds no special tokens; in training every document "
        "was preceded by `<|endoftext|>` (50256, also the BOS and EOS id), so prepend it to start "
        "at a document boundary.",
        "",
    ]


def render(
    cfg: ModelConfig,
    n_params: int,
    source: Source,
    eval_doc: EvalResult | None,
    eval_path: Path | None,
    version: str,
    command: str,
) -> str:
    who = checkpoint_identity(source)
    schedule = who.get("schedule") or cfg.schedule_name
    title = f"Prism decoder: {who.get('scale') or 'unknown scale'}, schedule `{schedule}`"
    title += f", seed {who['seed']}" if who.get("seed") is not None else ""
    lines = [
        _front_matter(source, who),
        f"# {title}",
        "",
        f"A checkpoint of the open reproduction kit for {PAPER}. Prism keeps a GPT-style "
        "decoder's projections unchanged and only changes how many attention heads each layer "
        "splits them into: few wide heads early, the baseline count later. Parameters and FLOPs "
        "equal the uniform baseline's.",
        "",
        *_shape_section(cfg, n_params),
        *_training_section(source),
        *_eval_section(eval_doc, eval_path),
        *_usage_section(cfg),
        "## Provenance",
        "",
        f"- kit: `prism-repro` {version}",
        f"- exported from: `{source.weights}` (step {_num(source.meta.get('step'))})",
        f"- command: `{command}`",
        "",
    ]
    return "\n".join(lines)
