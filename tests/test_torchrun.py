"""`hexiseq run` under real torchrun agents on this machine (gloo, CPU): failures print one line per
process and no traceback; a stopped rank is named and the run ends about one --timeout after it
stopped (not twice that: torchrun's 30 s shutdown grace on a stopped process is cut short)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

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


def finish(agents: list[subprocess.Popen], timeout: float = 180) -> list[str]:
    """The agents' outputs once all have exited; past `timeout` every agent is killed and the test
    fails with the tail of each one's output (where a run stalls shows in it), not a bare TimeoutExpired."""
    outs = []
    for a in agents:
        try:
            outs.append(a.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            tails = [f"--- agent {i} ---\n{(b.communicate()[0] or '')[-3000:]}" for i, b in enumerate(agents)]
            pytest.fail(f"the torchrun agents did not finish within {timeout:g} s:\n" + "\n".join(tails))
    return outs


def ours(output: str) -> list[str]:
    """The lines our processes print about a failure."""
    return [ln for ln in output.splitlines() if re.match(r"(\[rank\d+\]:)?hexiseq run: (rank|error)", ln)]


@pytest.mark.serial  # times the run's end against its --timeout
def test_a_stopped_rank_is_named_and_ends_the_run_within_about_one_timeout(tmp_path):
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(tmp_path / "plan.json")
    p = torchrun(
        ["run", "--plan", "plan.json", "--steps", "100000", "--timeout", "6", "--time-limit", "120", "--out", "run"],
        2,
        tmp_path,
    )
    lines = []
    for line in p.stdout:  # wait until training runs
        lines.append(line)
        if "first step after" in line:
            break
    time.sleep(1.0)  # a few steps in
    workers = [
        int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    ]
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
    assert (
        f"rank 0/2: a collective timed out after 6 s waiting for a peer (--timeout): rank 1 (pid {victim}" in mine[0]
    ), mine
    assert "stopped (SIGSTOP)" in mine[0], mine
    assert not re.search(r'File ".*/hexiseq/', out), out[-3000:]
    assert seconds < 6 + 20, seconds  # ~one timeout plus the heartbeat check; it was 6 + 30 s before
    # rank 0 saw the failure: status.json is final (it stayed "training", issue 22)
    assert json.loads((tmp_path / "run" / "status.json").read_text())["phase"] == "failed"


def test_bad_input_under_torchrun_is_one_line_per_process(tmp_path):
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(tmp_path / "plan.json")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    p = torchrun(["run", "--plan", "plan.json", "--steps", "1", "--init-from", "ckpt", "--out", "run"], 2, tmp_path)
    out, _ = p.communicate(timeout=100)
    mine = ours(out)
    assert sorted(ln.split(":")[1] for ln in mine) == [" rank 0/2", " rank 1/2"], out[-3000:]
    assert all("ckpt/config.json: 5 problems" in ln for ln in mine), mine  # the whole message follows on its lines
    assert not re.search(r'File ".*/hexiseq/', out), out[-3000:]  # torchrun's own ChildFailedError is not ours


# ------------------------------------------------------------------------ two nodes on one machine

CLUSTER = """name: two-nodes
inter_node_latency_us: 10
nodes:
  - {gpu: H100-SXM, count: 2, nic_gbps: 25}
  - {gpu: A100-80GB, count: 2, nic_gbps: 25}
"""


def _cross_node_plan(tmp_path):
    """4 ranks whose groups span both nodes: plan rank 1 is node 1's first device (torchrun's rank 2)."""
    from hexiseq.plan import Group, Plan

    (tmp_path / "two-nodes.yaml").write_text(CLUSTER)
    plan = Plan(
        256,
        8,
        4,
        (Group((0, 2), 48, (40, 56), (3, 5)), Group((1, 3), 80, (100, 60), (4, 4))),
        block_size=8,
        name="cross",
        cluster=str(tmp_path / "two-nodes.yaml"),
    )
    plan.check().save(tmp_path / "plan.json")
    return plan


@pytest.mark.numerics
def test_two_torchrun_agents_run_a_two_node_plan(tmp_path, within):
    """Two agents (--nnodes 2, --node-rank 0/1, a localhost rendezvous) under a 2-node plan: every
    process takes the plan rank of its device (node, local rank per the cluster file); the first
    loss equals the single-process loss of the same model and tokens."""
    from _numerics import FP32

    from hexiseq.runs import load, load_summary
    from hexiseq.runtime.llama import Llama, LlamaConfig
    from hexiseq.runtime.parallel import SingleDevice
    from hexiseq.runtime.train import make_tokens
    from hexiseq.specs import get_model

    _cross_node_plan(tmp_path)
    port = free_port()
    args = ["run", "--plan", "plan.json", "--out", "run", "--steps", "3", "--model", "tiny", "--timeout", "60"]
    agents = [
        torchrun(
            args,
            2,
            tmp_path,
            ["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port)],
        )
        for n in (0, 1)
    ]
    outs = finish(agents)
    assert [a.returncode for a in agents] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    for s in (
        "0=node 0/local 0 (device 0",
        "1=node 1/local 0 (device 2",
        "2=node 0/local 1 (device 1",
        "3=node 1/local 1 (device 3",
    ):
        assert s in outs[0], outs[0][-3000:]
    summary = load_summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["world_size"] == 4 and summary["predicted_step_time_s"] > 0
    cfg = LlamaConfig.from_spec(get_model("tiny"))
    ref = SingleDevice(Llama(cfg).init_weights(0))
    with torch.no_grad():
        ref_loss = ref.loss(make_tokens(cfg, 256, 0))[1]
    within(
        abs(load(tmp_path / "run")["loss"].iloc[0] - ref_loss) / ref_loss,
        FP32,
        "two torchrun nodes vs one process: first loss",
    )


def test_a_torchrun_world_that_is_not_the_plans_is_refused_on_every_process(tmp_path):
    _cross_node_plan(tmp_path)
    p = torchrun(["run", "--plan", "plan.json", "--out", "run", "--steps", "1", "--model", "tiny"], 4, tmp_path)
    out, _ = p.communicate(timeout=100)
    msg = "torchrun has 1 node (--nnodes) but plan 'cross' uses 2 nodes of cluster 'two-nodes'"
    mine = ours(out)
    assert p.returncode != 0 and mine and all(msg in ln for ln in mine), out[-3000:]
    # Every process refuses with the same line. Its printed copy can be lost when torchrun stops the
    # others as soon as one has failed (their output is relayed by the agent), so a process counts as
    # refusing when its line is printed or is its entry in torchrun's failure summary (error file).
    refused = {int(r) for r in re.findall(r"hexiseq run: rank (\d)/4: " + re.escape(msg), out)}
    assert refused == {0, 1, 2, 3}, out[-3000:]
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.numerics
def test_two_torchrun_agents_run_a_two_replica_plan_one_replica_per_node(tmp_path, within):
    """Two agents, each node one data-parallel replica (node 0: one HP group of 2, 3 sequences per
    step; node 1: two CP groups of 1, 1 sequence), HSDP over the two replicas: the first loss equals
    the single-process loss of the same model and tokens (synthetic data: the same sequence throughout)."""
    from _numerics import FP32

    from hexiseq.plan import Group, Plan, Sharding
    from hexiseq.runs import load, load_summary
    from hexiseq.runtime.llama import Llama, LlamaConfig
    from hexiseq.runtime.parallel import SingleDevice
    from hexiseq.runtime.train import make_tokens
    from hexiseq.specs import get_model

    (tmp_path / "two-nodes.yaml").write_text(CLUSTER)
    one = dict(seq_len=256, num_heads=8, num_kv_heads=4, block_size=8, cluster=str(tmp_path / "two-nodes.yaml"))
    node0 = Plan(groups=(Group((0, 1), 128, (100, 156), (3, 5)),), **one)
    node1 = Plan(groups=(Group((2,), 48, (96,), (8,)), Group((3,), 80, (160,), (8,))), **one)
    Plan.joint([node0, node1], [3, 1], Sharding("zero2", "replica"), name="joint").check().save(tmp_path / "plan.json")
    port = free_port()
    args = ["run", "--plan", "plan.json", "--out", "run", "--steps", "2", "--model", "tiny", "--timeout", "60"]
    agents = [
        torchrun(
            args,
            2,
            tmp_path,
            ["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port)],
        )
        for n in (0, 1)
    ]
    outs = finish(agents)
    assert [a.returncode for a in agents] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    summary = load_summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["world_size"] == 4 and summary["global_batch"] == 4
    assert [(r["replica"], r["sequences"], r["ranks"]) for r in summary["replicas"]] == [(0, 3, 2), (1, 1, 2)]
    cfg = LlamaConfig.from_spec(get_model("tiny"))
    ref = SingleDevice(Llama(cfg).init_weights(0))
    with torch.no_grad():
        ref_loss = ref.loss(make_tokens(cfg, 256, 0))[1]
    within(
        abs(load(tmp_path / "run")["loss"].iloc[0] - ref_loss) / ref_loss,
        FP32,
        "two torchrun nodes, one replica each, vs one process: first loss",
    )
