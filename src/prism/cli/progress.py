"""A command whose work reports progress: a transient bar on stderr while it runs, then its table."""

from __future__ import annotations

from typing import Any, Callable


def with_bar(
    label: str, table: Callable[[Any], Any], work: Callable[..., Any], source, out: str, **kwargs
) -> int:
    """`work(source, out, **kwargs)` under a bar named `label` (its `progress(name, done, total)`
    updates it), then `table(result)` printed and `out` logged as written; 0."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, description=name, completed=done, total=total)

        result = work(source, out, **kwargs, progress=progress)
    console.print(table(result))
    console.log(f"wrote {out}")
    return 0
