"""The named parts a config value or an argument picks (data sources, pipeline stages, evaluation
tasks, trackers, strategies): one Registry per kind (docs/design.md, "Adding a part")."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from prism.errors import ConfigError

Part = TypeVar("Part")


class Registry(Generic[Part]):
    """name -> part of one kind, in registration order; `kind` (or the config `key`) names it in
    the refusal, `listed` writes the valid names."""

    def __init__(
        self, kind: str, key: str | None = None, listed: Callable[[list[str]], str] | None = None
    ) -> None:
        self.kind = kind
        self.key = key
        self._listed = listed or ", ".join
        self._parts: dict[str, Part] = {}

    def add(self, name: str, part: Part, replace: bool = False) -> Part:
        """Register `part` as `name`; a name already taken is refused unless `replace`."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} needs a non-empty name, not {name!r}.")
        if name in self._parts and not replace:
            held = self._parts[name]
            label = getattr(held, "__qualname__", type(held).__qualname__)
            raise ValueError(
                f"{self.kind} {name!r} is already registered ({label}); pass replace=True to swap it out."
            )
        self._parts[name] = part
        return part

    def register(self, name: str) -> Callable[[Part], Part]:
        """The decorator form of `add`: `@SOURCES.register("mine")` above a class."""
        return lambda part: self.add(name, part)

    def remove(self, name: str) -> None:
        """Forget `name` (a part a test or a site registered for a while)."""
        self._parts.pop(name, None)

    def get(self, name: str) -> Part:
        try:
            return self._parts[name]
        except (KeyError, TypeError):  # TypeError: an unhashable value from a config
            raise ConfigError(self.unknown(name)) from None

    __getitem__ = get

    def unknown(self, name: object) -> str:
        """The one sentence that refuses `name`."""
        valid = self._listed(self.names())
        if self.key:
            return f"{self.key}={name!r} is invalid: use one of {valid}."
        return f"unknown {self.kind} {name!r}; valid {self.kind}s are {valid}."

    def names(self) -> list[str]:
        return list(self._parts)

    def parts(self) -> list[Part]:
        return list(self._parts.values())

    def items(self) -> list[tuple[str, Part]]:
        return list(self._parts.items())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._parts
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._parts))

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._parts)})"
