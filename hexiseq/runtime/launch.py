"""Start a torch.distributed world: spawned local processes (tests, notebooks, benchmarks) or torchrun.

`spawn_world` never hangs: the parent hosts the rendezvous store (no port race), every process
group gets a `timeout=`, and the whole world is killed after `timeout_s`. A rank's exception comes
back as its traceback text.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class WorldError(RuntimeError):
    """A spawned rank failed, died, or the world ran past its deadline."""


@dataclass
class WorldResult:
    """What each rank of a spawned world did: `values[r]` when it returned, `errors[r]` (traceback
    text) when it raised, `exitcodes[r]` of its process (None while still running when killed)."""

    values: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    exitcodes: dict[int, int | None] = field(default_factory=dict)
    timed_out: bool = False

    def missing(self, nproc: int) -> list[int]:
        return [r for r in range(nproc) if r not in self.values and r not in self.errors]


def _worker(fn: Callable, rank: int, nproc: int, port: int, backend: str, pg_timeout_s: float, threads: int,
            args: tuple, results: "mp.Queue") -> None:
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":  # bind the GPU before NCCL creates its communicator
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore("127.0.0.1", port, nproc, is_master=False, timeout=timedelta(seconds=pg_timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=nproc, timeout=timedelta(seconds=pg_timeout_s))
        value = fn(rank, nproc, *args)
        results.put((rank, True, value))
    except BaseException:  # report everything, including KeyboardInterrupt / SystemExit, as text
        results.put((rank, False, traceback.format_exc()))
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


def run_world(fn: Callable, nproc: int, *args: Any, timeout_s: float = 120.0, backend: str = "gloo",
              pg_timeout_s: float | None = None, threads: int | None = None) -> WorldResult:
    """Run `fn(rank, nproc, *args)` on `nproc` spawned ranks and collect every outcome without raising
    on rank failures (for tests that kill a rank on purpose). Kills the world after `timeout_s`."""
    if nproc <= 0:
        raise ValueError(f"nproc must be positive, got {nproc}")
    pg_timeout_s = float(pg_timeout_s if pg_timeout_s is not None else timeout_s)
    # torch threads per rank: the caller's, else HEXISEQ_RANK_THREADS (the numerics audit varies it), else
    # the cores shared out so that the ranks do not oversubscribe the machine
    threads = threads or int(os.environ.get("HEXISEQ_RANK_THREADS") or 0) or max(1, (os.cpu_count() or 1) // nproc)
    # The parent hosts the store on a free port it picked itself, so two worlds never collide.
    store = dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, timeout=timedelta(seconds=pg_timeout_s), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(fn, r, nproc, store.port, backend, pg_timeout_s, threads, args, results), daemon=True)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    out = WorldResult()
    deadline = time.monotonic() + timeout_s
    dead_since: dict[int, float] = {}
    try:
        while len(out.values) + len(out.errors) < nproc:
            try:
                rank, ok, value = results.get(timeout=0.05)
                (out.values if ok else out.errors)[rank] = value
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r in out.values or r in out.errors or p.exitcode is None:
                    continue
                # A dead process may still have its result in the pipe: give it a moment.
                if now - dead_since.setdefault(r, now) > 0.3:
                    out.errors[r] = f"rank {r} died with exit code {p.exitcode} without returning"
            if now > deadline:
                out.timed_out = True
                break
    finally:
        # Finished ranks get a moment to tear their process group down; the rest are killed.
        grace = time.monotonic() + (0.0 if out.timed_out else 1.0)
        for p in procs:
            p.join(timeout=max(0.0, grace - time.monotonic()))
            if p.is_alive():
                p.kill()
        for r, p in enumerate(procs):
            p.join(timeout=5)
            out.exitcodes[r] = p.exitcode
        results.close()
    return out


def spawn_world(fn: Callable, nproc: int, *args: Any, timeout_s: float = 120.0, backend: str = "gloo",
                pg_timeout_s: float | None = None) -> list:
    """Run `fn(rank, world_size, *args)` on `nproc` spawned processes, each with the default process
    group initialized (loopback, parent-hosted store, `timeout=` set); return the values in rank order.

    `fn` must be a module-level (importable) function and its results picklable. Raises WorldError
    with the failing ranks' tracebacks when any rank raises or dies, or when the world runs past
    `timeout_s` (the processes are then killed).
    """
    res = run_world(fn, nproc, *args, timeout_s=timeout_s, backend=backend, pg_timeout_s=pg_timeout_s)
    if res.errors or res.timed_out:
        parts = [f"--- rank {r} ---\n{res.errors[r]}" for r in sorted(res.errors)]
        if res.timed_out:
            parts.append(f"world killed after {timeout_s:g} s; ranks still running: {res.missing(nproc)}")
        raise WorldError(f"spawned world of {nproc} failed ({getattr(fn, '__name__', fn)}):\n" + "\n".join(parts))
    return [res.values[r] for r in range(nproc)]


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> tuple[int, int]:
    """Initialize the default group from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT);
    NCCL with the local GPU when CUDA is present, gloo otherwise. Returns (rank, world_size)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise RuntimeError("init_from_env: RANK / WORLD_SIZE are not set; launch with torchrun")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()
