"""Errors a user can cause, shared by every layer. A leaf: it imports nothing of the kit.

Every user error of the kit is a `PrismError`: its message is one sentence a person can act on
and its class says the exit code. prism.cli.exits prints the sentence as `error: <sentence>` and
exits with that code; any other exception is a bug (or a crash) and surfaces with its traceback.
A kind that was a ValueError or RuntimeError before the family existed keeps that base too, so
code that catches it that way goes on working; the kit itself catches the kit's own classes.
"""

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
