"""The memory plan: a training job's peak device memory per rank, before it runs, from two optimizer
steps of the real decoder in fake tensors plus formulas (docs/performance.md, "How it is estimated")."""

from __future__ import annotations

import functools
import json
import operator
import weakref
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from prism.compat import dispatch_mode, fake_tensor_mode, is_dtype_copy, op_name, partitioned_graphs
from prism.config.schema import ConfigError, RunConfig
from prism.core.model import ModelConfig, PrismDecoder
from prism.train.batch import BatchPlan, batch_plan
from prism.train.optim import make_optimizer

GIB = 2**30
# no visible GPU and no train.gpu_memory_gib: the paper's card, at the total torch reports for it
ASSUMED_CARD = "NVIDIA H100 80GB HBM3"
ASSUMED_CARD_GIB = 79.1
PARTS = ("parameters", "gradients", "optimizer", "activations", "autocast_copies", "other")
PARAMS, GRADS, OPTIM, ACTS, COPIES, OTHER = range(len(PARTS))
# each precision Lightning accepts: the weights' dtype, and the autocast dtype (None: no autocast)
PRECISION_DTYPES = {
    "32-true": (torch.float32, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-true": (torch.bfloat16, None),
    "16-true": (torch.float16, None),
    "64-true": (torch.float64, None),
}
# the traced phases of a compiled run: the largest shortfall measured against a real compiled step,
# rounded up, so that `auto` does not pick from a plan that errs low (docs/performance.md)
COMPILED_ALLOWANCE = 0.13
# what the traced graphs do not model: runs with either are planned eager (docs/performance.md)
UNTRACED = ("activation_checkpointing", "loss_chunk_tokens")
PHASES = ("train_step", "validation", "zero_shot", "checkpoint_save")
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
    "bf16-mixed / 16-mixed: the CPU's autocast op lists stand in for CUDA's (both run matmuls in "
    "the low precision and keep the weights' copies for the backward); 16-mixed's GradScaler "
    "adds 8 bytes always and 12 from the backward to the update (scaler_bytes)",
    "bf16-true / 16-true / 64-true: weights, gradients and AdamW state in that dtype; 64-true runs "
    "the math SDPA kernel, as CUDA's flash and memory-efficient kernels take no float64",
    "Lightning's order: the previous step's gradients live until the first micro-batch's forward "
    "ends (zero_grad runs before its backward)",
    "DDP gradients: train.ddp_gradient_as_bucket_view keeps them in the buckets all step (a formula)",
    "FSDP2: parameters, gradients and AdamW state divided over the ranks, plus the gathered root "
    "unit and two blocks during forward and backward (a formula, no fake process group)",
)


# ----- counting live storages ------------------------------------------------------------------
class LiveStorages(dispatch_mode()):
    """The storages that ops return, each with the ops it lives between and its part (`other`
    until the simulation knows more), from `model`'s weights on; timeline() sums them by part."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.records: dict[int, list[int]] = {}  # id(storage) -> [bytes, first op, last op + 1, part]
        self.done: list[list[int]] = []
        self.ops = 0
        self.phase = FORWARD
        self.phases: list[int] = []
        self.forward_keys: list[int] = []
        for t in (*model.parameters(), *model.buffers()):
            self.add(t, PARAMS)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        part = OTHER
        if is_dtype_copy(func) and isinstance(args[0], torch.Tensor):
            record = self.records.get(id(args[0].untyped_storage()))
            if record is not None and record[3] == PARAMS:  # autocast's copy of a weight
                part = COPIES
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.add(t, part)
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
    precision: str  # a key of PRECISION_DTYPES
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
    largest_bytes: int  # the largest single parameter (FSDP2 gathers one at a time to save)


# the optimizer's settings change numbers, not memory; `fused` (per shape) decides its temporaries
OPTIMIZER = dict(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, warmup_frac=0, min_lr_ratio=0.1)


def attention_backend(precision: str) -> SDPBackend:
    """The SDPA kernel CUDA picks: flash (no s x s scores), or math for float64, which flash refuses."""
    return SDPBackend.MATH if precision == "64-true" else SDPBackend.FLASH_ATTENTION


def build_decoder(cfg: ModelConfig, precision: str) -> PrismDecoder:
    """The decoder as Lightning's precision plugin leaves it: made under the weights' dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(PRECISION_DTYPES[precision][0])
    try:
        return PrismDecoder(cfg)
    finally:
        torch.set_default_dtype(previous)


def autocast(precision: str) -> torch.autocast:
    dtype = PRECISION_DTYPES[precision][1]
    return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@functools.lru_cache(maxsize=128)
def simulate_step(shape: StepShape) -> Timeline:
    """The steady (second) step's timeline of two optimizer steps of the real decoder in fake CPU
    tensors, in Lightning's order (zero_grad after the first micro-batch's forward)."""
    with fake_tensor_mode(), sdpa_kernel([attention_backend(shape.precision)]):
        cfg, model = _fake_decoder(shape, True, None)
        # the device only picks fused or not: make_optimizer's flag is the config's `fused` here
        optimizer, _ = make_optimizer(model, {**OPTIMIZER, "fused": shape.fused}, 100, torch.device("cpu"))
        params = [p for p in model.parameters() if p.requires_grad]
        tracker = LiveStorages(model)
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p: tracker.move(p.grad, GRADS))
        start = 0
        with tracker:
            for step in range(SIMULATED_STEPS):
                start = tracker.ops
                # the first step only brings the optimizer state into being: one micro-batch
                steady = step == SIMULATED_STEPS - 1
                for micro in range(2 if shape.accumulating and steady else 1):
                    tracker.phase = FORWARD
                    x = torch.randint(0, cfg.vocab_size, (shape.micro_batch, cfg.seq_len))
                    with autocast(shape.precision):
                        loss = model(x, x)
                    tracker.end_forward()
                    if micro == 0:
                        optimizer.zero_grad(set_to_none=True)
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
        return Timeline(*tracker.timeline(start), *_sizes(model))


def _sizes(model: PrismDecoder) -> tuple[int, int, int, int]:
    """Timeline's param_bytes, root_bytes, block_bytes and largest_bytes of `model`."""
    params = [p.nbytes for p in model.parameters() if p.requires_grad]
    blocks = [sum(p.nbytes for p in b.parameters()) for b in model.blocks]
    return sum(params), sum(params) - sum(blocks), max(blocks), max(params)


@functools.lru_cache(maxsize=128)
def simulate_forward(model: str, batch: int, length: int, precision: str, head_rows: int) -> int:
    """Peak bytes an evaluation's forward adds to the weights, under inference_mode: the trunk and
    `head_rows` rows of float32 logits (zero-shot, long context), or with 0 the validation loss."""
    cfg = ModelConfig(**json.loads(model))
    with fake_tensor_mode(), sdpa_kernel([attention_backend(precision)]):
        decoder = build_decoder(cfg, precision).eval()
        tracker = LiveStorages(decoder)
        # inference_mode, as Lightning validates: no_grad would keep a second copy of the logits
        with tracker, torch.inference_mode(), autocast(precision):
            idx = torch.randint(0, cfg.vocab_size, (batch, length))
            if head_rows:
                h = decoder.hidden_states(idx).flatten(0, 1)
                logits = decoder.lm_head(h[:head_rows])[..., : cfg.vocab_size].float()
                logits.logsumexp(-1)
                del h, logits
            else:
                decoder(idx, idx)
            del idx
        samples = tracker.timeline()[0]
    return int((samples.sum(axis=1) - samples[:, PARAMS]).max())


# ----- compiled steps ----------------------------------------------------------------------------
# inductor's buffers over AOT autograd's partitioned graphs: an elementwise or view op fuses into its
# readers, unless an extern kernel or several readers read it; reductions and extern kernels write
REDUCTIONS = set("sum mean amax amin var_mean var prod max min any all logsumexp".split())
ELEMENTWISE = {"clone", "_to_copy", "convert_element_type", "full", "scalar_tensor", "embedding", "gather"}
ELEMENTWISE |= {"index", "where", "expand", "copy", "zeros_like", "ones_like", "full_like", "empty_like"}
ELEMENTWISE |= {"slice_scatter", "select_scatter"}  # inductor lowers these as elementwise with masks
SCATTERS = ("scatter", "scatter_add", "index_put", "_unsafe_masked_index_put_accumulate", "index_add")
REALIZE_READS = 4  # inductor's realize_reads_threshold: an elementwise result read this often is a buffer


def _op_kind(node, kinds: dict) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op != "call_function":
        return "other"
    if node.target is operator.getitem:
        return kinds[node.args[0]]
    name = op_name(node.target)
    if getattr(node.target, "is_view", False) or name in ("alias", "split", "unbind", "split_with_sizes"):
        return "view"
    tags = getattr(node.target, "tags", ())
    base = node.args[0] if node.args else None
    if name == "scatter" and op_name(getattr(base, "target", None)) == "full":
        return "elementwise"  # inductor's scatter_upon_const_tensor pass: where(iota == index, ...)
    if torch.Tag.pointwise in tags or name in ELEMENTWISE:
        return "elementwise"
    return "reduction" if name in REDUCTIONS else "extern"


def _traced_bytes(node) -> int:
    val = node.meta.get("val")
    return val.nbytes if isinstance(val, torch.Tensor) else 0


def graph_buffers(
    gm, inputs_live: bool, sizes_by_name: dict[str, int] | None = None
) -> tuple[int, dict[str, int], int]:
    """(peak live bytes, its split into "inputs" / "outputs" / "temporaries", outputs' bytes) of
    one partitioned graph under inductor's rules (above). `inputs_live`: the inputs count (a
    backward's saved tensors); `sizes_by_name`: node bytes by name (a derived micro-batch)."""
    nodes = list(gm.graph.nodes)

    def _node_bytes(n) -> int:
        return sizes_by_name[n.name] if sizes_by_name is not None else _traced_bytes(n)

    index = {n: i for i, n in enumerate(nodes)}
    kinds: dict = {}
    for n in nodes:
        kinds[n] = _op_kind(n, kinds)

    @functools.lru_cache(maxsize=None)
    def readers(n) -> tuple:  # the non-view nodes that read n, through its views
        found = []
        for u in n.users:
            found.extend(readers(u) if kinds[u] == "view" else [u])
        return tuple(found)

    end = len(nodes)
    outputs = {r for r in nodes if any(u.op == "output" for u in readers(r))}
    materialized = set()
    for n in nodes:
        kind, rs = kinds[n], readers(n)
        if kind in ("view", "other") or _node_bytes(n) == 0:
            continue
        if kind == "elementwise" and n not in outputs:
            onto = [r for r in rs if op_name(r.target) in SCATTERS and r.args[0] is n]
            if onto and len(rs) == 1:
                continue  # the scatter's own buffer
            if not any(kinds[r] == "extern" for r in rs) and len(rs) < REALIZE_READS:
                continue  # fused into its readers
        materialized.add(n)

    @functools.lru_cache(maxsize=None)
    def computed_at(n) -> int:
        if n in materialized or n.op == "output" or kinds[n] == "other":
            return index[n]
        return max((computed_at(r) for r in readers(n)), default=index[n])

    sizes, last, group = {}, {}, {}
    for n in materialized:
        if kinds[n] == "input" and not inputs_live:
            continue
        sizes[n] = _node_bytes(n)
        last[n] = end if n in outputs else max((computed_at(r) for r in readers(n)), default=index[n])
        group[n] = "inputs" if kinds[n] == "input" else "outputs" if n in outputs else "temporaries"
    live = {"inputs": sum(sizes[n] for n in sizes if kinds[n] == "input"), "outputs": 0, "temporaries": 0}
    frees: dict[int, list] = {}
    for n, i in last.items():
        frees.setdefault(i, []).append(n)
    peak, at_peak = sum(live.values()), dict(live)
    for i, n in enumerate(nodes):
        dying = frees.get(i, [])
        if n in sizes and kinds[n] != "input":
            reuse = next((m for m in dying if sizes[m] == sizes[n] and m not in outputs), None)
            if reuse is not None:  # written in place: the dying input's bytes change hands
                live[group[reuse]] -= sizes[reuse]
                dying = [m for m in dying if m is not reuse]
            live[group[n]] += sizes[n]
            if sum(live.values()) > peak:
                peak, at_peak = sum(live.values()), dict(live)
        for m in dying:
            live[group[m]] -= sizes[m]
    return peak, at_peak, sum(sizes[n] for n in outputs if n in sizes)


class _Tupled(torch.nn.Module):
    """AOT autograd takes modules that return tuples."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(x, y),)


# A deep decoder's graphs are composed from one- and two-block traces: both peak at the output head,
# where every block's saved tensors live, so each block adds its own worth (docs/performance.md).
COMPOSED_BASE = 1  # the blocks traced as the base of the composition


def _fake_decoder(shape: StepShape, training: bool, heads: tuple[int, ...] | None):
    """The decoder of `shape` with only the blocks of head counts `heads` (None: all), set up to run."""
    cfg = ModelConfig(**json.loads(shape.model))
    if heads is not None:
        cfg = replace(cfg, n_layer=len(heads), heads=list(heads))
    model = build_decoder(cfg, shape.precision)
    model.loss_chunk = shape.loss_chunk_tokens
    model.checkpoint_blocks = shape.activation_checkpointing
    model.train(training)
    return cfg, model


@functools.lru_cache(maxsize=64)
def traced_graphs(shape: StepShape, training: bool, heads: tuple[int, ...] | None) -> tuple:
    """The partitioned (forward, backward; None for inference) graphs of _fake_decoder's model."""
    with fake_tensor_mode(), sdpa_kernel([attention_backend(shape.precision)]):
        cfg, model = _fake_decoder(shape, training, heads)
        x = torch.randint(0, cfg.vocab_size, (shape.micro_batch, cfg.seq_len))
        grad = torch.enable_grad() if training else torch.inference_mode()
        with grad, autocast(shape.precision):
            return partitioned_graphs(_Tupled(model), (x, x))


def _numbers(graphs: tuple, training: bool, sizes: tuple | None = None) -> tuple[int, ...]:
    """Forward outputs and temporaries, backward inputs, outputs and temporaries at each graph's
    peak; an inference graph's peak and zeros."""
    forward, backward = graphs
    fw_sizes, bw_sizes = sizes or (None, None)
    if not training:
        return (graph_buffers(forward, False, fw_sizes)[0], 0, 0, 0, 0)
    _, fw, _ = graph_buffers(forward, False, fw_sizes)
    _, bw, _ = graph_buffers(backward, True, bw_sizes)
    return (fw["outputs"], fw["temporaries"], bw["inputs"], bw["outputs"], bw["temporaries"])


def _skeleton(gm) -> tuple:
    return tuple((n.op, n.name, str(n.target)) for n in gm.graph.nodes)


def _loss_chunks(shape: StepShape) -> int:
    """How many chunks the training loss takes: the graph's structure changes with it."""
    tokens = shape.micro_batch * ModelConfig(**json.loads(shape.model)).seq_len
    return -(-tokens // shape.loss_chunk_tokens) if shape.loss_chunk_tokens else 0


# Every node's bytes are affine in the micro-batch, the graph's structure the same: two traces give
# every other micro-batch by the line through them (docs/performance.md).
_REFERENCES: dict[tuple, list[int]] = {}  # the family of a shape -> the micro-batches traced


@functools.lru_cache(maxsize=1024)
def traced_graph_numbers(shape: StepShape, training: bool, heads: tuple[int, ...] | None) -> tuple[int, ...]:
    """_numbers of traced_graphs, traced or derived from two traces of the family (comment above)."""
    graph = replace(shape, accumulating=False, fused=True)  # the step's, not the graphs' settings
    if graph != shape:
        return traced_graph_numbers(graph, training, heads)
    family = (replace(shape, micro_batch=0), _loss_chunks(shape), training, heads)
    traced = _REFERENCES.setdefault(family, [])
    if shape.micro_batch not in traced:
        derived = _derived_numbers(shape, training, heads, traced[:2]) if len(traced) >= 2 else None
        if derived is not None:
            return derived
        traced.append(shape.micro_batch)
    return _numbers(traced_graphs(shape, training, heads), training)


def _derived_numbers(
    shape: StepShape, training: bool, heads, references: list[int]
) -> tuple[int, ...] | None:
    """traced_graph_numbers at shape.micro_batch from the two traced at `references`; None where
    their structures differ or a size is not on a line of whole bytes (then the caller traces)."""
    a, b = references
    ga = traced_graphs(replace(shape, micro_batch=a), training, heads)
    gb = traced_graphs(replace(shape, micro_batch=b), training, heads)
    m = shape.micro_batch
    sizes = []
    for x, y in zip(ga, gb, strict=True):
        if x is None:
            sizes.append(None)
            continue
        if _skeleton(x) != _skeleton(y):
            return None
        at: dict[str, int] = {}
        for nx, ny in zip(x.graph.nodes, y.graph.nodes, strict=True):
            sx, sy = _traced_bytes(nx), _traced_bytes(ny)
            step, rest = divmod((sy - sx) * (m - a), b - a)
            if rest or sx + step < 0:
                return None
            at[nx.name] = sx + step
        sizes.append(at)
    return _numbers(ga, training, tuple(sizes))


def compiled_graph_numbers(shape: StepShape, training: bool, whole: bool = False) -> np.ndarray:
    """_numbers of the whole decoder, composed from one- and two-block traces (`whole`: traced whole)."""
    heads = ModelConfig(**json.loads(shape.model)).heads
    if whole or len(heads) <= COMPOSED_BASE + 1:
        return np.array(traced_graph_numbers(shape, training, None), dtype=np.int64)
    last = tuple(heads[-COMPOSED_BASE:])
    base = np.array(traced_graph_numbers(shape, training, last), dtype=np.int64)
    total = base.copy()
    for h in heads[:-COMPOSED_BASE]:
        total += np.array(traced_graph_numbers(shape, training, (h, *last)), dtype=np.int64) - base
    return total


@functools.lru_cache(maxsize=128)
def simulate_compiled_step(shape: StepShape, whole: bool = False) -> Timeline:
    """The steady step of a compiled run, one row per moment that can hold the peak: each
    micro-batch's forward and backward graph at its peak (compiled_graph_numbers), then the update."""
    with torch.device("meta"):
        model = build_decoder(ModelConfig(**json.loads(shape.model)), shape.precision)
    params = [p for p in model.parameters() if p.requires_grad]
    weights = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
    sizes = _sizes(model)
    grads = sizes[0]
    fw_out, fw_tmp, bw_in, bw_out, bw_tmp = compiled_graph_numbers(shape, True, whole)
    # AdamW: two moments like each parameter, and a float32 step count per parameter
    state = 2 * grads + 4 * len(params)
    rows, phases = [], []

    def row(phase: int, grads_now: float, acts: float, other: float) -> None:
        rows.append([weights, grads_now, state, acts, 0, other])  # by PARTS, no autocast copies
        phases.append(phase)

    for micro in range(2 if shape.accumulating else 1):
        # the first micro-batch's forward runs beside the previous step's gradients (Lightning)
        row(FORWARD, grads, fw_out, fw_tmp)
        held = grads if micro else 0  # the second backward adds onto the first one's gradients
        row(BACKWARD, held + bw_out, bw_in, bw_tmp)
    row(UPDATE, grads, 0, 0)
    return Timeline(np.array(rows, dtype=np.int64), np.array(phases, dtype=np.int8), *sizes)


@functools.lru_cache(maxsize=128)
def simulate_compiled_forward(
    model: str, batch: int, length: int, precision: str, head_rows: int, whole: bool = False
) -> int:
    """The validation step of a compiled run: its inference graph's peak above the weights."""
    del head_rows  # compiled runs compile the validation step only; zero-shot scoring runs eager
    cfg = json.loads(model)
    cfg["seq_len"] = length
    shape = StepShape(json.dumps(cfg, sort_keys=True), batch, precision, False, 0, False, True)
    return int(compiled_graph_numbers(shape, False, whole)[0])


# ----- the plan of one job -----------------------------------------------------------------------
PHASE_NAMES = {p: p.replace("_", " ") for p in PHASES} | {"zero_shot": "in-loop zero-shot"}


@dataclass
class MemoryEstimate:
    micro_batch: int
    accumulation: int
    world_size: int
    strategy: str  # single | ddp | fsdp
    precision: str
    parts: dict[str, int]  # bytes by part at the training step's peak
    device_gib: float
    phases: dict[str, int]  # PHASES the job runs -> peak bytes
    evaluations: dict[str, int]  # separate jobs: long_context -> bytes
    in_loop_eval: bool  # train.eval_every_tokens > 0: the zero-shot scoring shares the job
    compiled: bool  # the run compiles (train.compile, auto on a GPU)
    untraced: tuple[str, ...]  # the settings of a compiled run that made the plan eager (UNTRACED)
    device: str  # where device_gib comes from, in words
    overhead_gib: float  # train.memory_overhead_gib
    fraction: float  # train.memory_fraction

    @property
    def traced(self) -> bool:
        """The steps planned are the compiled graphs (with COMPILED_ALLOWANCE)."""
        return self.compiled and not self.untraced

    @property
    def steps_text(self) -> str:
        if not self.compiled:
            return "eager steps"
        if self.untraced:
            keys = " and ".join(f"train.{k}" for k in self.untraced)
            return f"eager steps for a compiled run, whose {keys} the trace does not model"
        return f"compiled steps + {COMPILED_ALLOWANCE:.0%} allowance"

    @property
    def peak_bytes(self) -> int:
        """The training step's peak."""
        return sum(self.parts.values())

    @property
    def job_peak_bytes(self) -> int:
        """The job's peak: the highest of its phases."""
        return max([self.peak_bytes, *self.phases.values()])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda k: self.phases[k]) if self.phases else "train_step"

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def job_peak_gib(self) -> float:
        return self.job_peak_bytes / GIB

    @property
    def usable_gib(self) -> float:
        """What the tensors may fill: the device less the per-process overhead, times the fraction."""
        return max(0.0, (self.device_gib - self.overhead_gib) * self.fraction)

    @property
    def fits(self) -> bool:
        return self.job_peak_bytes / GIB <= self.usable_gib

    @property
    def margin_text(self) -> str:
        return (
            f"margin of {self.overhead_gib:g} GiB per process + {1 - self.fraction:.0%} of the rest "
            f"({self.usable_gib:,.1f} GiB usable)"
        )

    def to_dict(self) -> dict:
        return {
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "precision": self.precision,
            "keeps": precision_keeps(self.precision),
            "steps": "compiled" if self.traced else "eager",
            "compiled_run": self.compiled,
            "steps_text": self.steps_text,
            "peak_gib": round(self.job_peak_gib, 3),
            "peak_bytes": self.job_peak_bytes,
            "peak_phase": self.peak_phase,
            "train_step_gib": round(self.peak_gib, 3),
            "device_gib": self.device_gib,
            "device": self.device,
            "overhead_gib": self.overhead_gib,
            "fraction": self.fraction,
            "usable_gib": round(self.usable_gib, 3),
            "fits": self.fits,
            "in_loop_eval": self.in_loop_eval,
            "parts": _gib(self.parts),
            "phases": _gib(self.phases),
            "evaluations_gib": _gib(self.evaluations),
            "assumptions": list(ASSUMPTIONS),
        }

    def line(self) -> str:
        """The training job's plan in one line: the split, the job's peak and whether it fits."""
        parts = ", ".join(f"{k} {v / GIB:,.1f}" for k, v in self.parts.items())
        verdict = "fits" if self.fits else "does NOT fit"
        return (
            f"micro_batch {self.micro_batch} x accumulation {self.accumulation} ({self.precision}, "
            f"{self.steps_text}): peak {self.job_peak_gib:,.1f} GiB per device at the "
            f"{PHASE_NAMES[self.peak_phase]} (train step {self.peak_gib:,.1f}: {parts}); device "
            f"{self.device_gib:,.1f} GiB ({self.device}): {verdict} under the {self.margin_text}"
        )

    def phase_lines(self) -> list[str]:
        """One line per phase of the job: its peak per device."""
        return [f"{PHASE_NAMES[k]}: {v / GIB:,.2f} GiB" for k, v in self.phases.items()]


def _gib(sizes: dict[str, int]) -> dict[str, float]:
    return {k: round(v / GIB, 3) for k, v in sizes.items()}


def precision_keeps(precision: str) -> dict[str, str]:
    """What a precision keeps on the device, by part, in words (describe.py --json)."""
    weights, compute = PRECISION_DTYPES[precision]
    w = str(weights).removeprefix("torch.")
    keeps = {"weights": w, "gradients": w, "optimizer": f"AdamW's two moments in {w}"}
    if compute is not None:
        low = str(compute).removeprefix("torch.")
        keeps["autocast_copies"] = f"{low} copies of the weights, kept for the backward"
    keeps["loss"] = "float32 logits and loss"
    return keeps


def device_memory(cfg: RunConfig) -> tuple[float, str]:
    """The device's GiB and where that comes from: train.gpu_memory_gib, else the visible GPU's
    total memory, else the assumed card (the paper's H100 80GB, as torch reports it)."""
    if cfg.train.gpu_memory_gib is not None:
        return float(cfg.train.gpu_memory_gib), "train.gpu_memory_gib"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory / GIB, f"the visible {props.name}"
    return ASSUMED_CARD_GIB, f"assumed {ASSUMED_CARD}: no visible GPU, train.gpu_memory_gib unset"


def target_precision(cfg: RunConfig) -> str:
    """train.precision for the plan's target, a GPU unless train.accelerator=cpu (auto: bf16-mixed)."""
    precision = str(cfg.train.precision)
    if precision != "auto":
        return precision
    return "32-true" if str(cfg.train.accelerator).lower() == "cpu" else "bf16-mixed"


def planned_compile(cfg: RunConfig) -> bool:
    """Whether the run compiles: train.compile, whose auto is on unless train.accelerator=cpu."""
    if cfg.train.compile is not None:
        return bool(cfg.train.compile)
    return str(cfg.train.accelerator).lower() != "cpu"


def step_shape(cfg: RunConfig, micro_batch: int, accumulation: int, schedule: str) -> StepShape:
    return StepShape(
        json.dumps(cfg.model_config(schedule).to_dict(), sort_keys=True),
        micro_batch,
        target_precision(cfg),
        bool(cfg.train.activation_checkpointing),
        int(cfg.train.loss_chunk_tokens),
        accumulation > 1,
        True if cfg.train.fused is None else bool(cfg.train.fused),  # auto = fused on a GPU
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
    if target_precision(cfg) == "16-mixed":  # Lightning's GradScaler (scaler_bytes)
        steady, stepping = scaler_bytes()
        s[:, OTHER] += steady
        s[phase != FORWARD, OTHER] += stepping
    if not fused:  # foreach AdamW: sqrt(exp_avg_sq) of every parameter at once
        s[phase == UPDATE, OTHER] += timeline.param_bytes / (world_size if kind == "fsdp" else 1)
    return s


def scaler_bytes() -> tuple[int, int]:
    """What 16-mixed's GradScaler adds: (always: the fp32 scale and int32 growth tracker; from the
    backward to the update: the scaled loss, found_inf and the inverse scale)."""
    return 4 + 4, 4 + 4 + 4


def estimate_memory(
    cfg: RunConfig,
    world_size: int,
    micro_batch: int | None = None,
    long_context_length: int | None = None,
    schedule: str | None = None,
    split: BatchPlan | None = None,
) -> MemoryEstimate:
    """The peak per device, by phase, of cfg's training job on `world_size` devices at `micro_batch`
    (None: the batch split), and of the long-context job at `long_context_length` tokens if given;
    `schedule` is the variant simulated (default uniform, whose plan every variant shares); `split`:
    the batch plan, when the caller has it (default: batch_plan's)."""
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
    # FSDP2 (prism.train.strategy's name, not imported here: it imports Lightning)
    kind = "fsdp" if str(cfg.train.strategy) == "fsdp" else "ddp" if world_size > 1 else "single"
    compiled = planned_compile(cfg)
    untraced = tuple(k for k in UNTRACED if compiled and getattr(shape, k))
    traced = compiled and not untraced
    timeline = simulate_compiled_step(shape) if traced else simulate_step(shape)
    s = strategy_parts(timeline, kind, world_size, cfg, shape.fused)
    peak = int(np.argmax(s.sum(axis=1)))
    parts = {name: int(s[peak, i]) for i, name in enumerate(PARTS)}
    if PRECISION_DTYPES[shape.precision][1] is None:
        del parts["autocast_copies"]  # a -true precision keeps none
    if traced:
        parts["compiled_allowance"] = int(COMPILED_ALLOWANCE * sum(parts.values()))
    # between steps: the weights, the optimizer state and the gradients; FSDP gathers to compute
    shards = world_size if kind == "fsdp" else 1
    resident = int(s[-1][[PARAMS, OPTIM]].sum()) + timeline.param_bytes // shards
    if shape.precision == "16-mixed":
        resident += scaler_bytes()[0]
    unsharded = 1 - 1 / shards  # the share of a tensor that FSDP gathers from the other ranks
    gathered = int((timeline.root_bytes + 2 * timeline.block_bytes) * unsharded)
    forward = simulate_compiled_forward if compiled else simulate_forward
    validation = (
        resident + gathered + forward(shape.model, micro_batch, cfg.model.seq_len, shape.precision, 0)
    )
    phases = {
        "train_step": sum(parts.values()),
        # traced whatever the training step's settings (it neither checkpoints nor chunks its loss)
        "validation": int(validation * (1 + COMPILED_ALLOWANCE)) if compiled else validation,
    }
    in_loop = bool(cfg.train.eval_every_tokens)
    if in_loop:  # zero-shot scoring runs eager (prism.eval.engine), between steps
        bs, seq = int(cfg.eval.batch_size), cfg.model.seq_len
        rows = min(EVAL_HEAD_CHUNK, bs * seq)
        scoring = simulate_forward(shape.model, bs, seq, shape.precision, rows)
        phases["zero_shot"] = resident + gathered + scoring
    # the checkpoint: torch.save copies the device's tensors; FSDP2 gathers one tensor at a time
    phases["checkpoint_save"] = resident + int(timeline.largest_bytes * unsharded)
    evaluations = {}
    if long_context_length:
        evaluations["long_context"] = long_context_peak(cfg, shape.model, long_context_length)
    device, source = device_memory(cfg)
    return MemoryEstimate(
        micro_batch,
        accumulation,
        world_size,
        kind,
        shape.precision,
        parts,
        device,
        phases,
        evaluations,
        in_loop,
        compiled,
        untraced,
        source,
        float(cfg.train.memory_overhead_gib),
        float(cfg.train.memory_fraction),
    )


def long_context_peak(cfg: RunConfig, model: str, length: int) -> int:
    """The long-context job on one device: float32 weights, one document of `length` tokens, and
    by formula its attention-distance hook's qkv, rotated q, k and a block of scores for the widest layer."""
    params = 4 * _param_count(model)
    heads = max(max(cfg.head_schedule(s).heads) for s in cfg.run_schedules)  # the widest of the runs
    hook = 4 * (5 * length * cfg.model.d_model + 3 * heads * LONG_QUERY_BLOCK * length)
    trunk = simulate_forward(model, 1, length, "32-true", min(LONG_LOGIT_CHUNK, length))
    return int(params + trunk + hook)


@functools.lru_cache(maxsize=16)
def _param_count(model: str) -> int:
    with torch.device("meta"):
        decoder = PrismDecoder(ModelConfig(**json.loads(model)))
    return sum(p.numel() for p in decoder.parameters()) + sum(b.numel() for b in decoder.buffers())


# ----- choosing the micro-batch ------------------------------------------------------------------
def fit_micro_batch(cfg: RunConfig, world_size: int, split: BatchPlan | None = None) -> MemoryEstimate:
    """The largest micro-batch dividing each device's share whose job's peak fits under the margin,
    trying every divisor (the peak need not grow with it); a ConfigError naming the ways out if none."""
    split = split or batch_plan(cfg, world_size)
    share = split.micro_batch * split.accumulation
    tried = []
    for m in sorted((m for m in range(1, share + 1) if share % m == 0), reverse=True):
        estimate = estimate_memory(cfg, world_size, m, split=split)
        if estimate.fits:
            return estimate
        tried.append(estimate)
    raise ConfigError(refusal(cfg, min(tried, key=lambda e: e.job_peak_bytes)))


def _remedies(cfg: RunConfig, least: MemoryEstimate) -> list[tuple[str, MemoryEstimate]]:
    """The settings that lower the job's peak, each with its estimate at the same micro-batch."""
    t = cfg.train
    world = least.world_size
    tries: list[tuple[str, RunConfig, int]] = []

    def setting(**values) -> RunConfig:
        return replace(cfg, train=replace(t, **values))

    if not t.activation_checkpointing:
        tries.append(("train.activation_checkpointing=true", setting(activation_checkpointing=True), world))
    tokens = least.micro_batch * cfg.model.seq_len
    chunk = max(1, tokens // 4)
    if not t.loss_chunk_tokens or int(t.loss_chunk_tokens) >= tokens:  # a chunk below a micro-batch's tokens
        tries.append((f"train.loss_chunk_tokens={chunk}", setting(loss_chunk_tokens=chunk), world))
    if not least.compiled and t.compile is False:
        tries.append(("train.compile=true", setting(compile=True), world))
    if world > 1 and least.strategy != "fsdp":  # sharding helps only over several ranks
        tries.append(("train.strategy=fsdp", setting(strategy="fsdp"), world))
    if least.strategy == "fsdp":  # more ranks, smaller shards
        tries.append((f"{2 * world} devices", cfg, 2 * world))
    found = []
    for text, other, world in tries:
        try:
            split = batch_plan(other, world)
            share = split.micro_batch * split.accumulation
            m = least.micro_batch if share % least.micro_batch == 0 else 1
            estimate = estimate_memory(other, world, m, split=split)
        except ConfigError:
            continue
        if estimate.job_peak_bytes < least.job_peak_bytes:
            found.append((text, estimate))
    return found


def refusal(cfg: RunConfig, least: MemoryEstimate) -> str:
    """Why no micro-batch fits (`least`: the lowest peak), and what each setting that lowers it gives."""
    remedies = _remedies(cfg, least)
    if remedies:
        ways = [f"{text} ({e.job_peak_gib:,.1f} GiB{', fits' if e.fits else ''})" for text, e in remedies]
        advice = "; what lowers it: " + ", ".join(ways) + ", or a device with more memory."
    else:
        advice = "; no setting the plan knows lowers it: use a device with more memory."
    return (
        f"{cfg.scale} needs {least.job_peak_gib:,.1f} GiB per device at its lowest (micro-batch "
        f"{least.micro_batch}, at the {PHASE_NAMES[least.peak_phase]}; {least.precision}, "
        f"{least.steps_text}, {least.strategy}, {least.world_size} device(s)), more than the "
        f"{least.usable_gib:,.1f} GiB usable of {least.device_gib:g} GiB ({least.device}) under the "
        f"{least.margin_text.split(' (')[0]}" + advice
    )


def occupied_warning(estimate: MemoryEstimate, free_bytes: int, total_bytes: int) -> str | None:
    """A warning when another process holds device memory the plan counted on, else None."""
    usable = (free_bytes / GIB - estimate.overhead_gib) * estimate.fraction
    if estimate.job_peak_bytes / GIB <= usable:
        return None
    return (
        f"warning: the device has {free_bytes / GIB:,.1f} of its {total_bytes / GIB:,.1f} GiB free (another "
        f"process holds {(total_bytes - free_bytes) / GIB:,.1f} GiB), but the memory plan's peak of "
        f"{estimate.job_peak_bytes / GIB:,.1f} GiB at micro_batch {estimate.micro_batch} needs "
        f"{estimate.job_peak_bytes / GIB / estimate.fraction + estimate.overhead_gib:,.1f} GiB free: "
        "this run may run out of memory."
    )
