"""Runs of joint plans (data-parallel replicas with uneven shares): per-replica records, and DCP
resume across plans with different replica counts and strategies continuing the losses.

A float64 run of a joint plan (two unequal replicas, shares 3:1, ZeRO-3 inside each replica) on a
packed token stream; resumed at step 2 under a one-replica plan (DP = 1, replicated), then at step 4
under two equal replicas (HSDP, ZeRO-2, shares 2:2), and from step 4 under the same replicas with
shares 3:1 (on gloo: the copies' all-reduce after the backward), whose step-5 checkpoint resumes under
DP = 1; and resumed at step 2 under ZeRO-1 (Zero1AdamW),
whose checkpoints resume under ZeRO-3 and replicated: every session continues the first run's losses
(the step's samples do not depend on the plan; the update is the one of one process).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
from _numerics import FP64

from hexiseq.cli import main
from hexiseq.plan import Plan, Sharding, random_plan
from hexiseq.runs import load

pytestmark = pytest.mark.slow
ARGS = [
    "--model",
    "tiny",
    "--lr",
    "3e-3",
    "--steps",
    "6",
    "--dtype",
    "float64",
    "--checkpoint-every",
    "2",
    "--keep-checkpoints",
    "3",
]


def shifted(plan: Plan, by: int) -> Plan:
    """The plan on devices `by` further (replicas of a joint plan sit on disjoint devices)."""
    return replace(plan, groups=tuple(replace(g, devices=tuple(d + by for d in g.devices)) for g in plan.groups))


UNEQUAL = Plan.joint(
    [random_plan(2, 256, 8, 4, seed=3, block_size=8), shifted(random_plan(1, 256, 8, 4, seed=5, block_size=8), 2)],
    [3, 1],
    Sharding("zero3", "replica"),
    name="unequal",
)
EQUAL = Plan.joint(
    [random_plan(2, 256, 8, 4, seed=5, block_size=8), shifted(random_plan(2, 256, 8, 4, seed=3, block_size=8), 2)],
    [2, 2],
    Sharding("zero2", "replica"),
    name="equal",
)
# the same equal replicas with shares 3:1: on gloo FSDP on each set and the copies' all-reduce after the
# backward (runtime/sharding.py), whose checkpoints only the first set writes
EQUAL_3_1 = Plan.joint([EQUAL.replica(i) for i in range(2)], [3, 1], EQUAL.sharding, name="equal-3-1")
DP1 = random_plan(3, 256, 8, 4, seed=5, block_size=8)
# ZeRO-1 inside each of the unequal replicas (shard sets of 2 and 1 ranks), and a one-replica version-2
# plan under its own sharding (ZeRO-3 over all devices; no --fsdp given)
ZERO1 = replace(UNEQUAL, sharding=Sharding("zero1", "replica"), name="zero1")
ONE_ZERO3 = Plan.joint([DP1], [4], Sharding("zero3", "all"), name="one-zero3")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("replicas")
    for name, plan in (
        ("unequal", UNEQUAL),
        ("equal", EQUAL),
        ("equal-3-1", EQUAL_3_1),
        ("dp1", DP1),
        ("zero1", ZERO1),
        ("one-zero3", ONE_ZERO3),
    ):
        plan.save(d / f"{name}.json")
    np.save(d / "tokens.npy", np.random.default_rng(0).integers(0, 500, 256 * 40 + 1).astype(np.int64))
    return d


def losses(run_dir) -> list[float]:
    m = load(run_dir)
    assert list(m["step"]) == list(range(1, len(m) + 1))
    return list(m["loss"])


@pytest.fixture(scope="module")
def joint_run(work):
    out = work / "joint"
    assert main(["run", "--plan", str(work / "unequal.json"), "--data", str(work / "tokens.npy"), *ARGS, "--out",
                 str(out)]) == 0  # fmt: skip
    return out


def test_joint_run_records_replicas(joint_run):
    records = [json.loads(line) for line in (joint_run / "metrics.jsonl").read_text().splitlines()]
    cfg = json.loads((joint_run / "config.json").read_text())
    assert cfg["global_batch"] == 4 and len(records) == 6
    for r in records:
        reps = r["replicas"]
        assert [(x["replica"], x["sequences"], x["ranks"]) for x in reps] == [(0, 3, 2), (1, 1, 1)]
        assert min(x["waiting_s"] for x in reps) == 0.0  # the straggler waits for no one
        assert all(x["step_time_s"] > 0 and x["tokens_per_s"] > 0 for x in reps)
    summary = json.loads((joint_run / "summary.json").read_text())
    assert [(x["replica"], x["sequences"]) for x in summary["replicas"]] == [(0, 3), (1, 1)]
    assert all(x["measured_compute_s"] > 0 and "predicted_compute_s" in x for x in summary["replicas"])


@pytest.mark.numerics
def test_resume_joint_to_dp1_and_back(work, joint_run, within):
    ref = losses(joint_run)
    assert ref[-1] < ref[0]
    dp1 = work / "to-dp1"
    shutil.copytree(joint_run, dp1)
    assert main(["run", "--resume", str(dp1), "--checkpoint", "step-00000002", "--plan", str(work / "dp1.json")]) == 0
    got = losses(dp1)
    assert got[:2] == ref[:2] and len(got) == 6
    within(max(abs(a - b) / abs(b) for a, b in zip(got[2:], ref[2:])), FP64, "joint -> DP = 1: losses of steps 3-6")
    back = work / "back"
    shutil.copytree(dp1, back)
    assert (
        main(["run", "--resume", str(back), "--checkpoint", "step-00000004", "--plan", str(work / "equal.json")]) == 0
    )
    got = losses(back)
    assert len(got) == 6
    within(max(abs(a - b) / abs(b) for a, b in zip(got[4:], ref[4:])), FP64, "DP = 1 -> HSDP: losses of steps 5-6")
    # HSDP with shares 3:1 (the copies' all-reduce after the backward), checkpointing its step 5; back to DP = 1
    uneven = work / "hsdp-3-1"
    shutil.copytree(dp1, uneven)
    assert main(["run", "--resume", str(uneven), "--checkpoint", "step-00000004", "--plan",
                 str(work / "equal-3-1.json"), "--checkpoint-every", "1"]) == 0  # fmt: skip
    got = losses(uneven)
    within(max(abs(a - b) / abs(b) for a, b in zip(got[4:], ref[4:])), FP64, "DP = 1 -> HSDP 3:1: losses of steps 5-6")
    last = work / "from-hsdp-3-1"
    shutil.copytree(uneven, last)
    assert main(["run", "--resume", str(last), "--checkpoint", "step-00000005", "--plan", str(work / "dp1.json")]) == 0
    within(abs(losses(last)[5] - ref[5]) / abs(ref[5]), FP64, "HSDP 3:1 -> DP = 1: loss of step 6")


@pytest.mark.numerics
def test_zero1_checkpoints_and_resumes_across_strategies(work, joint_run, within):
    """ZeRO-1 (Zero1AdamW) runs, checkpoints and resumes: the first run's checkpoint of step 2 (ZeRO-3
    over unequal shard sets: replicas of 2 and 1 ranks, FSDP per set) resumed under ZeRO-1 inside the
    same unequal replicas; its step 3 under a one-replica plan of ZeRO-3 over all devices; its step 4
    under DP = 1 replicated, whose step 5 back under ZeRO-1. Every session continues the first run's
    losses (float64)."""
    ref = losses(joint_run)
    z1 = work / "zero1"
    shutil.copytree(joint_run, z1)
    assert main(["run", "--resume", str(z1), "--checkpoint", "step-00000002", "--plan", str(work / "zero1.json"),
                 "--checkpoint-every", "1", "--keep-checkpoints", "6"]) == 0  # fmt: skip
    got = losses(z1)
    assert got[:2] == ref[:2] and len(got) == 6
    within(max(abs(a - b) / abs(b) for a, b in zip(got[2:], ref[2:])), FP64, "ZeRO-3 unequal sets -> ZeRO-1: steps 3-6")
    assert "replica 1: 1 sequence on 1 rank  step " in (z1 / "console.log").read_text()  # per-replica console lines
    chain = (("zero1", "one-zero3", 3, "ZeRO-1 -> ZeRO-3 (one replica)"), ("zero1", "dp1", 4, "ZeRO-1 -> replicated"),
             ("from-zero1-dp1", "zero1", 5, "replicated -> ZeRO-1"))  # fmt: skip
    for source, plan, at, what in chain:  # the resumed runs checkpoint every step (as z1 was told)
        out = work / f"from-{source}-{plan}"
        shutil.copytree(work / source, out)
        assert main(["run", "--resume", str(out), "--checkpoint", f"step-{at:08d}", "--plan",
                     str(work / f"{plan}.json")]) == 0  # fmt: skip
        got = losses(out)
        assert len(got) == 6
        within(max(abs(a - b) / abs(b) for a, b in zip(got[at:], ref[at:])), FP64, f"{what}: steps {at + 1}-6")
    last = json.loads((work / "from-zero1-one-zero3" / "metrics.jsonl").read_text().splitlines()[-1])
    assert [(x["sequences"], x["ranks"]) for x in last["replicas"]] == [(4, 3)]  # ran under the plan's sharding


def test_a_conflicting_fsdp_is_refused(work, capsys):
    assert main(["run", "--plan", str(work / "zero1.json"), "--model", "tiny", "--fsdp", "--steps", "1", "--out",
                 str(work / "refused")]) != 0  # fmt: skip
    err = capsys.readouterr().err
    assert "plan 'zero1' shards by its own strategy, zero1 inside each replica (hybrid), but --fsdp" in err
    assert not (work / "refused" / "metrics.jsonl").exists()


def test_verify_accepts_a_joint_plan(work, capsys):
    assert main(["verify", "--plan", str(work / "unequal.json"), "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "replicas: 2, sequences per step 3 + 1, sharding zero3 (replica)" in out and "PASS" in out


def test_launch_accepts_a_joint_plan(work):
    from hexiseq.runs import launch

    h = launch(work / "equal.json", steps=2, out=work / "launched", model="tiny")
    summary = h.wait(timeout=300)
    assert summary["status"] == "completed", h.error
    assert [r["sequences"] for r in summary["replicas"]] == [2, 2] and summary["global_batch"] == 4
