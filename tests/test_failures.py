"""Failures inside ranks reach the user as one message: which rank, what failed, what to do, and
the exit code it deserves (2 bad input, 1 runtime fault). Each scenario is a real spawned world of
two gloo ranks in which rank 1 fails in one way while rank 0 waits for it in a collective."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from hexiseq.errors import SpecError
from hexiseq.runtime.failures import INPUT, PEER, RankFailure, classify, summarize
from hexiseq.runtime.world import WorldError, spawn_world

# the scenarios time how long a failure takes to reach the user (within about one timeout)
pytestmark = pytest.mark.serial


def _fail(rank: int, world: int, mode: str) -> int:
    if rank == 1:
        if mode == "input":
            raise SpecError("checkpoint /data/ckpt/model.safetensors is corrupt: re-save it")
        if mode == "bug":
            raise ZeroDivisionError("division by zero")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "limit":
            time.sleep(60)
    t = torch.ones(2)
    dist.all_reduce(t)  # rank 0 waits here for rank 1
    if mode == "limit":
        time.sleep(60)
    return int(t[0])


def _world_error(mode: str, **kw) -> tuple[WorldError, float]:
    t0 = time.monotonic()
    with pytest.raises(WorldError) as info:
        spawn_world(_fail, 2, mode, **kw)
    return info.value, time.monotonic() - t0


@pytest.mark.parametrize(
    "mode,rc,words",
    [
        (
            "input",
            2,
            [
                "rank 1 of 2:",
                "/data/ckpt/model.safetensors is corrupt",
                "re-save",
                "(rank 0 lost their connection because of it)",
            ],
        ),
        ("bug", 1, ["rank 1 of 2: ZeroDivisionError: division by zero", "--debug"]),
        ("kill", 1, ["rank 1 of 2: was killed by SIGKILL", "dmesg"]),
    ],
)
def test_a_failing_rank_is_named_once(mode, rc, words):
    e, _ = _world_error(mode, timeout_s=60, pg_timeout_s=30)
    text = str(e)
    assert e.rc == rc and all(w in text for w in words), text
    assert "Traceback" not in text and len(text.splitlines()) <= 3, text
    assert "Traceback" in e.details() or mode == "kill"  # --debug still has the tracebacks


def test_a_stopped_rank_is_named_within_the_collective_timeout():
    """SIGSTOP: rank 0 times out after --timeout (2 s); the parent names rank 1 as stopped and kills
    it at once, instead of waiting for a process that will never answer."""
    e, seconds = _world_error("stop", timeout_s=60, pg_timeout_s=2)
    text = str(e)
    assert (
        e.rc == 1 and "rank 1 of 2: (pid" in text and "was stopped (SIGSTOP" in text and "timed out after 2 s" in text
    ), text
    assert "(rank 0 timed out waiting because of it)" in text, text
    assert seconds < 20, seconds  # spawn (~3 s on 2 busy cores) + the 2 s timeout, not the 60 s limit


def test_the_time_limit_ends_the_world():
    e, seconds = _world_error("limit", timeout_s=6, pg_timeout_s=120)
    assert e.rc == 1 and "ranks 0, 1 of 2: was still running at the time limit of 6 s" in str(e), str(e)
    assert seconds < 15


def test_summary_rules():
    """Causes first, ranks with the same message together; consequences summed up; bad input only
    when every cause is bad input."""
    f = {
        0: RankFailure(0, INPUT, "plan is invalid", at=1.0),
        1: RankFailure(1, INPUT, "plan is invalid", at=1.1),
        2: RankFailure(2, PEER, "peer closed", at=2.0),
    }
    text, bad = summarize(f, 3)
    assert bad and text.splitlines() == [
        "ranks 0, 1 of 3: plan is invalid",
        "(rank 2 lost their connection because of it)",
    ]
    f[2] = classify(2, RuntimeError("[pair.cc:537] Read error: Connection reset by peer"))
    assert f[2].kind == PEER
    f[3] = classify(3, RuntimeError("boom"))
    text, bad = summarize(f, 4)
    assert not bad and "rank 3 of 4: RuntimeError: boom" in text
    assert classify(0, RuntimeError("Timed out waiting 2000ms for recv operation"), 2.0).message.startswith(
        "a collective timed out after 2 s"
    )


def _slow_but_healthy(rank: int, world: int) -> float:
    t0 = time.monotonic()
    time.sleep(3.0)  # longer than the process-group timeout, but outside any collective
    t = torch.ones(1)
    dist.all_reduce(t)
    return time.monotonic() - t0


def test_timeout_bounds_each_collective_not_the_run():
    """--timeout is the process-group timeout: a world that runs longer than it is not killed (it
    used to cap the whole spawned run: a healthy long run died at 600 s)."""
    seconds = spawn_world(_slow_but_healthy, 2, timeout_s=None, pg_timeout_s=1.5)
    assert min(seconds) > 1.5


def test_run_time_limit_from_the_command_line(tmp_path, capsys):
    """--time-limit stops the run at the next step boundary with a checkpoint, as SIGTERM does (it
    used to kill the world, losing the work since the last checkpoint); the record matches it."""
    import json

    from hexiseq.cli import main
    from hexiseq.plan import random_plan
    from hexiseq.runs import checkpoint as ckpt
    from hexiseq.runs import load

    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(tmp_path / "p.json")
    run = tmp_path / "run"
    argv = ["run", "--plan", str(tmp_path / "p.json"), "--steps", "1000000", "--time-limit", "8", "--out", str(run)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "stopped at the --time-limit of 8 s, at a step boundary with a checkpoint" in out, out + err
    last = ckpt.checkpoints(run / "checkpoints")[-1]
    step = json.loads((last / "trainer.json").read_text())["step"]
    assert list(load(run)["step"]) == list(range(1, step + 1))
    assert json.loads((run / "status.json").read_text())["phase"] == "stopped"
    assert not (run / "STOP").exists()


def test_a_refusing_torchrun_process_waits_for_every_ranks_line(monkeypatch):
    """wait_for_peer_reports (a torchrun process refusing bad input, after printing its line): it
    returns once every rank has posted in the agent's store, not at its deadline; a rank that never
    posts holds it to the deadline only."""
    import socket
    import threading

    from hexiseq.runtime import failures

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # the agent's store
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "refusal")
    monkeypatch.setattr(failures, "_BOARD", None)
    peer = dist.PrefixStore(failures.board_prefix(), dist.TCPStore("127.0.0.1", port, is_master=False))
    try:
        threading.Timer(0.5, lambda: peer.set("reported/1", "1")).start()
        t0 = time.monotonic()
        failures.wait_for_peer_reports(0, 2, wait_s=20.0)
        waited = time.monotonic() - t0
        assert 0.4 <= waited < 10.0, waited  # until rank 1's post, far from the deadline
        t0 = time.monotonic()
        failures.wait_for_peer_reports(0, 3, wait_s=1.0)  # rank 2 never posts
        assert time.monotonic() - t0 >= 0.95
    finally:
        if failures._BOARD is not None:
            failures._BOARD.close()
    del agent


WRITER = """
import sys
from hexiseq.runtime.failures import print_line
for i in range(3000):
    print_line(f"hexiseq run: rank {sys.argv[1]}/2: item {i}: 2 problems:\\n  - a is missing\\n  - b is missing")
"""


def test_print_line_keeps_each_message_whole_when_processes_share_a_pipe():
    # Two torchrun processes share one stderr pipe; `print` wrote a message and its newline apart,
    # and CI once saw rank 1's first line glued to the end of rank 0's message.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r, w = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(k)], stderr=w, stdout=subprocess.DEVNULL, env=env)
        for k in (0, 1)
    ]
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    assert [p.wait() for p in procs] == [0, 0]
    lines = out.splitlines()
    heads = [ln for ln in lines if ln.startswith("hexiseq run: ")]
    assert len(heads) == 6000, len(heads)
    assert sorted(ln for ln in lines if not ln.startswith("hexiseq")) == sorted(
        ["  - a is missing", "  - b is missing"] * 6000
    )
