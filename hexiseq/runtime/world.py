"""Start a torch.distributed world: spawned local processes (tests, notebooks, benchmarks) or torchrun.

`spawn_world` never hangs: the parent hosts the rendezvous store (no port race), every process
group gets a `timeout=` (per collective), a rank that stays silent after the others failed is
killed, and the whole world may be given a time limit. Rank failures come back as one message
(failures.py); their tracebacks stay available for --debug.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .failures import LIMIT, RankFailure, classify, died, env_board, process_state, silent, summarize


class WorldError(RuntimeError):
    """A spawned world failed: `str(e)` is one message naming the root cause (see failures.py),
    `failures` every rank's report, `rc` the exit code it deserves (2 bad input, 1 a runtime fault)."""

    def __init__(self, message: str, failures: dict[int, RankFailure] | None = None, bad_input: bool = False) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})
        self.bad_input = bad_input

    @property
    def rc(self) -> int:
        return 2 if self.bad_input else 1

    def details(self) -> str:
        """Every rank's traceback (for --debug)."""
        return "\n".join(
            f"--- rank {r} ({f.kind}) ---\n{f.detail or f.message}" for r, f in sorted(self.failures.items())
        )


@dataclass
class WorldResult:
    """What each rank of a spawned world did: `values[r]` when it returned, `failures[r]` when it
    raised, died, or was killed as stopped/hung, `exitcodes[r]` of its process. `errors[r]` is the
    failure as text (the traceback when there is one)."""

    values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    exitcodes: dict[int, int | None] = field(default_factory=dict)
    timed_out: bool = False

    @property
    def errors(self) -> dict[int, str]:
        return {r: f.detail or f.message for r, f in self.failures.items()}

    def missing(self, nproc: int) -> list[int]:
        return [r for r in range(nproc) if r not in self.values and r not in self.failures]


def _die_with_parent() -> None:
    """A rank outlives no parent: SIGKILL when the launcher dies, even by SIGKILL (Linux prctl;
    elsewhere a watcher thread), so that an orphaned world does not train on alone."""
    parent = os.getppid()
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, 9) == 0:  # PR_SET_PDEATHSIG, SIGKILL
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
    except (AttributeError, OSError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker(
    fn: Callable,
    rank: int,
    nproc: int,
    port: int,
    backend: str,
    pg_timeout_s: float,
    threads: int,
    args: tuple,
    results: mp.Queue,
) -> None:
    _die_with_parent()
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":  # bind the GPU before NCCL creates its communicator
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore("127.0.0.1", port, nproc, is_master=False, timeout=timedelta(seconds=pg_timeout_s))
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=nproc, timeout=timedelta(seconds=pg_timeout_s)
        )
        value = fn(rank, nproc, *args)
        results.put((rank, True, value))
    except BaseException as e:  # report everything, including KeyboardInterrupt / SystemExit
        results.put((rank, False, classify(rank, e, pg_timeout_s)))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def local_backend(nproc: int) -> str:
    """NCCL when this machine has a GPU for every spawned rank, else gloo (CPU)."""
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


DEFAULT_PG_TIMEOUT_S = 300.0
_DEATH_GRACE_S = 0.3  # a dead process may still have its result in the pipe
_AFTER_FAILURE_S = 5.0  # beyond the process-group timeout, how long the others get to fail after a cause


def run_world(
    fn: Callable,
    nproc: int,
    *args: Any,
    timeout_s: float | None = 120.0,
    backend: str = "gloo",
    pg_timeout_s: float | None = None,
    threads: int | None = None,
    poll: Callable[[float], None] | None = None,
) -> WorldResult:
    """Run `fn(rank, nproc, *args)` on `nproc` spawned ranks and collect every outcome without raising
    on rank failures (for tests that kill a rank on purpose).

    `pg_timeout_s` bounds every collective (the process-group timeout; default `timeout_s`, else 300 s).
    `timeout_s` bounds the whole world (None: no limit): ranks still running then are killed and
    `timed_out` is set. Once a rank has failed, the others get the process-group timeout (they are in
    or will reach a collective) plus a few seconds to fail in turn; a rank still silent after that is
    killed and reported as stopped (SIGSTOP) or hung — at once when every rank still out is stopped. `poll(elapsed_s)`
    is called about every 0.1 s.
    """
    if nproc <= 0:
        raise ValueError(f"nproc must be positive, got {nproc}")
    pg_timeout_s = float(pg_timeout_s if pg_timeout_s is not None else (timeout_s or DEFAULT_PG_TIMEOUT_S))
    # torch threads per rank: the caller's, else HEXISEQ_RANK_THREADS (the numerics audit varies it), else
    # the cores shared out so that the ranks do not oversubscribe the machine
    threads = threads or int(os.environ.get("HEXISEQ_RANK_THREADS") or 0) or max(1, (os.cpu_count() or 1) // nproc)
    # The parent hosts the store on a free port it picked itself, so two worlds never collide.
    store = dist.TCPStore(
        "127.0.0.1", 0, nproc, is_master=True, timeout=timedelta(seconds=pg_timeout_s), wait_for_workers=False
    )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker, args=(fn, r, nproc, store.port, backend, pg_timeout_s, threads, args, results), daemon=True
        )
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    out = WorldResult()
    t0 = time.monotonic()
    deadline = t0 + timeout_s if timeout_s is not None else float("inf")
    dead_since: dict[int, float] = {}
    first_failure: float | None = None
    try:
        while len(out.values) + len(out.failures) < nproc:
            try:
                rank, ok, value = results.get(timeout=0.1)
                if ok:
                    out.values[rank] = value
                else:
                    out.failures[rank] = value
                    first_failure = first_failure or time.monotonic()
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            if poll is not None:
                poll(now - t0)
            for r, p in enumerate(procs):
                if r in out.values or r in out.failures or p.exitcode is None:
                    continue
                if now - dead_since.setdefault(r, now) > _DEATH_GRACE_S:
                    out.failures[r] = died(r, p.exitcode, p.pid)
                    first_failure = first_failure or now
            missing = out.missing(nproc)
            all_stopped = missing and out.failures and all(process_state(procs[r].pid) == "T" for r in missing)
            if first_failure is not None and (all_stopped or now - first_failure > pg_timeout_s + _AFTER_FAILURE_S):
                for r in missing:
                    out.failures[r] = silent(r, procs[r].pid, pg_timeout_s, others_failed=True)
                break
            if now > deadline:
                out.timed_out = True
                for r in out.missing(nproc):
                    out.failures[r] = RankFailure(
                        r,
                        LIMIT,
                        f"was still running at the time limit of {timeout_s:g} s and was killed",
                        pid=procs[r].pid,
                    )
                break
    finally:
        # Finished ranks get a moment to tear their process group down; the rest are killed.
        grace = time.monotonic() + (0.0 if out.timed_out or out.missing(nproc) else 1.0)
        for p in procs:
            p.join(timeout=max(0.0, grace - time.monotonic()))
            if p.is_alive():
                p.kill()  # SIGKILL also ends a stopped process
        for r, p in enumerate(procs):
            p.join(timeout=5)
            out.exitcodes[r] = p.exitcode
        results.close()
    return out


def spawn_world(
    fn: Callable,
    nproc: int,
    *args: Any,
    timeout_s: float | None = 120.0,
    backend: str = "gloo",
    pg_timeout_s: float | None = None,
    poll: Callable[[float], None] | None = None,
) -> list:
    """Run `fn(rank, world_size, *args)` on `nproc` spawned processes, each with the default process
    group initialized (loopback, parent-hosted store, `timeout=` set); return the values in rank order.

    `fn` must be a module-level (importable) function and its results picklable. Raises WorldError
    with one message naming the root cause when any rank raises, dies or hangs, or when the world runs
    past `timeout_s` (the processes are then killed); `WorldError.details()` has every traceback.
    """
    res = run_world(fn, nproc, *args, timeout_s=timeout_s, backend=backend, pg_timeout_s=pg_timeout_s, poll=poll)
    if res.failures:
        message, bad_input = summarize(res.failures, nproc)
        raise WorldError(message, res.failures, bad_input)
    return [res.values[r] for r in range(nproc)]


def torchrun_env() -> bool:
    """Is this process one rank of a torchrun (or any env://) launch?"""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(
    backend: str | None = None,
    timeout_s: float = DEFAULT_PG_TIMEOUT_S,
    rank: int | None = None,
    device_index: int | None = None,
) -> tuple[int, int]:
    """Initialize the default group from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT);
    NCCL with the local GPU when CUDA is present, gloo otherwise. `rank` overrides RANK (the plan's
    rank of this process's device), `device_index` the GPU it binds (default LOCAL_RANK). `timeout_s`
    bounds every collective. Also starts this rank's
    heartbeat board in the store (failures.py), so that a failing rank can name a stopped peer.
    Returns (rank, world_size)."""
    if not dist.is_initialized():
        if not torchrun_env():
            raise RuntimeError("init_from_env: RANK / WORLD_SIZE are not set; launch with torchrun")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) if device_index is None else device_index)
        rank = int(os.environ["RANK"]) if rank is None else rank
        world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), rank=rank, world_size=world)
        env_board(rank, world)
    return dist.get_rank(), dist.get_world_size()


def arm_time_limit(seconds: float | None, on_expiry: Callable[[], None]) -> threading.Timer | None:
    """Call `on_expiry` after `seconds` from a daemon timer (a torchrun process's --time-limit);
    None: no limit. The callback is expected to end the process."""
    if seconds is None:
        return None
    timer = threading.Timer(seconds, on_expiry)
    timer.daemon = True
    timer.start()
    return timer
