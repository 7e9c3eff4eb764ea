"""Cost of a plan before it runs: steps, tokens, GPU-hours and disk.

GPU-hours per run = trained tokens / (tokens/s per GPU) / 3600, with the per-GPU rate taken
 (a) from the paper: Table 2's total tokens/s over 8 H100s divided by 8 (Table 5's throughput
     change applied to the ablation schedules), and
 (b) from this machine: `results/<scale>/bench.json` when the benchmark has run (per device,
     assuming linear scaling over devices, which DDP approaches but never exceeds).
Evaluation, benchmark and analysis take minutes next to training and are not included.

Disk: a Lightning checkpoint holds fp32 weights and AdamW's two fp32 moments, 12 bytes per
parameter; the exported safetensors weights 4 bytes per parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prism.config import RunConfig
from prism.describe import count_params
from prism.report.paper import PaperTables, load_paper_tables

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
class Costs:
    n_params: int
    steps: int
    tokens: int
    global_batch_tokens: int
    seq_len: int
    runs: list[RunCost]
    paper_tps_per_gpu: float | None
    measured: dict[str, float]  # schedule -> measured tokens/s per device
    measured_hardware: str | None
    ckpt_bytes: int
    export_bytes: int
    periodic_ckpts: int

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
    try:
        doc = json.loads(bench_path.read_text())
        n = int(doc.get("num_devices") or 1)
        rates = {
            s: float(v["train_tokens_per_s"]) / n
            for s, v in doc["schedules"].items()
            if v.get("train_tokens_per_s")
        }
        return rates, f"{n}× {doc.get('hardware', '?')}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, None


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
    measured, hw = measured_throughput(Path(cfg.results_dir) / cfg.scale / "bench.json")
    runs = []
    for seed in cfg.seeds:
        for s in cfg.run_schedules:
            p_rate = base * (1 + change.get(s, 0.0) / 100) if base else None
            m_rate = measured.get(s) or measured.get("uniform")
            runs.append(
                RunCost(
                    s,
                    seed,
                    steps,
                    tokens,
                    tokens / p_rate / 3600 if p_rate else None,
                    tokens / m_rate / 3600 if m_rate else None,
                )
            )
    n = count_params(cfg)
    return Costs(
        n,
        steps,
        tokens,
        t.global_batch_tokens,
        cfg.model.seq_len,
        runs,
        base,
        measured,
        hw,
        CKPT_BYTES_PER_PARAM * n,
        EXPORT_BYTES_PER_PARAM * n,
        steps // t.ckpt_every_steps
        if t.keep_checkpoints == -1
        else min(t.keep_checkpoints, steps // t.ckpt_every_steps),
    )


def data_source(cfg: RunConfig) -> str:
    from prism.data.sources import source_for

    return f"{source_for(cfg.data).describe()}; {cfg.data.val_tokens:,} held-out validation tokens"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
