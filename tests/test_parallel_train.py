"""The whole model under uneven plans equals the single-process model (CPU, gloo, fp32).

One spawned world per world size runs several jobs (spawning costs seconds). Every job is
compared with the same job on one process: the output rows, the loss and every parameter
gradient of the first step (<= 1e-5 relative), and for the multi-step jobs the loss of every
AdamW step and the final weights.
"""

from __future__ import annotations

import pytest
import torch

from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, random_plan
from hexiseq.runtime.model import IGNORE_INDEX, Llama, LlamaConfig
from hexiseq.runtime.parallel import ParallelOptions, shard_sequence
from hexiseq.runtime.train import StepJob, TrainConfig, _gpu_matches, check_world, reference_job, unpack

TOL = 1e-5
CFG = LlamaConfig(vocab=128, hidden=64, layers=2, heads=8, kv_heads=4, ffn=96, rope_theta=1000.0)
TIED = LlamaConfig(vocab=128, hidden=64, layers=2, heads=8, kv_heads=4, ffn=96, rope_theta=1000.0, tie_embeddings=True)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def hand_plan() -> Plan:
    """4 ranks, 2 groups of 2; a rank with heads but no tokens, one with tokens but no heads,
    shards straddling the front/back chunk boundary, uneven chunks (S = 2 x (24 + 40) = 128)."""
    return Plan(128, 8, 4, (
        Group((2, 0), 24, (0, 48), (6, 2)),  # rank 0: no tokens, 6 heads
        Group((1, 3), 40, (50, 30), (8, 0)),  # rank 3: no heads
    ), block_size=8, name="hand")


def check_job(job: StepJob, ranks: list[dict], seq_len: int) -> dict[str, float]:
    ref = reference_job(job, seq_len)
    out = torch.full_like(ref["output"], float("nan"))
    for r in ranks:
        out[r["positions"]] = r["output"]
    errs = {"out": rel_err(out, ref["output"])}  # NaN (fails) where a row was not produced
    for i, (a, b) in enumerate(zip(ranks[0]["steps"], ref["steps"])):
        errs[f"loss{i}"] = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    for r in ranks:
        assert [s["loss"] for s in r["steps"]] == [s["loss"] for s in ranks[0]["steps"]], "ranks log different losses"
        assert set(r["grads"]) == set(ref["grads"])
        for n, g in ref["grads"].items():
            errs[f"grad:{n}"] = max(errs.get(f"grad:{n}", 0.0), rel_err(r["grads"][n], g))
            # replicas stay identical: the same summed gradient everywhere, the same update
            assert torch.equal(r["params"][n], ranks[0]["params"][n]), (r["rank"], n)
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"{job.plan['name']}: errors above {TOL}: {bad}"
    # Weights after the AdamW steps, measured against how far they moved. Adam divides every gradient
    # entry by its own RMS, so an entry whose magnitude is near Adam's eps turns its fp32 rounding
    # (~1e-7 of the largest gradient) into a visible difference of its update: the mean difference
    # must be <= 1e-5 of the mean movement, and no single entry may differ by 10% of a step (lr).
    init = dict(Llama(job.model).init_weights(job.seed).named_parameters())
    for n, p in ref["params"].items():
        diff = (ranks[0]["params"][n] - p).abs()
        moved = (p - init[n].detach()).abs().mean().item()
        errs[f"param:{n}"] = diff.mean().item() / moved
        assert errs[f"param:{n}"] <= TOL, f"{job.plan['name']}: weight {n}: mean difference {errs[f'param:{n}']:.3g} of its movement"
        assert diff.max().item() <= 0.1 * job.train.lr * job.steps, f"{job.plan['name']}: weight {n}: an entry differs by {diff.max():.3g}"
    return errs


@pytest.fixture(scope="module")
def world4():
    from hexiseq.runtime.launch import spawn_world
    from hexiseq.runtime.train import step_worker_many

    jobs = [
        # full checkpointing on the plan with two groups: the backward replays the all-to-all and the
        # KV exchange inside each checkpoint (selective checkpointing is job 2)
        StepJob(plan=random_plan(4, 128, 8, 4, seed=3, block_size=8).to_dict(), model=CFG, seed=1, collect=True,
                options=ParallelOptions(activation_checkpointing="full")),
        StepJob(plan=hand_plan().to_dict(), model=TIED, seed=2, steps=5, collect=True, train=TrainConfig(lr=1e-2)),
        StepJob(plan=random_plan(4, 96, 8, 4, seed=11, block_size=4, whole_kv_heads=True).to_dict(), model=CFG, seed=4,
                steps=2, collect=True, options=ParallelOptions(activation_checkpointing=True, loss_chunk=7)),
        StepJob(plan=hand_plan().to_dict(), model=TIED, seed=5, steps=2, collect=True, train=TrainConfig(lr=1e-2),
                options=ParallelOptions(fsdp=True)),
    ]
    return jobs, unpack(spawn_world(step_worker_many, 4, jobs, timeout_s=240))


def _ranks(world, i):
    jobs, results = world
    return jobs[i], [r[i] for r in results]


def test_random_uneven_plan_one_step_full_recompute(world4):
    job, ranks = _ranks(world4, 0)
    assert job.options.activation_checkpointing == "full"
    check_job(job, ranks, job.plan["seq_len"])


def test_hand_plan_tied_embeddings_five_adamw_steps(world4):
    job, ranks = _ranks(world4, 1)
    errs = check_job(job, ranks, 128)
    assert len([k for k in errs if k.startswith("loss")]) == 5
    losses = [s["loss"] for s in ranks[0]["steps"]]
    assert losses[-1] < losses[0]  # it trains
    assert ranks[0]["positions"].numel() == 0  # rank 0 held no tokens, yet its gradients count


def test_recompute_and_chunked_loss(world4):
    job, ranks = _ranks(world4, 2)
    check_job(job, ranks, 96)


def test_fsdp_sharded_parameters(world4):
    """FSDP2 (fully_shard per block + root, tied embeddings) gives the replicated result; gloo on CPU."""
    job, ranks = _ranks(world4, 3)
    check_job(job, ranks, 128)


def test_three_ranks():
    from hexiseq.runtime.launch import spawn_world
    from hexiseq.runtime.train import step_worker_many

    plan = random_plan(3, 64, 8, 4, seed=3, block_size=4)  # groups of 2 + 1, chunks 24/8, shards 37/11/16, heads 1/7/8
    assert plan.group_sizes == (2, 1) and len(set(plan.shards)) == 3 and len(set(plan.heads)) == 3
    job = StepJob(plan=plan.to_dict(), model=CFG, seed=5, collect=True)
    results = unpack(spawn_world(step_worker_many, 3, [job], timeout_s=180))
    check_job(job, [r[0] for r in results], 64)


def test_shard_labels_follow_global_positions():
    plan = hand_plan()
    tokens = torch.arange(1000, 1128)
    for lay in plan.layout():
        shard = shard_sequence(tokens, lay)
        assert shard.positions.tolist() == lay.token_indices()
        assert torch.equal(shard.tokens, tokens[shard.positions])
        for p, y in zip(shard.positions.tolist(), shard.labels.tolist()):
            assert y == (IGNORE_INDEX if p == 127 else 1000 + p + 1)


def test_world_checks():
    with pytest.raises(PlanError, match="4 ranks but the running world has 1"):
        check_world(hand_plan())
    assert _gpu_matches("A100-80GB", "NVIDIA A100-SXM4-80GB")
    assert not _gpu_matches("A100-40GB", "NVIDIA A100-SXM4-80GB")
    assert _gpu_matches("H100-SXM", "NVIDIA H100 80GB HBM3")
    assert _gpu_matches("RTX-4090", "NVIDIA GeForce RTX 4090") and not _gpu_matches("RTX-A6000", "NVIDIA GeForce RTX 4090")
