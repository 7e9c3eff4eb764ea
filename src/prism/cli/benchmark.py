"""Throughput benchmark of head schedules (paper Table 2; docs/commands.md#benchmarkpy)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from prism.cli.command import Key, command
from prism.config.values import AT_LEAST_1, at_least_zero, number, positive
from prism.measure.bench import BenchSettings


def benchmark(
    scale: str,
    schedules: Optional[str] = None,
    steps: Annotated[Optional[int], Key("bench.steps"), AT_LEAST_1] = None,
    round_steps: Annotated[int, AT_LEAST_1] = BenchSettings.round_steps,
    warmup: Annotated[Optional[int], Key("bench.warmup"), at_least_zero("it must be at least 0")] = None,
    infer_steps: Annotated[Optional[int], at_least_zero("it must be at least 0")] = None,
    micro_batch: Annotated[Optional[int], Key("bench.micro_batch"), AT_LEAST_1] = None,
    seq_len: Annotated[Optional[int], AT_LEAST_1] = None,
    device: str = "auto",
    compile: Optional[bool] = None,
    fullgraph: bool = True,
    compile_mode: Literal["full", "regional"] = "full",
    precision: Literal["bf16", "fp32"] = "bf16",
    seed: Annotated[int, number("it must be a whole number from 0 to 2**63-1", ge=0, lt=2**63)] = 0,
    peak_tflops: Annotated[Optional[float], positive("it must be a positive number")] = None,
    out: Optional[str] = None,
    overrides: list[str] = (),
) -> int:
    """Time full training steps (and forward-only steps) of head schedules of one scale,
    interleaved in one process.

    Args:
        schedules: comma list of schedule names or head lists (default: run_schedules); uniform is
            always included as the reference
        steps: timed rounds
        round_steps: back-to-back steps per schedule per round, timed together
        warmup: untimed steps per schedule
        infer_steps: timed forward-only rounds (default: --steps; 0 skips)
        micro_batch: sequences per step (default: train.micro_batch)
        seq_len: tokens per sequence (default: model.seq_len)
        compile: torch.compile the models (default: on for CUDA, off on CPU)
        fullgraph: compile with fullgraph=True (default) so a graph break is reported
        compile_mode: full: the whole model as one graph, as training compiles it (default);
            regional: each block alone (much shorter compile for deep models)
        precision: bf16 autocast on CUDA (default; CPU always runs fp32) or fp32
        seed: the models' initialisation seed
        peak_tflops: dense peak TFLOP/s for MFU when the device is not in prism.hardware's table
        out: write the JSON result here (atomically)
        overrides: config overrides key=value, e.g. model.seq_len=512
    """
    from prism.measure.bench_plan import benchmark_to_file

    options = infer_steps, seq_len, device, compile, fullgraph, compile_mode, round_steps, precision
    benchmark_to_file(scale, overrides, schedules, (*options, seed, peak_tflops), out)
    return 0


main = command(benchmark, out="out")
