"""Running a prepared run: in the foreground (`execute`: spawned ranks, or this process as one
torchrun rank) or in the background from a notebook (`launch` -> `RunHandle`).

A background run is a `hexiseq run` subprocess in its own process group (spawned ranks or
torchrun), so a notebook never has to spawn workers itself; the handle reads the run directory for
live metrics, the summary and the outcome, and stops the run gracefully (SIGTERM: the ranks finish
their step, checkpoint and write the summary).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import HexiSeqError, RunFailed
from ..plan import Plan
from ..runtime.placement import check_placement
from ..runtime.world import WorldError, arm_time_limit, init_from_env, local_backend, spawn_world
from .config import RunConfig
from .progress import Console, Progress, closing_lines
from .rundir import RunDir, RunView, default_run_dir, load_summary
from .session import TimeLimit, discard_refused_start, mark_failed
from .settings import options
from .slurm import SlurmRun, pop_options, submit


class _Tail:
    """New records of metrics.jsonl since the last call (complete lines only)."""

    def __init__(self, run: RunDir) -> None:
        self.path, self.offset = run.metrics, run.metrics.stat().st_size if run.metrics.exists() else 0

    def new(self) -> list[dict[str, Any]]:
        import json

        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind("\n") + 1
        self.offset += len(chunk[:end].encode())
        return [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]


def _on_sigterm(handler: Any) -> Any:
    """Install a SIGTERM handler (only the main thread may); returns the previous one."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except (ValueError, TypeError):  # not the main thread, or no previous Python handler to restore
        return None


def execute_spawned(
    run: RunDir,
    cfg: RunConfig,
    resume: Path | None,
    session: int,
    console: Console,
    start: int,
    timeout_s: float,
    time_limit_s: float | None,
) -> dict[str, Any]:
    """Spawn the plan's ranks on this machine; this process shows the progress and keeps the record."""
    from .loop import RunJob, run_worker, write_summary

    world = cfg.plan.world_size
    progress = Progress.of_run(console, cfg, start)
    tail = _Tail(run)
    limit = TimeLimit(run, time_limit_s)  # a stop at the step boundary first, a kill after the grace period

    def poll(elapsed: float = 0.0) -> None:
        limit.ask_if_due(elapsed)
        status = run.read_json(run.status)
        if status:
            progress("phase", status["phase"])
        for r in tail.new():
            progress("step", r)
        progress.heartbeat()

    previous = _on_sigterm(lambda *_: (run.path / "STOP").touch())  # a graceful stop, at a step boundary
    job = RunJob(str(run.path), cfg, str(resume) if resume else None, session)
    try:
        spawn_world(
            run_worker,
            world,
            job,
            timeout_s=limit.kill_after_s,
            pg_timeout_s=timeout_s,
            backend=local_backend(world),
            poll=poll,
        )
    except WorldError as e:
        poll()
        progress.close()
        if discard_refused_start(run, e.rc):  # the ranks refused a new run's input: nothing is left behind
            raise
        write_summary(run, cfg, None, "failed", error=str(e))
        raise
    except BaseException as e:  # an interrupt, or an error of the launcher's own: the status says so
        mark_failed(run, e)
        raise
    finally:
        _on_sigterm(previous)
        (run.path / "STOP").unlink(missing_ok=True)
    poll()
    progress.close()
    summary = load_summary(run.path) or {}
    for line in closing_lines(summary) + ([limit.note()] if limit.note() else []):
        console.print(line)
    return summary


def execute_torchrun(
    run: RunDir,
    cfg: RunConfig,
    resume: Path | None,
    session: int,
    console: Console,
    start: int,
    placement: Any,
    cluster: Any,
    timeout_s: float,
    time_limit_s: float | None,
    on_time_limit: Any = None,
    before_training: Any = None,
) -> dict[str, Any] | None:
    """This process is one rank of a torchrun launch (placement: runtime.placement). Rank 0 writes the
    run's files (`before_training(rank)`, once every process has joined, so that all of them checked
    the input first) and prints the progress; returns its summary (None on other ranks)."""
    import torch.distributed as dist

    from .loop import RunJob, run_worker

    limit = TimeLimit(run, time_limit_s)
    arm_time_limit(time_limit_s, limit.ask)  # a stop at the next step boundary (rank 0 sees STOP)
    arm_time_limit(limit.kill_after_s, on_time_limit)  # ... or the end, past the grace period
    rank, world = init_from_env(timeout_s=timeout_s, rank=placement.rank, device_index=placement.cuda_index)
    placements = check_placement(cfg.plan, placement, cluster)
    lead = rank == 0
    if before_training is not None:
        before_training(rank)
    dist.barrier()
    progress = None
    if lead:
        progress = Progress.of_run(console, cfg, start)
        progress.beat_in_background()
        console.print(
            "  ranks: "
            + ", ".join(
                f"{p['rank']}=node {p['node']}/local {p['local_rank']} (device {p['device']}, {p['host']})"
                for p in placements
            )
        )
    job = RunJob(str(run.path), cfg, str(resume) if resume else None, session, placement.__dict__, console=True)
    try:
        run_worker(rank, world, job, progress=progress)
    except BaseException as e:
        if lead:  # status.json is final after any end rank 0 sees
            mark_failed(run, e)
        raise
    dist.barrier()
    dist.destroy_process_group()
    if not lead:
        return None
    progress.close()
    summary = load_summary(run.path) or {}
    for line in closing_lines(summary):
        console.print(line)
    return summary


# ------------------------------------------------------------------------------- notebooks


class RunHandle(RunView):
    """A run started by `launch`: live `.metrics`, `.summary`, `.status`, `.wait()`, `.stop()`, `.watch()`."""

    def __init__(self, run_dir: Path, process: subprocess.Popen, log: Path) -> None:
        self.run_dir, self.process, self.log = Path(run_dir), process, log

    def __repr__(self) -> str:
        return f"RunHandle({str(self.run_dir)!r}, status={self.status!r})"

    @property
    def status(self) -> str:
        rc = self.process.poll()
        if rc is None:
            return self.phase() or "starting"
        if rc != 0:
            return "failed"
        return (self.summary or {}).get("status", "completed")

    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def error(self) -> str | None:
        """The run's error message (the last lines it printed) when it failed."""
        if self.process.poll() in (None, 0):
            return None
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        msg = [ln for ln in lines if "error" in ln.lower()]
        return "\n".join((msg or lines)[-6:])

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the run ends; its summary. RunFailed with the run's message when it failed."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HexiSeqError(f"the run in {self.run_dir} is still running after {timeout:g} s") from None
        if self.process.returncode != 0:
            raise RunFailed(f"the run in {self.run_dir} failed (exit code {self.process.returncode}):\n{self.error}")
        return self.summary or {}

    def stop(self, wait: bool = True, timeout: float = 120.0) -> dict[str, Any] | None:
        """Ask the run to stop after its current step (it checkpoints and writes its summary)."""
        if self.running():
            (self.run_dir / "STOP").touch()
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if wait:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.summary

    def kill(self) -> None:
        """End the run at once (SIGKILL to its process group); its last checkpoint stays resumable."""
        if self.running():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def watch(self, every: float = 1.0) -> dict[str, Any] | None:
        """A live display (notebook) of loss and tokens/s until the run ends, then predicted vs measured."""
        from .notebook import watch

        return watch(self, every)


# The `hexiseq run` options launch passes on, besides the settings' field table: the world's and the record's.
_COMMAND_VALUES = ("timeout", "time_limit", "save")
_COMMAND_FLAGS = ("plot",)
_OWN_ARGUMENTS = ("data", "labels", "steps")  # launch's own parameters


def _known_options() -> tuple[set[str], set[str]]:
    """(options that take a value, flags) of `launch`, by keyword."""
    rows = [row for row in options() if row.key not in _OWN_ARGUMENTS]
    flags = {row.key for row in rows if isinstance(row.default, bool)} | set(_COMMAND_FLAGS)
    values = {row.key for row in rows if row.key not in flags} | set(_COMMAND_VALUES)
    return values, flags


def launch(
    plan: Any,
    data: Any = None,
    *,
    labels: Any = None,
    steps: int = 20,
    out: str | Path | None = None,
    launcher: str = "spawn",
    background: bool = True,
    backend: str = "local",
    **run_options: Any,
) -> RunHandle | SlurmRun:
    """Start a run of `plan` (a Plan or a plan file) in the background and return its handle.

    `data`: a text file/folder or token file path (as `hexiseq run --data`), or token ids ([S], [1, S]
    or [N, S]; list, numpy or torch) with optional `labels` of the same shape (Hugging Face convention,
    -100 = ignored). `run_options`: the `hexiseq run` options by name (lr=3e-3, global_batch=2,
    warmup_steps=5, model="tiny", checkpoint_every=10, ...). `launcher`: "spawn" (ranks spawned on
    this machine) or "torchrun" (torchrun --standalone, one process per rank).
    `backend="slurm"`: a Slurm job instead (partition=, time=, account=, qos=, constraint=, gpus=,
    env=, ...: hexiseq.runs.slurm.LAUNCH_OPTIONS), returning a `SlurmRun`.
    """
    from .data import save_sequences

    if backend not in ("local", "slurm"):
        raise HexiSeqError(f"launch: backend must be 'local' or 'slurm', got {backend!r}")
    if backend == "slurm":  # the Slurm options out first: the rest are the run's (hexiseq.runs.slurm)
        slurm_options, slurm_how = pop_options(run_options)
    values, flags = _known_options()
    unknown = set(run_options) - values - flags
    if unknown:
        raise HexiSeqError(f"launch: unknown options {sorted(unknown)}; known: {sorted(values | flags)}")
    if launcher not in ("spawn", "torchrun"):
        raise HexiSeqError(f"launch: launcher must be 'spawn' or 'torchrun', got {launcher!r}")
    run = RunDir(out if out is not None else default_run_dir())
    if run.path.exists() and any(run.path.iterdir()):
        raise HexiSeqError(
            f"launch: {run.path} already holds files; give another out= (or resume it with hexiseq run --resume)"
        )
    run.inputs.mkdir(parents=True, exist_ok=True)
    plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    plan.save(run.inputs / "plan.json")
    argv = ["run", "--plan", str(run.inputs / "plan.json"), "--steps", str(steps), "--out", str(run.path)]
    if data is not None:
        if isinstance(data, (str, Path)):
            argv += ["--data", str(data)]
            if labels is not None:
                argv += ["--labels", str(labels)]
        else:
            tokens_path, labels_path = save_sequences(data, labels, run.inputs)
            argv += ["--data", str(tokens_path)] + (["--labels", str(labels_path)] if labels_path else [])
    for key, value in run_options.items():
        if key in flags:
            argv += [f"--{key.replace('_', '-')}"] if value else []
        elif value is not None:
            argv += [f"--{key.replace('_', '-')}={value}"]
    if backend == "slurm":
        slurm_run = submit(plan, run.path, argv, slurm_options, slurm_how)
        if not background:
            slurm_run.wait()
        return slurm_run
    if launcher == "torchrun":
        cmd = [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node",
            str(plan.world_size),
            "-m",
            "hexiseq.cli",
            *argv,
        ]
    else:
        cmd = [sys.executable, "-m", "hexiseq.cli", *argv]
    log = run.inputs / "launcher.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    handle = RunHandle(run.path, process, log)
    if not background:
        handle.wait()
    return handle
