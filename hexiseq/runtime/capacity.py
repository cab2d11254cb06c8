"""How many ranks this machine can spawn: each local rank is a process of its own (torch and a
model replica in it), so a world far beyond the cores or the memory only thrashes or is killed by
the out-of-memory killer. Checked before any work by the commands that spawn local worlds
(`run`, `verify --nproc`, `profile --world`)."""

from __future__ import annotations

import os

from ..errors import HexiSeqError

RANKS_PER_CORE = 8  # CPU ranks mostly wait on each other: oversubscription works up to here
MIN_RANKS = 16  # always allowed (a small machine still runs the usual 8-rank plans)
RANK_MEMORY_BYTES = 300 * 2**20  # a CPU rank's resident memory: the interpreter, torch and a small model


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def local_rank_limit() -> int:
    """The largest world this machine may spawn: RANKS_PER_CORE per core (at least MIN_RANKS), and
    no more than its available memory holds at RANK_MEMORY_BYTES each."""
    cores = os.cpu_count() or 1
    limit = max(MIN_RANKS, RANKS_PER_CORE * cores)
    memory = available_memory()
    if memory is not None:
        limit = min(limit, max(1, memory // RANK_MEMORY_BYTES))
    return int(limit)


def check_local_world(n: int, flag: str) -> None:
    """Refuse spawning `n` local ranks when this machine cannot hold them; `flag` names the option."""
    limit = local_rank_limit()
    if n > limit:
        memory = available_memory()
        free = f" and {memory / 2**30:.1f} GiB of memory available" if memory is not None else ""
        raise HexiSeqError(
            f"{flag} {n}: this machine has {os.cpu_count() or 1} CPU cores{free}: at most {limit} local ranks "
            f"(each a process of about {RANK_MEMORY_BYTES // 2**20} MB); use a smaller world, or torchrun across "
            "machines"
        )
