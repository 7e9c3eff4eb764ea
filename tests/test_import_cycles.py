"""No import cycle among the modules of src/prism: every import counts, at module level, inside a
function or under TYPE_CHECKING, because each one says which concept depends on which. A cycle
means a concept sits in the wrong module (docs/design.md is to draw the layers; until then this
test keeps the graph acyclic). A planted cycle in a small tree proves the test can fail."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


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
                # `from prism import training` imports the module prism.training
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
