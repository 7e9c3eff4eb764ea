"""The paper's published numbers, read from `paper_tables/*.yaml` (the one source of truth)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from prism.errors import PrismError

PAPER_SCALES = ("124m", "354m", "757m")
FILES = ("table1", "table2", "table3", "table4", "table5", "figure3a", "figure4")


class PaperTablesError(PrismError, ValueError):
    """A paper_tables file that is missing or lacks a value the report needs."""


def default_paper_dir() -> Path:
    env = os.environ.get("PRISM_PAPER_TABLES")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "paper_tables"


@dataclass(frozen=True)
class PaperTables:
    """Plain dicts per file; the accessors return None where the paper has no number."""

    t1: dict
    t2: dict
    t3: dict
    t4: dict
    t5: dict
    fig3a: dict
    fig4: dict

    def config(self, scale: str) -> dict | None:
        row = self.t1["scales"].get(scale)
        return None if row is None else {**row, **self.t1["inferred"]["scales"][scale]}

    def val_loss(self, scale: str, schedule: str) -> dict | None:
        return self.t2["rows"].get(scale, {}).get(schedule)

    def tokens_per_s_per_gpu(self, scale: str) -> float | None:
        return self.t2["inferred"]["tokens_per_s_per_gpu"].get(scale)

    def zero_shot(self, scale: str, schedule: str) -> dict | None:
        return self.t3["rows"].get(scale, {}).get(schedule)

    def ablation(self) -> list[dict]:
        return list(self.t5["rows"])

    def delta_loss_points(self, scale: str) -> list[dict]:
        return list(self.fig3a["points"]) if self.fig3a["scale"] == scale else []

    def delta_distance(self, scale: str) -> dict[int, dict]:
        """layer -> reading (a reading covering several layers appears under each of them)."""
        return {int(layer): r for r in self.fig4["readings"].get(scale, []) for layer in r["layers"]}

    def baseline_d0(self, scale: str) -> float | None:
        return self.fig4["baseline_D0"].get(scale)


def _load(path: Path) -> dict:
    if not path.is_file():
        raise PaperTablesError(
            f"paper table {path} does not exist; the report needs all of "
            f"{', '.join(f + '.yaml' for f in FILES)} in {path.parent}."
        )
    doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(doc, dict) or "source" not in doc:
        raise PaperTablesError(f"paper table {path} has no `source:` naming where its numbers come from.")
    return doc


@lru_cache(maxsize=4)
def load_paper_tables(paper_dir: str | Path | None = None) -> PaperTables:
    d = Path(paper_dir) if paper_dir else default_paper_dir()
    docs = [_load(d / f"{name}.yaml") for name in FILES]
    tables = PaperTables(*docs)
    for scale in PAPER_SCALES:
        for sched in ("uniform", "prism"):
            if tables.val_loss(scale, sched) is None or tables.zero_shot(scale, sched) is None:
                raise PaperTablesError(
                    f"paper tables in {d} lack the {scale} {sched} row of Table 2 or Table 3."
                )
    return tables
