"""The candidate schedules of a search (docs/search.md, "The space"): a schedule group, every valid
schedule under the §2.1 rules and filters, or named ones; deduplicated by their heads, uniform
first, each keeping the name it was given where it has one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from prism.config.schema import ConfigError, RunConfig, default_config_dir
from prism.core.schedule import ScheduleError, ScheduleFilter, count_schedules, iter_schedules

RULES = "rules"
# the most schedules `rules` may hold: every candidate is built and recorded in the study (about
# 0.1 ms and 60 bytes each), so 757m's 2 million unfiltered schedules would take minutes to list
MAX_RULES = 100_000


@dataclass(frozen=True)
class Candidate:
    key: str  # what the trial trains: a name the config resolves, or the compact head text
    text: str  # compact heads, e.g. 3x2,6x2,12x8
    marks: tuple[str, ...] = ()  # where the paper names it: "Table 4 prism", "Table 5 config-6"

    def to_dict(self) -> dict:
        return {"key": self.key, "text": self.text, "marks": list(self.marks)}


def _group_file(name: str, config_dir: Path) -> Path:
    return config_dir / "schedules" / f"{name}.yaml"


def _paper_names(cfg: RunConfig, config_dir: Path) -> dict[str, str]:
    """heads text -> where the paper names that schedule at this shape."""
    marks = {cfg.head_schedule("prism").text(): "Table 4 prism"} if "prism" in cfg.schedules else {}
    table5 = _group_file("table5", config_dir)
    if table5.is_file():
        for name in OmegaConf.load(table5).get("schedules", {}):
            if name in cfg.schedules:  # the group's shape is this scale's
                marks.setdefault(cfg.head_schedule(name).text(), f"Table 5 {name}")
    return marks


def _group_names(cfg: RunConfig, name: str, path: Path) -> list[str]:
    doc = OmegaConf.load(path)
    shape, keys = dict(doc.get("shape", {})), ("n_layer", "d_model", "h_base")
    if [shape.get(k) for k in keys] != [getattr(cfg.model, k) for k in keys]:
        raise ConfigError(
            f"--space {name} holds schedules for n_layer={shape.get('n_layer')}, d_model="
            f"{shape.get('d_model')}, h_base={shape.get('h_base')}, not for scale {cfg.scale} "
            f"({cfg.model.n_layer} x {cfg.model.d_model}, h_base {cfg.model.h_base}), so the space is "
            f"empty; use --space rules or schedules of this shape."
        )
    return ["uniform", "prism", *doc.get("schedules", {}).keys()]


def build_space(cfg: RunConfig, items: list[str], rules: ScheduleFilter) -> list[Candidate]:
    """The candidates of `items` (each a group name, `rules`, a schedule name or head text), in
    the order given, uniform first. Raises ConfigError with one sentence."""
    config_dir = default_config_dir()
    if not items:
        raise ConfigError("--space is missing: give table5, rules, or schedule names or head lists.")
    for item in items:
        if not item.strip():  # an empty name would resolve to the config's default schedule
            raise ConfigError(
                f"--space {item!r} is empty: give table5, rules, a schedule name or a head list."
            )
    specs: list[str] = ["uniform"]
    for item in items:
        if item == RULES:
            shape = f"L={cfg.shape.n_layer}, d_model={cfg.shape.d_model}, h_base={cfg.shape.h_base}"
            n = count_schedules(cfg.shape, rules)  # counted, not listed: the count is quick at any size
            if n == 0:
                raise ConfigError(
                    f"--space rules holds no schedule of {shape} under these filters; relax "
                    f"--smooth/--baseline-preservation/--power-of-two/--max-head-dim."
                )
            if n > MAX_RULES:
                raise ConfigError(
                    f"--space rules holds {n:,} schedules of {shape} under these filters, more than the "
                    f"{MAX_RULES:,} a search can list; add --smooth, --baseline-preservation, "
                    f"--power-of-two or --max-head-dim, or name the candidates."
                )
            specs += [s.text() for s in iter_schedules(cfg.shape, rules)]
        elif _group_file(item, config_dir).is_file():
            specs += _group_names(cfg, item, _group_file(item, config_dir))
        else:
            specs.append(item)
    marks = _paper_names(cfg, config_dir)
    seen: dict[str, Candidate] = {}
    for spec in specs:
        try:
            schedule = cfg.head_schedule(spec)
        except ScheduleError as exc:
            raise ConfigError(f"--space {spec}: {exc}") from None
        text = schedule.text()
        if text in seen:
            continue
        mark = marks.get(text)
        seen[text] = Candidate(schedule.name or text, text, (mark,) if mark else ())
    out = list(seen.values())
    if len(out) < 2:
        raise ConfigError(
            f"--space {' '.join(items)} holds no schedule besides uniform at scale {cfg.scale}, so "
            f"there is nothing to compare; add schedules or use --space rules."
        )
    return out
