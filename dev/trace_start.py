"""Follow `reproduce/train.py --scale tiny` from argv to Lightning's Trainer.fit and count what the
kit does on the way: its functions called (file:function, in first-call order), the distinct kit
modules entered, the calls in all, the switches between packages (prism.config -> prism.train is
one) from one kit call to the next, and the calls of the checks (check_*, config_hash). Module and
class bodies (imports) are not calls.

    python dev/trace_start.py [--list] [key=value ...]

The run is real (a temporary runs_dir, 2 optimizer steps); the trace stops where fit begins.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
from collections import Counter
from pathlib import Path

import prism

SRC = str(Path(prism.__file__).resolve().parent)
SHIM = str(Path(__file__).resolve().parents[1] / "reproduce")


def package(module: str) -> str:
    """prism.train.trainer -> prism.train; a leaf module (prism.cluster) is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2])


def main(argv: list[str]) -> int:
    show = "--list" in argv
    overrides = [a for a in argv if a != "--list"]
    import lightning

    from prism.cli import train as cli

    calls: list[tuple[str, str, str]] = []  # (module, file:function) per kit call
    fit_code = lightning.Trainer.fit.__code__
    state = {"on": True}

    def profile(frame, event, _arg):
        if event != "call" or not state["on"]:
            return
        code = frame.f_code
        if code is fit_code:
            state["on"] = False
            sys.setprofile(None)
            return
        file = code.co_filename
        if not (file.startswith(SRC) or file.startswith(SHIM)):
            return
        module = frame.f_globals.get("__name__", "?")
        if code.co_name.startswith("<") or not code.co_flags & inspect.CO_OPTIMIZED:
            return  # module and class bodies (imports), comprehensions and lambdas: no call of the kit's
        rel = Path(file).resolve().relative_to(Path(SRC).parent) if file.startswith(SRC) else Path(file)
        calls.append((module, f"{rel}:{code.co_name}"))

    with tempfile.TemporaryDirectory() as tmp:
        args = ["--scale", "tiny", f"runs_dir={tmp}", "train.tokens=4096", *overrides]
        sys.setprofile(profile)
        try:
            code = cli.main(args)
        finally:
            sys.setprofile(None)
    if state["on"]:
        print(f"trainer.fit was not reached (exit {code})", file=sys.stderr)
        return 1
    names = list(dict.fromkeys(name for _, name in calls))
    modules = {m for m, _ in calls}
    switches = sum(package(a) != package(b) for (a, _), (b, _) in zip(calls, calls[1:]))
    checks = [n for _, n in calls if n.split(":")[1].startswith("check_") or n.endswith(":config_hash")]
    if show:
        for name in names:
            print(name)
        for name, n in sorted(Counter(checks).items()):
            print(f"{n} x {name}")
    print(
        f"kit calls: {len(calls)}; distinct kit functions: {len(names)}; modules entered: {len(modules)}; "
        f"package switches: {switches}; calls of check_* and config_hash: {len(checks)} "
        f"({len(set(checks))} distinct)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
