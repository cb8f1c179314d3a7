"""The ``provisionerd`` command: one module per subcommand (argument parsing, output, exit codes)."""
