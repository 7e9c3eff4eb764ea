"""The layers of src/prism (docs/design.md): no import cycle, and no import from a lower layer into
a higher one. Every import counts, at module level, inside a function or under TYPE_CHECKING,
because each one says which concept depends on which. Planted trees prove both checks can fail."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


# Bottom first. A module may import modules of its own package and of any lower layer. The
# packages of one layer are independent of each other; the leaves (modules directly under prism/)
# may import each other.
LAYERS: list[tuple[str, ...]] = [
    ("prism", "prism.errors", "prism.io", "prism.stats", "prism.hardware", "prism.compat")
    + ("prism.cluster", "prism.processes", "prism.provenance", "prism.registry"),
    ("prism.core",),
    ("prism.config",),
    ("prism.data",),
    ("prism.runs",),
    ("prism.eval",),
    ("prism.train",),
    ("prism.measure", "prism.export"),
    ("prism.report",),
    ("prism.pipeline",),
    ("prism.search",),
    ("prism.cli",),
]


def module_graph(src: Path, package: str) -> dict[str, set[str]]:
    """module -> the kit modules it imports, for every .py file of src/<package>."""
    files = {}
    for path in (src / package).rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # a relative import
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from prism.train import trainer` imports the module prism.train.trainer
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                if target.split(".")[0] != package:
                    continue
                found = resolve(target)
                # a module importing its own package's __init__ (which re-exports it) is no edge
                if found and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def unit_of(module: str, layers: list[tuple[str, ...]]) -> tuple[int, str] | None:
    """(layer index, package or leaf) that `module` belongs to: the longest listed prefix (the
    top package itself names only its __init__)."""
    found = None
    for index, units in enumerate(layers):
        for unit in units:
            inside = module == unit or ("." in unit and module.startswith(unit + "."))
            if inside and (not found or len(unit) > len(found[1])):
                found = (index, unit)
    return found


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """`a -> b` for every import that goes up a layer or across to a sibling package, and
    `a: no layer` for a module no layer lists."""
    out = [f"{m}: no layer" for m in sorted(graph) if unit_of(m, layers) is None]
    for module in sorted(graph):
        here = unit_of(module, layers)
        for target in sorted(graph[module]):
            there = unit_of(target, layers)
            if here and there and (there[0] > here[0] or (there[0] == here[0] > 0 and there[1] != here[1])):
                out.append(f"{module} -> {target}")
    return out


def test_no_import_goes_up_a_layer():
    assert layer_violations(module_graph(SRC, "prism"), LAYERS) == []


def test_a_planted_upward_or_sideways_import_is_found(tmp_path):
    pkg = tmp_path / "kit"
    for sub in ("low", "high", "side"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "leaf.py").write_text("")
    (pkg / "stray.py").write_text("")
    (pkg / "high" / "a.py").write_text("from kit.low import b\nimport kit.leaf\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from kit.high import a\n")  # up, in a function
    (pkg / "side" / "c.py").write_text("from kit.high import a\n")  # across, in the same layer
    layers = [("kit", "kit.leaf"), ("kit.low",), ("kit.high", "kit.side")]
    found = layer_violations(module_graph(tmp_path, "kit"), layers)
    assert found == [
        "kit.stray: no layer",
        "kit.low.b -> kit.high",
        "kit.low.b -> kit.high.a",
        "kit.side.c -> kit.high",
        "kit.side.c -> kit.high.a",
    ]
    (pkg / "low" / "b.py").write_text("")
    (pkg / "side" / "c.py").write_text("from kit.low import b\n")
    assert layer_violations(module_graph(tmp_path, "kit"), layers) == ["kit.stray: no layer"]


def test_the_kit_has_no_import_cycle():
    graph = module_graph(SRC, "prism")
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []


def test_a_planted_cycle_is_found_whatever_the_import_form(tmp_path):
    pkg = tmp_path / "kit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "leaf.py").write_text("import os\n")
    (pkg / "a.py").write_text("from kit.sub import b\nfrom kit import leaf\n")
    # the cycle closes inside a function, as an import that dodges one at load time does
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kit.a\n")
    graph = module_graph(tmp_path, "kit")
    assert {"kit.sub.b", "kit.leaf"} <= graph["kit.a"] and graph["kit.sub.b"] == {"kit.c"}
    assert cycles(graph) == [["kit.a", "kit.c", "kit.sub.b"]]
    (pkg / "c.py").write_text("import os\n")  # the planted edge removed: no cycle left
    assert cycles(module_graph(tmp_path, "kit")) == []
