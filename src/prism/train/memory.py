"""The memory plan: the peak device memory of a training job per rank, before it runs.

Two optimizer steps of the real PrismDecoder (forward, backward, gradient clipping, the kit's
AdamW from prism.train.optim, zero_grad) run in fake tensors on the CPU: every op makes tensors
with shapes, dtypes and storages but no data, so even 757M takes seconds and no memory. A
dispatch mode counts the bytes of the live storages after every op, by part (parameters,
gradients, optimizer state, activations, other); the steady step's peak is the second step's,
where gradients and optimizer state exist. The strategy's effect is applied to that timeline by
formula: DDP keeps every gradient in its buckets for the whole step, FSDP2 shards parameters,
gradients and optimizer state over the ranks but gathers the root unit and two blocks at a time.
What is simulated and what is a formula: docs/performance.md.
"""

from __future__ import annotations

import functools
import json
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from prism.compat import dispatch_mode, fake_tensor_mode
from prism.config.schema import ConfigError, RunConfig
from prism.core.model import ModelConfig, PrismDecoder
from prism.train.batch import BatchPlan, batch_plan
from prism.train.optim import make_optimizer

GIB = 2**30
# the share of the device's memory a plan may fill: the rest is the CUDA context, NCCL's buffers
# and the caching allocator's fragmentation, which the tensors' bytes do not show
MARGIN = 0.9
DEFAULT_DEVICE_GIB = 80.0  # no visible GPU: the paper's H100 80GB
PARTS = ("parameters", "gradients", "optimizer", "activations", "other")
PARAMS, GRADS, OPTIM, ACTS, OTHER = range(len(PARTS))
FORWARD, BACKWARD, UPDATE = range(3)  # the phase of each op of the timeline
SIMULATED_STEPS = 2  # the second is the steady one: gradients and optimizer state exist
EVAL_HEAD_CHUNK = 512  # prism.eval.engine.HEAD_CHUNK: output-head rows per step of zero-shot scoring
LONG_QUERY_BLOCK = 256  # prism.measure.long_context: query rows per attention-distance block
LONG_LOGIT_CHUNK = 1024  # prism.measure.long_context: positions per output-head step
ASSUMPTIONS = (
    "attention: a flash / memory-efficient SDPA kernel (no s x s scores), as on the GPU; the "
    "simulation runs the CPU's flash kernel, whose saved tensors are the same size",
    "AdamW: fused (one kernel, no temporaries) unless train.fused=false, whose foreach "
    "implementation adds one fp32 copy of the parameters during the update (a formula)",
    "bf16-mixed: the CPU's autocast op lists stand in for CUDA's (both run matmuls in bf16 and "
    "keep the weights' bf16 copies for the backward)",
    "eager: torch.compile is not modelled (its fused kernels usually keep less)",
    "DDP gradients: train.ddp_gradient_as_bucket_view keeps them in the buckets all step (a formula)",
    "FSDP2: parameters, gradients and AdamW state divided over the ranks, plus the gathered root "
    "unit and two blocks during forward and backward (a formula, no fake process group)",
)


# ----- counting live storages ------------------------------------------------------------------
class LiveStorages(dispatch_mode()):
    """The storages that ops return, each with the op after which it exists, the op before which
    it was freed (weakref.finalize on the storage) and its part. A part holds for a storage's
    whole life: `other` until the simulation knows more (a gradient once accumulated, optimizer
    state once the optimizer holds it, activations when it outlives its forward), so the bytes by
    part after every op are only summed up at the end (timeline())."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[int, list[int]] = {}  # id(storage) -> [bytes, first op, last op + 1, part]
        self.done: list[list[int]] = []
        self.ops = 0
        self.phase = FORWARD
        self.phases: list[int] = []
        self.forward_keys: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.add(t, OTHER)
        self.phases.append(self.phase)
        self.ops += 1
        return out

    def add(self, tensor: torch.Tensor, part: int) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.records:
            return
        self.records[key] = [storage.nbytes(), self.ops, -1, part]
        if self.phase == FORWARD:
            self.forward_keys.append(key)
        weakref.finalize(storage, self.free, key)

    def free(self, key: int) -> None:
        record = self.records.pop(key)
        record[2] = self.ops
        self.done.append(record)

    def move(self, tensor: torch.Tensor, part: int) -> None:
        """`tensor`'s storage is `part`, all its life."""
        record = self.records.get(id(tensor.untyped_storage()))
        if record is None:
            self.add(tensor, part)
        else:
            record[3] = part

    def end_forward(self) -> None:
        """What the forward made and still lives is kept for the backward: activations."""
        for key in self.forward_keys:
            record = self.records.get(key)
            if record is not None and record[3] == OTHER:
                record[3] = ACTS
        self.forward_keys = []

    def timeline(self, first_op: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(live bytes by part after each op from `first_op` on, the phase of each op)."""
        rows = np.array([*self.done, *self.records.values()], dtype=np.int64).reshape(-1, 4)
        ends = np.where(rows[:, 2] < 0, self.ops, rows[:, 2])
        change = np.zeros((self.ops + 1, len(PARTS)), dtype=np.int64)
        np.add.at(change, (rows[:, 1], rows[:, 3]), rows[:, 0])
        np.add.at(change, (ends, rows[:, 3]), -rows[:, 0])
        live = np.cumsum(change, axis=0)[: self.ops]
        return live[first_op:], np.array(self.phases[first_op:], dtype=np.int8)


# ----- the simulation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepShape:
    """Everything the simulated step depends on (the cache key of simulate_step)."""

    model: str  # ModelConfig.to_dict() as JSON
    micro_batch: int
    bf16: bool
    activation_checkpointing: bool
    loss_chunk_tokens: int
    accumulating: bool  # a second micro-batch backward runs onto the first one's gradients
    fused: bool


@dataclass(frozen=True)
class Timeline:
    """Live bytes by part after each op of the steady step, and the sizes the formulas need."""

    samples: np.ndarray  # (ops, parts) bytes
    phases: np.ndarray  # (ops,) FORWARD | BACKWARD | UPDATE
    param_bytes: int  # trainable parameters (one gradient and its share of the state each)
    root_bytes: int  # FSDP2's root unit: what is not in a block (embedding / tied head, final norm)
    block_bytes: int  # the largest block


def _train_dict(shape: StepShape) -> dict:
    # the optimizer's settings only change numbers, not memory; fused decides its temporaries
    return {
        "lr": 1e-3,
        "weight_decay": 0.1,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "warmup_frac": 0.0,
        "min_lr_ratio": 0.1,
        "fused": shape.fused,
    }


@functools.lru_cache(maxsize=64)
def simulate_step(shape: StepShape) -> Timeline:
    """Two optimizer steps of the real decoder in fake CPU tensors (fake CUDA tensors fail at some
    decompositions on a CPU-only torch): the first of one micro-batch, which creates the optimizer
    state, the second of two when the step accumulates; the second step's timeline."""
    cfg = ModelConfig(**json.loads(shape.model))
    with fake_tensor_mode(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        model = PrismDecoder(cfg)
        model.loss_chunk = shape.loss_chunk_tokens
        model.checkpoint_blocks = shape.activation_checkpointing
        model.train()
        # the device only picks fused or not: make_optimizer's flag is the config's `fused` here
        optimizer, _ = make_optimizer(model, _train_dict(shape), 100, torch.device("cpu"))
        params = [p for p in model.parameters() if p.requires_grad]
        tracker = LiveStorages()
        for t in (*model.parameters(), *model.buffers()):
            tracker.add(t, PARAMS)
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p: tracker.move(p.grad, GRADS))
        start = 0
        with tracker:
            for step in range(SIMULATED_STEPS):
                start = tracker.ops
                # the first step only brings the optimizer state into being: one micro-batch
                steady = step == SIMULATED_STEPS - 1
                for _ in range(2 if shape.accumulating and steady else 1):
                    tracker.phase = FORWARD
                    x = torch.randint(0, cfg.vocab_size, (shape.micro_batch, cfg.seq_len))
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=shape.bf16):
                        loss = model(x, x)
                    tracker.end_forward()
                    tracker.phase = BACKWARD
                    loss.backward()
                    del x, loss
                tracker.phase = UPDATE
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                for state in optimizer.state.values():
                    for value in state.values():
                        if isinstance(value, torch.Tensor):
                            tracker.move(value, OPTIM)
                optimizer.zero_grad(set_to_none=True)
        samples, phases = tracker.timeline(start)
        block_bytes = max(sum(_nbytes(p) for p in b.parameters()) for b in model.blocks)
        param_bytes = sum(_nbytes(p) for p in params)
        in_blocks = sum(_nbytes(p) for b in model.blocks for p in b.parameters())
    return Timeline(samples, phases, param_bytes, param_bytes - in_blocks, block_bytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@functools.lru_cache(maxsize=64)
def simulate_forward(model: str, batch: int, length: int, bf16: bool, head_rows: int) -> int:
    """Peak bytes an evaluation's forward adds to the weights: the trunk over (batch, length)
    without gradients, then `head_rows` rows of float32 logits and their log-sum-exp."""
    cfg = ModelConfig(**json.loads(model))
    with fake_tensor_mode(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        decoder = PrismDecoder(cfg).eval()
        tracker = LiveStorages()
        for t in (*decoder.parameters(), *decoder.buffers()):
            tracker.add(t, PARAMS)
        with tracker, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            idx = torch.randint(0, cfg.vocab_size, (batch, length))
            h = decoder.hidden_states(idx).flatten(0, 1)
            logits = decoder.lm_head(h[:head_rows])[..., : cfg.vocab_size].float()
            logits.logsumexp(-1)
            del idx, h, logits
        samples = tracker.timeline()[0]
    return int((samples.sum(axis=1) - samples[:, PARAMS]).max())


# ----- the plan of one job -----------------------------------------------------------------------
@dataclass
class MemoryEstimate:
    micro_batch: int
    accumulation: int
    world_size: int
    strategy: str  # single | ddp | fsdp
    precision: str
    parts: dict[str, int]  # bytes by part at the peak
    device_gib: float
    evaluations: dict[str, int] = field(default_factory=dict)  # name -> peak bytes on the device
    in_loop_eval: bool = False  # train.eval_every_tokens > 0: the zero-shot scoring shares the job
    margin: float = MARGIN

    @property
    def peak_bytes(self) -> int:
        """The training step's peak."""
        return sum(self.parts.values())

    @property
    def job_peak_bytes(self) -> int:
        """The job's peak: the step's, or the in-loop zero-shot scoring's where that is higher."""
        return max(self.peak_bytes, self.evaluations.get("zero_shot", 0) if self.in_loop_eval else 0)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def usable_gib(self) -> float:
        return self.margin * self.device_gib

    @property
    def fits(self) -> bool:
        return self.job_peak_bytes / GIB <= self.usable_gib

    def to_dict(self) -> dict:
        return {
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "precision": self.precision,
            "peak_gib": round(self.peak_gib, 3),
            "device_gib": self.device_gib,
            "margin": self.margin,
            "fits": self.fits,
            "in_loop_eval": self.in_loop_eval,
            "parts": {k: round(v / GIB, 3) for k, v in self.parts.items()},
            "evaluations_gib": {k: round(v / GIB, 3) for k, v in self.evaluations.items()},
            "assumptions": list(ASSUMPTIONS),
        }

    def line(self) -> str:
        """The training job's plan in one line: the split, the estimate and whether it fits."""
        parts = ", ".join(f"{k} {v / GIB:,.1f}" for k, v in self.parts.items())
        verdict = "fits" if self.fits else "does NOT fit"
        scoring = ""
        if self.in_loop_eval:
            scoring = f"; in-loop zero-shot {self.evaluations['zero_shot'] / GIB:,.1f} GiB"
        return (
            f"micro_batch {self.micro_batch} x accumulation {self.accumulation}: peak "
            f"{self.peak_gib:,.1f} GiB per device ({parts}){scoring}; device {self.device_gib:,.1f} "
            f"GiB: {verdict} under the {self.margin:.0%} margin ({self.usable_gib:,.1f} GiB)"
        )


def device_gib(cfg: RunConfig) -> float:
    """train.gpu_memory_gib, else the visible GPU's total memory, else 80 (the paper's H100)."""
    if cfg.train.gpu_memory_gib is not None:
        return float(cfg.train.gpu_memory_gib)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return DEFAULT_DEVICE_GIB


def target_precision(cfg: RunConfig) -> str:
    """The plan is for a GPU unless train.accelerator=cpu: `auto` is bf16-mixed there (§3.1),
    wherever the plan is made."""
    precision = str(cfg.train.precision)
    if precision != "auto":
        return precision
    return "32-true" if str(cfg.train.accelerator).lower() == "cpu" else "bf16-mixed"


def strategy_kind(cfg: RunConfig, world_size: int) -> str:
    if str(cfg.train.strategy) == "fsdp":  # FSDP2 (prism.train.strategy, which imports Lightning)
        return "fsdp"
    return "ddp" if world_size > 1 else "single"


def step_shape(cfg: RunConfig, micro_batch: int, accumulation: int, schedule: str) -> StepShape:
    fused = cfg.train.fused
    return StepShape(
        json.dumps(cfg.model_config(schedule).to_dict(), sort_keys=True),
        micro_batch,
        target_precision(cfg) == "bf16-mixed",
        bool(cfg.train.activation_checkpointing),
        int(cfg.train.loss_chunk_tokens),
        accumulation > 1,
        True if fused is None else bool(fused),  # auto = fused on a GPU
    )


def strategy_parts(timeline: Timeline, kind: str, world_size: int, cfg: RunConfig, fused: bool) -> np.ndarray:
    """The timeline's bytes by part under the strategy, by formula (module docstring)."""
    s = timeline.samples.astype(np.float64)
    phase = timeline.phases
    if kind == "ddp":
        if cfg.train.ddp_gradient_as_bucket_view:
            s[:, GRADS] = timeline.param_bytes  # the gradients are views of the buckets
        else:
            s[:, GRADS] += timeline.param_bytes
    elif kind == "fsdp" and world_size > 1:
        n = world_size
        s[:, [PARAMS, GRADS, OPTIM]] /= n
        computing = phase != UPDATE
        gathered = (timeline.root_bytes + 2 * timeline.block_bytes) * (1 - 1 / n)
        s[computing, PARAMS] += gathered
        # the root's and one block's unsharded gradients wait for their reduce-scatter
        s[phase == BACKWARD, GRADS] += (timeline.root_bytes + timeline.block_bytes) * (1 - 1 / n)
    if not fused:  # foreach AdamW: sqrt(exp_avg_sq) of every parameter at once
        s[phase == UPDATE, OTHER] += timeline.param_bytes / (world_size if kind == "fsdp" else 1)
    return s


def estimate_memory(
    cfg: RunConfig,
    world_size: int,
    micro_batch: int | None = None,
    long_context_length: int | None = None,
    schedule: str | None = None,
    split: BatchPlan | None = None,
) -> MemoryEstimate:
    """The peak per device of cfg's training job on `world_size` devices at `micro_batch` (None:
    the batch split of prism.train.batch), with the evaluations that share its device: the
    in-loop zero-shot scoring, and the long-context evaluation at `long_context_length` tokens
    when given (its own job, on a device holding only the weights). `schedule`: the variant
    simulated, default uniform: the head counts change only the attention's log-sum-exp and the
    RoPE tables, under 0.1 % of the peak at 124m (every variant of a scale shares the plan).
    `split`: batch_plan(cfg, world_size) where the caller has it already."""
    split = split or batch_plan(cfg, world_size)
    if micro_batch is None:
        micro_batch, accumulation = split.micro_batch, split.accumulation
    else:
        share = split.micro_batch * split.accumulation
        if share % micro_batch:
            raise ConfigError(
                f"micro-batch {micro_batch} does not divide the {share} sequences each device takes per step."
            )
        accumulation = share // micro_batch
    shape = step_shape(cfg, micro_batch, accumulation, schedule or "uniform")
    kind = strategy_kind(cfg, world_size)
    timeline = simulate_step(shape)
    s = strategy_parts(timeline, kind, world_size, cfg, shape.fused)
    peak = int(np.argmax(s.sum(axis=1)))
    parts = {name: int(s[peak, i]) for i, name in enumerate(PARTS)}
    # between steps the weights, the optimizer state and (until the next step zeroes them) the
    # gradients are on the device; FSDP gathers the root and a block for the forward
    resident = s[-1].copy()
    resident[GRADS] = timeline.param_bytes / (world_size if kind == "fsdp" else 1)
    if kind == "fsdp" and world_size > 1:
        resident[PARAMS] += (timeline.root_bytes + 2 * timeline.block_bytes) * (1 - 1 / world_size)
    bs, seq = int(cfg.eval.batch_size), cfg.model.seq_len
    evaluations = {
        "zero_shot": int(
            resident[[PARAMS, GRADS, OPTIM]].sum()
            + simulate_forward(shape.model, bs, seq, shape.bf16, min(EVAL_HEAD_CHUNK, bs * seq))
        )
    }
    if long_context_length:
        evaluations["long_context"] = long_context_peak(cfg, shape.model, long_context_length)
    precision, device = target_precision(cfg), device_gib(cfg)
    in_loop = bool(cfg.train.eval_every_tokens)
    return MemoryEstimate(
        micro_batch, accumulation, world_size, kind, precision, parts, device, evaluations, in_loop
    )


def long_context_peak(cfg: RunConfig, model: str, length: int) -> int:
    """The long-context job on one device: float32 weights, a batch of one document of `length`
    tokens, the output head LONG_LOGIT_CHUNK positions at a time; plus, by formula, what its
    attention-distance hook holds for the widest layer: the layer's qkv and rotated q, k, and a
    block of scores, their masked copy and probabilities."""
    params = 4 * _param_count(model)
    heads = max(max(cfg.head_schedule(s).heads) for s in cfg.run_schedules)  # the widest of the runs
    hook = 4 * (5 * length * cfg.model.d_model + 3 * heads * LONG_QUERY_BLOCK * length)
    trunk = simulate_forward(model, 1, length, False, min(LONG_LOGIT_CHUNK, length))
    return int(params + trunk + hook)


@functools.lru_cache(maxsize=16)
def _param_count(model: str) -> int:
    with torch.device("meta"):
        decoder = PrismDecoder(ModelConfig(**json.loads(model)))
    return sum(p.numel() for p in decoder.parameters()) + sum(b.numel() for b in decoder.buffers())


# ----- choosing the micro-batch ------------------------------------------------------------------
def fit_micro_batch(cfg: RunConfig, world_size: int, split: BatchPlan | None = None) -> MemoryEstimate:
    """The largest micro-batch that divides each device's share of the global batch and whose
    estimate fits under the margin, found by bisection over those divisors (the estimate grows
    with the micro-batch); a ConfigError naming the ways out when even 1 does not fit. `split`:
    batch_plan(cfg, world_size) where the caller has it already (the run plan)."""
    split = split or batch_plan(cfg, world_size)
    share = split.micro_batch * split.accumulation
    divisors = [m for m in range(1, share + 1) if share % m == 0]
    low, high, best, smallest = 0, len(divisors) - 1, None, None
    while low <= high:
        mid = (low + high) // 2
        estimate = estimate_memory(cfg, world_size, divisors[mid], split=split)
        if estimate.fits:
            best, low = estimate, mid + 1
        else:
            high = mid - 1
            smallest = estimate if mid == 0 else smallest
    if best is None:
        raise ConfigError(refusal(cfg, smallest or estimate_memory(cfg, world_size, 1, split=split)))
    return best


def refusal(cfg: RunConfig, at_one: MemoryEstimate) -> str:
    """Why a job cannot fit at micro-batch 1, and the settings that lower its peak, in one sentence."""
    t = cfg.train
    ways = []
    if at_one.strategy != "fsdp":
        ways.append("train.strategy=fsdp (shards the weights, gradients and AdamW state)")
    if not t.activation_checkpointing:
        ways.append("train.activation_checkpointing=true")
    if not t.loss_chunk_tokens:
        ways.append("train.loss_chunk_tokens=8192")
    ways.append("more devices")
    return (
        f"{cfg.scale} needs {at_one.peak_gib:,.1f} GiB per device even at micro-batch 1 ({at_one.strategy}, "
        f"{at_one.world_size} device(s)), more than {at_one.margin:.0%} of train.gpu_memory_gib="
        f"{at_one.device_gib:g}; use " + ", ".join(ways[:-1]) + f" or {ways[-1]}."
    )


def occupied_warning(estimate: MemoryEstimate, free_bytes: int, total_bytes: int) -> str | None:
    """One line when the device's free memory at the start (torch.cuda.mem_get_info) is less than
    the job's peak needs under the margin, i.e. another process holds memory the plan counted on;
    None when the peak fits what is free."""
    if estimate.job_peak_bytes <= estimate.margin * free_bytes:
        return None
    return (
        f"warning: the device has {free_bytes / GIB:,.1f} of its {total_bytes / GIB:,.1f} GiB free (another "
        f"process holds {(total_bytes - free_bytes) / GIB:,.1f} GiB), but the memory plan's peak of "
        f"{estimate.job_peak_bytes / GIB:,.1f} GiB at micro_batch {estimate.micro_batch} needs "
        f"{estimate.job_peak_bytes / estimate.margin / GIB:,.1f} GiB free: this run may run out of memory."
    )
