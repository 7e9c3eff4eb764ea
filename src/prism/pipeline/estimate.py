"""Cost of a plan before it runs: steps, tokens, GPU-hours and disk, at the paper's per-GPU rate
and at the rate this machine's benchmark measured. What is counted and what is not:
docs/report.md, "Cost"."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prism.config.describe import count_params, describe_variant
from prism.config.schema import RunConfig
from prism.errors import ConfigError
from prism.hardware import peak_flops, wants_gpu
from prism.report.fmt import on_devices, recorded
from prism.report.paper import PAPER_SCALES, PaperTables, load_paper_tables
from prism.runs.layout import BENCH_NAME, scale_result
from prism.runs.records import Bench

if TYPE_CHECKING:
    from prism.train.batch import BatchPlan
    from prism.train.memory import MemoryEstimate

CKPT_BYTES_PER_PARAM = 12
EXPORT_BYTES_PER_PARAM = 4


@dataclass
class RunCost:
    schedule: str
    seed: int
    steps: int
    tokens: int
    gpu_h_paper: float | None
    gpu_h_measured: float | None


@dataclass
class EvalCost:
    """What the zero-shot milestones inside one training run cost."""

    milestones: int  # per run
    requests: int  # per milestone (identical requests scored once)
    tokens: int  # model-input tokens per milestone, padding included
    counted: str  # how `tokens` was found
    tokens_per_s: float | None  # forward tokens/s of the whole run (all its devices)
    rate_source: str
    host_s: float = 0.0  # reading and tokenising the documents, which every milestone repeats

    @property
    def seconds(self) -> float | None:
        return self.tokens / self.tokens_per_s + self.host_s if self.tokens_per_s else None


@dataclass
class Costs:
    n_params: int
    steps: int
    tokens: int
    runs: list[RunCost]
    paper_tps_per_gpu: float | None
    measured: dict[str, float]  # schedule -> measured tokens/s per device
    measured_hardware: str | None
    ckpt_bytes: int
    export_bytes: int
    periodic_ckpts: int
    zeroshot: EvalCost | None = None  # train.eval_every_tokens > 0
    # a scale the paper did not train: tokens/s per H100 estimated from FLOPs (flops_rate)
    flops_tps_per_gpu: float | None = None
    flops_basis: str | None = None

    def total(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.runs]
        return None if not vals or any(v is None for v in vals) else sum(vals)

    @property
    def disk_min(self) -> int:
        """last.ckpt + exported weights, every run."""
        return len(self.runs) * (self.ckpt_bytes + self.export_bytes)

    @property
    def disk_max(self) -> int:
        """...plus the periodic step checkpoints training keeps (train.keep_checkpoints)."""
        return len(self.runs) * (self.ckpt_bytes * (1 + self.periodic_ckpts) + self.export_bytes)


def measured_throughput(bench_path: Path) -> tuple[dict[str, float], str | None]:
    """Training tokens/s per device of each schedule bench.json measured, and on what; nothing
    without a usable bench.json."""
    bench = Bench.read(bench_path, [])
    if bench is None:
        return {}, None
    n = bench.num_devices or 1
    rates = {s: float(v.train_tokens_per_s) / n for s, v in bench.schedules.items() if v.train_tokens_per_s}
    return rates, on_devices(n, bench.hardware)


# Requests per document and model-input tokens per request of the default splits (the first 500
# documents of each in ../shared/data/eval, GPT-2 tokens), for a plan whose eval.data_dir is the hub.
TYPICAL_REQUESTS = {
    "hellaswag": (4.0, 42.2),
    "piqa": (2.0, 35.7),
    "arc_easy": (4.0, 31.1),
    "winogrande": (2.0, 20.9),
    "blimp": (2.0, 9.9),  # each paradigm
    "wikitext": (4.8, 1015.0),  # rolling windows of 1,024 tokens
}


def counted_requests(cfg: RunConfig) -> tuple[int, int, str, float] | None:
    """(requests, padded input tokens, how, host seconds) of one milestone, counted as the engine
    batches them, from the local task files; None when they cannot be read here. The host seconds
    are those of reading and tokenising them here, timed."""
    from prism.data.tokenizer import GPT2Tokenizer
    from prism.eval.data import load_docs
    from prism.eval.engine import length_order, model_input
    from prism.eval.evaluator import build_requests
    from prism.eval.job import task_units
    from prism.eval.tasks import TASKS, EvalInputError

    data_dir, seq_len, bs = cfg.eval.data_dir, cfg.model.seq_len, cfg.eval.batch_size
    if not data_dir or not Path(data_dir).is_dir():
        return None
    n_req = n_tok = 0
    t0 = time.perf_counter()
    try:
        for unit in task_units(",".join(cfg.train.eval_tasks)):
            docs = {n: load_docs(TASKS[n], data_dir, cfg.train.eval_limit) for n in unit}
            flat, _ = build_requests(docs, GPT2Tokenizer(), seq_len)
            unique = list(dict.fromkeys(flat))
            order = length_order(unique, seq_len)
            for i in range(0, len(order), bs):
                batch = [unique[k] for k in order[i : i + bs]]
                n_tok += len(batch) * max(len(model_input(r, seq_len)[0]) for r in batch)
            n_req += len(unique)
    except (EvalInputError, ValueError, OSError):
        return None
    return n_req, n_tok, f"counted from the documents in {data_dir}", time.perf_counter() - t0


def typical_requests(cfg: RunConfig) -> tuple[int, int, str, float]:
    from prism.eval.tasks import resolve_tasks

    n_req = n_tok = 0.0
    for name in resolve_tasks(list(cfg.train.eval_tasks)):
        per_doc, length = TYPICAL_REQUESTS["blimp" if name.startswith("blimp_") else name]
        docs = 62 if name == "wikitext" else cfg.train.eval_limit  # wikitext's test split has 62
        n_req += docs * per_doc
        n_tok += docs * per_doc * min(length, cfg.model.seq_len)
    return int(n_req), int(n_tok), "from typical task sizes (eval.data_dir is not a local folder)", 0.0


def eval_cost(cfg: RunConfig, base_rate: float | None, bench_path: Path) -> EvalCost | None:
    """Seconds per milestone = input tokens / forward tokens/s of the run's devices (forward_rate)."""
    from prism.train.batch import world_size

    t = cfg.train
    if not t.eval_every_tokens:
        return None
    n_req, n_tok, counted, host_s = counted_requests(cfg) or typical_requests(cfg)
    try:
        devices = world_size(cfg)
    except (ConfigError, ValueError, TypeError):
        devices = 1
    rate, source = forward_rate(base_rate, bench_path, devices)
    return EvalCost(t.tokens // t.eval_every_tokens, n_req, n_tok, counted, rate, source, host_s)


def forward_rate(
    base_rate: float | None,
    bench_path: Path,
    devices: int = 1,
    base_what: str = "the paper's",
    unit: str = "GPU",
) -> tuple[float | None, str]:
    """(forward tokens/s of `devices` devices, where it comes from): the benchmark's measured
    inference rate when bench.json has one, else 3x the training rate `base_rate` per device (a
    forward pass is about a third of a training step's 6N FLOPs per token), else None."""
    bench = Bench.read(bench_path, [])
    if bench is not None:
        n = bench.num_devices or 1
        infer = [float(v.infer_tokens_per_s) / n for v in bench.schedules.values() if v.infer_tokens_per_s]
        if infer:
            return min(infer) * devices, (
                f"the benchmark's forward rate, {min(infer):,.0f} tokens/s per device on "
                f"{recorded(bench.hardware)} ({bench_path}), x {devices} device(s)"
            )
    if base_rate:
        return 3 * base_rate * devices, (
            f"arithmetic: 3 x {base_what} {base_rate:,.0f} training tokens/s per {unit} (forward only, "
            f"~1/3 of a training step's FLOPs per token) x {devices} device(s)"
        )
    return None, "n/a (no benchmark result and no paper rate for this scale)"


@dataclass
class LongContextCost:
    """What the long-context evaluation of one run costs (the long_context stage)."""

    runs: int
    measurements: int  # (length, RoPE choice) units a run measures; at factor 1 the choices share one
    tokens: int  # forward tokens per run, every unit
    seconds: float | None  # per run, on one device
    rate_source: str


def long_context_cost(cfg: RunConfig, paper: PaperTables | None = None) -> LongContextCost:
    """Forward tokens = documents x length per (length, RoPE choice), at forward_rate() slowed by the
    FLOPs per token at that length (its attention term grows with it); the attention-distance pass
    beside it and the documents' reading are not counted."""
    from prism.core.model import flops_per_token
    from prism.measure.long_context.settings import settings_for

    paper = paper or load_paper_tables()
    settings = settings_for(cfg.long_context, cfg.model.seq_len)
    n = count_params(cfg)
    bench, gpu = scale_result(cfg, BENCH_NAME), wants_gpu(cfg.train.accelerator)
    if gpu:
        base, what = paper.tokens_per_s_per_gpu(cfg.scale), "the paper's"
        if not base:
            base, what = flops_rate(cfg, n, paper)[0], "an H100's FLOPs-estimated"
    else:  # a CPU job, priced as training is: at this machine's measured rate, never a GPU's
        measured, hardware = measured_throughput(bench)
        base, what = (
            (min(measured.values()), f"this machine's measured ({hardware})") if measured else (None, "")
        )
    rate, source = forward_rate(base, bench, base_what=what, unit="GPU" if gpu else "device")
    if rate is None and not gpu:
        source = (
            f"n/a until the benchmark has run on this machine ({bench}); a CPU is not priced at a GPU's rate"
        )
    measurements = tokens = 0
    seconds = 0.0
    for length in settings.lengths:
        distinct = len({u.effective for u in settings.units() if u.length == length})
        unit_tokens = distinct * settings.documents * length
        measurements, tokens = measurements + distinct, tokens + unit_tokens
        slower = flops_per_token(cfg.model, n, length) / flops_per_token(cfg.model, n, cfg.model.seq_len)
        seconds += unit_tokens * slower / rate if rate else 0.0
    runs = len(cfg.seeds) * len(cfg.run_schedules)
    return LongContextCost(runs, measurements, tokens, seconds if rate else None, source)


PAPER_GPU = "H100"  # Table 2's hardware (8x H100 80GB SXM5)


def flops_rate(cfg: RunConfig, n_params: int, paper: PaperTables) -> tuple[float, str]:
    """Training tokens/s per H100 for a scale the paper has no throughput for, and a sentence saying
    so: FLOPs per token at the MFU the paper implies (Table 2) at its scale nearest in size."""
    nearest = min(PAPER_SCALES, key=lambda s: abs(math.log(n_params / paper.config(s)["n_params"])))
    mfu = paper.t2["inferred"]["mfu"][nearest]
    per_token = describe_variant(cfg, "uniform")["flops_per_token"]
    peak = peak_flops(PAPER_GPU)
    rate = mfu * peak / per_token
    return rate, (
        f"estimated from FLOPs: {per_token:,} FLOPs/token at {mfu:.0%} MFU (the paper's {nearest}, "
        f"nearest in size) of an {PAPER_GPU}'s {peak / 1e12:,.0f} TFLOP/s = {rate:,.0f} tokens/s per GPU"
    )


def estimate(cfg: RunConfig, paper: PaperTables | None = None) -> Costs:
    paper = paper or load_paper_tables()
    t = cfg.train
    steps = t.tokens // t.global_batch_tokens
    tokens = steps * t.global_batch_tokens
    base = paper.tokens_per_s_per_gpu(cfg.scale)
    change = (
        {r["kit"]: r["tok_s_change_pct"] or 0.0 for r in paper.ablation()}
        if cfg.scale == paper.t5["scale"]
        else {}
    )
    measured, hw = measured_throughput(scale_result(cfg, BENCH_NAME))
    runs = []
    for seed in cfg.seeds:
        for s in cfg.run_schedules:
            p_rate = base * (1 + change.get(s, 0.0) / 100) if base else None
            m_rate = measured.get(s) or measured.get("uniform")
            gpu_h = [tokens / rate / 3600 if rate else None for rate in (p_rate, m_rate)]
            runs.append(RunCost(s, seed, steps, tokens, *gpu_h))
    n = count_params(cfg)
    flops_tps, flops_basis = (None, None) if base else flops_rate(cfg, n, paper)
    ckpt, export, saves = CKPT_BYTES_PER_PARAM * n, EXPORT_BYTES_PER_PARAM * n, steps // t.ckpt_every_steps
    periodic = saves if t.keep_checkpoints == -1 else min(t.keep_checkpoints, saves)
    zeroshot = eval_cost(cfg, base, scale_result(cfg, BENCH_NAME))
    return Costs(
        n_params=n,
        steps=steps,
        tokens=tokens,
        runs=runs,
        paper_tps_per_gpu=base,
        measured=measured,
        measured_hardware=hw,
        ckpt_bytes=ckpt,
        export_bytes=export,
        periodic_ckpts=periodic,
        zeroshot=zeroshot,
        flops_tps_per_gpu=flops_tps,
        flops_basis=flops_basis,
    )


def data_source(cfg: RunConfig) -> str:
    from prism.data.sources import source_for

    return f"{source_for(cfg.data).describe()}; {cfg.data.val_tokens:,} held-out validation tokens"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000


def memory_plan(cfg: RunConfig, split: BatchPlan, long_context: bool) -> MemoryEstimate:
    """The memory plan of every training job of the scale at the plan's batch `split` (the variants
    share it), and of the long-context evaluation at its longest length when that stage runs."""
    from prism.measure.long_context.settings import settings_for
    from prism.train.memory import estimate_memory

    longest = max(settings_for(cfg.long_context, cfg.model.seq_len).lengths) if long_context else None
    return estimate_memory(cfg, split.world_size, split.micro_batch, longest, split=split)
