"""Tasks + model -> metrics: load documents, build every request, score them all in one pass,
then aggregate per task (and per group)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from prism.core.model import PrismDecoder
from prism.data.tokenizer import GPT2Tokenizer
from prism.eval.data import load_docs
from prism.eval.engine import Progress, score_requests
from prism.eval.metrics import aggregate_choice, aggregate_group, aggregate_rolling, choice_scores
from prism.eval.requests import TokenRequest, encode_pairs, rolling_windows
from prism.eval.tasks import GROUPS, TASKS, ChoiceDoc, Doc, RollingDoc, resolve_tasks


@dataclass
class TaskRequests:
    """The requests of one task and, per document, which of them belong to it."""

    docs: list[Doc]
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) into the flat list


def build_requests(
    docs_by_task: dict[str, list[Doc]], tok: GPT2Tokenizer, max_len: int
) -> tuple[list[TokenRequest], dict[str, TaskRequests]]:
    """One flat list of token requests for all tasks, plus each document's slice of it.
    Everything is tokenised in two batched calls (pairs, rolling texts) across all tasks."""
    all_docs = [d for docs in docs_by_task.values() for d in docs]
    pairs = [
        (c, x) for d in all_docs if isinstance(d, ChoiceDoc) for c, x in zip(d.contexts, d.continuations)
    ]
    encoded = iter(encode_pairs(tok, pairs))
    rolling = [d.text for d in all_docs if isinstance(d, RollingDoc)]
    tokens = iter(tok.encode_batch(rolling) if rolling else [])
    flat: list[TokenRequest] = []
    layout: dict[str, TaskRequests] = {}
    for name, docs in docs_by_task.items():
        tr = TaskRequests(docs)
        for d in docs:
            reqs = (
                [next(encoded) for _ in d.contexts]
                if isinstance(d, ChoiceDoc)
                else rolling_windows(next(tokens), max_len)
            )
            tr.spans.append((len(flat), len(flat) + len(reqs)))
            flat += reqs
        layout[name] = tr
    return flat, layout


def overlong_task(docs_by_task: dict[str, list[Doc]], seq_len: int) -> tuple[str, int, int] | None:
    """(task, continuation length, the task's documents) of the first task with a continuation longer
    than `seq_len` tokens, which the engine cannot score; None when all fit. Before any scoring."""
    flat, layout = build_requests(docs_by_task, GPT2Tokenizer(), seq_len)
    for name, tr in layout.items():
        longest = max((len(flat[i].continuation) for a, b in tr.spans for i in range(a, b)), default=0)
        if longest > seq_len:
            return name, longest, len(tr.docs)
    return None


@contextlib.contextmanager
def rich_progress(total: int, enabled: bool, label: str) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    from rich import progress as rp

    columns = (rp.BarColumn(), rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), rp.TimeRemainingColumn())
    with rp.Progress(rp.TextColumn("{task.description}"), *columns) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.update(task, advance=n)


def evaluate(
    model: PrismDecoder,
    tasks: list[str] | str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    show_progress: bool = False,
    return_samples: bool = False,
    docs: dict[str, list[Doc]] | None = None,
    progress: Progress | None = None,
) -> dict:
    """Evaluate `model` zero-shot: {"tasks": {name: metrics}}, + "samples" (per-request
    log-likelihoods and greedy flags) when asked. `docs`: documents already loaded for some
    tasks; `progress`: called after each round of batches when no bar is shown."""
    names = resolve_tasks(tasks)
    docs = {n: docs[n] if docs and n in docs else load_docs(TASKS[n], data_dir, limit) for n in names}
    flat, layout = build_requests(docs, GPT2Tokenizer(), model.cfg.seq_len)
    model.eval()
    shown = (
        names[0]
        if len(names) == 1
        else ("blimp" if all(n.startswith("blimp_") for n in names) else f"{len(names)} tasks")
    )
    label = f"{shown}: {sum(len(d) for d in docs.values())} documents"
    with rich_progress(len(set(flat)), show_progress, label) as bar:
        scored = score_requests(model, flat, batch_size=batch_size, device=device, progress=bar or progress)

    results: dict[str, dict] = {}
    samples: dict[str, list[dict]] = {}
    for name, tr in layout.items():
        task = TASKS[name]
        per_doc = [scored[a:b] for a, b in tr.spans]
        if task.output_type == "multiple_choice":
            scores = [choice_scores(d, [ll for ll, _ in r]) for d, r in zip(tr.docs, per_doc)]
            results[name] = aggregate_choice(scores, task.metrics)
            samples[name] = [
                {"lls": [ll for ll, _ in r], "is_greedy": [g for _, g in r], "gold": d.gold, **s}
                for d, r, s in zip(tr.docs, per_doc, scores)
            ]
        else:
            lls = [sum(ll for ll, _ in r) for r in per_doc]
            results[name] = aggregate_rolling(tr.docs, lls)
            samples[name] = [{"ll": ll, "words": d.words, "bytes": d.bytes} for d, ll in zip(tr.docs, lls)]

    for group, members in GROUPS.items():
        present = {m: results.pop(m) for m in members if m in results}
        if len(present) == len(members):
            results[group] = {
                **aggregate_group(present, TASKS[members[0]].metrics),
                "paradigms": {m[len(group) + 1 :]: r for m, r in present.items()},
            }
        else:
            results.update(present)  # single paradigms asked for by name stay as they are
    out = {"tasks": results}
    if return_samples:
        out["samples"] = samples
    return out
