"""Directories that a reader sees whole or not at all (checkpoints). Single files:
`hexiseq.specs.write_text_atomic`.

A directory is built in a temporary sibling `.NAME.tmp-PID-RANDOM`, every file and the
directory fsync'd, and then put in place by one rename — or, when a directory of that name exists
already, by an atomic exchange of the two (Linux `renameat2(RENAME_EXCHANGE)`), after which the old
one is deleted. A reader therefore sees the old directory or the new one, never a mix; a save
killed midway leaves only its temporary sibling, which the next save of that name removes (and
`stale_temporaries` lists, so that loaders can say so).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

_TMP = ".tmp-"
_OLD = ".old-"


def fsync_dir(path: Path | str) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(paths) -> None:
    """fsync each file of `paths`."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (files first, then their directories)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where the system lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: the filesystem cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(a))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(path: Path | str) -> list[Path]:
    """Siblings of `path` left by a save that was killed: temporaries whose writer is gone, and the
    old copy of a replacement that stopped between its two renames (systems without exchange)."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    out = []
    for p in path.parent.glob(f".{path.name}{_TMP}*"):
        pid = p.name[len(f".{path.name}{_TMP}") :].split("-")[0]
        if not (pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid))):
            out.append(p)
    return sorted(out + list(path.parent.glob(f".{path.name}{_OLD}*")))


def remove_stale(path: Path | str) -> list[str]:
    """Clean up after killed saves of `path`: delete stale temporaries; when `path` itself is missing
    but the old copy of an interrupted replacement is there, put that copy back. Returns notes."""
    path = Path(path)
    notes = []
    for p in stale_temporaries(path):
        if _OLD in p.name and not path.exists():
            os.rename(p, path)
            notes.append(f"restored {path} from {p.name}, left by a save that was interrupted")
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        notes.append(f"removed {p.name}, left by a save that was interrupted")
    return notes


def publish(tmp: Path, path: Path) -> None:
    """Put the finished (fsync'd) directory `tmp` in place of `path` in one step: a rename, or an
    exchange with the existing `path` (whose old contents are then deleted)."""
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        if _exchange(tmp, path):
            shutil.rmtree(tmp)  # tmp now holds the old directory
        else:  # two renames: a moment without `path`, never a mixed directory
            old = path.with_name(f".{path.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """`with atomic_dir(target) as tmp:` write the files into `tmp`; on a clean exit they replace
    `target` whole (see the module doc); on an exception `tmp` is removed and `target` untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    tmp = path.with_name(f".{path.name}{_TMP}{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        publish(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
