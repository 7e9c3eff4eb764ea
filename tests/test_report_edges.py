"""The report at the edges of what a valid result file may hold: numbers near the largest float
(finite, so the stages' records accept them) and text with `|` or a line break in a table cell;
and report.py refusing a --runs-dir that is not a folder while a missing default runs/ is fine."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import load_script

from prism.report import build_report
from prism.report.fmt import Table

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"
report_main = load_script("report").main  # reproduce/report.py's


def _fixtures(tmp_path: Path) -> tuple[Path, Path]:
    runs, results = tmp_path / "runs", tmp_path / "results"
    shutil.copytree(FIX / "runs", runs)
    shutil.copytree(FIX / "results", results)
    return runs, results


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _final_loss(loss: float):
    """A summary's change to a run whose last evaluation gave `loss`, the curve's minimum kept right."""

    def change(d: dict) -> None:
        d["val_curve"][-1]["val_loss"] = d["final_val_loss"] = loss
        best = min(d["val_curve"], key=lambda p: p["val_loss"])
        d.update(min_val_loss=best["val_loss"], min_val_step=best["step"], min_val_tokens=best["tokens"])

    return change


def test_a_loss_or_perplexity_of_1e308_still_gives_a_report(tmp_path):
    runs, results = _fixtures(tmp_path)
    _edit(runs / "124m" / "prism" / "seed0" / "train_summary.json", _final_loss(1e308))
    for seed in (0, 1):
        _edit(
            results / "124m" / "eval" / "prism" / f"seed{seed}.json",
            lambda d: d["tasks"]["wikitext"].update(word_perplexity=1e308),
        )
    text, _ = build_report(["124m"], runs, results)
    # prism's seeds 1e308, 3.361, 3.363 against uniform's ~3.376: t = 1 and df = 2 to 1e-300, so
    # p = 1 - 1/sqrt(3) (Student's t with 2 df)
    table2 = r"^\| 124m \| −0\.0144 \| 0\.0060 \| \+3{10}\d+\.0000 \| 3 / 3 \| 0\.423 \|$"
    assert re.search(table2, text, re.M)
    assert f"| {1e308:.1f} ± 0.0 |" in text  # both perplexities 1e308: the mean is exact
    # the fit across scales would square s²/n: it says why it is left out instead
    assert "has a loss of 1e+308: every loss must be finite and at most 1e+50." in text


def test_a_pipe_or_line_break_in_a_cell_stays_in_its_cell_and_row():
    table = Table(["a", "b"], [["x|y", "1\r\n2\n3\r4"]])
    assert table == "| a | b |\n|---|---|\n| x\\|y | 1 2 3 4 |"


def test_a_hardware_name_with_a_pipe_and_a_line_break_keeps_table2_one_row(tmp_path):
    runs, results = _fixtures(tmp_path)
    for summary in runs.glob("124m/*/seed*/train_summary.json"):
        _edit(summary, lambda d: d.get("throughput", {}).update(hardware="NVIDIA H100 | SXM\n80GB"))
    text, _ = build_report(["124m"], runs, results)
    row = next(line for line in text.splitlines() if line.startswith("| 124m | prism | 3.3604 ± 0.0010 |"))
    assert row.endswith(" | 8× NVIDIA H100 \\| SXM 80GB |")
    assert len(re.findall(r"(?<!\\)\|", row)) == 11  # ten cells, as in the header


def test_report_cli_refuses_a_runs_dir_that_is_not_a_folder(capsys, tmp_path, monkeypatch):
    results, missing = tmp_path / "results", tmp_path / "rnus"
    results.mkdir()
    argv = ["--scales", "tiny", "--results-dir", str(results)]
    assert report_main([*argv, "--runs-dir", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"error: --runs-dir {missing} is not a folder; give the runs_dir the training runs were "
        f"written to (default: runs).\n"
    )
    assert not missing.exists() and list(results.iterdir()) == []  # nothing written
    # runs/, the default, is absent until something trains (run_all.py names it too): a report of
    # the paper's numbers alone
    monkeypatch.chdir(tmp_path)
    assert report_main(argv) == 0 and report_main([*argv, "--runs-dir", "runs"]) == 0
    assert (results / "RESULTS.md").is_file() and not (tmp_path / "runs").exists()
