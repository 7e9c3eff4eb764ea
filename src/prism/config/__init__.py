"""A run's configuration: the schema with every default, the role of each key, loading and
overrides, and the value rules (types and ranges only)."""
