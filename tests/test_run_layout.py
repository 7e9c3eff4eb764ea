"""One home for where runs live: prism.runs.layout holds every file name of a run folder, the
results tree, a search's folder and run_all.py's records, and no other module of src/prism spells
one as a string literal (f-string pieces included; docstrings, which only describe, excepted).
docs/outputs.md lists the same files in the same order. A planted module proves the scan can fail."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from prism.config.schema import load_config
from prism.runs import layout

SRC = Path(__file__).resolve().parents[1] / "src"
LAYOUT = SRC / "prism" / "runs" / "layout.py"
OUTPUTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "outputs.md"


def file_names() -> list[str]:
    """The layout's file names and patterns (a name with a dot, not a bare suffix such as .ckpt),
    in the order the module defines them."""
    values = [v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)]
    return list(dict.fromkeys(v for v in values if "." in v and not v.startswith(".")))


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def spelled_names(src: Path, names: list[str]) -> list[str]:
    """'path:line: name' for every string literal under src/prism, outside runs/layout.py, that
    uses one of `names` as a path: the whole literal, or a name after a '/' (`f"{run}/config.yaml"`,
    "checkpoints/last.ckpt" in a message). A sentence that mentions a file by its bare name
    ("keeps last.ckpt only") describes it, as a docstring does."""
    in_path = {n: re.compile("/" + re.escape(n) + r"(?![\w*-])") for n in names}
    found = []
    for path in sorted((src / "prism").rglob("*.py")):
        if path.resolve() == LAYOUT.resolve():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for name, pattern in in_path.items():
                    if node.value == name or pattern.search(node.value):
                        found.append(f"{path.relative_to(src)}:{node.lineno}: {name}")
    return sorted(found)


def test_only_the_layout_spells_a_run_file_name():
    names = file_names()
    assert {"train_summary.json", "last.ckpt", "config.yaml", "bench.json", "SEARCH.md"} <= set(names)
    assert spelled_names(SRC, names) == []


def test_the_scan_finds_a_planted_name(tmp_path):
    planted = tmp_path / "prism" / "train" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        '"""Reads train_summary.json (a docstring only describes)."""\n'
        "from pathlib import Path\n"
        'NOTE = "a trial keeps last.ckpt only"  # a sentence that mentions a file\n'
        "def last(run):\n"
        '    return Path(run) / "checkpoints" / "last.ckpt"\n'
        "def summary(run):\n"
        '    return f"{run}/train_summary.json"\n'
    )
    assert spelled_names(tmp_path, file_names()) == [
        "prism/train/planted.py:5: last.ckpt",
        "prism/train/planted.py:7: train_summary.json",
    ]


def test_the_doc_lists_every_file_in_the_layout_s_order():
    """docs/outputs.md's tree names each file of the layout, in the order the layout defines them."""
    tree = OUTPUTS_DOC.read_text(encoding="utf-8").split("```", 2)[1]

    def first(name: str) -> int:
        m = re.search(r"(?<![\w.*-])" + re.escape(name) + r"(?![\w*-])", tree)
        return m.start() if m else -1

    names = file_names()
    assert [n for n in names if first(n) < 0] == []
    assert sorted(names, key=first) == names


def test_paths_are_built_from_the_config():
    cfg = load_config("tiny", ["runs_dir=/r", "results_dir=/res", "schedule=prism", "train.seed=2"])
    run = layout.run_dir(cfg)
    assert run == Path("/r/tiny/prism/seed2")
    assert layout.last_checkpoint(run) == run / "checkpoints" / "last.ckpt"
    assert (
        layout.checkpoints_dir(run) / layout.step_checkpoint_name(120) == run / "checkpoints/step-000120.ckpt"
    )
    assert layout.eval_result(layout.scale_results_dir(cfg), "prism", 2) == Path(
        "/res/tiny/eval/prism/seed2.json"
    )
    assert layout.scale_result(cfg, layout.BENCH_NAME) == Path("/res/tiny/bench.json")
    assert layout.logs_dir(cfg) / layout.stage_log_name("eval", "prism", 2) == Path(
        "/res/tiny/logs/eval-prism-seed2.log"
    )
    assert layout.stage_record(run, folder=True) == Path("/r/tiny/prism/seed2.stage.json")
    assert layout.stage_record(Path("/res/tiny/bench.json")) == Path("/res/tiny/bench.stage.json")
    assert layout.lock_path(run) == Path("/r/tiny/prism/.seed2.lock")
    assert layout.report_path(cfg) == Path("/res/RESULTS.md")
    assert layout.default_study_dir(cfg) == Path("/res/tiny/search")
    assert layout.seed_of("seed12") == 12 and layout.seed_of("seed12.old-ab") is None
    assert (
        layout.seed_of_eval_result("seed3.json") == 3
        and layout.seed_of_eval_result("seed3.stage.json") is None
    )
