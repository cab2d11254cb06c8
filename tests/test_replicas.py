"""Data-parallel replicas with uneven shares equal one process over the whole global batch (CPU, gloo, float64).

Every job trains its replicas a few AdamW steps on padded sequences with ignored labels (uneven
token counts) and is compared with the same steps on one process: the loss of every step, every
parameter gradient of the first step, and the final weights on every rank. One spawned world per
world size runs all its jobs (spawning costs seconds).

- world 5: replica 0 is 3 ranks in 2 groups (CP x HP), replica 1 is 2 ranks in one group (HP),
  shares 3:1, under every strategy: replicated, ZeRO-1/2/3 over all devices and inside each replica
  (unequal replicas: FSDP per replica and a flat reduction across).
- world 4: two equal replicas of different layouts under HSDP (2-D mesh), ZeRO-2 and ZeRO-3, shares
  3:1 and 2:2, and sharding inside each node (two nodes of two ranks, the node spanning no replica).
"""

from __future__ import annotations

import pytest
import torch
from _numerics import FP64, rel_err

from hexiseq.errors import PlanError
from hexiseq.plan import random_plan
from hexiseq.runtime.llama import IGNORE_INDEX, LlamaConfig
from hexiseq.runtime.replicas import ReplicaLayout, derive_joint_context
from hexiseq.runtime.sharding import JointJob, _shard_offset, joint_reference, synthetic_sequence
from hexiseq.runtime.train import TrainConfig, unpack

pytestmark = pytest.mark.numerics

CFG = LlamaConfig(vocab=128, hidden=64, layers=2, heads=8, kv_heads=4, ffn=96, rope_theta=1000.0)
TOL_WEIGHTS_MAX = 1e-8  # largest weight difference / lr after the steps (see test_parallel_train)
CP_HP = random_plan(3, 64, 8, 4, seed=3, block_size=4)  # groups of 2 + 1
HP = random_plan(2, 64, 8, 4, seed=5, block_size=4)  # one group of 2
CP = random_plan(2, 64, 8, 4, seed=3, block_size=4)  # two groups of 1

UNEQUAL = [("replicated", "all"), ("zero1", "all"), ("zero1", "replica"), ("zero2", "all"), ("zero3", "all"),
           ("zero2", "replica"), ("zero3", "replica")]  # fmt: skip
EQUAL = [("zero3", "replica", (3, 1)), ("zero2", "replica", (2, 2)), ("zero3", "node", (1, 3)),
         ("zero1", "node", (3, 1))]  # fmt: skip


def _job(layout: ReplicaLayout, seed: int, steps: int = 3) -> JointJob:
    return JointJob(layout.to_dict(), CFG, steps=steps, seed=seed, train=TrainConfig(lr=1e-2), collect=True,
                    dtype="float64")  # fmt: skip


def check(job: JointJob, ranks: list[dict], within, what: str) -> None:
    """Every rank against the one-process reference."""
    ref = joint_reference(job)
    errs, weights = {}, {}
    for i, (a, b) in enumerate(zip(ranks[0]["steps"], ref["steps"])):
        errs[f"loss{i}"] = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        errs[f"norm{i}"] = abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"])
    for r in ranks:
        assert [s["loss"] for s in r["steps"]] == [s["loss"] for s in ranks[0]["steps"]], "ranks log different losses"
        for n, g in ref["grads"].items():
            errs[f"grad:{n}"] = max(errs.get(f"grad:{n}", 0.0), rel_err(r["grads"][n], g))
        for n, p in ref["params"].items():
            top = (r["params"][n] - p).abs().max().item() / job.train.lr
            weights[n] = max(weights.get(n, 0.0), top)
    worst = max(errs, key=lambda k: errs[k] if errs[k] == errs[k] else float("inf"))
    within(errs[worst], FP64, f"{what}: losses, norms, gradients (worst: {worst})")
    worst = max(weights, key=lambda k: weights[k] if weights[k] == weights[k] else float("inf"))
    within(weights[worst], TOL_WEIGHTS_MAX, f"{what}: weights, largest difference / lr (worst: {worst})")


@pytest.fixture(scope="module")
def world5():
    from hexiseq.runtime.sharding import joint_worker
    from hexiseq.runtime.world import spawn_world

    jobs = [_job(ReplicaLayout((CP_HP, HP), (3, 1), stage, scope), seed=i) for i, (stage, scope) in enumerate(UNEQUAL)]
    return jobs, unpack(spawn_world(joint_worker, 5, jobs, timeout_s=600))


@pytest.fixture(scope="module")
def world4():
    from hexiseq.runtime.sharding import joint_worker
    from hexiseq.runtime.world import spawn_world

    jobs = [
        _job(ReplicaLayout((HP, CP), shares, stage, scope, rank_nodes=(0, 0, 1, 1) if scope == "node" else ()), seed=i)
        for i, (stage, scope, shares) in enumerate(EQUAL)
    ]
    return jobs, unpack(spawn_world(joint_worker, 4, jobs, timeout_s=600))


@pytest.mark.parametrize("index", range(len(UNEQUAL)), ids=[f"{a}-{b}" for a, b in UNEQUAL])
def test_unequal_replicas_shares_3_1(world5, index, within):
    jobs, results = world5
    ranks = [r[index] for r in results]
    assert [r["replica"] for r in ranks] == [0, 0, 0, 1, 1]
    assert len(ranks[0]["steps"]) == 3
    check(jobs[index], ranks, within, "unequal replicas {}/{}".format(*UNEQUAL[index]))
    layout = ReplicaLayout.from_dict(jobs[index].layout)
    params = len(ranks[0]["params"])
    if layout.stage == "zero1":  # each parameter's states held by one rank of each shard set
        assert [sum(ranks[r]["states"] for r in s) for s in layout.shard_sets()] == [params] * len(layout.shard_sets())
        assert all(0 < r["states"] < params for r in ranks)


@pytest.mark.parametrize("index", range(len(EQUAL)), ids=[f"{a}-{b}-{c[0]}{c[1]}" for a, b, c in EQUAL])
def test_equal_replicas_hybrid(world4, index, within):
    jobs, results = world4
    check(jobs[index], [r[index] for r in results], within, "equal replicas {}/{} {}".format(*EQUAL[index]))


def test_replica_ranks_and_shares():
    layout = ReplicaLayout((CP_HP, HP), (3, 1), "zero3", "replica")
    assert layout.world_size == 5 and layout.starts == (0, 3) and layout.global_batch == 4
    assert [layout.replica_of(r) for r in range(5)] == [0, 0, 0, 1, 1]
    assert layout.shard_sets() == ((0, 1, 2), (3, 4))
    assert (layout.first_sequence(0), layout.first_sequence(1)) == (0, 3)
    joint = derive_joint_context(layout, 4)
    assert (joint.replica, joint.ctx.rank, joint.ctx.rank_offset, joint.sequences) == (1, 1, 3, 1)
    assert ReplicaLayout.from_dict(layout.to_dict()) == layout
    assert layout.fingerprint() != ReplicaLayout((CP_HP, HP), (2, 2), "zero3", "replica").fingerprint()
    assert ReplicaLayout((CP_HP, HP), (3, 1), "zero1", "all").shard_sets() == ((0, 1, 2, 3, 4),)
    with pytest.raises(PlanError, match="at least one sequence"):
        ReplicaLayout((CP_HP, HP), (4, 0))
    with pytest.raises(PlanError, match="node of every rank"):
        ReplicaLayout((CP_HP, HP), (3, 1), "zero2", "node")


def test_layout_from_a_joint_plan():
    from hexiseq.plan import Plan, Sharding

    joint = Plan.joint([CP_HP, HP], [3, 1], Sharding("zero2", "replica"))
    layout = ReplicaLayout.from_plan(joint, 4)
    assert (layout.stage, layout.scope, layout.sequences) == ("zero2", "replica", (3, 1))
    assert [p.world_size for p in layout.plans] == [3, 2]
    assert [tuple(joint.replica_ranks(i)) for i in range(2)] == [tuple(layout.replica_ranks(i)) for i in range(2)]
    one = ReplicaLayout.from_plan(CP_HP, 5)
    assert one.num_replicas == 1 and one.sequences == (5,)


def test_shard_offsets_follow_torch_chunk():
    for rows in (0, 1, 5, 64, 97):
        for parts in (1, 2, 3, 4):
            chunks = torch.arange(rows).chunk(parts) if rows else ()
            starts = [int(c[0]) for c in chunks if c.numel()]
            assert [_shard_offset(rows, parts, i) for i in range(len(starts))] == starts


def test_synthetic_sequences_pad_and_ignore():
    counts = set()
    for index in range(6):
        tokens, labels = synthetic_sequence(CFG, 64, index, seed=0)
        assert labels[-1] == IGNORE_INDEX
        counts.add(int((labels != IGNORE_INDEX).sum()))
    assert len(counts) > 3  # uneven token counts across sequences


def test_runs_refuse_a_conflicting_fsdp_and_a_batch_the_replicas_do_not_share():
    from hexiseq.plan import Plan, Sharding
    from hexiseq.runs.config import joint_global_batch, pass_sharding, refuse_conflicting_fsdp

    joint = Plan.joint([CP_HP, HP], [3, 1], Sharding("zero1", "all"), name="z1")
    with pytest.raises(PlanError, match=r"plan 'z1' shards by its own strategy, zero1 over all devices, but --fsdp"):
        refuse_conflicting_fsdp(joint, fsdp=True)
    refuse_conflicting_fsdp(joint, fsdp=False)
    refuse_conflicting_fsdp(Plan.joint([CP_HP, HP], [3, 1], Sharding("zero3", "all")), fsdp=True)  # the same
    refuse_conflicting_fsdp(CP_HP, fsdp=True)  # a version-1 plan: --fsdp decides
    assert joint_global_batch(joint, 1) == 4 and joint_global_batch(joint, 4) == 4
    with pytest.raises(PlanError, match="global batch is 6"):
        joint_global_batch(joint, 6)
    # the cost model's pass shape: a version-2 plan's own stage, a version-1 plan's --fsdp
    one = Plan.joint([CP_HP], [4], Sharding("replicated", "all"))
    assert pass_sharding(one, fsdp=True) == "replicated" and pass_sharding(joint, fsdp=True) == "replicated"
    assert pass_sharding(Plan.joint([CP_HP], [4], Sharding("zero2", "all")), fsdp=False) == "zero3"
    assert (pass_sharding(CP_HP, fsdp=True), pass_sharding(CP_HP, fsdp=False)) == ("zero3", "replicated")


def test_zero1_owners_balanced_and_deterministic():
    from hexiseq.runtime.zero1 import assign_owners

    sizes = [64 * 128, 64, 64 * 64, 64 * 64, 96 * 64, 64, 96 * 64, 64 * 96, 64]
    owners = assign_owners(sizes, 3)
    assert owners == assign_owners(sizes, 3) and set(owners) == {0, 1, 2}
    loads = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(3)]
    assert max(loads) - min(loads) <= max(sizes)  # greedy largest-first: within one parameter of even
    assert assign_owners([5, 5], 1) == [0, 0] and assign_owners([1, 9, 9], 2) == [0, 0, 1]
