"""The whole model under uneven plans equals the single-process model (CPU, gloo).

One spawned world per world size runs several jobs (spawning costs seconds). Every job is
compared with the same job on one process: the output rows, the loss and every parameter
gradient of the first step, and for the multi-step jobs the loss of every AdamW step and the
final weights.

Precision: a comparison across several AdamW steps is ill-conditioned in fp32 (Adam divides each
gradient entry by its own RMS, so the rounding noise of a near-zero entry becomes a visible
difference of its update, and differently on another CPU), so every multi-step job runs in
float64, where both sides agree to ~1e-13. Single-step jobs run in fp32 and compare outputs,
loss and gradients only (the first Adam update is ~lr·sign(g): not a numeric comparison).
"""

from __future__ import annotations

import pytest
import torch
from _numerics import FP32, FP64, rel_err

from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, random_plan
from hexiseq.runtime.llama import IGNORE_INDEX, Llama, LlamaConfig
from hexiseq.runtime.parallel import ParallelOptions, shard_sequence
from hexiseq.runtime.train import StepJob, TrainConfig, _gpu_matches, check_world, reference_job, unpack

pytestmark = pytest.mark.numerics

TOL = {"float32": FP32, "float64": FP64}  # outputs, losses, gradients (relative)
TOL_WEIGHTS_MEAN, TOL_WEIGHTS_MAX = 1e-10, 1e-8  # float64 weights after several AdamW steps (check_job)
CFG = LlamaConfig(vocab=128, hidden=64, layers=2, heads=8, kv_heads=4, ffn=96, rope_theta=1000.0)
TIED = LlamaConfig(vocab=128, hidden=64, layers=2, heads=8, kv_heads=4, ffn=96, rope_theta=1000.0, tie_embeddings=True)


def hand_plan() -> Plan:
    """4 ranks, 2 groups of 2; a rank with heads but no tokens, one with tokens but no heads,
    shards straddling the front/back chunk boundary, uneven chunks (S = 2 x (24 + 40) = 128)."""
    return Plan(
        128,
        8,
        4,
        (
            Group((2, 0), 24, (0, 48), (6, 2)),  # rank 0: no tokens, 6 heads
            Group((1, 3), 40, (50, 30), (8, 0)),  # rank 3: no heads
        ),
        block_size=8,
        name="hand",
    )


def check_job(job: StepJob, ranks: list[dict], seq_len: int, within) -> dict[str, float]:
    """Compare a distributed job with the one-process reference; every error goes through `within`."""
    if job.steps > 1:
        assert job.dtype == "float64", "a multi-step comparison must run in float64 (module doc)"
    tol = TOL[job.dtype]
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
    worst = max(errs, key=lambda k: errs[k] if errs[k] == errs[k] else float("inf"))
    within(errs[worst], tol, f"{job.plan['name']} ({job.dtype}, worst: {worst})")
    if job.steps > 1:
        # Weights after the AdamW steps. Adam still divides each entry by its own RMS, so an entry whose
        # gradient is near Adam's eps turns float64 rounding (~1e-16) into up to ~1e-8 of a step: the mean
        # difference is measured against the mean movement, and the worst entry against a step (lr).
        init = dict(Llama(job.model).init_weights(job.seed).named_parameters())
        mean, top = {}, {}
        for n, p in ref["params"].items():
            diff = (ranks[0]["params"][n] - p).abs()
            mean[n] = diff.mean().item() / (p - init[n].detach().double()).abs().mean().item()
            top[n] = diff.max().item() / job.train.lr
        n = max(mean, key=mean.get)
        within(mean[n], TOL_WEIGHTS_MEAN, f"{job.plan['name']}: weights, mean difference / mean movement (worst: {n})")
        n = max(top, key=top.get)
        within(top[n], TOL_WEIGHTS_MAX, f"{job.plan['name']}: weights, largest difference / lr (worst: {n})")
        errs.update({f"param:{k}": v for k, v in mean.items()})
    return errs


@pytest.fixture(scope="module")
def world4():
    from hexiseq.runtime.train import step_worker_many
    from hexiseq.runtime.world import spawn_world

    jobs = [
        # full checkpointing on the plan with two groups: the backward replays the all-to-all and the
        # KV exchange inside each checkpoint (selective checkpointing is job 2)
        StepJob(
            plan=random_plan(4, 128, 8, 4, seed=3, block_size=8).to_dict(),
            model=CFG,
            seed=1,
            collect=True,
            options=ParallelOptions(activation_checkpointing="full"),
        ),
        StepJob(
            plan=hand_plan().to_dict(),
            model=TIED,
            seed=2,
            steps=5,
            collect=True,
            train=TrainConfig(lr=1e-2),
            dtype="float64",
        ),
        StepJob(
            plan=random_plan(4, 96, 8, 4, seed=11, block_size=4, whole_kv_heads=True).to_dict(),
            model=CFG,
            seed=4,
            steps=2,
            collect=True,
            options=ParallelOptions(activation_checkpointing="selective", loss_chunk=7),
            dtype="float64",
        ),
        StepJob(
            plan=hand_plan().to_dict(),
            model=TIED,
            seed=5,
            steps=2,
            collect=True,
            train=TrainConfig(lr=1e-2),
            options=ParallelOptions(fsdp=True),
            dtype="float64",
        ),
    ]
    return jobs, unpack(spawn_world(step_worker_many, 4, jobs, timeout_s=240))


def _ranks(world, i):
    jobs, results = world
    return jobs[i], [r[i] for r in results]


def test_random_uneven_plan_one_step_full_recompute(world4, within):
    job, ranks = _ranks(world4, 0)
    assert job.options.activation_checkpointing == "full"
    check_job(job, ranks, job.plan["seq_len"], within)


def test_hand_plan_tied_embeddings_five_adamw_steps(world4, within):
    job, ranks = _ranks(world4, 1)
    errs = check_job(job, ranks, 128, within)
    assert len([k for k in errs if k.startswith("loss")]) == 5
    losses = [s["loss"] for s in ranks[0]["steps"]]
    assert losses[-1] < losses[0]  # it trains
    assert ranks[0]["positions"].numel() == 0  # rank 0 held no tokens, yet its gradients count


def test_recompute_and_chunked_loss(world4, within):
    job, ranks = _ranks(world4, 2)
    check_job(job, ranks, 96, within)


def test_fsdp_sharded_parameters(world4, within):
    """FSDP2 (fully_shard per block + root, tied embeddings) gives the replicated result; gloo on CPU."""
    job, ranks = _ranks(world4, 3)
    check_job(job, ranks, 128, within)


def test_three_ranks(within):
    from hexiseq.runtime.train import step_worker_many
    from hexiseq.runtime.world import spawn_world

    plan = random_plan(3, 64, 8, 4, seed=3, block_size=4)  # groups of 2 + 1, chunks 24/8, shards 37/11/16, heads 1/7/8
    assert plan.group_sizes == (2, 1) and len(set(plan.shards)) == 3 and len(set(plan.heads)) == 3
    job = StepJob(plan=plan.to_dict(), model=CFG, seed=5, collect=True)
    results = unpack(spawn_world(step_worker_many, 3, [job], timeout_s=180))
    check_job(job, [r[0] for r in results], 64, within)


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
    assert _gpu_matches("RTX-4090", "NVIDIA GeForce RTX 4090") and not _gpu_matches(
        "RTX-A6000", "NVIDIA GeForce RTX 4090"
    )
