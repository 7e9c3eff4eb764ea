"""Throughput of head schedules (paper Table 2 and Table 5's tok/s column), timed in interleaved
rounds of whole training steps: docs/evaluation.md, "Throughput benchmark"."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from prism import compat
from prism.config.schema import BenchSection, TrainSection
from prism.core.model import ModelConfig, PrismDecoder, flops_per_token
from prism.errors import cause
from prism.hardware import device_name, peak_flops
from prism.train.optim import make_optimizer

# in the order the dispatcher prefers them
BACKEND_NAMES = {
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
    SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.MATH: "math",
}
SPREAD = "p25-p75"  # what step_time_s_spread and ratio_to_uniform_spread hold


@dataclass
class BenchSettings:
    steps: int = BenchSection.steps  # timed rounds; every schedule runs round_steps steps per round
    round_steps: int = 4  # back-to-back steps per schedule per round, timed together
    warmup: int = BenchSection.warmup  # untimed steps per schedule first (the first one compiles)
    infer_steps: int = 20  # timed forward-only rounds (0 = skip inference)
    micro_batch: int = 8
    seq_len: int = 1024
    device: str = "cpu"
    compile: bool = False
    fullgraph: bool = True  # a graph break is an error, not a silent slowdown
    compile_mode: str = "full"  # "full": one graph for the model (what training does);
    #                            "regional": each block compiled alone, blocks of equal head count
    #                            share one compiled graph, so deep models compile in far less time
    amp: bool = True  # bf16 autocast on CUDA; always off on CPU
    seed: int = 0
    lr: float = 1e-4
    peak_tflops: float | None = None  # overrides the hardware table (an unlisted GPU, or tests)
    loss_chunk: int = 0  # train.loss_chunk_tokens: chunked output layer + loss (0 = plain)
    train: dict | None = None  # the run's train section (AdamW settings); None = the defaults

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.amp and torch.device(self.device).type == "cuda" else None


# ----- helpers ---------------------------------------------------------------------------------
def build_model(cfg: ModelConfig, device: torch.device | str, seed: int) -> PrismDecoder:
    """Build directly on the target device (a 757M model never exists twice in host memory).
    Seeding first gives every schedule of a shape bit-identical weights."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = PrismDecoder(cfg)
    return model.train()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Seconds one call takes: CUDA events on GPU (device time between two synchronised points),
    perf_counter on CPU."""
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----- SDPA backend detection ------------------------------------------------------------------
def sdpa_backend(
    batch: int, n_head: int, seq_len: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> str:
    """The SDPA backend PyTorch dispatches a causal (B, h, T, d_h) call to, verified by running
    forward and backward with only that backend allowed. The dispatcher's own decision comes from
    prism.compat.sdpa_choice (torch.compile lowers SDPA with the same choice)."""
    # Eligibility depends on head dim, dtype, length and alignment, so the real shape is used.
    q, k, v = (
        torch.randn(batch, n_head, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    picked = compat.sdpa_choice(q, k, v)
    # None: this torch cannot say; the backends are then tried in priority order
    choice = SDPBackend(picked) if picked is not None else None
    for backend in (b for b in dict.fromkeys((choice, *BACKEND_NAMES)) if b in BACKEND_NAMES):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            return BACKEND_NAMES[backend]
        except RuntimeError:
            continue
    return "none"


def layer_backends(
    cfg: ModelConfig, batch: int, seq_len: int, device: torch.device, dtype: torch.dtype
) -> list[str]:
    found = {h: sdpa_backend(batch, h, seq_len, cfg.d_model // h, device, dtype) for h in set(cfg.heads)}
    return [found[h] for h in cfg.heads]


ATTENTION_KERNEL = ("flash", "fmha", "attention", "attn", "cudnn", "sdpa", "efficient")


def attention_kernels(step, device: torch.device) -> list[str]:
    """Names of the attention kernels (GPU) or aten ops (CPU) one call of `step` runs, from the
    profiler: the ground truth behind `layer_backends` (math runs none; ATTENTION_KERNEL the names)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        sync(device)
    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    names = {e.name for e in prof.events() if e.device_type == wanted}
    return sorted(n for n in names if any(k in n.lower() for k in ATTENTION_KERNEL))


# ----- one schedule ----------------------------------------------------------------------------
class ScheduleRunner:
    """A model, its optimizer and a fixed batch; `train_step` and `infer_step` are what is timed."""

    def __init__(self, name: str, cfg: ModelConfig, s: BenchSettings):
        self.name, self.cfg, self.s = name, cfg, s
        self.device = torch.device(s.device)
        self.model = build_model(cfg, self.device, s.seed)
        self.model.loss_chunk = s.loss_chunk
        # training's AdamW (train section of the run's config), at the benchmark's constant LR
        train = {**asdict(TrainSection()), **(s.train or {}), "lr": s.lr, "warmup_frac": 0.0}
        self.optimizer, _ = make_optimizer(self.model, train, max_steps=1, device=self.device)
        gen = torch.Generator().manual_seed(s.seed + 1)
        tokens = torch.randint(0, cfg.vocab_size, (s.micro_batch, s.seq_len + 1), generator=gen)
        tokens = tokens.to(self.device)
        self.x, self.y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        self.fn = self.model
        self.compile_error: str | None = None
        if s.compile and s.compile_mode == "regional":
            # One compiled entry per distinct head count and grad mode; keep room for all of them.
            compat.raise_recompile_limit(64)
            for block in self.model.blocks:
                block.compile(fullgraph=s.fullgraph, dynamic=False)
        elif s.compile:
            self.fn = torch.compile(self.model, fullgraph=s.fullgraph, dynamic=False)  # as training

    def _autocast(self):
        dtype = self.s.amp_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def train_step(self) -> None:
        with self._autocast():
            loss = self.fn(self.x, self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.optimizer.step()
        # Free gradients now, not at the next step, so between steps only weights and optimizer
        # state stay resident (that is what `resident_bytes` counts for the other schedules).
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def infer_step(self) -> None:
        self.model.eval()
        try:
            with self._autocast():
                self.fn(self.x)
        finally:
            self.model.train()

    def resident_bytes(self) -> int:
        state = (t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t))
        return sum(t.nbytes for t in (*self.model.parameters(), *state))


# ----- the benchmark ---------------------------------------------------------------------------------
def run_benchmark(named_cfgs: dict[str, ModelConfig], s: BenchSettings, progress=print) -> dict:
    """Benchmark several schedules of one shape; the first one is the reference for ratios."""
    device = torch.device(s.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    runners = []
    for name, cfg in named_cfgs.items():
        progress(f"building {name} ({cfg.schedule.text()}) on {device}")
        runners.append(ScheduleRunner(name, cfg, s))

    for r in runners:  # warm-up: compilation, allocator growth, cuDNN/cuBLAS autotuning
        progress(
            f"warming up {r.name} ({s.warmup} train + {min(s.warmup, s.infer_steps)} forward steps"
            f"{', compiling' if s.compile else ''})"
        )
        t0 = time.perf_counter()
        try:
            for _ in range(max(1, s.warmup)):
                r.train_step()
            for _ in range(min(max(1, s.warmup), s.infer_steps)):
                r.infer_step()
        except Exception as exc:
            if not s.compile:
                raise
            # A graph break under fullgraph=True (or a compiler failure) is a finding to report;
            # the schedule is then timed eagerly so the run still yields numbers.
            r.compile_error = cause(exc)
            progress(f"  compile failed for {r.name} ({r.compile_error}); timing it eagerly")
            r.fn = r.model
            for block in r.model.blocks:
                compat.uncompile(block)
            r.optimizer.zero_grad(set_to_none=True)
            for _ in range(max(1, s.warmup)):
                r.train_step()
        sync(device)
        progress(f"  {r.name} warm in {time.perf_counter() - t0:.1f}s")

    # cpu_times: CPU seconds of this process per step: on a shared CPU they are far less disturbed
    # by other tenants than wall time (reported alongside, never instead; meaningless for GPU work).
    times, infer, cpu_times = ({r.name: [] for r in runners} for _ in range(3))
    peaks: dict[str, int | None] = {r.name: None for r in runners}
    resident = {r.name: r.resident_bytes() for r in runners}
    progress(f"timing {s.steps} interleaved rounds of {len(runners)} schedules")
    k = max(1, s.round_steps)
    for i in range(s.steps):
        # Interleave, reversing the order every other round (A B, B A, ...) so that neither
        # schedule always runs right after the other's steps.
        for r in runners if i % 2 == 0 else runners[::-1]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            cpu0 = time.process_time()
            times[r.name].append(timed(lambda: [r.train_step() for _ in range(k)], device) / k)  # noqa: B023
            cpu_times[r.name].append((time.process_time() - cpu0) / k)
            if device.type == "cuda":
                # The other schedules' weights and optimizer state are resident too; subtract them.
                others = sum(resident.values()) - resident[r.name]
                peaks[r.name] = max(peaks[r.name] or 0, torch.cuda.max_memory_allocated(device) - others)
    for i in range(s.infer_steps):
        for r in runners if i % 2 == 0 else runners[::-1]:
            infer[r.name].append(timed(r.infer_step, device))

    name, dtype = device_name(device), s.amp_dtype or torch.float32
    if s.peak_tflops:
        peak = s.peak_tflops * 1e12
    else:
        peak = peak_flops(name, dtype) if device.type == "cuda" else None
    ref, tokens = runners[0].name, s.micro_batch * s.seq_len
    schedules = {}
    for r in runners:
        median = statistics.median(times[r.name])
        fpt = flops_per_token(r.model.cfg, r.model.flop_params(), s.seq_len)
        infer_median = statistics.median(infer[r.name]) if infer[r.name] else None
        res = {
            "heads": list(r.cfg.heads),
            "head_dims": [r.cfg.d_model // h for h in r.cfg.heads],
            "n_params": r.model.num_params(),
            "flops_per_token": fpt,
            "step_times_s": times[r.name],
            "step_time_s_median": median,
            "step_time_s_spread": np.quantile(times[r.name], (0.25, 0.75)).tolist(),
            "train_tokens_per_s": tokens / median,
            "mfu": tokens / median * fpt / peak if peak else None,
            "peak_memory_bytes": peaks[r.name],
            "infer_step_time_s_median": infer_median,
            "infer_tokens_per_s": tokens / infer_median if infer_median is not None else None,
            "compile_error": r.compile_error,
        }
        res["attention_backends"] = layer_backends(r.cfg, s.micro_batch, s.seq_len, device, dtype)
        res["attention_kernels"] = attention_kernels(r.train_step, device)
        per_round = [a / b for a, b in zip(times[ref], times[r.name])]
        res["ratio_to_uniform"] = statistics.median(times[ref]) / median
        res["ratio_to_uniform_spread"] = np.quantile(per_round, (0.25, 0.75)).tolist()
        res["step_time_s_min"] = min(times[r.name])
        res["ratio_to_uniform_min"] = min(times[ref]) / min(times[r.name])
        if device.type == "cpu":
            res["cpu_time_s_median"] = statistics.median(cpu_times[r.name])
            res["ratio_to_uniform_cpu_time"] = statistics.median(cpu_times[ref]) / res["cpu_time_s_median"]
        res["infer_ratio_to_uniform"] = (
            statistics.median(infer[ref]) / infer_median if infer_median is not None else None
        )
        schedules[r.name] = res
    return {
        "hardware": name,
        "num_devices": 1,
        "device_type": device.type,
        "compile": s.compile,
        "fullgraph": s.fullgraph if s.compile else None,
        "compile_mode": s.compile_mode if s.compile else None,
        "dtype": "bfloat16" if s.amp_dtype else "float32",
        "micro_batch": s.micro_batch,
        "seq_len": s.seq_len,
        "steps": s.steps,
        "round_steps": k,
        "loss_chunk_tokens": s.loss_chunk,
        "warmup": s.warmup,
        "infer_steps": s.infer_steps,
        "reference": ref,
        "peak_flops": peak,
        "spread": SPREAD,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "schedules": schedules,
    }
