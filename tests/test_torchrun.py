"""`hexiseq run` under real torchrun agents on this machine (gloo, CPU): failures print one line per
process and no traceback; a stopped rank is named and the run ends about one --timeout after it
stopped (not twice that: torchrun's 30 s shutdown grace on a stopped process is cut short)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hexiseq.plan import random_plan

pytestmark = pytest.mark.slow
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], nproc: int, cwd: Path, extra: list[str] = ()) -> subprocess.Popen:
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), *extra, "-m", "hexiseq.cli", *args]
    if not extra:
        cmd[1:1] = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ours(output: str) -> list[str]:
    """The lines our processes print about a failure."""
    return [ln for ln in output.splitlines() if re.match(r"(\[rank\d+\]:)?hexiseq run: (rank|error)", ln)]


def test_a_stopped_rank_is_named_and_ends_the_run_within_about_one_timeout(tmp_path):
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(tmp_path / "plan.json")
    p = torchrun(["run", "--plan", "plan.json", "--steps", "100000", "--timeout", "6", "--time-limit", "120"], 2, tmp_path)
    lines = []
    for line in p.stdout:  # wait until training runs
        lines.append(line)
        if "step 3/" in line:
            break
    workers = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2, lines
    victim = max(workers)  # started second: local rank 1 = rank 1 of a one-node run
    os.kill(victim, signal.SIGSTOP)
    t0 = time.monotonic()
    out, _ = p.communicate(timeout=100)
    seconds = time.monotonic() - t0
    out = "".join(lines) + out
    assert p.returncode != 0
    mine = ours(out)
    assert len(mine) == 1, "\n".join(mine) or out[-3000:]
    assert f"rank 0/2: a collective timed out after 6 s waiting for a peer (--timeout): rank 1 (pid {victim}" in mine[0], mine
    assert "stopped (SIGSTOP)" in mine[0], mine
    assert not re.search(r'File ".*/hexiseq/', out), out[-3000:]
    assert seconds < 6 + 20, seconds  # ~one timeout plus the heartbeat check; it was 6 + 30 s before


def test_bad_input_under_torchrun_is_one_line_per_process(tmp_path):
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(tmp_path / "plan.json")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    p = torchrun(["run", "--plan", "plan.json", "--steps", "1", "--init-from", "ckpt"], 2, tmp_path)
    out, _ = p.communicate(timeout=100)
    mine = ours(out)
    assert sorted(ln.split(":")[1] for ln in mine) == [" rank 0/2", " rank 1/2"], out[-3000:]
    assert all("config.json lacks" in ln for ln in mine), mine
    assert not re.search(r'File ".*/hexiseq/', out), out[-3000:]  # torchrun's own ChildFailedError is not ours
