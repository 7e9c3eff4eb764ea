"""One prepared GPU check, time-boxed section by section (under 10 minutes on one H200):

  backends   the SDPA backend PyTorch uses for d_h = 256, 128, 96, 64 in bf16 (dispatcher
             choice, which backends run at all, their fwd+bwd time, profiler kernel names)
  bench-S    uniform vs Prism at scale S (124m, 354m, 757m): full training steps, one micro-batch,
             bf16 autocast, torch.compile(fullgraph=True), interleaved; tokens/s, MFU, ratio.
             124m compiles the whole model (as training does); the deeper 354m/757m compile each
             block alone by default (--full-compile for all) so they fit the time box.
  overhead   the Lightning training path vs a plain PyTorch loop at the first scale (124m):
             same model, batches, precision and compile (dev/overhead.py), alternating rounds
  microbatch uniform training steps at the first scale with micro-batch 1x, 1.5x and 2x the
             default (32, 48, 64 at 124m): tokens/s and MFU each, and the largest one again with
             the chunked output layer + loss (train.loss_chunk_tokens) on
  numerics   124m Prism logits in bf16 autocast vs fp32 on the same input, compiled vs eager
  fsdp       train.strategy=fsdp end to end: the shrunken tiny run under FSDP2 and under DDP
             on the same devices (2 where there are, else 1), bf16-mixed + compile + fused
             AdamW on a GPU; the validation curves side by side, the export gathered and equal
             to last.ckpt, tokens/s and peak memory of each (CPU: 2 gloo ranks, 32-true)
  memory     the memory plan (prism.train.memory) against torch.cuda.max_memory_allocated: 124m
             and 354m at two micro-batches each, eager and compiled (block by block), the ratio
             of each; then the micro-batch the plan picks for this GPU and two steps at it (CPU:
             the estimates, the pick and two steps at it, without a measured peak)
  fullgraph  torch.compile(fullgraph=True) forward + backward of the whole 354m and 757m Prism
             models (124m's is the bench itself), with the time --total-s leaves over

Every section runs in its own process with a deadline, so a hang or a crash loses only that
section; results are merged into $OUT/gpu_check.json after each one and the log goes to
$OUT/gpu_check.log. Compiling the Prism schedules with fullgraph=True is itself a check: a graph
break is recorded as `compile_error` in the bench sections.

    OUT=/tmp/out python dev/gpu_check.py
    python dev/gpu_check.py --scales tiny --device cpu --steps 2 --out /tmp/gc   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prism.io import atomic_write_text  # noqa: E402  (the parent reads partial results)

MICRO_BATCH = {"tiny": 4, "124m": 32, "354m": 16, "757m": 16}
BUDGET_S = {
    "backends": 25,
    "bench-124m": 120,
    "overhead": 110,
    "microbatch": 140,
    "numerics": 50,
    "bench-354m": 60,
    "bench-757m": 60,
    "fsdp": 180,
    "memory": 150,
    "fullgraph": 150,
}  # fullgraph runs last, in whatever is left of --total-s
LOSS_CHUNK_TOKENS = 8192  # the chunked loss's setting measured by `microbatch`


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----- sections (each runs in a child process) -----------------------------------------------
def section_backends(args) -> dict:
    import statistics

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from prism.measure.bench import BACKEND_NAMES, attention_kernels, sdpa_backend

    dev = torch.device(args.device)
    dtype = torch.bfloat16
    B, T, width = 8, (1024 if dev.type == "cuda" else 128), 1536
    out = {
        "shape": {"batch": B, "seq_len": T, "d_model": width},
        "dtype": "bfloat16",
        "torch": torch.__version__,
        "head_dims": {},
    }
    for attr in (
        "_get_flash_sdp_enabled",
        "_get_cudnn_sdp_enabled",
        "_get_fa3_sdp_enabled",
        "_get_sdp_priority_order",
    ):
        if hasattr(torch._C, attr):
            value = getattr(torch._C, attr)()
            out[attr.lstrip("_")] = [int(v) for v in value] if isinstance(value, (list, tuple)) else value

    def fwd_bwd(q, k, v):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    for dh in (256, 128, 96, 64):
        h = width // dh
        q, k, v = (torch.randn(B, h, T, dh, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        entry = {"heads": h, "dispatch": sdpa_backend(B, h, T, dh, dev, dtype), "backends": {}}
        timer_sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        for backend, name in BACKEND_NAMES.items():
            try:
                with sdpa_kernel([backend]):
                    fwd_bwd(q, k, v)
                    times = []
                    for _ in range(5):
                        timer_sync()
                        t0 = time.perf_counter()
                        fwd_bwd(q, k, v)
                        timer_sync()
                        times.append(time.perf_counter() - t0)
                entry["backends"][name] = {"runs": True, "fwd_bwd_ms": 1e3 * statistics.median(times)}
            except Exception as exc:  # a backend that cannot take this shape raises
                entry["backends"][name] = {"runs": False, "why": str(exc).splitlines()[0][:200]}
        entry["default_kernels"] = attention_kernels(lambda: fwd_bwd(q, k, v), dev)  # noqa: B023 (called here)
        entry["flash_ok"] = entry["backends"]["flash"]["runs"]
        out["head_dims"][str(dh)] = entry
        log(f"  d_h={dh}: dispatch={entry['dispatch']} kernels={entry['default_kernels'][:3]}")
    return out


def section_bench(args, scale: str) -> dict:
    from prism.config.schema import load_config
    from prism.measure.bench import BenchSettings, run_benchmark

    run = load_config(scale)
    cfgs = {n: run.model_config(n) for n in ("uniform", "prism")}
    regional = scale not in ("124m", "tiny") and not args.full_compile
    s = BenchSettings(
        steps=args.steps,
        warmup=args.warmup,
        infer_steps=args.infer_steps,
        micro_batch=MICRO_BATCH[scale],
        seq_len=run.model.seq_len,
        device=args.device,
        compile=args.compile,
        fullgraph=True,
        compile_mode="regional" if regional else "full",
    )
    res = run_benchmark(cfgs, s, progress=lambda m: log("  " + m))
    res["scale"] = scale
    for name, r in res["schedules"].items():
        log(
            f"  {scale} {name}: {r['train_tokens_per_s']:,.0f} tok/s, "
            f"MFU {r['mfu'] if r['mfu'] is None else round(100 * r['mfu'], 1)} %, "
            f"ratio {r['ratio_to_uniform']:.4f} {r['ratio_to_uniform_spread']}, "
            f"backends {sorted(set(r['attention_backends']))}, compile_error={r['compile_error']}"
        )
    return res


def section_overhead(args) -> dict:
    """Lightning vs plain loop (dev/overhead.py's measure_overhead) at the first scale."""
    import importlib.util

    from prism.config.schema import load_config

    spec = importlib.util.spec_from_file_location("overhead", Path(__file__).with_name("overhead.py"))
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    measure_overhead = overhead.measure_overhead

    scale = args.scales[0]
    mb = MICRO_BATCH[scale]
    cfg = load_config(
        scale,
        [
            f"train.micro_batch={mb}",
            "data.source=offline",  # no hub needed
            f"train.global_batch_tokens={4 * mb * load_config(scale).model.seq_len}",
            f"train.compile={'true' if args.compile else 'false'}",
            f"train.accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        ],
    )
    res = measure_overhead(cfg, steps=max(4, args.steps // 2), warmup=2, rounds=2)  # accumulation 4
    log(f"  {scale} Lightning / plain loop: {res['ratio']:.4f} (rounds {res['round_ratios']})")
    return res


def section_microbatch(args) -> dict:
    """Uniform training steps at micro-batch 1x, 1.5x, 2x the default, then the largest with the
    chunked output layer + loss: which micro-batch gives the highest MFU, and whether the
    chunked loss is faster there."""
    from prism.config.schema import load_config
    from prism.measure.bench import BenchSettings, run_benchmark

    scale = args.scales[0]
    run = load_config(scale)
    base = MICRO_BATCH[scale]
    trials = [(mb, 0) for mb in (base, base * 3 // 2, base * 2)] + [(base * 2, LOSS_CHUNK_TOKENS)]
    out: dict = {"scale": scale, "schedule": "uniform", "trials": []}
    for mb, chunk in trials:
        s = BenchSettings(
            steps=max(2, args.steps // 2),
            warmup=args.warmup,
            infer_steps=0,
            micro_batch=mb,
            seq_len=run.model.seq_len,
            device=args.device,
            compile=args.compile,
            fullgraph=True,
            loss_chunk=chunk,
        )
        try:
            r = run_benchmark({"uniform": run.model_config("uniform")}, s, progress=lambda m: log("  " + m))[
                "schedules"
            ]["uniform"]
            entry = {
                "micro_batch": mb,
                "loss_chunk_tokens": chunk,
                "tokens_per_s": r["train_tokens_per_s"],
                "mfu": r["mfu"],
                "step_time_s_median": r["step_time_s_median"],
                "peak_memory_bytes": r["peak_memory_bytes"],
                "compile_error": r["compile_error"],
            }
        except Exception as exc:  # e.g. out of memory at the largest micro-batch: a finding
            entry = {
                "micro_batch": mb,
                "loss_chunk_tokens": chunk,
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            }
        out["trials"].append(entry)
        log(f"  micro-batch {mb}, loss chunk {chunk}: {entry}")
        atomic_write_text(args.result, json.dumps({"ok": True, "partial": True, **out}, indent=2))
        import torch

        if args.device == "cuda":
            torch.cuda.empty_cache()
    ok = [t for t in out["trials"] if t.get("mfu") is not None or t.get("tokens_per_s")]
    if ok:
        best = max(
            (t for t in ok if t["loss_chunk_tokens"] == 0), key=lambda t: t["tokens_per_s"], default=None
        )
        out["best_micro_batch"] = best and best["micro_batch"]
        plain = next((t for t in ok if t["micro_batch"] == base * 2 and t["loss_chunk_tokens"] == 0), None)
        chunked = next((t for t in ok if t["loss_chunk_tokens"]), None)
        if plain and chunked:
            out["chunked_over_plain_tokens_per_s"] = chunked["tokens_per_s"] / plain["tokens_per_s"]
    return out


def section_numerics(args) -> dict:
    import torch

    from prism.config.schema import load_config
    from prism.measure.bench import build_model

    scale = "124m" if "124m" in args.scales or args.device == "cuda" else args.scales[0]
    run = load_config(scale)
    cfg = run.model_config("prism")
    dev = torch.device(args.device)
    model = build_model(cfg, dev, seed=0).eval()
    B = MICRO_BATCH[scale]  # the bench's inference shape, so the compile cache can be reused
    T = run.model.seq_len
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def stats(a, b):
        d = (a.float() - b.float()).abs()
        return {
            "max_abs_diff": d.max().item(),
            "mean_abs_diff": d.mean().item(),
            "ref_abs_mean": b.float().abs().mean().item(),
            "ref_std": b.float().std().item(),
        }

    out = {
        "scale": scale,
        "schedule": cfg.schedule.text(),
        "batch": B,
        "seq_len": T,
        "weights": "random init, seed 0 (GPT-2 init)",
    }
    with torch.no_grad():
        ref = model(x).float()
        ref_loss = torch.nn.functional.cross_entropy(ref.flatten(0, 1), y.flatten()).item()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            bf = model(x)
        bf_loss = torch.nn.functional.cross_entropy(bf.float().flatten(0, 1), y.flatten()).item()
        out["bf16_vs_fp32"] = {
            **stats(bf, ref),
            "loss_fp32": ref_loss,
            "loss_bf16": bf_loss,
            "loss_diff": bf_loss - ref_loss,
        }
        log(f"  bf16 vs fp32: {out['bf16_vs_fp32']}")
        del ref
        if args.compile:
            compiled = torch.compile(model, fullgraph=True, dynamic=False)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                cbf = compiled(x)
            cbf_loss = torch.nn.functional.cross_entropy(cbf.float().flatten(0, 1), y.flatten()).item()
            out["compiled_vs_eager_bf16"] = {
                **stats(cbf, bf),
                "loss_compiled": cbf_loss,
                "loss_eager": bf_loss,
                "loss_diff": cbf_loss - bf_loss,
            }
            log(f"  compiled vs eager (bf16): {out['compiled_vs_eager_bf16']}")
    if args.compile:
        # The training graph (bf16 autocast, the bench's shape, so its compile cache is reused):
        # loss and gradients, compiled vs eager.
        model.train()

        def loss_and_grads(fn):
            model.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = fn(x, y)
            loss.backward()
            return loss.item(), [p.grad.float().clone() for p in model.parameters()]

        loss_e, grads_e = loss_and_grads(model)
        loss_c, grads_c = loss_and_grads(torch.compile(model, fullgraph=True, dynamic=False))
        rel = max(((c - e).norm() / e.norm().clamp_min(1e-30)).item() for c, e in zip(grads_c, grads_e))
        out["compiled_vs_eager_bf16_train"] = {
            "loss_eager": loss_e,
            "loss_compiled": loss_c,
            "loss_diff": loss_c - loss_e,
            "max_rel_grad_diff": rel,
        }
        log(f"  compiled vs eager (bf16 fwd+bwd): {out['compiled_vs_eager_bf16_train']}")
    return out


def section_fullgraph(args) -> dict:
    """torch.compile(fullgraph=True) of the whole Prism model, forward + backward in bf16, for
    the scales the bench compiled block by block (124m's bench already compiles it whole).
    Written after each scale, so a time-out keeps the scales already done."""
    import torch

    from prism.config.schema import load_config
    from prism.measure.bench import build_model

    dev = torch.device(args.device)
    out: dict = {"batch": 1, "scales": {}}
    for scale in [s for s in args.scales if s not in ("124m",)] or args.scales:
        run = load_config(scale)
        cfg = run.model_config("prism")
        model = build_model(cfg, dev, seed=0)
        x = torch.randint(0, cfg.vocab_size, (1, run.model.seq_len + 1), device=dev)
        t0 = time.perf_counter()
        try:
            fn = torch.compile(model, fullgraph=True, dynamic=False)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = fn(x[:, :-1], x[:, 1:])
            loss.backward()
            finite = all(
                p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters()
            )
            entry = {
                "ok": finite,
                "schedule": cfg.schedule.text(),
                "loss": loss.item(),
                "grads_finite": finite,
            }
        except Exception as exc:
            entry = {
                "ok": False,
                "schedule": cfg.schedule.text(),
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            }
        entry["compile_and_step_s"] = round(time.perf_counter() - t0, 1)
        out["scales"][scale] = entry
        log(f"  {scale} prism fullgraph fwd+bwd: {entry}")
        atomic_write_text(args.result, json.dumps({"ok": True, "partial": True, **out}, indent=2))
        del model, fn
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


# test_train's shrunken tiny run: 12 steps of 4 x 32 tokens, validation at 0, 6 and 12
FSDP_RUN = [
    "--scale",
    "tiny",
    "--schedule",
    "prism",
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=1536",
    "train.lr=3e-3",
    "train.val_every_steps=6",
    "train.ckpt_every_steps=6",
    "data.val_tokens=256",
]


def measured_step_peak(cfg, micro_batch: int, compiled: bool, device, steps: int = 3) -> int | None:
    """max_memory_allocated of `steps` optimizer steps of two micro-batches each (the estimate's
    steady step accumulates too) in Lightning's order (zero_grad after a step's first forward),
    bf16 autocast and fused AdamW as training runs them, the whole model compiled as the kit
    compiles it; on a CPU, the steps run and None is returned (no allocator statistics)."""
    import torch

    from prism.config.schema import to_dict
    from prism.core.model import PrismDecoder
    from prism.train.optim import make_optimizer

    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = PrismDecoder(cfg.model_config("uniform")).to(device)
    optimizer, _ = make_optimizer(model, to_dict(cfg)["train"], 100, device)
    if compiled:
        model.compile(dynamic=False)  # prism.train.module.PrismLightningModule.configure_model
    for _ in range(steps):
        for i in range(2):
            x = torch.randint(0, cfg.model.vocab_size, (micro_batch, cfg.model.seq_len), device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
                loss = model(x, x)
            if i == 0:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    peak = torch.cuda.max_memory_allocated() if gpu else None
    del model, optimizer
    return peak


def measured_validation_peak(cfg, micro_batch: int, compiled: bool, device) -> int | None:
    """max_memory_allocated of a validation pass as Lightning runs it (eval mode, inference_mode,
    the model's own unchunked loss) after a training step, so that the gradients and AdamW state
    are there; None on a CPU."""
    import torch

    from prism.config.schema import to_dict
    from prism.core.model import PrismDecoder
    from prism.train.optim import make_optimizer

    gpu = device.type == "cuda"
    model = PrismDecoder(cfg.model_config("uniform")).to(device)
    optimizer, _ = make_optimizer(model, to_dict(cfg)["train"], 100, device)
    if compiled:
        model.compile(dynamic=False)
    x = torch.randint(0, cfg.model.vocab_size, (micro_batch, cfg.model.seq_len), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        model(x, x).backward()
    optimizer.step()
    model.eval()
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        model(x, x)  # the compile of the inference graph, outside the measurement
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        model(x, x)
    peak = torch.cuda.max_memory_allocated() if gpu else None
    del model, optimizer
    return peak


def section_memory(args) -> dict:
    """The memory plan (prism.train.memory) against torch.cuda.max_memory_allocated at 124m and
    354m, two micro-batches each, eager then compiled; then the micro-batch the plan picks for
    this device (prism.train.memory.fit_micro_batch) and a few steps at it. Partial results go to
    the result file after each measurement, so a timed-out section keeps what it measured."""
    import torch

    from prism.config.schema import load_config
    from prism.train.memory import GIB, estimate_memory, fit_micro_batch

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    gib = torch.cuda.get_device_properties(device).total_memory / GIB if gpu else 80.0
    scales = [s for s in args.scales if s in ("124m", "354m")] or args.scales[:1]
    out: dict = {"device_gib": gib, "compile_mode": "whole model", "trials": []}

    def keep() -> None:
        atomic_write_text(args.result, json.dumps({"ok": True, "partial": True, **out}, default=str))

    trials = [
        (s, mb, c) for c in (False, True) for s in scales for mb in (MICRO_BATCH[s] // 2, MICRO_BATCH[s])
    ]
    for scale, mb, compiled in trials:
        if compiled and not args.compile:
            continue
        overrides = [f"train.gpu_memory_gib={gib}", "train.precision=bf16-mixed", f"train.compile={compiled}"]
        cfg = load_config(scale, overrides)
        t0 = time.perf_counter()
        estimate = estimate_memory(cfg, 1, mb)
        estimate_s = time.perf_counter() - t0
        validation = None
        try:  # a CPU has no allocator statistics: its trials are the estimates alone
            measured = measured_step_peak(cfg, mb, compiled, device) if gpu else None
            validation = measured_validation_peak(cfg, mb, compiled, device) if gpu else None
        except Exception as exc:  # an out-of-memory or a compile failure is this trial's result
            measured, error = (
                None,
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            )
        else:
            error = None
        trial = {
            "scale": scale,
            "micro_batch": mb,
            "compiled": compiled,
            "estimate_gib": estimate.peak_gib,
            "estimate_s": round(estimate_s, 2),
            "parts_gib": {k: v / GIB for k, v in estimate.parts.items()},
            "measured_gib": None if measured is None else measured / GIB,
            "ratio": None if measured is None else estimate.peak_bytes / measured,
            "validation_estimate_gib": estimate.phases["validation"] / GIB,
            "validation_measured_gib": None if validation is None else validation / GIB,
            "validation_ratio": None if validation is None else estimate.phases["validation"] / validation,
            "error": error,
        }
        out["trials"].append(trial)
        log(
            f"  {scale} mb {mb} {'compiled' if compiled else 'eager'}: estimate "
            f"{trial['estimate_gib']:.2f} GiB, "
            f"measured {trial['measured_gib']}, ratio {trial['ratio']}; validation ratio "
            f"{trial['validation_ratio']}"
        )
        keep()
        if not compiled and scale == scales[0] and mb == MICRO_BATCH[scale]:
            cfg_auto = load_config(
                scale, [f"train.gpu_memory_gib={gib}", "train.precision=bf16-mixed", "train.compile=false"]
            )
            chosen = fit_micro_batch(cfg_auto, 1)
            try:
                peak, error = measured_step_peak(cfg_auto, chosen.micro_batch, False, device, steps=2), None
            except Exception as exc:  # out of memory at the chosen micro-batch: the check's finding
                peak, error = (
                    None,
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                )
            out["auto"] = {
                "scale": scale,
                "micro_batch": chosen.micro_batch,
                "accumulation": chosen.accumulation,
                "estimate_gib": chosen.peak_gib,
                "measured_gib": None if peak is None else peak / GIB,
                "steps_ran": 0 if error else 2,
                "error": error,
            }
            log(f"  auto at {scale}: {chosen.line()}; measured {out['auto']['measured_gib']}")
            keep()
    ratios = [t["ratio"] for t in out["trials"] if t["ratio"] is not None]
    out["ratio_range"] = [min(ratios), max(ratios)] if ratios else None
    return out


def section_fsdp(args) -> dict:
    """The same run under train.strategy=fsdp and =ddp (each a training process of its own,
    which starts its other rank itself); what each measured, and how far their losses are."""
    import tempfile

    import torch

    from prism.runs.checkpoint import load_model

    gpu = args.device.startswith("cuda")
    devices = min(2, torch.cuda.device_count()) if gpu else 2
    settings = [
        f"train.accelerator={'gpu' if gpu else 'cpu'}",
        f"train.devices={devices}",
        f"train.compile={'true' if args.compile else 'false'}",
    ]
    out: dict = {"devices": devices, "settings": settings, "runs": {}}
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("fsdp", "ddp"):
            runs = Path(tmp) / strategy
            cmd = [sys.executable, str(repo / "reproduce" / "train.py"), *FSDP_RUN, *settings]
            cmd += [f"train.strategy={strategy}", f"runs_dir={runs}"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
            if proc.returncode != 0:
                raise RuntimeError(f"{strategy} run failed: {proc.stderr.strip().splitlines()[-1:]}")
            run_dir = runs / "tiny" / "prism" / "seed0"
            summary = json.loads((run_dir / "train_summary.json").read_text())
            exported = load_model(run_dir)[0].state_dict()
            last = load_model(run_dir / "checkpoints" / "last.ckpt")[0].state_dict()
            out["runs"][strategy] = {
                "val_curve": [(p["step"], p["val_loss"]) for p in summary["val_curve"]],
                "tokens_per_s": summary["throughput"]["tokens_per_s"],
                "peak_memory_bytes": summary["throughput"]["peak_memory_bytes"],
                "export_equals_last_ckpt": all(torch.equal(exported[k], last[k]) for k in exported),
            }
            log(f"  {strategy}: val {out['runs'][strategy]['val_curve']}")
    fsdp, ddp = out["runs"]["fsdp"], out["runs"]["ddp"]
    diff = max(abs(a[1] - b[1]) for a, b in zip(fsdp["val_curve"], ddp["val_curve"]))
    # fp32 (CPU): the runs differ only in the last bits of the clip factor, which tests/test_fsdp.py
    # bounds by 1e-4 in validation loss. bf16 autocast (GPU): compiled graphs break at FSDP's
    # hooks, so kernels fuse differently and bf16 rounds differently; bf16 keeps 8 significant
    # bits, so one rounding of a loss near 10 is 10 * 2**-8 = 0.04.
    tolerance = 10 * 2**-8 if gpu else 1e-4
    out.update(max_val_loss_diff=diff, tolerance=tolerance, matches=diff <= tolerance)
    out["ok"] = out["matches"] and fsdp["export_equals_last_ckpt"]
    log(f"  fsdp vs ddp: max |val loss diff| {diff:.3g} (tolerance {tolerance:.3g})")
    return out


def run_section(args, name: str) -> dict:
    if name == "fsdp":
        return section_fsdp(args)
    if name == "backends":
        return section_backends(args)
    if name == "numerics":
        return section_numerics(args)
    if name == "fullgraph":
        return section_fullgraph(args)
    if name == "overhead":
        return section_overhead(args)
    if name == "microbatch":
        return section_microbatch(args)
    if name == "memory":
        return section_memory(args)
    return section_bench(args, name.split("-", 1)[1])


# ----- the parent: run each section in a child with a deadline --------------------------------
def child(args) -> int:
    import traceback

    import torch

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        result = {"ok": True, **run_section(args, args.section)}
    except Exception as exc:
        traceback.print_exc()
        result = {
            "ok": False,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        }
    atomic_write_text(args.result, json.dumps(result, indent=2, default=str))
    return 0


def stream(cmd: list[str], deadline_s: float, logf) -> tuple[int | None, float]:
    """Run `cmd`, echoing and logging its output; kill its process group at the deadline."""
    import selectors

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
    )
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        left = deadline_s - (time.perf_counter() - t0)
        if left <= 0:
            os.killpg(proc.pid, 9)
            proc.wait()
            return None, time.perf_counter() - t0
        if sel.select(timeout=min(left, 1.0)):
            line = proc.stdout.readline()
            if line:
                print(line, end="", flush=True)
                logf.write(line)
                logf.flush()
                continue
            if proc.poll() is not None:
                return proc.returncode, time.perf_counter() - t0
        elif proc.poll() is not None:
            return proc.returncode, time.perf_counter() - t0


def parent(args) -> int:
    out_dir = Path(args.out or os.environ.get("OUT") or "gpu_check_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    from prism.io import atomic_write_json

    sections = (
        ["backends"]
        + [f"bench-{s}" for s in args.scales[:1]]
        + ["overhead", "microbatch", "numerics"]
        + [f"bench-{s}" for s in args.scales[1:]]
        + ["fsdp", "memory"]
        + (["fullgraph"] if args.compile else [])
    )
    sections = [
        s for s in sections if not args.sections or s.split("-")[0] in args.sections or s in args.sections
    ]
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(args), "sections": {}}
    json_path = out_dir / "gpu_check.json"
    t_start = time.perf_counter()
    with open(out_dir / "gpu_check.log", "a") as logf:
        for name in sections:
            left = args.total_s - (time.perf_counter() - t_start)
            budget = min(BUDGET_S.get(name, 90) * args.budget_scale, left)
            if budget < 10:
                report["sections"][name] = {"ok": False, "error": "skipped: total time box used up"}
                log(f"{name}: skipped, total time box used up")
                continue
            log(f"=== {name} (time box {budget:.0f}s)")
            logf.write(f"=== {name}\n")
            result_file = out_dir / f".{name}.json"
            result_file.unlink(missing_ok=True)
            cmd = [
                sys.executable,
                "-u",
                __file__,
                "--child",
                name,
                "--result",
                str(result_file),
                "--device",
                args.device,
                "--scales",
                ",".join(args.scales),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--infer-steps",
                str(args.infer_steps),
                "--compile" if args.compile else "--no-compile",
            ] + (["--full-compile"] if args.full_compile else [])
            rc, took = stream(cmd, budget, logf)
            if result_file.is_file():
                res = json.loads(result_file.read_text())
                result_file.unlink()
            else:
                res = {"ok": False, "error": "timed out" if rc is None else f"exit code {rc}"}
            res["wall_s"] = round(took, 1)
            res["timed_out"] = rc is None
            report["sections"][name] = res
            atomic_write_json(json_path, report)  # partial results survive whatever comes next
            log(f"{name}: {'ok' if res.get('ok') else 'FAILED: ' + str(res.get('error'))} in {took:.0f}s")
    report["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    atomic_write_json(json_path, report)
    log(f"wrote {json_path} ({report['total_wall_s']}s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", default="124m,354m,757m", type=lambda s: [x for x in s.split(",") if x])
    p.add_argument(
        "--sections",
        default=None,
        type=lambda s: [x for x in s.split(",") if x],
        help="subset of backends,bench,overhead,microbatch,numerics,memory,fsdp,fullgraph "
        "(or bench-124m ...)",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=10, help="timed interleaved rounds per scale")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--infer-steps", type=int, default=5)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--full-compile",
        action="store_true",
        help="compile 354m/757m as one graph too (longer than the default time boxes)",
    )
    p.add_argument("--total-s", type=float, default=570, help="time box of the whole check")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's time box")
    p.add_argument("--out", default=None, help="output folder (default: $OUT)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compile is None:
        args.compile = args.device.startswith("cuda")
    unknown = [s for s in args.scales if s not in MICRO_BATCH]
    if unknown:
        print(f"error: unknown scale {unknown[0]!r}: use {', '.join(MICRO_BATCH)}.", file=sys.stderr)
        return 2
    if args.child:
        args.section = args.child
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
