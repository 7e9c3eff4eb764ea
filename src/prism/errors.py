"""Errors a user can cause, shared by every layer; a leaf that imports nothing of the kit.
docs/design.md, "Errors and exit codes"."""

from __future__ import annotations

EXIT_BAD_INPUT = 2  # a setting, an argument or the data is wrong: fix it and run again
EXIT_REFUSED = 1  # nothing is wrong with the input, but the work cannot (or need not) go on


class PrismError(Exception):
    """A user error: str(exc) is one sentence, `exit_code` what the command exits with."""

    exit_code: int = EXIT_BAD_INPUT


class ConfigError(PrismError, ValueError):
    """A configuration value that cannot be used; the message names the key."""


class UsageError(PrismError):
    """A command-line argument that cannot be used; the message names the flag and what is valid."""


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of `exc`'s message, cut to `limit` characters ("" for an empty one)."""
    return (str(exc).splitlines() or [""])[0][:limit]


def cause(exc: BaseException, limit: int | None = None) -> str:
    """`Type: first line` of `exc`, the one-line cause a refusal or a log line quotes."""
    return f"{type(exc).__name__}: {first_line(exc, limit)}"


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, newest first: a Ctrl-C that
    cut a call short can surface as that call's own error (torch.save raises "unexpected pos")."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not e for e in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain
