"""The kit uses only public names of Lightning and torch outside prism.compat.

A private name (`_anything`) of a library can be renamed in any release; an assignment to it then
silently does nothing and a call fails only when that code path runs (for preemption: at the
moment a job is signalled). prism.compat holds the few uses that have no public equivalent, each
checked at start-up; this test keeps every other module of src/prism free of them.

A name counts as private when it starts with one underscore (dunders are public protocol) and is:
- imported: a private module segment or imported name (`import torch._dynamo`,
  `from lightning...throughput_monitor import _plugin_to_compute_dtype`);
- read or written as an attribute that the kit never defines itself (`loop._should_accumulate()`,
  `self._trainer`), directly or through getattr/setattr/hasattr or import_module with a string:
  the kit's own private attributes are the ones it assigns on self/cls or defines (a name the kit
  defines anywhere counts as its own everywhere, a blind spot kept for simplicity);
- a method the kit overrides in a subclass of a library class whose base defines it
  (overriding `RichProgressBar._update_metrics`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import prism

SRC = Path(__file__).resolve().parents[1] / "src" / "prism"
COMPAT = SRC / "compat.py"


# documented standard-library functions with a leading underscore: the watchdog's stacks of every
# thread, and its exit that no stuck thread can hold up
STDLIB_DOCUMENTED = {"_current_frames", "_exit"}


def _private(name: str) -> bool:
    return (
        name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
        and name not in STDLIB_DOCUMENTED
    )


def _kit_defined(trees: dict[Path, ast.AST]) -> set[str]:
    """Private names the kit itself defines: functions, classes, names, and attributes it assigns
    on `self` or `cls`."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
                while targets:
                    target = targets.pop()
                    if isinstance(target, (ast.Tuple, ast.List)):
                        targets.extend(target.elts)
                    elif isinstance(target, ast.Name):
                        names.add(target.id)
                    # `self._x = ...` defines the kit's own attribute; `self._x[k] = ...` and
                    # `other._x = ...` change someone else's
                    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                        if target.value.id in ("self", "cls"):
                            names.add(target.attr)
    return {n for n in names if _private(n)}


def private_uses(root: Path, exclude: tuple[Path, ...] = ()) -> list[str]:
    """`file:line: name` for every use of a library's private name in the .py files under root."""
    trees = {
        p: ast.parse(p.read_text(), filename=str(p))
        for p in sorted(root.rglob("*.py"))
        if p not in exclude and "remote" not in p.relative_to(root).parts  # remote: transformers code
    }
    own = _kit_defined(trees)
    found = []
    for path, tree in trees.items():
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno}: import {alias.name}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                module = node.module or ""
                if any(_private(part) for part in module.split(".")):
                    found.append(f"{where}:{node.lineno}: from {module}")
                for alias in node.names:
                    if _private(alias.name) and not module.startswith("prism"):
                        found.append(f"{where}:{node.lineno}: {module}.{alias.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{where}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                # the same names reached through strings: getattr(x, "_y"), import_module("a._b")
                func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                args = [
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
                if func in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1:
                    name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
                    if isinstance(name, str) and _private(name) and name not in own:
                        found.append(f"{where}:{node.lineno}: {func}(..., {name!r})")
                elif func == "import_module" and args and any(_private(p) for p in args[0].split(".")):
                    found.append(f"{where}:{node.lineno}: import_module({args[0]!r})")
    return sorted(found, key=lambda u: (u.split(":")[0], int(u.split(":")[1])))


def private_overrides(exclude_modules: tuple[str, ...] = ("prism.compat",)) -> list[str]:
    """Methods of kit classes that override a private name of a Lightning or torch base class."""
    found = []
    for info in pkgutil.walk_packages(prism.__path__, "prism."):
        if info.name in exclude_modules or ".remote" in info.name:
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            foreign = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in ("lightning", "torch")]
            for name, value in vars(cls).items():
                # functions only: ABCMeta and autograd.Function set private attributes themselves
                if not inspect.isfunction(value) or not _private(name):
                    continue
                if any(name in vars(base) for base in foreign):
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return found


def test_src_uses_no_private_library_name_outside_compat():
    uses = private_uses(SRC, exclude=(COMPAT,))
    assert uses == [], "private Lightning/torch names outside prism/compat.py:\n" + "\n".join(uses)


def test_no_kit_class_overrides_a_private_library_method():
    assert private_overrides() == []


def test_the_scanner_finds_each_kind_of_private_use(tmp_path):
    """The check above can fail: each kind of use it looks for is found in a planted file."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "bad.py").write_text(
        "import torch._dynamo\n"
        "from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype\n"
        "from torch._C import foo\n"
        "def f(trainer):\n"
        "    trainer.fit_loop._should_accumulate()\n"
        "    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = None\n"
        "def g(loop):\n"
        "    return getattr(loop, '_should_accumulate')(), importlib.import_module('torch._C')\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "    def _helper(self):\n"
        "        return self._own + len(self.__dict__)\n"
    )
    uses = private_uses(pkg)
    assert sorted(u.split(": ", 1)[1] for u in uses) == sorted(
        [
            "import torch._dynamo",
            "lightning.pytorch.callbacks.throughput_monitor._plugin_to_compute_dtype",
            "from torch._C",
            "._should_accumulate",
            "._broadcast_sigterm_tensor",
            "getattr(..., '_should_accumulate')",
            "import_module('torch._C')",
        ]
    )


def trainer_assignments(root: Path) -> list[str]:
    """`file:line: trainer.x` for every assignment to an attribute of a Trainer (a name
    `trainer`) in the .py files under root, other than `should_stop`, Lightning's public way for a
    callback to end training."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                base = target
                while isinstance(base, ast.Attribute) and isinstance(base.value, ast.Attribute):
                    base = base.value
                if (
                    isinstance(base, ast.Attribute)
                    and isinstance(base.value, ast.Name)
                    and base.value.id == "trainer"
                    and base.attr != "should_stop"
                ):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: trainer.{base.attr}")
    return found


def test_the_trainer_is_configured_only_through_its_constructor(tmp_path):
    """Plan, then build: accumulation, validation interval, sanity steps and callbacks are
    decided before the Trainer exists and passed to it, never patched in afterwards."""
    assert trainer_assignments(SRC) == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "patch.py").write_text(
        "def f(trainer):\n    trainer.accumulate_grad_batches = 4\n    trainer.fit_loop.x = 1\n"
        "    trainer.should_stop = True\n"
    )
    assert [u.split(": ", 1)[1] for u in trainer_assignments(tmp_path / "pkg")] == [
        "trainer.accumulate_grad_batches",
        "trainer.fit_loop",
    ]
