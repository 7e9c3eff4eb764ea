"""Examples per second: prism.eval against lm_eval running the same tasks through the `prism`
adapter, same checkpoint, same local data, same batch size, measured in one run.

    python dev/eval_speed.py --checkpoint runs/tiny/prism/seed0 --data-dir ../shared/data/eval \\
        --tasks hellaswag,piqa,arc_easy,winogrande,blimp,wikitext --limit 0.01 --batch-size 32

Without --checkpoint a random tiny model (2 layers x 64, seq_len 128) stands in. Both sides run
once on 1 document per task first so that file caches and tokenizer tables are warm; then each
is timed end to end (documents -> requests -> scores -> metrics); with --repeats the two
alternate and each keeps its fastest time. The two also have to agree
on acc and acc_norm, otherwise the ratio means nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from prism.eval.evaluator import evaluate
from prism.eval.tasks import resolve_tasks


def tiny_random_model():
    from prism.core.model import ModelConfig, PrismDecoder

    torch.manual_seed(0)
    return PrismDecoder(ModelConfig(n_layer=2, d_model=64, h_base=4, heads=[2, 4], seq_len=128)).eval()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--tasks", default="hellaswag,piqa,arc_easy,winogrande,blimp,wikitext")
    p.add_argument(
        "--limit",
        type=float,
        default=0.01,
        help="documents per task; below 1 a fraction of every task, which keeps the "
        "full run's mix of tasks (default 0.01)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="alternate the two runs this many times and keep each side's fastest "
        "(fairer on a shared, loaded machine)",
    )
    args = p.parse_args(argv)

    import lm_eval
    from lm_eval.tasks import TaskManager

    from prism.eval.harness import PrismHarnessLM, write_local_task_configs

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.checkpoint:
        from prism.runs.checkpoint import load_model

        model, _ = load_model(args.checkpoint)
    else:
        model = tiny_random_model()
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    if args.limit >= 1:
        args.limit = int(args.limit)
    n_docs_tasks = resolve_tasks(names)  # BLiMP counts per paradigm
    manager = TaskManager(
        include_path=str(write_local_task_configs(args.data_dir, tempfile.mkdtemp())), include_defaults=False
    )
    adapter = PrismHarnessLM(model=model, batch_size=args.batch_size, device="cpu")

    def run_ours(limit):
        return evaluate(model, names, data_dir=args.data_dir, limit=limit, batch_size=args.batch_size)

    def run_harness(limit):
        return lm_eval.simple_evaluate(
            model=adapter,
            tasks=names,
            limit=limit,
            task_manager=manager,
            bootstrap_iters=0,
            verbosity="ERROR",
        )

    def timed(fn):
        t0 = time.perf_counter()
        out = fn(args.limit)
        return out, time.perf_counter() - t0

    run_ours(1), run_harness(1)  # warm caches on both sides
    t_ours = t_harness = float("inf")
    for _ in range(max(1, args.repeats)):
        ours, t = timed(run_ours)
        t_ours = min(t_ours, t)
        theirs, t = timed(run_harness)
        t_harness = min(t_harness, t)

    n_docs = 0
    for task, metrics in ours["tasks"].items():
        n_docs += metrics["n"]
        for m in ("acc", "acc_norm"):
            if m in metrics and abs(metrics[m] - theirs["results"][task][f"{m},none"]) > 1e-12:
                raise SystemExit(
                    f"{task} {m} differs: ours {metrics[m]} vs harness "
                    f"{theirs['results'][task][f'{m},none']}; the timing is void."
                )
    report = {
        "tasks": names,
        "documents": n_docs,
        "task_count": len(n_docs_tasks),
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "ours_s": t_ours,
        "harness_s": t_harness,
        "ours_examples_per_s": n_docs / t_ours,
        "harness_examples_per_s": n_docs / t_harness,
        "ratio": t_harness / t_ours,
    }
    print(
        f"{n_docs} documents ({','.join(names)}), batch {args.batch_size}, {torch.get_num_threads()} threads"
    )
    print(f"prism.eval           {t_ours:8.2f} s  {n_docs / t_ours:8.1f} examples/s")
    print(f"lm_eval + adapter    {t_harness:8.2f} s  {n_docs / t_harness:8.1f} examples/s")
    print(f"ratio                {t_harness / t_ours:8.2f}x  (same acc/acc_norm on every task)")
    return report


if __name__ == "__main__":
    main()
