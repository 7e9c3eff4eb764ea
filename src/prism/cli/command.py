"""Every command's parser, built from its typed function: a parameter is a flag (`dry_run: bool`
is `--dry-run`, `seeds: list[int]` takes several words, a parameter without a default is
required), its help is the docstring's `Args:` line, and `overrides` are the `key=value` words,
in any order among the flags. Every command also takes `--config FILE` (a YAML file of config
keys, the same as `key=value`; several merge in order, and `key=value` wins) and
`--print_config` (the resolved settings, as YAML that `--config` reads back; nothing is run).

jsonargparse, which litgpt and LightningCLI build their commands with, was measured against the
documented command lines and left out: its switches take a value (`--resume true`), its lists a
JSON list or `--seeds+`, and its flags are spelled with underscores (`--dry_run`).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import typing
from typing import Any, Callable

from prism.config.overrides import file_overrides
from prism.errors import PrismError

HIDDEN = "hidden"  # Annotated[bool, HIDDEN]: a flag for the kit's own processes, left out of --help


def docstring_args(fn: Callable) -> dict[str, str]:
    """name -> help of the `Args:` section of `fn`'s docstring (Google style, as litgpt's)."""
    doc = inspect.getdoc(fn) or ""
    helps: dict[str, str] = {}
    name = None
    for line in doc.split("Args:", 1)[1].splitlines() if "Args:" in doc else []:
        m = re.match(r"\s{4}(\w+): (.*)", line)
        if m:
            name, helps[m.group(1)] = m.group(1), m.group(2)
        elif name and line.startswith(" " * 8):
            helps[name] += " " + line.strip()
        elif line.strip():
            break
    return helps


def build_parser(
    fn: Callable, prog: str, epilog: str | None = None, exclusive=(), configured: bool = False
) -> argparse.ArgumentParser:
    """The parser of `fn`'s parameters. `exclusive`: tuples of parameters of which at most one is
    given (a tuple that starts with "!": exactly one, unless `configured`: a --config file may
    give it)."""
    doc = inspect.getdoc(fn) or ""
    p = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    helps, hints = docstring_args(fn), typing.get_type_hints(fn, include_extras=True)
    groups = {}
    for names in exclusive:
        group = p.add_mutually_exclusive_group(required=names[0] == "!" and not configured)
        groups.update({n: group for n in names if n != "!"})
    for param in inspect.signature(fn).parameters.values():
        if param.name == "print_config":  # added below, in LightningCLI's spelling
            continue
        if param.name == "overrides":
            p.add_argument("overrides", nargs="*", help=helps.get("overrides", "config overrides key=value"))
            continue
        hint, extras = hints[param.name], ()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
        kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        options: dict[str, Any] = {"help": argparse.SUPPRESS if HIDDEN in extras else helps.get(param.name)}
        if kind is bool:
            options["action"] = "store_true"
        elif typing.get_origin(kind) is list:
            item = typing.get_args(kind)[0]
            options.update(type=item, nargs="+") if "append" not in extras else options.update(
                type=item, action="append"
            )
        else:
            options["type"] = kind
        if param.default is inspect.Parameter.empty:
            options["required"] = param.name not in groups
        else:
            options["default"] = param.default
        (groups.get(param.name) or p).add_argument(f"--{param.name.replace('_', '-')}", **options)
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML file of config keys, the same as key=value (several merge in order; key=value wins)",
    )
    p.add_argument(
        "--print_config",
        action="store_true",
        help="print the resolved settings as YAML that --config reads back, and run nothing",
    )
    return p


def parse(fn: Callable, argv: list[str] | None, prog: str, epilog: str | None = None, exclusive=()) -> dict:
    """`fn`'s arguments from `argv` (usage line and exit 2 on a bad flag, argparse's), with
    `overrides` the files' keys first, then the command line's; `print_config` beside them. A
    key the command line gives twice is warned about (prism.config.schema.repeated_keys)."""
    from prism.config.schema import repeated_keys

    configured = any(a == "--config" or a.startswith("--config=") for a in argv or sys.argv[1:])
    parser = build_parser(fn, prog, epilog, exclusive, configured)
    args = vars(parser.parse_intermixed_args(argv))
    given = list(args.get("overrides") or [])
    for warning in repeated_keys(given):
        sys.stderr.write(f"warning: {warning}\n")
    try:
        files = [o for path in args.pop("config") for o in file_overrides(path)]
    except PrismError as exc:
        parser.exit(exc.exit_code, f"error: {exc}\n")
    if args.get("scale", False) is None:  # a file's `scale` stands for --scale
        args["scale"] = next((o.split("=", 1)[1] for o in reversed(files) if o.startswith("scale=")), None)
    args["overrides"] = files + given
    return args


def show_config(settings: dict, derived: dict | None = None) -> int:
    """The resolved settings as YAML, and what the run derives from them as comments (so that the
    printed file, given back with --config, sets the same)."""
    import yaml

    sys.stdout.write(yaml.safe_dump(settings, sort_keys=False, default_flow_style=None))
    for line in yaml.safe_dump(derived or {}, sort_keys=False).splitlines() if derived else []:
        sys.stdout.write(f"# {line}\n")
    return 0
