"""Runs on a real Slurm on this machine (tests/_slurm.py: munged, slurmctld and two slurmd, "nodes"
n1 and n2 in partitions h100 and a100, two stand-in GPUs each), started once per session as root.
Skipped, with the reason, only where Slurm cannot run (not root, not installed: .ci/run installs it).

- the golden scripts pass `sbatch --test-only`; sinfo's partitions are checked against the plan;
- a 4-rank CPU run of the tiny model whose plan spans both partitions, by `hexiseq launch --slurm`:
  a heterogeneous job, one torchrun agent per node, each process on its plan rank; and at the same
  time a one-partition run by `hexiseq.launch(plan, backend="slurm")` (submitit);
- the same heterogeneous run scancelled mid-way (it checkpoints at a step boundary and stops), then
  resumed with `hexiseq launch --slurm --resume`: the same losses as the uninterrupted run, bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _slurm import LocalSlurm, SlurmUnavailable
from test_slurm import cross_plan, golden_jobs, one_node_plan

import hexiseq
from hexiseq.errors import HexiSeqError
from hexiseq.runs import load, load_summary
from hexiseq.runs import slurm as hslurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RUN = ["--model", "tiny", "--schedule", "constant", "--warmup-steps", "0", "--lr", "1e-3", "--no-tensorboard"]
STEPS = 16


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    """A running two-node Slurm for the session; SLURM_CONF points every client at it."""
    try:
        cluster = LocalSlurm.start(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as e:
        pytest.skip(f"no Slurm here: {e}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        cluster.stop()


def hexiseq_cli(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "hexiseq.cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, **kw,
    )  # fmt: skip


def losses(run_dir: Path) -> list[float]:
    return [float(x) for x in load(run_dir)["loss"]]


def test_the_golden_scripts_pass_sbatch_test_only_and_partitions_are_checked(local_slurm, tmp_path):
    for name, job in golden_jobs(tmp_path).items():
        path = tmp_path / f"{name}.sbatch"
        path.write_text(hslurm.render(job))
        assert "to start at" in hslurm.sbatch(path, test_only=True), name
    job = golden_jobs(tmp_path)["heterogeneous"]
    assert hslurm.check_job(job)[1:] == []  # the run directory /shared/runs/x is not node-local
    parts = hslurm.read_partitions()
    assert {p: dict(i.nodes) for p, i in parts.items()} == {"h100": {"n1": "gpu:h100:2"}, "a100": {"n2": "gpu:a100:2"}}
    swapped = hslurm.make_job(
        cross_plan(tmp_path), "/shared/r", ("run",), hslurm.SlurmOptions({"H100-SXM": "a100", "A100-80GB": "h100"})
    )
    with pytest.raises(HexiSeqError, match="partition 'a100' has a100 GPUs .* the plan's nodes there are H100-SXM"):
        hslurm.check_job(swapped)
    with pytest.raises(HexiSeqError, match="Slurm has no partition 'l40s'"):
        hslurm.check_job(hslurm.make_job(cross_plan(tmp_path), "/r", ("run",), hslurm.SlurmOptions({"*": "l40s"})))


def test_a_heterogeneous_job_and_a_one_partition_job_run_scancel_and_resume(local_slurm, tmp_path):
    t0 = time.monotonic()
    cross_plan(tmp_path).save(tmp_path / "plan.json")
    env = ["--env", "OMP_NUM_THREADS=1"]
    # 1. the uninterrupted heterogeneous run (CLI), and alongside it a one-partition run from Python
    full = hexiseq_cli(
        ["launch", "--slurm", "--plan", "plan.json", "--out", "full", "--steps", str(STEPS), *RUN, *env, "--wait"],
        tmp_path,
    )
    one_node_plan(tmp_path).save(tmp_path / "pair.json")
    pair = hexiseq.launch(
        tmp_path / "pair.json",
        backend="slurm",
        partition="a100",
        gpus=False,  # leaves n2's two GPUs to the heterogeneous job: both run at once
        env={"OMP_NUM_THREADS": "1"},
        steps=6,
        model="tiny",
        out=tmp_path / "pair",
    )
    assert pair.submitit_job is not None and pair.state in ("PENDING", "RUNNING", "COMPLETED")
    summary = pair.wait(timeout=150)
    assert summary["status"] == "completed" and summary["world_size"] == 2, pair.error
    assert pair.state == "COMPLETED" and len(pair.metrics) == 6 and pair.status == "completed"
    out, err = full.communicate(timeout=150)
    assert full.returncode == 0, out[-3000:] + err[-3000:]
    assert "submitted Slurm job" in out and "a heterogeneous job, h100: 1 node x 2, a100: 1 node x 2" in out
    assert "looks node-local" in err  # pytest's tmp_path is under /tmp
    assert "done: loss" in out and "(completed)" in out
    record = load_summary(tmp_path / "full")
    assert record["status"] == "completed" and record["world_size"] == 4 and record["steps_done"] == STEPS
    job_out = next((tmp_path / "full" / "slurm").glob("*.out")).read_text()
    for s in (  # every process took the plan rank of its device: node (HEXISEQ_NODE) and local rank
        "0=node 0/local 0 (device 0",
        "1=node 1/local 0 (device 2",
        "2=node 0/local 1 (device 1",
        "3=node 1/local 1 (device 3",
    ):
        assert s in job_out, job_out[-3000:]
    assert f"hexiseq: the run completed {STEPS} steps" in job_out
    reference = losses(tmp_path / "full")
    assert len(reference) == STEPS
    t1 = time.monotonic()

    # 2. the same run, scancelled mid-way: the ranks finish their step, checkpoint and stop
    cut = hexiseq_cli(
        ["launch", "--slurm", "--plan", "plan.json", "--out", "cut", "--steps", str(STEPS), *RUN, *env, "--json"],
        tmp_path,
    )
    out, err = cut.communicate(timeout=60)
    assert cut.returncode == 0, err
    job = hslurm.SlurmRun(tmp_path / "cut", json.loads(out)["job_id"])
    metrics = tmp_path / "cut" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert job.running() and time.monotonic() < deadline, f"{job.state}: {job.error}"
        time.sleep(0.2)
    job.cancel(timeout=90)
    assert job.state.startswith("CANCELLED") and not job.running()
    stopped = load_summary(tmp_path / "cut")
    assert stopped["status"] == "stopped" and 3 <= stopped["steps_done"] < STEPS, stopped
    assert (tmp_path / "cut" / "checkpoints" / f"step-{stopped['steps_done']:08d}").is_dir()
    assert job.status == "stopped" and job.error is None
    t2 = time.monotonic()

    # 3. resumed to completion: the uninterrupted run's losses, bitwise
    resumed = hexiseq_cli(["launch", "--slurm", "--resume", "cut", "--wait", "--json"], tmp_path)  # same options
    out, err = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, err[-3000:]
    info = json.loads(out)
    assert info["state"] == "COMPLETED" and info["summary"]["status"] == "completed"
    assert "export OMP_NUM_THREADS=1" in (tmp_path / "cut" / "slurm" / "job-2.sbatch").read_text()
    assert losses(tmp_path / "cut") == reference
    t3 = time.monotonic()
    print(f"\nSlurm runs: the first two {t1 - t0:.1f} s, scancelled {t2 - t1:.1f} s, resumed {t3 - t2:.1f} s")
