"""Every command the README and docs/*.md show, as written.

The commands are read from the shell code blocks and from inline `python reproduce/...` spans, and
split into words by bash itself (quotes, comments and brace groups as a user's shell treats them).
Each one's arguments go through the real parser of its script; its `key=value` overrides are
loaded for the scale it names, as the script would; and the read-only ones (`--dry-run`,
`--print_config`, `describe.py`, `--help`) are run in-process from an empty folder, which they must
leave empty. A `--config` file is named relative to the checkout, as the docs' commands are run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import load_script

from prism.config.ladder import ladder_scales
from prism.config.schema import load_config
from prism.pipeline import load_run_config
from prism.pipeline.layout import resolve_layout
from prism.train.batch import batch_plan, requested_devices

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
LAUNCHERS = ("python", "python3", "torchrun", "srun", "sbatch")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


@dataclass
class Command:
    where: str  # file:line, for the failure message
    text: str

    @property
    def words(self) -> list[str]:
        """The words bash makes of the command (no globbing, nothing run but printf)."""
        out = subprocess.run(
            ["bash", "-f", "-c", f"printf '%s\\0' {self.text}"], capture_output=True, text=True, check=True
        ).stdout
        return out.split("\0")[:-1]


def shell_blocks(text: str):
    """(first line number, body) of every fenced block in a shell language."""
    for m in re.finditer(r"^```([A-Za-z]*)[^\n]*\n(.*?)^```", text, re.M | re.S):
        if m.group(1).lower() in SHELL_FENCES:
            yield text.count("\n", 0, m.start(2)) + 1, m.group(2)


def documented_commands() -> list[Command]:
    found: list[Command] = []
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT)
        for first, body in shell_blocks(text):
            joined = body.replace("\\\n", " ")  # continuation lines
            for offset, line in enumerate(joined.splitlines()):
                if "reproduce/" in line and _is_kit_command(line):
                    found.append(Command(f"{name}:{first + offset}", line.strip()))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for m in re.finditer(r"`([^`]+)`", prose):
            span = " ".join(m.group(1).split())
            if "reproduce/" in span and _is_kit_command(span):
                found.append(Command(f"{name}:{text.count(chr(10), 0, text.find(m.group(0))) + 1}", span))
    return found


def _is_kit_command(line: str) -> bool:
    words = [w for w in line.split() if not ASSIGNMENT.fullmatch(w)]
    return bool(words) and words[0] in LAUNCHERS


def script_call(words: list[str]) -> tuple[dict[str, str], str, list[str], dict]:
    """(environment assignments, script name, its arguments, launch facts) of one command."""
    env = {}
    while words and ASSIGNMENT.fullmatch(words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    launch: dict = {}
    if words[0] == "sbatch":  # the batch script runs run_all.py --scale SCALE "$@" on the allocation
        i = next(i for i, w in enumerate(words) if w.endswith("run_scale.sbatch"))
        for opt in words[1:i]:
            key, _, value = opt.partition("=")
            if key in ("--nodes", "--gpus-per-node"):
                launch[key] = int(value)
        return env, "run_all", ["--scale", *words[i + 1 :]], launch
    i = next(i for i, w in enumerate(words) if w.startswith("reproduce/") and w.endswith(".py"))
    return env, Path(words[i]).stem, words[i + 1 :], launch


class Parsed(BaseException):
    """Raised by the patched parser with its namespace, so that `main` goes no further."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace


def parse(name: str, script, argv: list[str], monkeypatch) -> SimpleNamespace | None:
    """What the script makes of argv before it starts work: the namespace of its own parser, or
    for run_all.py the arguments its main hands the orchestrator (None after --help)."""
    with monkeypatch.context() as m:
        if name == "run_all":

            def orchestrate(scale, overrides, **kw):
                raise Parsed(SimpleNamespace(scale=scale, overrides=overrides, **kw))

            def orchestrate_ladder(ladder, overrides, **kw):
                raise Parsed(SimpleNamespace(ladder=ladder, overrides=overrides, **kw))

            m.setattr(script, "run_all", orchestrate)
            m.setattr(script, "run_ladder", orchestrate_ladder)
        else:
            for method in ("parse_args", "parse_intermixed_args"):
                original = getattr(argparse.ArgumentParser, method)

                def stop(self, args=None, namespace=None, _original=original):
                    raise Parsed(_original(self, args, namespace))

                m.setattr(argparse.ArgumentParser, method, stop)
        try:
            rc = script.main(argv)
        except Parsed as parsed:
            return parsed.namespace
        except SystemExit as exc:
            assert exc.code == 0, f"the parser refused {argv}"
            return None
    raise AssertionError(f"{name}.py ended ({rc}) before starting work on {argv}")


def check_config(name: str, ns: SimpleNamespace, launch: dict) -> None:
    """Load the config the script would load from these arguments."""
    scale, overrides = getattr(ns, "scale", None), list(getattr(ns, "overrides", None) or [])
    ladder = getattr(ns, "ladder", None)  # run_all.py --ladder: every rung's config
    if scale is None and ladder is None:
        return
    if name == "train":
        extra = [f"schedule={ns.schedule}"] if ns.schedule else []
        load_config(scale, [*overrides, *extra, *([f"train.seed={ns.seed}"] if ns.seed is not None else [])])
    elif name == "run_all":
        nodes = ns.nodes or launch.get("--nodes")
        gpus = ns.gpus_per_node or launch.get("--gpus-per-node")
        layout = resolve_layout(overrides, nodes, gpus)
        for rung in ladder_scales(ladder) if ladder else [scale]:
            cfg = load_run_config(rung, [*overrides, *(layout.overrides if layout else [])], None, None)
            batch_plan(cfg, requested_devices(cfg) * cfg.train.num_nodes)
    else:
        cfg = load_config(scale, overrides)
        for schedule in (getattr(ns, "schedules", None) or "").split(","):
            if schedule:
                cfg.head_schedule(schedule)


COMMANDS = documented_commands()
SCRIPTS = {p.stem for p in (ROOT / "reproduce").glob("*.py")}


def test_the_docs_show_commands_of_every_script():
    shown = {script_call(c.words)[1] for c in COMMANDS}
    assert len(COMMANDS) >= 25, [c.text for c in COMMANDS]
    assert shown == SCRIPTS, (shown, SCRIPTS)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
@pytest.mark.slow
def test_a_documented_command_parses_and_its_config_loads(command, monkeypatch, tmp_path, capsys):
    env, name, argv, launch = script_call(command.words)
    argv = [str(ROOT / w) if a == "--config" else w for a, w in zip(["", *argv], argv)]
    script = load_script(name)
    monkeypatch.chdir(tmp_path)  # relative runs/ and results/ name nothing of the checkout
    if "--print_config" in argv:  # read-only: run as written, its YAML printed and nothing written
        assert script.main(argv) == 0, capsys.readouterr()
        assert yaml.safe_load(capsys.readouterr().out), argv
        assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())
        return
    ns = parse(name, script, argv, monkeypatch)
    if ns is None:  # --help
        return
    check_config(name, ns, launch)
    if getattr(ns, "dry_run", False) or name == "describe":  # read-only: run it as written
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert script.main(argv) == 0, capsys.readouterr()
        assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())


def test_the_shell_splits_as_a_user_s_shell_does():
    # quotes go, brace groups expand, a comment ends the command
    words = Command("-", "python reproduce/analyze.py --checkpoints r/{a,b}/m 'x=1 #2' # note").words
    assert words == ["python", "reproduce/analyze.py", "--checkpoints", "r/a/m", "r/b/m", "x=1 #2"]
