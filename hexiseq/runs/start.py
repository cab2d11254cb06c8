"""Starting a run: the one place a new run directory is made and its configuration resolved.

Every starter calls `start_run`: `hexiseq run` (and so `hexiseq.launch`, which runs it in the
background), calibration and the planner-against-baseline comparison.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import HexiSeqError
from ..plan import Plan
from .config import RunConfig, resolve
from .rundir import RunDir, default_run_dir
from .settings import RunSettings


def start_run(
    plan: Plan, settings: RunSettings, out: Path | str | None = None, *, shared: bool = False
) -> tuple[RunDir, RunConfig]:
    """A new run directory (`out`, default runs/<timestamp>) holding the resolved run of `plan`:
    refused when it already holds a run, the settings resolved (data prepared into it), then
    config.json and plan.json written. On a failure nothing half-made is left behind.

    `shared`: the directory is shared by processes that start together (torchrun): each checks,
    none writes the record (the caller's rank 0 does, once every process has joined and so has
    passed the checks), and a failure removes only what is empty."""
    if out is not None and not str(out).strip():
        RunDir.create(str(out))  # refuses an empty --out (it names no directory)
    path = Path(out) if out is not None else default_run_dir()
    existed = path.exists()
    if not shared:
        run = RunDir.create(path)
    else:
        run = RunDir(path)
        if run.config.exists():
            raise HexiSeqError(
                f"--out {path}: already holds a run; continue it with --resume {path}, or give another --out"
            )
        run.path.mkdir(parents=True, exist_ok=True)
    try:
        cfg = resolve(plan, settings, run.data)
    except BaseException:
        if not existed:
            if shared:  # other processes may be writing there too: only an empty directory goes
                shutil.rmtree(run.data, ignore_errors=True)
                try:
                    run.path.rmdir()
                except OSError:
                    pass
            else:
                shutil.rmtree(run.path, ignore_errors=True)
        raise
    if not shared:
        write_record(run, cfg)
    return run, cfg


def write_record(run: RunDir, cfg: RunConfig) -> None:
    """The resolved run in its directory: config.json (what --resume continues) and plan.json."""
    run.write_json(run.config, cfg.to_dict())
    run.write_json(run.plan, cfg.plan.to_dict())
