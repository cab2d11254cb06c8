"""One writer per run directory: an exclusive lock on RUN_DIR/.lock.

The lock is `fcntl.flock` on the file, taken before anything else is written into the directory
and held by the process that writes the record (the launcher of spawned ranks; rank 0 under
torchrun). The kernel drops it when that process ends, however it ends (a crash, SIGKILL), so a
lock is never left behind; the file itself stays and says who held it last (pid, host, time).
A second run into the same directory is refused at once, naming the other run's pid and host.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import HexiSeqError

LOCK_NAME = ".lock"

# directory (real path) -> the open descriptor that holds its lock, in this process
_HELD: dict[str, int] = {}

F = TypeVar("F", bound=Callable[..., Any])


def _holder(fd: int) -> dict[str, Any]:
    """What the lock file says about its holder; a moment's wait while a new holder writes it."""
    for _ in range(20):
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        try:
            data = json.loads(raw)
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
        time.sleep(0.05)
    return {}


def _held_here(key: str, path: Path) -> bool:
    """This process holds the lock of `key` already, on the file that is there now (not on one of a
    directory since removed and made again)."""
    fd = _HELD.get(key)
    if fd is None:
        return False
    try:
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            return True
    except OSError:
        pass
    os.close(_HELD.pop(key))
    return False


def take(directory: Path | str, flag: str = "--out") -> None:
    """Lock `directory` for this process (it must exist); HexiSeqError naming the other run's pid and
    host when another process holds it, or the directory when it cannot be locked. `flag`: the
    option that named the directory, for the message. Taking a lock this process holds is a no-op."""
    directory = Path(directory)
    path = directory / LOCK_NAME
    key = os.path.realpath(directory)
    if _held_here(key, path):
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise HexiSeqError(
            f"{flag} {directory}: cannot write there ({e.strerror or type(e).__name__}); give a writable directory"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = _holder(fd)
        os.close(fd)
        since = f", since {time.strftime('%H:%M:%S', time.localtime(other['time']))}" if "time" in other else ""
        raise HexiSeqError(
            f"{flag} {directory}: another run is writing this run directory (pid {other.get('pid', '?')} on host "
            f"{other.get('host', '?')}{since}); wait for it to end or stop it (touch {directory / 'STOP'}), "
            "or give another directory"
        ) from None
    except OSError as e:  # a filesystem without locks (ENOLCK)
        os.close(fd)
        raise HexiSeqError(
            f"{flag} {directory}: cannot be locked ({e.strerror}): put run directories on a filesystem with locks"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}).encode())
    _HELD[key] = fd


def release(directory: Path | str) -> None:
    """Give up this process's lock of `directory` (the file stays: removing it would race a taker)."""
    fd = _HELD.pop(os.path.realpath(directory), None)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    """Give up every run-directory lock this process holds."""
    for key in list(_HELD):
        os.close(_HELD.pop(key))


def locked_by_other(directory: Path | str) -> dict[str, Any] | None:
    """The holder (pid, host, time) when another process holds `directory`'s lock now, else None
    (no lock file, nobody holds it, or this process does): a run's status is live only while held."""
    directory = Path(directory)
    path = directory / LOCK_NAME
    if _held_here(os.path.realpath(directory), path) or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd) or {"pid": "?", "host": "?"}
    finally:
        os.close(fd)  # closing drops a shared lock taken here
    return None


def releases_locks(fn: F) -> F:
    """Decorate a command: the run-directory locks it took are released when it returns or raises
    (in-process callers, e.g. tests and notebooks, may run into the same directory again)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = set(_HELD)
        try:
            return fn(*args, **kwargs)
        finally:
            for key in set(_HELD) - before:
                os.close(_HELD.pop(key))

    return wrapper  # type: ignore[return-value]
