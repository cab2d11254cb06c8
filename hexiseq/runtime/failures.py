"""What went wrong in a distributed world, said once.

When one rank fails, every other rank fails too, a moment later, with an error about *it*
("Connection reset by peer", "Timed out waiting 30000ms for recv"). Printing every rank's traceback
buries the one that matters. Here:

- each rank classifies its own exception (`classify`): bad input (a `HexiSeqError`, exit code 2),
  a consequence of a peer's failure (a closed connection, a collective that timed out), or a fault;
- the launcher turns the ranks' outcomes into one message (`summarize`): the root cause (which
  rank, what failed, which file or value, what to do) and the ranks that stopped because of it.
  A spawned world's parent sees every rank's report, exit code and process state (a SIGSTOPped
  process is named as stopped);
- under torchrun there is no parent, so each process writes a small *board* in the rendezvous
  store (`RankBoard`: a heartbeat every second, and its failure when it fails) and, when it fails,
  reads the others' posts to print one line naming the root cause itself (`torchrun_line`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import HexiSeqError

# Kinds of failure. INPUT / ERROR / DIED / STOPPED / HUNG are causes; TIMEOUT and PEER are what the
# other ranks see of a cause; LIMIT is the run's own --time-limit.
INPUT, ERROR, DIED, STOPPED, HUNG, LIMIT = "input", "error", "died", "stopped", "hung", "time-limit"
TIMEOUT, PEER = "timeout", "peer"
CONSEQUENCES = (TIMEOUT, PEER)

_PEER_WORDS = (
    "connection reset",
    "connection closed",
    "closed by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
    "end of file",
    "econnreset",
    "read error",
    "write error",
)
_TIMEOUT_WORDS = ("timed out", "timeout", "deadline exceeded")


@dataclass
class RankFailure:
    """One rank's failure: its `kind` (see the module constants), a one-paragraph `message` that
    says what to do, and the traceback (`detail`, shown with --debug)."""

    rank: int
    kind: str
    message: str
    detail: str = ""
    at: float = field(default_factory=time.time)
    pid: int | None = None

    @property
    def is_cause(self) -> bool:
        return self.kind not in CONSEQUENCES


class StorageError(HexiSeqError):
    """A write the run needs failed for a reason of the machine, not of the program: the disk is full,
    a quota is reached, the filesystem is read-only or the path not writable. Names the path, what
    was needed and what to do."""


_STORAGE_ADVICE = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space within your quota there",
    errno.EROFS: "the filesystem is read-only: give a writable location",
    errno.EACCES: "give a location you may write to (or fix its permissions)",
    errno.EPERM: "give a location you may write to (or fix its permissions)",
    errno.EIO: "the disk or network filesystem failed: check it",
    errno.ENOENT: "it was removed while the run wrote it: give a directory that stays",
}


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def storage_error(
    e: OSError, path: Path | str, doing: str, need_bytes: int | None = None, then: str = ""
) -> StorageError:
    """The StorageError of `e`, raised while `doing` (e.g. "writing checkpoint step-00000004") at
    `path`: the reason, how much was needed and is free (disk full), what to do, and `then` (e.g.
    "continue with --resume RUN_DIR")."""
    path = Path(path)
    reason = e.strerror or type(e).__name__
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
    room = ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            free = shutil.disk_usage(probe).free
            room = f": {'it needs about ' + _size(need_bytes) + ', ' if need_bytes else ''}{_size(free)} free"
        except OSError:
            pass
    advice = _STORAGE_ADVICE.get(e.errno or -1, "check the path")
    return StorageError(f"{doing} {path}{where}: {reason}{room}; {advice}{'; ' + then if then else ''}")


def unwrap(exc: BaseException) -> BaseException:
    """The first rank-local exception inside a torch.distributed.checkpoint CheckpointException."""
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ == "CheckpointException" and isinstance(failures, dict) and failures:
        inner = failures[sorted(failures)[0]]
        return inner[0] if isinstance(inner, tuple) and isinstance(inner[0], BaseException) else exc
    return exc


def classify(rank: int, exc: BaseException, pg_timeout_s: float | None = None) -> RankFailure:
    """This rank's exception as a RankFailure (called inside the rank, where the traceback is)."""
    exc = unwrap(exc)
    detail = "".join(traceback.format_exception(exc))
    first = (str(exc).strip().splitlines() or [""])[0]
    low = str(exc).lower()
    if isinstance(exc, StorageError):  # the machine's fault, not the input's: exit code 1, the record kept
        return RankFailure(rank, ERROR, str(exc), detail, pid=os.getpid())
    if isinstance(exc, HexiSeqError):
        return RankFailure(rank, INPUT, str(exc), detail, pid=os.getpid())
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ADVICE and exc.filename:
        failure = storage_error(exc, exc.filename, "cannot use")
        return RankFailure(rank, ERROR, str(failure), detail, pid=os.getpid())
    if isinstance(exc, MemoryError) or "out of memory" in low:
        return RankFailure(
            rank,
            ERROR,
            f"ran out of memory ({type(exc).__name__}: {first[:200]}); use a stronger --recompute "
            "policy, a shorter --seq-len or a plan over more devices",
            detail,
            pid=os.getpid(),
        )
    if isinstance(exc, (RuntimeError, ConnectionError, OSError)) and any(w in low for w in _TIMEOUT_WORDS):
        after = f" after {pg_timeout_s:g} s" if pg_timeout_s else ""
        return RankFailure(
            rank, TIMEOUT, f"a collective timed out{after} waiting for a peer (--timeout)", detail, pid=os.getpid()
        )
    if isinstance(exc, (RuntimeError, ConnectionError, OSError)) and any(w in low for w in _PEER_WORDS):
        return RankFailure(
            rank, PEER, "a peer closed its connection (it failed or died first)", detail, pid=os.getpid()
        )
    if isinstance(exc, KeyboardInterrupt):
        return RankFailure(rank, ERROR, "interrupted (Ctrl-C / SIGINT)", detail, pid=os.getpid())
    return RankFailure(
        rank,
        ERROR,
        f"{type(exc).__name__}: {first[:300]} — an internal fault, not your input: rerun with "
        "--debug for every rank's traceback and report it",
        detail,
        pid=os.getpid(),
    )


def died(rank: int, exitcode: int, pid: int | None = None) -> RankFailure:
    """A process that ended without reporting (killed by a signal, or os._exit)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " — the out-of-memory killer or another process ended it (see `dmesg`)" if name == "SIGKILL" else ""
        return RankFailure(
            rank, DIED, f"was killed by {name}{hint}; rerun (or --resume RUN_DIR from its last checkpoint)", pid=pid
        )
    return RankFailure(
        rank,
        DIED,
        f"exited with code {exitcode} without reporting an error (a crash in native code?); rerun with --debug",
        pid=pid,
    )


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R running, S sleeping, T stopped, Z zombie), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def silent(rank: int, pid: int | None, pg_timeout_s: float | None, others_failed: bool) -> RankFailure:
    """A rank still running when the launcher gives up on it: stopped (state T) or hung."""
    after = f"{pg_timeout_s:g} s" if pg_timeout_s else "the process-group timeout"
    if pid is not None and process_state(pid) == "T":
        return RankFailure(
            rank,
            STOPPED,
            f"(pid {pid}) was stopped (SIGSTOP / Ctrl-Z) and held up the run: the other ranks "
            f"timed out after {after} waiting for it (--timeout); it was killed. Do not stop ranks of a running "
            "job; rerun (or --resume RUN_DIR)",
            pid=pid,
        )
    what = "the other ranks failed" if others_failed else "the run ended"
    return RankFailure(
        rank,
        HUNG,
        f"(pid {pid}) did not respond after {what} (waited {after}, --timeout); it was killed. "
        "If it recurs, rerun with --debug",
        pid=pid,
    )


def _ranks(rs: list[int]) -> str:
    rs = sorted(rs)
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def summarize(failures: dict[int, RankFailure], nproc: int) -> tuple[str, bool]:
    """One message for the failures of a world of `nproc` ranks, and whether it is bad input (exit
    code 2) rather than a runtime fault (exit code 1). Causes come first, earliest first; ranks with
    the same message are named together; the ranks that only saw a cause are summed up in a line."""
    causes = sorted((f for f in failures.values() if f.is_cause), key=lambda f: (f.at, f.rank))
    followers = sorted(r for r, f in failures.items() if not f.is_cause)
    if not causes:  # only consequences: a hang nobody could name, or a peer outside the world
        first = sorted(failures.values(), key=lambda f: (f.at, f.rank))[0]
        return f"{_ranks(followers)} of {nproc}: {first.message}; no rank reported a cause", False
    by_message: dict[str, list[int]] = {}
    for f in causes:
        by_message.setdefault(f.message, []).append(f.rank)
    lines = [f"{_ranks(rs)} of {nproc}: {msg}" for msg, rs in by_message.items()]
    if followers:
        kinds = {failures[r].kind for r in followers}
        how = " or ".join(sorted({"timed out waiting" if k == TIMEOUT else "lost their connection" for k in kinds}))
        lines.append(f"({_ranks(followers)} {how} because of it)")
    return "\n".join(lines), all(f.kind == INPUT for f in causes)


# ----------------------------------------------------------------------------- torchrun: the board


class RankBoard:
    """This rank's posts in the rendezvous store: a heartbeat (wall time, pid, host) every
    `interval_s` from a daemon thread — a stopped or frozen process stops beating — and its failure.
    Its own store connection, so that it never waits behind a collective's store traffic."""

    def __init__(self, host: str, port: int, rank: int, world: int, prefix: str, interval_s: float = 1.0) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.interval_s = rank, world, interval_s
        base = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
        self.store = dist.PrefixStore(prefix, base)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="hexiseq-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.store.set(f"hb/{self.rank}", json.dumps({"t": time.time(), "pid": self.pid, "host": self.host}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception:  # the store is gone (the run is ending): stop beating
                return

    def close(self) -> None:
        self._stop.set()

    def post(self, failure: RankFailure) -> None:
        self.store.set(
            f"fail/{failure.rank}", json.dumps({"kind": failure.kind, "message": failure.message, "at": failure.at})
        )

    def _read(self, key: str) -> dict[int, dict[str, Any]]:
        out = {}
        for r in range(self.world):
            k = f"{key}/{r}"
            if self.store.check([k]):
                out[r] = json.loads(self.store.get(k))
        return out

    def failures(self) -> dict[int, dict[str, Any]]:
        return self._read("fail")

    def heartbeats(self) -> dict[int, dict[str, Any]]:
        return self._read("hb")


_BOARD: RankBoard | None = None


def open_board(host: str, port: int, rank: int, world: int, prefix: str) -> RankBoard | None:
    """Start this process's board (torchrun ranks); None when the store cannot be reached."""
    global _BOARD
    try:
        _BOARD = RankBoard(host, port, rank, world, prefix)
    except Exception:
        _BOARD = None
    return _BOARD


def board_prefix() -> str:
    """The store prefix of this torchrun launch's boards: one per run id and restart."""
    run, restart = os.environ.get("TORCHELASTIC_RUN_ID", "run"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"hexiseq/{run}/{restart}/"


def env_board(rank: int, world: int) -> RankBoard | None:
    """This process's board, opened from torchrun's environment (MASTER_ADDR / MASTER_PORT, the
    agent's store, which is up before any process group) unless it is open already."""
    if _BOARD is None and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        open_board(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, board_prefix())
    return _BOARD


def wait_for_peer_reports(rank: int, world: int, wait_s: float = 5.0) -> None:
    """Post that this rank's line is out and wait up to `wait_s` for every rank's. Bad input is
    refused by every process, but the first one to exit makes torchrun end the others, which then
    print nothing: seen on a slower machine, where one process reached its check a second or two
    after another."""
    board = env_board(rank, world)
    if board is None:
        return
    try:
        board.store.set(f"reported/{rank}", "1")
        keys = [f"reported/{r}" for r in range(world)]
        deadline = time.monotonic() + wait_s
        while not board.store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # the store is gone (the launch is ending): nothing to wait for
        pass


def print_line(message: str) -> None:
    """Write `message` and its newline to stderr in one system call. Under torchrun every process
    shares one pipe; `print` writes the text and the newline apart, so another process's line could
    land between them and two processes' lines run together. One write under PIPE_BUF (4 KiB) is
    never split."""
    data = (message + "\n").encode()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stderr has no descriptor
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        return
    sys.stderr.flush()
    while data:
        data = data[os.write(fd, data) :]


def torchrun_line(
    exc: BaseException, rank: int, world: int, pg_timeout_s: float | None, wait_s: float = 3.0
) -> tuple[str, int, list[int]]:
    """The one line a torchrun process prints for its failure, its exit code, and the pids of
    stopped peers on this host to kill once the line is out (else torchrun waits its 30 s shutdown
    grace on a stopped process). A rank that only saw a peer's failure waits up to `wait_s` for the
    cause to be posted and names it; a rank that timed out names the peers whose heartbeat stopped."""
    own = classify(rank, exc, pg_timeout_s)
    board = _BOARD
    where = f"rank {rank}/{world}"
    if board is not None:
        try:
            board.post(own)
        except Exception:
            board = None
    if own.is_cause or board is None:
        return f"{where}: {own.message}", 2 if own.kind == INPUT else 1, []
    board.close()
    deadline = time.monotonic() + wait_s
    causes: dict[int, dict[str, Any]] = {}
    try:
        while time.monotonic() < deadline:
            posted = board.failures()
            causes = {r: f for r, f in posted.items() if f["kind"] not in CONSEQUENCES}
            if causes or len(posted) == world:
                break
            time.sleep(0.2)
        if causes:
            r, f = min(causes.items(), key=lambda kv: kv[1]["at"])
            return f"{where}: stopped because rank {r} failed: {f['message']}", 2 if f["kind"] == INPUT else 1, []
        stale, kill = [], []
        now = time.time()
        for r, hb in board.heartbeats().items():
            age = now - hb["t"]
            if r != rank and age > max(5.0, 4 * board.interval_s):
                note = ""
                if hb["host"] == board.host and process_state(hb["pid"]) == "T":
                    kill.append(hb["pid"])
                    note = ", stopped (SIGSTOP): killing it"
                stale.append(f"rank {r} (pid {hb['pid']} on {hb['host']}) sent no heartbeat for {age:.0f} s{note}")
        if stale:
            return f"{where}: {own.message}: {'; '.join(stale)}", 1, kill
        quiet = sorted(set(range(world)) - set(board.failures()) - {rank})
        if quiet and own.kind == TIMEOUT:
            return f"{where}: {own.message}: {_ranks(quiet)} did not time out with the others (hung?)", 1, []
    except Exception:
        pass
    return f"{where}: {own.message}", 1, []


def kill_stopped(pids: list[int]) -> None:
    """SIGKILL stopped peers (a stopped process cannot act on SIGTERM)."""
    for pid in pids:
        if process_state(pid) == "T":
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
