"""report.json holds every number of RESULTS.md's tables: each table of the markdown is in it,
under its section, and each cell's text is what its numbers give through the cell's format
(prism.report.fmt.FORMATS) — so a program reads the numbers instead of parsing markdown."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from prism.report import write_report
from prism.report.fmt import render

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"
ZEROSHOT_FIX = ROOT / "tests" / "fixtures" / "report_zeroshot"


def _markdown_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """(section title, rows of cell texts, header first) of every table, in order."""
    out, section, rows = [], None, []
    for line in [*text.splitlines(), ""]:
        if line.startswith("## "):
            section = line[3:]
        if line.startswith("|"):
            rows.append(line)
            continue
        if rows:
            cells = [[c.strip() for c in re.split(r"(?<!\\)\|", r)[1:-1]] for r in rows]
            out.append((section, [cells[0], *cells[2:]]))  # the alignment row left out
            rows = []
    return out


def _json_tables(doc: dict) -> list[tuple[str, list[list]]]:
    return [(s["title"], [t["headers"], *t["rows"]]) for s in doc["sections"] for t in s["tables"]]


# names shown as they are: scales, schedules, tasks, hardware, the paper's ablation configs and
# shapes (Config-1, 2-phase), the paper's figures a column is read off (Fig. 3a), the evaluation
# length a long-context column is at (512 tokens, 512: ΔD_l), the paper's tables (Table 2); every
# other cell with a digit is a number or a format's cell in report.json
LABEL = re.compile(
    r"^(\d+m|tiny|cpu-\w+|uniform|prism|[Cc]onfig-\d+|\d+-phase( \w+)*|[\dx,]+|\d+× .*"
    r"|.*\(\d+ seeds?\)|.*\(paper, \d+ GPUs\)|.*\(Fig\. \d+\w?, read off the plot\)"
    r"|\d+ tokens|\d+: Δ?D_l( \w+)?|(Paper \()?Table \d+\)?|)$"
)


def _check(out: Path) -> int:
    text = out.read_text()
    doc = json.loads((out.parent / "report.json").read_text())
    md, js = _markdown_tables(text), _json_tables(doc)
    assert [title for title, _ in md] == [title for title, _ in js]
    cells = 0
    for (title, md_rows), (_, js_rows) in zip(md, js):
        assert len(md_rows) == len(js_rows), title
        for md_row, js_row in zip(md_rows, js_rows):
            assert len(md_row) == len(js_row), (title, md_row)
            for shown, value in zip(md_row, js_row):
                assert " ".join(render(value).replace("|", "\\|").split()) == shown, (title, shown, value)
                if isinstance(value, str) and re.search(r"\d", value) and not LABEL.match(value):
                    pytest.fail(f"{title}: the cell {value!r} shows numbers report.json holds only as text")
                cells += 1
    return cells


def test_every_table_cell_of_the_golden_report_is_in_report_json(tmp_path):
    out, changed = write_report(["124m", "757m"], FIX / "runs", FIX / "results", tmp_path / "RESULTS.md")
    assert tmp_path / "report.json" in changed
    assert _check(out) > 300


def test_every_table_cell_of_the_zeroshot_report_is_in_report_json(tmp_path):
    out, _ = write_report(["tiny"], ZEROSHOT_FIX / "runs", tmp_path / "results", tmp_path / "RESULTS.md")
    assert _check(out) > 10


def _long_context_result(seq_len: int, seed: str) -> dict:
    """A long-context result file (prism.runs.records.LongContext) made by hand: 2 lengths, 2 RoPE
    choices, 2 buckets, 3 layers; its numbers drawn from `seed`, so seeds and schedules differ."""
    rng, units = random.Random(seed), []
    documents = {"count": 2, "where": "wikitext", "origin": "hub"}
    for length in (256, 512):
        for choice in ("none", "yarn"):
            buckets = [3.0 + rng.uniform(0, 0.5), 3.2 + rng.uniform(0, 0.5)]
            units.append(
                {
                    "length": length,
                    "rope_scaling": choice,
                    "loss": sum(buckets) / 2,
                    "bucket_loss": buckets,
                    "bucket_edges": [0, length // 2, length],
                    "D": [rng.uniform(5, 20), rng.uniform(20, 60), rng.uniform(length / 8, length / 4)],
                    "documents": {"sha256": f"{length:064x}", **documents},
                }
            )
    return {"complete": True, "seq_len": seq_len, "results": units}


@pytest.mark.slow
def test_every_table_cell_of_the_long_context_section_is_in_report_json(tmp_path):
    """The fixtures above have no long-context results: two seeds of uniform and Prism (Δ with
    s.d. and p) and one of a context extension (its own row), written by hand."""
    results = tmp_path / "results"
    runs = [("uniform", 0, 128), ("uniform", 1, 128), ("prism", 0, 128), ("prism", 1, 128)]
    for folder, seed, seq_len in [*runs, ("prism-ctx256", 0, 256)]:
        f = results / "tiny" / "long_context" / folder / f"seed{seed}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(_long_context_result(seq_len, f"{folder} {seed}")))
    out, _ = write_report(["tiny"], ZEROSHOT_FIX / "runs", results, tmp_path / "RESULTS.md")
    doc = json.loads((tmp_path / "report.json").read_text())
    [beyond] = [s for s in doc["sections"] if s["title"].startswith("Beyond the training context")]
    # the loss table, Δ by position at each length, D_l per RoPE choice
    assert [t["heading"] for t in beyond["tables"]] == ["tiny"] * 5
    assert beyond["tables"][0]["rows"][4][0] == {
        "format": "lc_extension",
        "values": ["prism-ctx256", "prism", [256]],
    }
    assert _check(out) > 10
