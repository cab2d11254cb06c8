"""Subcommands of the `hexiseq` CLI, one module each (see hexiseq/cli.py)."""
