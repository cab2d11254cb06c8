"""Independent plans solved side by side in worker processes.

The joint planner solves many plans that do not depend on each other: each replica shape's DP = 1
plan and the DP = 1 plan of the whole cluster. With `workers` > 1 they run in a pool of processes
while the planner goes on (the DP x symmetric baselines, the partitions' order); a job the planner
needs that no worker has started yet it runs itself, rather than wait. Each job is the same
function on the same inputs as in one process, and the planner takes the results in its own order,
so the plan, its step and its bounds do not depend on the number of workers or on which finished
first (tests/test_planner_workers.py); only the wall time does.

The pool starts its processes with "spawn": a worker imports the planning core (no torch, ~0.7 s)
and shares no thread or lock with the caller (a forked copy of a process with HiGHS's or a kernel's
threads can hang). Spawn imports the caller's main module again in each worker, so a script that
asks for workers must plan under `if __name__ == "__main__":` (Python's rule for every spawned
process); notebooks, `python -c` and the `hexiseq` command need nothing. The pool is kept for the
next plan (workers start once per process) and closed at exit.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..errors import HexiSeqError

__all__ = ["Jobs", "available_cores", "resolve_workers"]

MAX_WORKERS = 16  # beyond this the joint planner's independent plans rarely keep a worker busy
# "auto" plans in this process alone below this many GPUs: such plans take about a second, less than
# starting the workers costs (measured on the 2-core Intel VM: testbed-8 gpt-7b 16K, G = 8, from the
# command line: 1.24 s in one process, 3.34 s with two workers started for it)
AUTO_MIN_DEVICES = 64


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int | str, devices: int | None = None) -> int:
    """`workers` as a number of processes: "auto" = the cores available (at most MAX_WORKERS), or 1
    for a cluster of fewer than AUTO_MIN_DEVICES `devices`; a number is taken as it is."""
    if workers == "auto":
        if devices is not None and devices < AUTO_MIN_DEVICES:
            return 1
        return min(available_cores(), MAX_WORKERS)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise HexiSeqError(f"workers must be 'auto' or a positive number of processes, got {workers!r}")
    return workers


class _Job:
    """One job: queued, running on a worker (`future`), or taken by this process, which runs it when
    its result is first asked for (with workers = 1 nothing is computed that the planner does not use)."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.future: Future | None = None
        self.taken = False  # by this process: never sent to a worker
        self._done, self._value, self._error = False, None, None

    def run_here(self) -> Any:
        if not self._done:
            try:
                self._value = self.fn(*self.args)
            except BaseException as e:  # kept and raised to every caller, as a Future does
                self._error = e
            self._done = True
        if self._error is not None:
            raise self._error
        return self._value


_pool: ProcessPoolExecutor | None = None
_pool_size = 0


def _shared_pool(size: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size != size:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
        _pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
        _pool_size = size
    return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)


class Jobs:
    """The jobs of one plan over `workers` processes, this one included. Jobs wait in a queue of
    this process and go to the shared pool of workers - 1 processes only as a worker frees up (the
    pool's own queue would hold them where this process cannot take them back); a job asked for
    while still queued is run here. With workers = 1 every job is run here when asked for, and
    only those asked for."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._queue: deque[_Job] = deque()
        self._running: list[Future] = []
        self._sent_first = False
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Job:
        """Queue `fn(*args)` (a module-level function: a worker imports it by name)."""
        job = _Job(fn, args)
        if self.workers > 1:
            with self._lock:
                self._queue.append(job)
            try:
                self._feed()
            except RuntimeError as e:
                # multiprocessing refuses to start a process while this one is still importing the
                # main module (the flag it checks itself): a script that plans at its top level, run
                # again by a starting worker
                if not getattr(multiprocessing.current_process(), "_inheriting", False):
                    raise
                raise HexiSeqError(
                    "the planner was asked for workers while a worker process was starting: spawned "
                    "workers import the main module, and this script plans at its top level; put the "
                    'planning under `if __name__ == "__main__":`, or plan with workers=1'
                ) from e
        return job

    def _feed(self, _done: Future | None = None) -> None:
        """Send queued jobs to the pool while a worker is free (also run by the pool's thread as each
        job ends)."""
        sent = []
        with self._lock:
            self._running = [f for f in self._running if not f.done()]
            while self._queue and len(self._running) < self.workers - 1:
                # the first job queued (the DP = 1 plan: the longest) goes first; then the workers take
                # the queue from its end, this process asks for it from the front: they meet midway
                job = self._queue.popleft() if not self._sent_first else self._queue.pop()
                self._sent_first = True
                try:
                    job.future = _shared_pool(self.workers - 1).submit(job.fn, *job.args)
                except BrokenProcessPool:  # a worker died since the last plan: a fresh pool, once
                    _reset_pool()
                    job.future = _shared_pool(self.workers - 1).submit(job.fn, *job.args)
                self._running.append(job.future)
                sent.append(job.future)
        for fut in sent:  # outside the lock: a job already done calls back at once, in this thread
            fut.add_done_callback(self._feed)

    def result(self, job: _Job) -> Any:
        """The job's result (its exception raised here): from its worker, or run here if no worker
        has it yet. A pool that lost a worker is a clear error."""
        with self._lock:
            if job.future is None and not job.taken:
                job.taken = True
                if job in self._queue:
                    self._queue.remove(job)
        if job.future is None:
            return job.run_here()
        try:
            return job.future.result()
        except BrokenProcessPool as e:
            _reset_pool()
            raise HexiSeqError(
                "a planner worker process stopped before it finished (out of memory, killed, or a script "
                'that plans with workers > 1 outside `if __name__ == "__main__":`); plan again, or with '
                "workers=1 to plan in this process alone"
            ) from e

    def close(self) -> None:
        """Drop the queued jobs and wait for the running ones (no work of this plan runs on into the
        next one)."""
        with self._lock:
            self._queue.clear()
            running = list(self._running)
        wait(running)


def _reset_pool() -> None:
    global _pool, _pool_size
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool, _pool_size = None, 0
