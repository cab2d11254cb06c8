"""The run directory: a run's record.

```
RUN_DIR/
  config.json      the resolved configuration (what `--resume` continues)
  plan.json        the plan the run executes (plans/ keeps the earlier ones of an elastic resume)
  metrics.jsonl    one JSON object per step (METRIC_KEYS and more)
  summary.json     predicted vs measured step time, environment, outcome (`summary_keys`)
  status.json      what the run is doing now (the launcher's heartbeat and notebooks read it)
  console.log      what the run printed
  checkpoints/     DCP checkpoints, step-NNNNNNNN/ (runs/checkpoint.py)
  tensorboard/     event files, when the tensorboard package is installed
  data/            tokens of a text source, given sequences
  loss.png         the loss curve (`hexiseq run --plot`, make demo)
  .lock            held by the run writing the directory (pid, host): one writer at a time (runs/lock.py)
```

`load(RUN_DIR)` gives the metrics as a table (pandas), `load_summary` the summary.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import HexiSeqError
from ..runtime.failures import StorageError, storage_error
from ..specs import write_text_atomic as write_text
from .config import RunConfig
from .lock import LOCK_NAME, locked_by_other, release, take

FINAL_PHASES = ("completed", "stopped", "failed")  # how a session ends (status.json's last phase)
METRIC_KEYS = ("step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "peak_mem_mb")


def default_run_dir() -> Path:
    """$HEXISEQ_RUNS/<YYYYmmdd-HHMMSS>, HEXISEQ_RUNS defaulting to ./runs (a suffix when that exists)."""
    base = Path(os.environ.get("HEXISEQ_RUNS") or "runs") / time.strftime("%Y%m%d-%H%M%S")
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


class RunDir:
    """Paths and writers of one run directory (the writers are called by rank 0 / the launcher)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.created = False  # a new run, by `create` in this process (a refused start removes what it made)
        self.made_dir = False  # ... and the directory itself did not exist before

    config = property(lambda self: self.path / "config.json")
    plan = property(lambda self: self.path / "plan.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    status = property(lambda self: self.path / "status.json")
    console = property(lambda self: self.path / "console.log")
    checkpoints = property(lambda self: self.path / "checkpoints")
    tensorboard = property(lambda self: self.path / "tensorboard")
    data = property(lambda self: self.path / "data")
    inputs = property(lambda self: self.path / "inputs")
    loss_png = property(lambda self: self.path / "loss.png")

    @classmethod
    def create(cls, path: Path | str | None) -> RunDir:
        """A new run directory, locked for this process (one writer: runs/lock.py); refuses one that
        already holds a run (resume it instead), one another run is writing, and a path that cannot
        be a directory. A refused directory that this call made is removed again."""
        if path is not None and not str(path).strip():
            raise HexiSeqError("--out '': give a directory path for the run (or leave --out out: runs/<timestamp>)")
        run = cls(path if path is not None else default_run_dir())
        if run.path.exists() and not run.path.is_dir():
            raise HexiSeqError(f"--out {run.path}: is a file; give a directory for the run")
        made = not run.path.exists()
        try:
            run.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HexiSeqError(
                f"--out {run.path}: cannot be made ({e.strerror or type(e).__name__}); give a writable directory"
            ) from None
        try:
            run.lock("--out")
            if any(p.name not in ("inputs", LOCK_NAME) for p in run.path.iterdir()):
                hint = f"continue it with --resume {run.path}" if run.config.exists() else "it is not a run directory"
                raise HexiSeqError(f"--out {run.path}: already holds files; {hint}, or give another --out")
        except BaseException:
            if made:
                release(run.path)
                (run.path / LOCK_NAME).unlink(missing_ok=True)
                run.path.rmdir()
            raise
        run.created, run.made_dir = True, made
        return run

    def lock(self, flag: str = "--resume") -> None:
        """Take this run directory's lock before writing into it (refused, naming the other run's
        pid and host, while another run holds it)."""
        take(self.path, flag)

    @classmethod
    def existing(cls, path: Path | str, flag: str = "--resume") -> RunDir:
        """The run directory `path` (named by `flag` in messages); refuses one without config.json."""
        run = cls(path)
        if not run.config.is_file():
            raise HexiSeqError(f"{flag} {run.path}: not a run directory (no config.json)")
        if run.checkpoints.exists() and not run.checkpoints.is_dir():
            raise HexiSeqError(
                f"{flag} {run.path}: {run.checkpoints} is not a directory (the run's checkpoints live there): "
                "the run directory is damaged; move that file away"
            )
        return run

    def read_config(self, flag: str = "--resume") -> RunConfig:
        """The run's config.json as a RunConfig, every typed view checked; HexiSeqError naming the
        file (and `flag`, the option that named the run directory) when it is unreadable or incomplete."""
        data = self.read_json(self.config)
        if data is None:
            raise HexiSeqError(
                f"{flag} {self.path}: {self.config} is unreadable (not a JSON object): the run directory is damaged"
            )
        try:
            cfg = RunConfig.from_dict(data)  # builds every typed section: a missing or bad field raises here
            if not isinstance(cfg.steps, int) or isinstance(cfg.steps, bool):
                raise TypeError("steps is not an integer")
        except HexiSeqError as e:  # the version, or the plan it holds
            raise HexiSeqError(f"{flag} {self.path}: {self.config}: {e}") from None
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            what = str(e).replace("RunConfig.__init__() ", "").replace("__init__() ", "")
            raise HexiSeqError(
                f"{flag} {self.path}: {self.config} is incomplete or damaged ({what}): it was not written by "
                "this HexiSeq, or was edited"
            ) from None
        return cfg

    # ---- writers
    def write_json(self, path: Path, obj: Any) -> None:
        text = json.dumps(obj, indent=2, default=_jsonable) + "\n"
        try:
            write_text(path, text)
        except OSError as e:  # disk full, read-only, removed: named, with what to do
            raise self._storage_error(e, path, len(text)) from None

    def _storage_error(self, e: OSError, path: Path, need_bytes: int | None = None) -> StorageError:
        then = f"continue with --resume {self.path}" if self.config.exists() else ""
        return storage_error(e, path, "writing", need_bytes=need_bytes, then=then)

    def set_status(self, phase: str, **extra: Any) -> None:
        self.write_json(self.status, {"phase": phase, "time": time.time(), **extra})

    def append_metrics(self, record: dict[str, Any]) -> None:
        try:
            with open(self.metrics, "a") as f:
                f.write(json.dumps(record, default=_jsonable) + "\n")
                f.flush()
        except OSError as e:
            raise self._storage_error(e, self.metrics) from None

    def keep_metrics_until(self, step: int) -> int:
        """On resume from the checkpoint of `step` (0: no checkpoint): drop the records after it (they
        are recomputed), and lines that are not records. Returns how many records were dropped."""
        if not self.metrics.exists():
            return 0
        records = self.read_metrics()
        kept = [r for r in records if r["step"] <= step]
        try:
            write_text(self.metrics, "".join(json.dumps(r) + "\n" for r in kept))
        except OSError as e:
            raise self._storage_error(e, self.metrics) from None
        return len(records) - len(kept)

    # ---- readers
    def read_metrics(self) -> list[dict[str, Any]]:
        """The per-step records; a line cut short by a kill is skipped."""
        if not self.metrics.is_file():
            return []
        out = []
        for line in self.metrics.read_bytes().decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # a line cut short, or not ours
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                out.append(record)
        return out

    def read_status(self) -> dict[str, Any] | None:
        """status.json, with `stale: True` when it is not final ("training", "checkpoint", ...) but no
        process holds the run's lock: the run that wrote it was killed or crashed (None: no status)."""
        status = self.read_json(self.status)
        if status is not None and status.get("phase") not in FINAL_PHASES:
            status["stale"] = (self.path / LOCK_NAME).is_file() and locked_by_other(self.path) is None
        return status

    def read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):  # missing, cut short, not UTF-8, nested too deep
            return None
        return data if isinstance(data, dict) else None


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def load(run_dir: Path | str):
    """The metrics of a run as a pandas DataFrame, one row per step (columns METRIC_KEYS and more;
    `peak_mem_mb` expanded into one column per rank, `peak_mem_mb_r0`, ...)."""
    import pandas as pd

    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise HexiSeqError(f"run directory not found: {run.path}")
    rows = []
    for r in run.read_metrics():
        row = {k: v for k, v in r.items() if k != "peak_mem_mb"}
        for i, m in enumerate(r.get("peak_mem_mb") or []):
            row[f"peak_mem_mb_r{i}"] = m
        rows.append(row)
    df = pd.DataFrame(rows, columns=None if rows else list(METRIC_KEYS))
    return df.set_index("step", drop=False) if rows else df


def load_summary(run_dir: Path | str) -> dict[str, Any] | None:
    """summary.json of a run (None while it has none)."""
    return RunDir(run_dir).read_json(RunDir(run_dir).summary)


class RunView:
    """What a run's handle reads of its run directory while the run goes on (local or Slurm):
    the metrics so far, the summary, the phase the run is in."""

    run_dir: Path

    @property
    def metrics(self):
        """The per-step metrics so far (pandas DataFrame; see `load`)."""
        return load(self.run_dir)

    @property
    def summary(self) -> dict[str, Any] | None:
        return load_summary(self.run_dir)

    def phase(self) -> str | None:
        """The phase status.json says (None before the run wrote one)."""
        run = RunDir(self.run_dir)
        status = run.read_json(run.status)
        return status["phase"] if status else None
