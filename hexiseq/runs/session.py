"""A session of a run in its record: how it begins, how it ends, and the time limit between.

- `begin_record`: before the ranks start, the record is made to match the state the session starts
  from: metrics.jsonl cut back to the checkpoint's step (to nothing when there is no checkpoint:
  the session starts at step 0), a STOP file left by an earlier session removed.
- `previous_end`: on resume, partial checkpoints of a killed save are removed, and a status.json
  that is not final ("training", "checkpoint", ...) while no process holds the run's lock says the
  last session was killed or crashed: both named in notes.
- `discard_refused_start`: a new run whose ranks refused its input leaves nothing behind;
- `mark_failed`: any end the launcher sees (a rank failure, an interrupt, an error of its own)
  leaves status.json final.
- `TimeLimit`: --time-limit asks the ranks to stop at the next step boundary with a checkpoint (as
  SIGTERM does); the world is killed only when that has not happened within the grace period.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from .lock import locked_by_other, release
from .rundir import FINAL_PHASES, RunDir

FINAL = FINAL_PHASES
GRACE_MIN_S = 30.0  # at least this long to finish the step and write the checkpoint
GRACE_FRACTION = 0.1  # ... or this fraction of the limit (a large model's checkpoint takes longer)


def stop_file(run: RunDir) -> Path:
    """RUN_DIR/STOP: the ranks stop at the next step boundary while it exists."""
    return run.path / "STOP"


def begin_record(run: RunDir, start: int) -> int:
    """Lock the run directory and make its record match step `start`, the step this session starts
    from (0: a new run, or a resume with no checkpoint yet). Returns how many records were dropped."""
    run.lock("run directory")  # a new run or a resume: the message names the directory either way
    stop_file(run).unlink(missing_ok=True)  # an earlier session's: it would stop this one at once
    return run.keep_metrics_until(start)


def previous_end(run: RunDir) -> list[str]:
    """Notes on how the last session ended, when its status.json is not final (it was killed or
    crashed before it could say so). Call with the run's lock held."""
    notes = []
    if run.checkpoints.is_dir():  # partial checkpoints of a killed save: they only fill the disk
        for tmp in sorted(run.checkpoints.glob(".step-*.tmp")):
            shutil.rmtree(tmp, ignore_errors=True)
            notes.append(f"removed {tmp.name}, a checkpoint the previous session did not finish writing")
    status = run.read_json(run.status)
    if status is None or status.get("phase") in FINAL or locked_by_other(run.path):
        return notes  # (the caller holds the lock: no other process can be writing this status)
    phase, step = status.get("phase"), status.get("step")
    at = f" at step {step}" if isinstance(step, int) else ""
    return notes + [
        f"the previous session ended without a final status (it was {phase!r}{at}): it was killed or crashed; "
        "the record is cut back to the checkpoint"
    ]


def discard_refused_start(run: RunDir, rc: int) -> bool:
    """After the ranks refused a new run's input (exit code 2: bad input found as they loaded it,
    e.g. non-finite weights or too little data) before any step or checkpoint: remove what the start
    made, so that a refused run leaves nothing behind (an `inputs/` folder a notebook's launch made
    stays, with its log). True when it was removed. Only for a directory `RunDir.create` made."""
    if (
        rc != 2
        or not run.created
        or run.read_metrics()
        or (run.checkpoints.is_dir() and any(run.checkpoints.iterdir()))
    ):
        return False
    release(run.path)
    for p in run.path.iterdir():
        if p.name != "inputs":
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    if run.made_dir and not any(run.path.iterdir()):
        run.path.rmdir()
    return True


def mark_failed(run: RunDir, error: BaseException | str) -> None:
    """Make status.json final ("failed", with the error) unless the session already wrote its end."""
    status = run.read_json(run.status) or {}
    if status.get("phase") not in FINAL:
        message = error if isinstance(error, str) else (str(error) or type(error).__name__)
        run.set_status("failed", error=message.splitlines()[0][:300] if message else None)


def grace_s(limit_s: float) -> float:
    """How long after --time-limit the ranks have to stop by themselves before they are killed."""
    return max(GRACE_MIN_S, GRACE_FRACTION * limit_s)


class TimeLimit:
    """--time-limit of a session: `ask_if_due(elapsed)` (the launcher's poll) asks the ranks to stop
    when the limit is reached; `kill_after_s` is when the world is killed if they have not."""

    def __init__(self, run: RunDir, limit_s: float | None) -> None:
        self.run, self.limit_s, self.asked_at = run, limit_s, None

    @property
    def kill_after_s(self) -> float | None:
        return None if self.limit_s is None else self.limit_s + grace_s(self.limit_s)

    def ask(self) -> None:
        """Ask for a stop at the next step boundary (the ranks check the STOP file after each step)."""
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            stop_file(self.run).touch()

    def ask_if_due(self, elapsed_s: float, *_: Any) -> None:
        if self.limit_s is not None and elapsed_s >= self.limit_s:
            self.ask()

    def note(self) -> str | None:
        """The line the run prints when the limit stopped it."""
        if self.asked_at is None or self.limit_s is None:
            return None
        return (
            f"stopped at the --time-limit of {self.limit_s:g} s, at a step boundary with a checkpoint: "
            f"continue with --resume {self.run.path}"
        )
