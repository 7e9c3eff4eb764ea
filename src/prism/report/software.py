"""RESULTS.md's software and hardware section: the environments the reported runs trained in
(train_summary.json's `environment`), and which runs differ from the others or changed between
their own attempts."""

from __future__ import annotations

from collections import Counter

from prism.report import fmt
from prism.report.collect import ScaleResults
from prism.runs.layout import seed_dir_name

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


def _key(env: dict) -> tuple:
    return tuple(env.get(k) for k, _ in COLUMNS)


@fmt.cell
def sw_environment(key: str, value) -> str:
    """One `environment` value as recorded (a version, a commit, a device name or count); a commit
    in its short form, keeping "-dirty"; a value the run did not record as none (CUDA and cuDNN:
    a build without them) or ?."""
    if value is None:
        return "none" if key in ("cuda", "cudnn") else "?"
    text = str(value)
    if key == "git_commit" and len(text) >= 40:
        text = text[:10] + text[40:]
    return text


@fmt.cell
def sw_runs(names: list[str]) -> str:
    """The runs that trained in one environment: how many, then their names."""
    return f"{len(names)}: {', '.join(names)}"


def software_lines(results: list[ScaleResults]) -> list[str]:
    """Markdown lines: one table row per distinct environment with the runs that used it, then a
    line per run that differs from the most common environment or changed between attempts."""
    users: dict[tuple, list[str]] = {}
    envs: dict[tuple, dict] = {}
    unrecorded: list[str] = []
    changed: list[str] = []
    for res in results:
        for schedule in res.schedules():
            for seed, run in sorted(res.runs.get(schedule, {}).items()):
                name = f"{res.scale}/{schedule}/{seed_dir_name(seed)}"
                env = run.summary.environment
                if env is None:
                    unrecorded.append(name)
                    continue
                key = _key(env)
                envs[key] = env
                users.setdefault(key, []).append(name)
                earlier = run.summary.earlier_environments or []
                differing = sorted({title for e in earlier for k, title in COLUMNS if e.get(k) != env.get(k)})
                if differing:
                    changed.append(f"{name} (between its attempts: {', '.join(differing)})")
    if not users and not unrecorded:
        return ["No finished run yet."]
    lines: list[str] = []
    if users:
        counts = Counter({key: len(names) for key, names in users.items()})
        rows = [
            [*(sw_environment(k, envs[key].get(k)) for k, _ in COLUMNS), sw_runs(users[key])]
            for key, _ in counts.most_common()
        ]
        lines += [fmt.Table([*(title for _, title in COLUMNS), "runs"], rows), ""]
        if len(users) > 1:
            common = counts.most_common(1)[0][0]
            for key, names in users.items():
                if key == common:
                    continue
                keys = [title for (k, title), a, b in zip(COLUMNS, key, common) if a != b]
                lines.append(
                    f"- **Differs from the most common environment** ({', '.join(keys)}): {', '.join(names)}."
                )
    if changed:
        lines.append(f"- **Environment changed between attempts:** {'; '.join(changed)}.")
    if unrecorded:
        lines.append(
            f"- Environment not recorded (trained by a kit that did not record it): {', '.join(unrecorded)}."
        )
    return lines
