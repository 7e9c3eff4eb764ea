"""The kit's commands: one module per command (its typed function and `main(argv) -> int`), which
reproduce/*.py call. The top layer: nothing in the library imports it."""
