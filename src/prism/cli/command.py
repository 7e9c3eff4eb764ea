"""Every command's parser and run, from its typed function (docs/commands.md): a parameter is a flag whose
help is its `Args:` line; Annotated extras make it a config key's short name (Key) or give its Rule."""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from prism.cli.exits import line, run_command, say
from prism.config.overrides import file_overrides, nested_overrides, scalar
from prism.config.values import Rule
from prism.errors import ConfigError, PrismError
from prism.io import check_output

HIDDEN = "hidden"  # Annotated[bool, HIDDEN]: a flag for the kit's own processes, left out of --help
APPEND = "append"  # Annotated[list[str], APPEND]: a repeatable flag (`--space a --space b`)
OWN = ("overrides", "print_config")  # parameters that are no flag of their own name
SHARED_HELP = {  # the help of a flag several commands have, where a command's `Args:` says no other
    "scale": "any configs/scale/<scale>.yaml, e.g. tiny or 124m",
    "checkpoint": ".ckpt, .safetensors or an exported run folder",
    "device": "auto, cpu, cuda or cuda:N",
    "overrides": "config overrides key=value",
    "config": "a YAML file of settings (docs/commands.md)",
    "print_config": "print the resolved settings as YAML, and run nothing",
}


@dataclass(frozen=True)
class Key:
    """Annotated[..., Key("search.top_k")]: the flag is the word `search.top_k=VALUE`. `listed`: the
    text is the key's list, split at its commas (or by `listed(text)`), an item with a comma quoted."""

    path: str
    listed: bool | Callable[[str], list] = False

    def word(self, value: Any) -> str:
        if self.listed:
            split = self.listed if callable(self.listed) else lambda t: t.split(",")
            items = [str(i).strip() for i in (value if isinstance(value, list) else split(str(value)))]
            return f"{self.path}=[{','.join(json.dumps(i) if ',' in i else i for i in items)}]"
        text = str(value)
        quoted = isinstance(value, str) and scalar(text) != text
        return f"{self.path}={json.dumps(text) if quoted else text}"


def docstring_args(fn: Callable) -> dict[str, str]:
    """name -> help of the `Args:` section of `fn`'s docstring (Google style, as litgpt's)."""
    section = (inspect.getdoc(fn) or "").partition("\nArgs:\n")[2]
    entries = re.findall(r"^ {4}(\w+): (.*(?:\n {8}.*)*)", section, re.M)  # an entry and its indented lines
    return {name: " ".join(text.split()) for name, text in entries}


def parameters(fn: Callable) -> dict[str, tuple[Any, tuple, Any]]:
    """name -> (type, Annotated extras, default) of `fn`'s flags."""
    hints, out = typing.get_type_hints(fn, include_extras=True), {}
    for param in inspect.signature(fn).parameters.values():
        hint, extras = hints[param.name], ()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # Optional[X]: X
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        out[param.name] = (hint, tuple(extras), param.default)
    return out


def build_parser(fn: Callable, epilog: str | None, exclusive=(), given=()) -> argparse.ArgumentParser:
    """The parser of `fn`'s parameters. `exclusive`: tuples of parameters of which at most one is
    given ("!" first: exactly one, unless a --config file gives one: `given`)."""
    p = argparse.ArgumentParser(
        prog=f"{fn.__module__.rsplit('.', 1)[-1]}.py",
        description=(inspect.getdoc(fn) or "").split("\n\n")[0],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    helps, groups = SHARED_HELP | docstring_args(fn), {}
    for names in exclusive:
        group = p.add_mutually_exclusive_group(required=names[0] == "!" and not set(names) & set(given))
        groups.update({n: group for n in names if n != "!"})
    for name, (kind, extras, default) in parameters(fn).items():
        shown = (helps.get(name) or "").replace("%", "%%")  # argparse formats help with %
        if key := _extra(extras, Key):  # the key's name, said once here for every command's alias
            shown = f"the config key {key.path}" + (f": {shown}" if shown else "")
        options: dict[str, Any] = {"help": argparse.SUPPRESS if HIDDEN in extras else shown or None}
        if name == "overrides":
            p.add_argument(name, nargs="*", **options)
            continue
        if kind is bool:
            options["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is list:
            item = typing.get_args(kind)[0]
            options.update(type=item, **({"action": "append"} if APPEND in extras else {"nargs": "+"}))
        elif typing.get_origin(kind) is typing.Literal:
            options["choices"] = typing.get_args(kind)
        else:
            options["type"] = kind
        if default is inspect.Parameter.empty:
            options["required"] = name not in groups and name not in given
        else:
            options["default"] = default
        if name != "print_config":  # added below, in LightningCLI's spelling, after --config
            (groups.get(name) or p).add_argument(f"--{name.replace('_', '-')}", **options)
    p.add_argument("--config", action="append", default=[], metavar="FILE", help=SHARED_HELP["config"])
    p.add_argument("--print_config", action="store_true", help=SHARED_HELP["print_config"])
    return p


def _from_files(fn: Callable, argv: list[str]) -> tuple[dict, list[str]]:
    """The values of `fn`'s parameters in the --config files of `argv` (a top-level key that names
    one), and their other keys as config words; ConfigError for any other key or a bad value."""
    params, found, words = parameters(fn), {}, []
    paths = [b for a, b in zip(argv, argv[1:]) if a == "--config"]
    paths += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    for word in (w for path in paths for w in file_overrides(path)):
        key, text = word.split("=", 1)
        if key in params and key not in OWN:
            kind, _extras, default = params[key]
            try:
                value = json.loads(text) if text[:1] in '[{"' else scalar(text)
                if value is None and default is not None:  # null: only where "not given" is the default
                    raise ValueError(value)
                found[key] = value if value is None else _read(kind, value)
            except argparse.ArgumentTypeError as exc:  # a flag's own reader says what is valid
                raise ConfigError(f"{key}: {text} is invalid: {exc}") from None
            except (ValueError, TypeError):
                raise ConfigError(f"{key}: {text} is invalid: give {_kind_name(kind)}.") from None
        elif "overrides" in params:
            words.append(word)
        else:
            settings = ", ".join(n for n in params if n not in OWN)
            raise ConfigError(f"config file key {key!r} is not a setting of this command; use {settings}.")
    return found, words


def _read(kind: Any, value: Any) -> Any:
    """A file's value as argparse reads the flag's words, `kind(text)` of the file's own spelling
    (each item of a list); a switch's value is true or false, a choice's one of its choices."""
    if typing.get_origin(kind) is list and isinstance(value, list):
        return [_read(typing.get_args(kind)[0], v) for v in value]
    choice = typing.get_origin(kind) is typing.Literal
    if (
        isinstance(value, (list, dict))  # a list or mapping where the flag takes one word
        or typing.get_origin(kind) is list
        or (kind is bool and not isinstance(value, bool))
        or (choice and value not in typing.get_args(kind))
    ):
        raise ValueError(value)
    return value if kind is bool or choice else kind(value if isinstance(value, str) else json.dumps(value))


def _kind_name(kind: Any) -> str:
    if typing.get_origin(kind) is list:
        return f"a list, each item {_kind_name(typing.get_args(kind)[0])}"
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(kind)))
    names = {int: "a whole number", float: "a number", str: "a text", bool: "true or false"}
    return names.get(kind, "a value its flag takes (see --help)")


def parse(fn: Callable, argv: list[str] | None, epilog=None, exclusive=()) -> dict:
    """`fn`'s arguments from `argv` and the --config files (ConfigError for a bad file or a value out
    of its Rule): `overrides` are the files' keys, then the flags' Key words, then the command line's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    found, file_words = _from_files(fn, argv)
    parser = build_parser(fn, epilog, exclusive, given=found)
    parser.set_defaults(**found)
    args = vars(parser.parse_intermixed_args(argv))
    args.pop("config")
    given, flag_words = list(args.get("overrides") or []), []
    for name, (_kind, extras, _default) in parameters(fn).items():
        value = args.get(name)
        if isinstance(value, list) and name != "overrides":  # `--seeds 0 1 k=v`: a list takes k=v too
            words = [v for v in value if isinstance(v, str) and "=" in v]
            value = [n for v in value if v not in words for n in (v if isinstance(v, list) else [v])]
            given += words
            args[name] = value = (value or None) if words else value
        rule, key = _extra(extras, Rule), _extra(extras, Key)
        if value is not None and rule is not None and not rule.ok(value):
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            raise ConfigError(f"--{name.replace('_', '-')}={shown} is invalid: {rule.valid}.")
        if key is not None and value is not None:
            (file_words if found.get(name) == value else flag_words).append(key.word(value))
            args[name] = None
    if "overrides" in args:
        args["overrides"] = file_words + flag_words + given
    return args


def _extra(extras: tuple, kind: type) -> Any:
    """The Annotated extra of `kind` (a Rule, a Key), or None."""
    return next((e for e in extras if isinstance(e, kind)), None)


def run(
    fn: Callable,
    argv: list[str] | None = None,
    epilog: str | None = None,
    exclusive=(),
    *,
    interrupted: str | Callable[[dict], str] = "nothing was written; run the same command again",
    out: str | None = None,
    work: Callable[..., int] | None = None,
    **ending,
) -> int:
    """A command from its words to its exit code: parse, then under run_command the repeated-key
    warnings, --print_config (unless `fn` prints its own), `args[out]` checked (prism.io.check_output)
    and `fn(**args)` (or `work(**args)`). `interrupted` (or `interrupted(args)`): what a Ctrl-C leaves."""
    try:
        args = parse(fn, argv, epilog, exclusive)
    except PrismError as exc:
        return say("error", exc.exit_code, str(exc))  # before any work: a bad --config file or value

    def checked() -> int:
        from prism.config.schema import repeated_keys

        # a worker's parent passed it the same words, and warned of a key given twice itself
        for warning in [] if args.get("worker") else repeated_keys(args.get("overrides") or []):
            line("warning", warning, ending.get("console"))
        if "print_config" not in parameters(fn) and args.pop("print_config"):
            return show_config(settings(fn, args))
        if out and args.get(out) is not None:
            check_output(args[out])
        return (work or fn)(**args)

    said = interrupted(args) if callable(interrupted) else interrupted
    return run_command(checked, interrupted=said, **ending)


def command(fn: Callable, **options) -> Callable[..., int]:
    """`fn`'s `main(argv=None) -> int`, which reproduce/<name>.py calls: run() with these options."""
    return partial(run, fn, **options)


def settings(fn: Callable, args: dict) -> dict:
    """What --print_config shows of a command without derived values: its resolved config (or its
    overrides, checked on tiny), then its parameters."""
    from prism.config.schema import load_config, to_dict

    shown = {}
    if "overrides" in args:
        cfg = load_config(args.get("scale") or "tiny", args["overrides"])
        shown = to_dict(cfg) if args.get("scale") else nested_overrides(args["overrides"])
    skip = {"overrides"} | {n for n, (_k, extras, _d) in parameters(fn).items() if _extra(extras, Key)}
    shown.update({n: v for n, v in args.items() if n not in skip and not (n in shown and v is None)})
    return shown


def show_config(settings: dict, derived: dict | None = None) -> int:
    """The resolved settings as YAML, then what the run derives from them as comments."""
    import yaml

    sys.stdout.write(yaml.safe_dump(settings, sort_keys=False, default_flow_style=None))
    for text in yaml.safe_dump(derived, sort_keys=False).splitlines() if derived else []:
        sys.stdout.write(f"# {text}\n")
    return 0


def with_bar(label: str, table: Callable, work: Callable, source, out: str, **kwargs) -> int:
    """A command whose work reports progress: `work(source, out, **kwargs)` under a transient bar on
    stderr (its `progress(name, done, total)` updates it), then `table(result)` printed; 0."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, description=name, completed=done, total=total)

        result = work(source, out, **kwargs, progress=progress)
    console.print(table(result))
    console.log(f"wrote {out}")
    return 0
