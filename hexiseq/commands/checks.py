"""Checks of command-line values, before any work: finite, in range, with the limit in the message.

The upper limits are sanity bounds (far above any real run, far below what would overflow or
allocate absurd memory); each message says the bound and the flag.
"""

from __future__ import annotations

import math

from ..errors import HexiSeqError

# flag -> (smallest, largest, whether the smallest is allowed)
LIMITS: dict[str, tuple[float, float, bool]] = {
    "--steps": (0, 10_000_000, False),
    "--lr": (0.0, 1.0, False),  # AdamW steps of more than 1 per entry are not training
    "--grad-clip": (0.0, 1e6, True),  # 0 disables clipping
    "--timeout": (0.0, 7 * 86400.0, False),  # per collective
    "--time-limit": (0.0, 365 * 86400.0, False),
    "--loss-chunk": (0, 2**24, False),
    "--seq-len": (0, 2**24, False),  # 16M tokens on one plan; the planner's own limit is its business
    "--seed": (0, 2**63 - 1, True),
    "--nproc": (0, 65536, False),
    "--tolerance": (0.0, 1.0, False),
    "--warmup-steps": (0, 10_000_000, True),
    "--global-batch": (0, 65536, False),
    "--checkpoint-every": (0, 10_000_000, True),
    "--weight-decay": (0.0, 10.0, True),
    "--min-lr-ratio": (0.0, 1.0, True),
    "--block-size": (0, 2**20, False),
}


def check_value(flag: str, value: float | int | None) -> None:
    """Raise HexiSeqError unless `value` is finite and inside LIMITS[flag] (None: not given, fine)."""
    if value is None:
        return
    lo, hi, lo_ok = LIMITS[flag]
    if isinstance(value, float) and not math.isfinite(value):
        raise HexiSeqError(f"{flag} must be a finite number, got {value}")
    if value < lo or (value == lo and not lo_ok):
        what = f"at least {lo:g}" if lo_ok else ("positive" if lo == 0 else f"above {lo:g}")
        raise HexiSeqError(f"{flag} must be {what}, got {value:g}")
    if value > hi:
        raise HexiSeqError(f"{flag} must be at most {hi:g}, got {value:g}")


def check_args(args: object, *flags: str) -> None:
    """check_value for each flag present on an argparse namespace (--grad-clip -> args.grad_clip)."""
    for flag in flags:
        check_value(flag, getattr(args, flag.lstrip("-").replace("-", "_"), None))
