"""Rows of a task, from a local folder of JSON lines in the hub's schema (docs/evaluation.md,
"Task data") or from the hub; a missing file is an error naming where it looked."""

from __future__ import annotations

import math
from itertools import islice
from pathlib import Path

from prism.config.values import EVAL_LIMIT
from prism.errors import first_line
from prism.eval.tasks import Doc, EvalInputError, Task
from prism.io import json_lines


def read_local_rows(task: Task, data_dir: str | Path, limit: int | None = None) -> list[dict]:
    path = Path(data_dir) / task.local_file
    lines = json_lines(
        path,
        lambda: EvalInputError(
            f"task {task.name}: no data at {path} (expected the {task.hub_path} "
            f"{task.split} split as JSON lines there; see --data-dir)."
        ),
        lambda n, why: EvalInputError(f"task {task.name}: line {n} of {path} is not JSON ({why})."),
    )
    rows = [row for _n, row in islice(lines, limit)]
    if not rows:
        raise EvalInputError(f"task {task.name}: {path} holds no rows.")
    return rows


def read_hub_rows(task: Task, limit: int | None = None) -> list[dict]:
    """The dataset and split the harness itself loads (needs the hub or a warm HF cache)."""
    import datasets

    where = f"{task.hub_path}" + (f" (config {task.hub_name})" if task.hub_name else "")
    try:
        ds = datasets.load_dataset(task.hub_path, task.hub_name, split=task.split)
    except Exception as exc:
        raise EvalInputError(
            f"task {task.name}: could not load {where} split {task.split} from the Hugging Face "
            f"hub ({first_line(exc) or type(exc).__name__}); pass --data-dir with local copies instead."
        ) from None
    n = len(ds) if limit is None else min(limit, len(ds))
    return [ds[i] for i in range(n)]


def check_limit(limit: float | None) -> None:
    whole = isinstance(limit, float) and limit.is_integer()  # train.eval_limit=100.0 counts 100
    if not EVAL_LIMIT.ok(int(limit) if whole else limit):  # eval.limit's rule, for a caller of the library
        raise EvalInputError(f"limit {limit} is invalid; {EVAL_LIMIT.valid}.")


def load_docs(task: Task, data_dir: str | Path | None = None, limit: float | None = None) -> list[Doc]:
    """The first `limit` rows of the task, turned into documents. As in the harness, a limit
    below 1 is a fraction of the split: the first ceil(n * limit) rows."""
    check_limit(limit)
    fraction = limit is not None and limit < 1
    n_rows = None if limit is None or fraction else int(limit)
    rows = read_local_rows(task, data_dir, n_rows) if data_dir else read_hub_rows(task, n_rows)
    if fraction:
        rows = rows[: math.ceil(len(rows) * limit)]
    where = Path(data_dir) / task.local_file if data_dir else task.hub_path
    docs = []
    for i, row in enumerate(rows):
        try:
            docs.append(task.to_doc(row))
        except EvalInputError as exc:
            raise EvalInputError(f"task {task.name}, row {i} of {where}: {exc}.") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise EvalInputError(
                f"task {task.name}, row {i} of {where} does not have the "
                f"{task.hub_path} schema ({type(exc).__name__}: {exc})."
            ) from None
    return docs
