"""RESULTS.md's software and hardware section: the environments the reported runs trained in, and
which runs differ from the others or changed between their own attempts."""

from __future__ import annotations

from collections import Counter

from prism.report import fmt
from prism.report.collect import ScaleResults
from prism.report.prose import prose

# (environment key, column title); `platform` is left out of the comparison: nodes of one cluster
# differ in kernel builds without any effect on a run's numbers.
COLUMNS = (
    ("git_commit", "kit commit"),
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("cudnn", "cuDNN"),
    ("lightning", "Lightning"),
    ("datasets", "datasets"),
    ("tiktoken", "tiktoken"),
    ("numpy", "numpy"),
    ("python", "Python"),
    ("hardware", "hardware"),
    ("num_devices", "devices"),
)


@fmt.cell
def sw_environment(key: str, value) -> str:
    """One `environment` value as recorded; a commit short, keeping "-dirty"; none recorded: none
    (CUDA and cuDNN: a build without them) or ?."""
    if value is None:
        return "none" if key in ("cuda", "cudnn") else "?"
    text = str(value)
    if key == "git_commit" and len(text) >= 40:
        text = text[:10] + text[40:]
    return text


# The runs that trained in one environment: how many, then their names.
sw_runs = fmt.cell(lambda names: f"{len(names)}: {', '.join(names)}", "sw_runs")


def _table_lines(users: dict[tuple, list[str]], envs: dict[tuple, dict]) -> list[str]:
    """The table, most common environment first, and a line per environment that differs from it."""
    counts = Counter({key: len(names) for key, names in users.items()})
    rows = [
        [*(sw_environment(k, envs[key].get(k)) for k, _ in COLUMNS), sw_runs(users[key])]
        for key, _ in counts.most_common()
    ]
    lines = [fmt.Table([*(title for _, title in COLUMNS), "runs"], rows), ""]
    common = counts.most_common(1)[0][0]
    for key, names in users.items():
        if key != common:
            keys = [title for (k, title), a, b in zip(COLUMNS, key, common) if a != b]
            lines.append(prose("software_differs", keys=keys, runs=names))
    return lines


def software_lines(results: list[ScaleResults]) -> list[str]:
    """A table row per environment with its runs, then the runs that differ or changed."""
    users: dict[tuple, list[str]] = {}  # environment key -> names of the runs in it
    envs: dict[tuple, dict] = {}  # key -> the environment itself
    unrecorded: list[str] = []  # runs whose summary names none
    changed: list[tuple[str, list[str]]] = []  # run, what changed between attempts
    for name, run in [named for res in results for named in res.named_runs(res.schedules())]:
        env = run.summary.environment
        if env is None:
            unrecorded.append(name)
            continue
        key = tuple(env.get(k) for k, _ in COLUMNS)
        envs[key] = env
        users.setdefault(key, []).append(name)
        earlier = run.summary.earlier_environments or []
        differing = sorted({title for e in earlier for k, title in COLUMNS if e.get(k) != env.get(k)})
        if differing:
            changed.append((name, differing))
    if not users and not unrecorded:
        return [prose("software_none")]
    lines = _table_lines(users, envs) if users else []
    if changed:
        lines.append(prose("software_changed", runs=changed))
    if unrecorded:
        lines.append(prose("software_unrecorded", runs=unrecorded))
    return lines
