"""The kit's commands: one module per command (its argument parsing and `main(argv) -> int`), each
run through prism.cli.exits.run_command (the small ones through exits.run_main, which also parses,
warns and checks --out). reproduce/*.py are thin scripts that call them. The top layer: nothing in
the library imports it."""
