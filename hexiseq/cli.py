"""The `hexiseq` command: one entry point, one module per subcommand in `hexiseq/commands/`.

Each command module defines `register(subparsers)` (adds its parser and sets `func`).
Errors a user can cause (`HexiSeqError`) print as one clear message and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import HexiSeqError

# Subcommands in the order `--help` lists them. A module that is absent is skipped so that a
# partial install still runs the others.
COMMANDS = ("info", "plan", "estimate", "verify", "run", "schema", "reproduce")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hexiseq",
        description="Plan and run long-context training on heterogeneous GPU clusters (asymmetric CP x HP).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"hexiseq.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"hexiseq.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HexiSeqError as e:
        print(f"hexiseq {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
