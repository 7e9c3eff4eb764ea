"""long_context: loss by position and attention distance per layer of one finished run past its
training length, under each RoPE scaling choice, results/<scale>/long_context/<schedule>/seed<k>.json.
Off by default (`--stages ...,long_context`). Its identity is the long_context section, the
validation data it may read and the hash of the run whose weights it measures."""

from __future__ import annotations

import json

from prism.config.schema import RunConfig
from prism.pipeline.stages.base import Job, Phase, PlanContext, PlannedRun, Stage
from prism.pipeline.stages.train import run_weights
from prism.runs import records
from prism.runs.layout import long_context_result
from prism.runs.resumable import LONG_CONTEXT

SECTION = "long_context"


def section_overrides(section: dict) -> list[str]:
    """The section as overrides, so the job measures what the plan says whatever the run's saved
    config.yaml holds (its section is the one of its training day)."""

    def word(value) -> str:
        if isinstance(value, list):
            return "[" + ",".join(map(word, value)) + "]"
        return "null" if value is None else json.dumps(value) if isinstance(value, str) else str(value)

    return [f"{SECTION}.{key}={word(value)}" for key, value in section.items()]


class LongContext(Stage):
    name = "long_context"
    script = "long_context.py"
    phase = Phase.per_run
    reads_training_data = True  # the run's own validation documents, where they are long enough
    selected_by_default = False  # an extension of the paper, not part of its reproduction
    output_record = records.LongContext  # complete, with results: the record's own condition

    def check(self, cfg: RunConfig) -> None:
        from prism.measure.long_context.settings import head_widths, settings_for

        widths = {w for name in cfg.run_schedules for w in head_widths(cfg.model_config(name))}
        # a length shorter than training or longer than the data or RoPE serve, too many buckets, ...
        settings_for(cfg.long_context, cfg.model.seq_len, cfg.data.val_tokens, tuple(widths))

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        cfg, full, train = ctx.cfg, ctx.full, ctx.job("train", run)
        out = long_context_result(ctx.results, train.run_dir.parent.name, run.seed)
        section = full[SECTION]

        def argv() -> list[str]:
            # the data keys the run's own documents depend on; the section follows in full
            passed = [o for o in ctx.passed if o.split("=", 1)[0].strip().startswith("data.")]
            weights = run_weights(train.run_dir)
            return [
                *ctx.command(self, checkpoint=weights, scale=cfg.scale, out=out),
                *passed,
                *section_overrides(section),
            ]

        data_id = ctx.data_identity() if section["source"] != "path" else None
        config = {SECTION: section, "data": data_id, "checkpoint": train.hash}
        return self.one_job(ctx, run, out, config, argv, deps=[train])

    def resumable(self, job: Job) -> bool:
        return LONG_CONTEXT.partial(job.output).is_file()

    def cost(self, cfg: RunConfig) -> str | None:
        from prism.pipeline.estimate import long_context_cost

        c = long_context_cost(cfg)
        per = "n/a" if c.seconds is None else f"{c.seconds:,.1f} s"
        total = "n/a" if c.seconds is None else f"{c.seconds * c.runs:,.0f} s"
        s = cfg.long_context
        return (
            f"long-context evaluation: {c.runs} runs x {c.measurements} measurements (lengths "
            f"{', '.join(map(str, s.lengths))} x RoPE {', '.join(s.rope_scalings)}; at factor 1 the "
            f"choices share one) of {s.documents} documents = {c.tokens:,} forward tokens per run; "
            f"{per} per run, {total} in all, on one device (rate: {c.rate_source})"
        )
