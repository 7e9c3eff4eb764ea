"""The kit's commands: one module per command (its typed function and `main(argv) -> int`), each
parsed by prism.cli.command and run through prism.cli.exits.run_command (the small ones through
command.run, which also warns and checks --out). reproduce/*.py are thin scripts that call them.
The top layer: nothing in the library imports it."""
