"""The kit's commands, one module each (a typed function and `main(argv) -> int`) for reproduce/*.py."""
