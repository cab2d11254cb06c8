"""The `hexiseq` command: one entry point, one module per subcommand in `hexiseq/commands/`.

Each command module defines `register(subparsers)` (adds its parser and sets `func`).
Errors a user can cause (`HexiSeqError`) print as one clear message and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import HexiSeqError
from .runtime.failures import kill_stopped, print_line, torchrun_line, wait_for_peer_reports
from .runtime.world import WorldError, torchrun_env

# Subcommands in the order `--help` lists them. A module that is absent is skipped so that a
# partial install still runs the others.
COMMANDS = (
    "info",
    "plan",
    "estimate",
    "verify",
    "run",
    "launch",
    "export",
    "profile",
    "calibrate",
    "schema",
    "reproduce",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hexiseq",
        description="Plan and run long-context training on heterogeneous GPU clusters (asymmetric CP x HP).",
    )
    parser.add_argument("--debug", dest="debug_all", action="store_true", help="show Python tracebacks of failures")
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
    debug = args.debug_all or getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        return report(e, args.command, debug, getattr(args, "timeout", None))


def report(e: Exception, command: str, debug: bool, pg_timeout_s: float | None = None) -> int:
    """Print one message for a failure and return the exit code: 2 for bad input, 1 for a fault.
    A spawned world's failure is already one message (its tracebacks follow with --debug); a
    torchrun process prints one line naming the root cause; anything else is re-raised with --debug."""
    if isinstance(e, WorldError):
        print(f"hexiseq {command}: error: {e}", file=sys.stderr)
        if debug:
            print(e.details(), file=sys.stderr)
        return e.rc
    if debug:
        raise e
    if torchrun_env():
        line, rc, stopped = torchrun_line(e, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), pg_timeout_s)
        print_line(f"hexiseq {command}: {line}")
        write_torchrun_error_file(f"hexiseq {command}: {line}")
        if rc == 2:  # bad input, refused by every process: each one's line out before any exits
            wait_for_peer_reports(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        kill_stopped(stopped)  # last: torchrun ends this process as soon as it sees the peer die
        return rc
    if isinstance(e, HexiSeqError):
        print(f"hexiseq {command}: error: {e}", file=sys.stderr)
        return 2
    print(
        f"hexiseq {command}: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback, and "
        f"report it)",
        file=sys.stderr,
    )
    return 1


def write_torchrun_error_file(message: str) -> None:
    """Give torchrun's failure summary our one line instead of "error_file: <N/A>" (the format of
    torch.distributed.elastic's error handler)."""
    import json
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        try:
            with open(path, "w") as f:
                json.dump(
                    {
                        "message": {
                            "message": message,
                            "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))},
                        }
                    },
                    f,
                )
        except OSError:
            pass


def entry() -> None:
    """The `hexiseq` executable (and `python -m hexiseq.cli`): `main`'s exit code. A torchrun rank
    that succeeded leaves without the interpreter's teardown, once its output is flushed: gloo's
    worker threads can abort a process at finalization ("terminate called without an active
    exception", SIGABRT; seen in CI after a completed run), which fails that agent and leaves the
    other one waiting in torchrun's exit barrier. Every file a rank writes is closed before `main`
    returns. A failing rank keeps the normal exit (its peers' refusals are waited for in `report`)."""
    rc = main()
    if rc == 0 and torchrun_env():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":  # pragma: no cover
    entry()
