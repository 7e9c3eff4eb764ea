"""Errors a user can cause, shared by every layer. A leaf: it imports nothing of the kit."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""
