"""One writer per run directory (issue 22, item 2): a second run into the same --out, or a resume of
a run that is still writing, is refused at once naming the other run's pid and host; the lock dies
with its process (SIGKILL included), so a crashed run's directory can be resumed."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from hexiseq.errors import HexiSeqError
from hexiseq.plan import random_plan
from hexiseq.runs import lock
from hexiseq.runs.rundir import RunDir

HOLD = (
    "import sys, time; from hexiseq.runs import lock; lock.take(sys.argv[1]); print('held', flush=True); time.sleep(60)"
)


def _holder(directory):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_held_directory_is_refused_naming_pid_and_host_and_freed_by_a_crash(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    other = _holder(d)
    try:
        with pytest.raises(HexiSeqError) as e:
            RunDir.create(d)
        msg = str(e.value)
        assert f"pid {other.pid}" in msg and socket.gethostname() in msg and "another run is writing" in msg
        assert lock.locked_by_other(d)["pid"] == other.pid
        assert d.is_dir()  # not this call's directory: left alone
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    assert lock.locked_by_other(d) is None  # the kernel dropped the lock with the process
    run = RunDir.create(d)
    assert json.loads((d / lock.LOCK_NAME).read_text())["pid"] != other.pid
    lock.release(run.path)


def test_taking_twice_in_one_process_is_a_no_op_and_release_frees(tmp_path):
    lock.take(tmp_path)
    lock.take(tmp_path)
    lock.release(tmp_path)
    other = _holder(tmp_path)
    other.kill()
    other.wait()


def test_a_refused_create_leaves_nothing(tmp_path):
    with pytest.raises(HexiSeqError, match="--out ''"):
        RunDir.create("")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("x")
    with pytest.raises(HexiSeqError, match="already holds files"):
        RunDir.create(tmp_path / "run")
    with pytest.raises(HexiSeqError, match="cannot be made"):
        RunDir.create("/proc/hexiseq-run")


@pytest.mark.slow
def test_two_concurrent_runs_into_one_out(tmp_path):
    plan = tmp_path / "plan.json"
    random_plan(2, 64, 8, 4, seed=3, block_size=8).save(plan)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "hexiseq.cli", "run", "--plan", str(plan), "--model", "tiny", "--no-tensorboard"]
    first = subprocess.Popen([*argv, "--steps", "400", "--out", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, "the first run ended before the second started"
        for extra in (["--steps", "3", "--out", str(out)], None):
            cmd = [*argv, *extra] if extra else [sys.executable, "-m", "hexiseq.cli", "run", "--resume", str(out)]
            second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, second.stderr
            assert f"pid {first.pid}" in second.stderr and "another run is writing" in second.stderr, second.stderr
            assert "Traceback" not in second.stderr
    finally:
        (out / "STOP").touch()  # the first stops at its next step boundary
        first.wait(120)
    assert first.returncode == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no interleaved record
