"""`key=value` overrides, read as values rather than as YAML documents: a flow list or mapping, or
one scalar as YAML spells it, else the text exactly as given (docs/training.md#overrides)."""

from __future__ import annotations

import json
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from prism.errors import ConfigError, PrismError

# YAML's spellings of null, true and false
KEYWORDS = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL")),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
# YAML's integers and floats as OmegaConf reads them (decimal only: a leading zero, as in a
# commit prefix 0123abc or 0123456, stays text)
INTEGER = re.compile(r"[-+]?(?:0|[1-9][0-9_]*)")
FLOAT = re.compile(
    r"""[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN)""",
    re.VERBOSE,
)


class OverrideError(PrismError, ValueError):
    """An override that is not `key=value`, or whose list or mapping does not parse."""


def scalar(text: str) -> Any:
    """One scalar value: null, a bool, an int, a float, or the text itself."""
    word = text.strip()
    if word in KEYWORDS:
        return KEYWORDS[word]
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return word[1:-1]
    if INTEGER.fullmatch(word):
        return int(word.replace("_", ""))
    if FLOAT.fullmatch(word):
        number = word.replace("_", "")
        if number.lower().lstrip("+-") in (".inf", ".nan"):  # YAML's spelling; Python's has no dot
            number = number.replace(".", "", 1)
        return float(number)
    return text


def parse_override(item: str) -> tuple[str, Any]:
    """(key, value) of one `key=value` override; raises OverrideError naming the key."""
    if "=" not in item:
        raise OverrideError(f"override {item!r} is not of the form key=value (e.g. train.lr=3e-4).")
    key, text = item.split("=", 1)
    if not key.strip():
        raise OverrideError(f"override {item!r} names no key; write key=value (e.g. train.lr=3e-4).")
    if not text.lstrip().startswith(("[", "{")):
        return key, scalar(text)
    kind = "list" if text.lstrip().startswith("[") else "mapping"
    try:
        value = OmegaConf.create(text)  # a flow collection, read by OmegaConf's YAML rules
    except Exception:  # yaml's parser errors span lines; the sentence below says what to fix
        value = None
    if not isinstance(value, (ListConfig, DictConfig)) or (kind == "list") != isinstance(value, ListConfig):
        example = f"{key}=[a,b]" if kind == "list" else f"{key}={{name: value}}"
        raise OverrideError(
            f"override {key}={text} is not a well-formed {kind}: write it as {example}, quoting an "
            f"item that holds a comma, bracket or #."
        )
    return key, OmegaConf.to_container(value)


def as_patch(key: str, value: Any) -> DictConfig:
    """The nested config that sets `key` (dotted) to `value`."""
    patch = OmegaConf.create()
    OmegaConf.update(patch, key, value, merge=True)
    return patch


def file_overrides(path: str) -> list[str]:
    """A YAML file of config keys (a command's --config) as `key=value` overrides, one a leaf: a
    mapping's keys are joined with dots, a list is one value."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of config keys, e.g. `train: {{lr: 6e-4}}`."
        )
    return list(_leaves(doc))


def _leaves(doc: dict, prefix: str = ""):
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        elif isinstance(value, str) and scalar(value) == value:  # text that reads back as itself
            yield f"{prefix}{key}={value}"
        else:
            yield f"{prefix}{key}={json.dumps(value)}"


def override_value(words: list[str], key: str) -> Any:
    """The value the last of `words` gives config key `key` (None: none gives it), for a command
    that also needs it where no config applies (analyze.py's exported weights, search's --top-k)."""
    return next((parse_override(w)[1] for w in reversed(words) if w.startswith(f"{key}=")), None)


def nested_overrides(words: list[str]) -> dict:
    """`key=value` words as the nested mapping a YAML file of them holds."""
    doc: dict = {}
    for word in words:
        key, value = parse_override(word)
        *path, last = key.split(".")
        node = doc
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return doc
