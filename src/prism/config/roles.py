"""What a config key is to a training run (its Role) and the range of its values (a prism.config.values
Rule, opaque here), declared on its dataclass field (docs/design.md, "Run identity"). A leaf."""

from __future__ import annotations

from dataclasses import MISSING, field, fields, is_dataclass
from enum import Enum
from functools import partial
from typing import Any, get_type_hints


class Role(str, Enum):
    """What a config key is to a training run, declared on the key's dataclass field."""

    identity = "identity"  # decides what the run computes: part of its identity and config_hash
    execution = "execution"  # how it executes (layout, batch split, cadence): a run may resume with another
    other_stage = "other_stage"  # another stage's or the orchestrator's setting, never a training run's
    resolved = "resolved"  # a table whose result the identity holds instead (schedules: the run's heads)


ROLE = "prism.role"  # the dataclass field metadata key that holds a field's Role
CHECK = "prism.check"  # ... and the one that holds the range of its values


def setting(
    default: Any = MISSING, check: Any = None, *, factory: Any = MISSING, role: Role | None = None
) -> Any:
    """A dataclass field with its default, the range of its values (`check`) and its role."""
    metadata = {ROLE: role} if role is not None else {}
    if check is not None:
        metadata[CHECK] = check
    return field(default=default, default_factory=factory, metadata=metadata)


# a field of each Role (setting's arguments; a section of identity keys: its fields declare their own)
identity_key = partial(setting, role=Role.identity)
execution_key = partial(setting, role=Role.execution)
other_stage = partial(setting, role=Role.other_stage)
resolved_key = partial(setting, role=Role.resolved)


# dataclasses of lower layers -> their fields' roles, and the ranges of their fields' values
_DECLARED_ROLES: dict[type, dict[str, Role]] = {}
_DECLARED_CHECKS: dict[type, dict[str, Any]] = {}


def declare(schema: type, default: Role, roles: dict[str, Role], checks: dict[str, Any]) -> None:
    """Declare the roles and value ranges of a dataclass that cannot import this module (a lower
    layer's): each field gets `default` unless `roles` names it."""
    names = {f.name for f in fields(schema)}
    if unknown := sorted((set(roles) | set(checks)) - names):
        raise TypeError(f"{schema.__name__} has no field {unknown[0]!r}: its fields are {sorted(names)}.")
    _DECLARED_ROLES[schema] = {name: roles.get(name, default) for name in names}
    _DECLARED_CHECKS[schema] = checks


def checks_of(schema: type) -> dict[str, Any]:
    """field name -> the range its dataclass field declares, for the fields that declare one."""
    found = {f.name: f.metadata[CHECK] for f in fields(schema) if CHECK in f.metadata}
    return {**_DECLARED_CHECKS.get(schema, {}), **found}


def role_tree(schema: type) -> dict[str, tuple[Role, dict | None]]:
    """Each field of the dataclass `schema` -> (its role, the same for its fields when it is an
    identity section). Raises TypeError naming a field that declares no role."""
    hints = get_type_hints(schema)
    tree: dict[str, tuple[Role, dict | None]] = {}
    for f in fields(schema):
        role = f.metadata.get(ROLE, _DECLARED_ROLES.get(schema, {}).get(f.name))
        if not isinstance(role, Role):
            raise TypeError(
                f"{schema.__name__}.{f.name} declares no role: declare it with identity_key(), "
                f"execution_key(), other_stage() or resolved_key() (prism.config.roles)."
            )
        section = hints[f.name] if is_dataclass(hints[f.name]) else None
        tree[f.name] = (role, role_tree(section) if section and role is Role.identity else None)
    return tree
