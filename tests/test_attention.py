"""Distributed attention (forward, dq, dk, dv) against dense single-process causal attention,
fp32 (and bf16), relative error within tests/_numerics.py's tolerances, for many uneven plans on 2, 3 and 4
spawned gloo ranks; bad plans refused before any collective; a dead peer gives an error, not a hang."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F
from _numerics import BF16, FP32

from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.runtime import PlanAttention, build_context, derive_context, plan_attention
from hexiseq.runtime.world import run_world, spawn_world

pytestmark = pytest.mark.numerics

TOL, TOL_BF16 = FP32, BF16  # relative: max |a - b| / max |b| over the sequence
QUANTITIES = ("out", "dq", "dk", "dv")


def dense_reference(plan: Plan, d: int, seed: int):
    """Full-sequence q, k, v, upstream gradient, and dense causal SDPA output and gradients (fp32)."""
    g = torch.Generator().manual_seed(seed)
    S, H, Hkv = plan.seq_len, plan.num_heads, plan.num_kv_heads
    q, k, v = (
        torch.randn(S, H, d, generator=g),
        torch.randn(S, Hkv, d, generator=g),
        torch.randn(S, Hkv, d, generator=g),
    )
    do = torch.randn(S, H, d, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    bhld = lambda t: t.transpose(0, 1)[None]  # noqa: E731
    out = F.scaled_dot_product_attention(*map(bhld, leaves), is_causal=True, enable_gqa=True)[0].transpose(0, 1)
    (out * do).sum().backward()
    return (q, k, v, do), (out.detach(), *(t.grad for t in leaves))


def _check_plans(rank: int, world: int, cases: list[tuple[str, int, str]]) -> list[dict]:
    """Run each plan: this rank's errors (max abs) and reference magnitudes (max abs) per quantity.
    Inputs are cast to `dtype` (fp32 or bf16); the reference is always fp32."""
    results = []
    for i, (text, d, dtype) in enumerate(cases):
        plan = Plan.from_json(text)
        ctx = build_context(plan, timeout_s=30)
        (q, k, v, do), ref = dense_reference(plan, d, seed=i)
        idx = torch.tensor(ctx.layout.token_indices(), dtype=torch.long)
        mine = [t[idx].to(getattr(torch, dtype)).requires_grad_() for t in (q, k, v)]
        attn = PlanAttention(ctx) if i % 2 else (lambda a, b, c, ctx=ctx: plan_attention(a, b, c, ctx))
        out = attn(*mine)
        (out * do[idx]).sum().backward()
        got = [out.detach()] + [t.grad for t in mine]
        err = {n: (a.float() - b[idx]).abs().max().item() if len(idx) else 0.0 for n, a, b in zip(QUANTITIES, got, ref)}
        mag = {n: b.abs().max().item() for n, b in zip(QUANTITIES, ref)}
        results.append({"plan": f"{plan.name}/{dtype}", "err": err, "mag": mag})
    return results


def _relative(results_by_rank: list[list[dict]]) -> dict[str, dict[str, float]]:
    """max |a - b| over all ranks / max |b| over the whole sequence, per plan and quantity."""
    out = {}
    for per_plan in zip(*results_by_rank):
        name = per_plan[0]["plan"]
        out[name] = {n: max(r["err"][n] for r in per_plan) / per_plan[0]["mag"][n] for n in QUANTITIES}
    return out


def _cases(world: int) -> list[tuple[Plan, int]]:
    cases: list[tuple[Plan, int]] = [
        (ring_plan(range(world), 24 * world, 3, 1, block_size=4, name="pure-cp"), 8),
        (ulysses_plan(range(world), 12 * world, 2 * world, world, block_size=3, name="pure-hp"), 4),
        # very small shards, non power-of-two chunks, tokens without heads and heads without tokens
        (
            Plan(
                6 * world,
                5,
                5,
                tuple(Group((r,), 3, (6,), (5,)) for r in range(world - 1)) + (Group((world - 1,), 3, (6,), (5,)),),
                block_size=1,
                name="tiny-chunks",
            ),
            4,
        ),
    ]
    if world >= 2:
        ranks = iter(range(world))
        cases.append(
            (
                Plan(
                    60,
                    7,
                    7,
                    (
                        Group((next(ranks),), 9, (18,), (7,)),
                        Group(
                            tuple(next(ranks) for _ in range(world - 1)),
                            21,
                            (0,) * (world - 2) + (42,),
                            (1,) * (world - 2) + (9 - world,),
                        ),
                    ),
                    block_size=3,
                    name="single-plus-hp",
                ),
                8,
            )
        )
    # KV heads split finely (GQA 3:1, ranges that start or end inside a KV head's query heads)
    if world == 2:
        cases.append((Plan(30, 6, 2, (Group((0, 1), 15, (0, 30), (1, 5)),), block_size=5, name="split-gqa-2"), 8))
    if world == 3:
        cases.append(
            (
                Plan(
                    42,
                    6,
                    2,
                    (Group((0, 1), 15, (27, 3), (4, 2)), Group((2,), 6, (12,), (6,))),
                    block_size=3,
                    name="split-gqa-2+1",
                ),
                8,
            )
        )
    if world == 4:
        cases.append((symmetric_plan(range(4), 64, 4, 2, cp=2, hp=2, block_size=4, name="usp-even"), 8))
        cases.append(
            (
                Plan(
                    60,
                    6,
                    2,
                    (Group((0, 1, 2), 21, (10, 5, 27), (1, 4, 1)), Group((3,), 9, (18,), (6,))),
                    block_size=3,
                    name="split-gqa-3+1",
                ),
                8,
            )
        )
    for s in range(10):
        H, Hkv = [(6, 2), (7, 7), (5, 1), (8, 4), (9, 3)][s % 5]
        S = 2 * world * (5 + s)
        cases.append((random_plan(world, S, H, Hkv, seed=1000 * world + s, whole_kv_heads=s % 3 == 0), 4 + 4 * (s % 3)))
    return cases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_dense_attention(world, within):
    cases = _cases(world)
    jobs = [(p.to_json(), d, "float32") for p, d in cases] + [(p.to_json(), d, "bfloat16") for p, d in cases[-2:]]
    rel = _relative(spawn_world(_check_plans, world, jobs, timeout_s=110))
    fp32 = {k: r for k, r in rel.items() if k.endswith("float32")}
    bf16 = {k: r for k, r in rel.items() if k.endswith("bfloat16")}
    worst = {n: max(r[n] for r in fp32.values()) for n in QUANTITIES}
    print(f"world {world}: {len(fp32)} plans, worst fp32 relative errors {worst}; bf16 {bf16}")
    name = max(fp32, key=lambda k: max(fp32[k].values()))
    within(max(fp32[name].values()), TOL, f"world {world}: worst fp32 plan {name}")
    assert len(bf16) == 2
    name = max(bf16, key=lambda k: max(bf16[k].values()))
    within(max(bf16[name].values()), TOL_BF16, f"world {world}: worst bf16 plan {name}")
    # the cases really cover what they claim: uneven heads and chunks, ranks without heads or
    # without tokens, fine GQA splits
    plans = [p for p, _ in cases]
    assert any(len(set(p.heads)) > 1 for p in plans) and any(len(set(g.chunk_len for g in p.groups)) > 1 for p in plans)
    assert any(0 in p.heads for p in plans) and any(0 in p.shards for p in plans)
    assert any(not derive_context(p, r).gqa_aligned for p in plans for r in range(world) if p.heads[r])


def _refusals(rank: int, world: int) -> list[str]:
    """Plans that must be refused on this 2-rank world, before any collective (or, for two ranks
    that hold different plans, by the one agreement check that all ranks reach together)."""
    msgs = []
    tries = [
        ring_plan(range(3), 48, 4, 2, block_size=8),  # 3 ranks on a world of 2
        Plan(16, 4, 2, (Group((0, 1), 8, (8, 8), (2, 1)),), block_size=1),  # heads do not add up
        Plan(16, 4, 2, (Group((0, 1), 8, (8, 7), (2, 2)),), block_size=1),  # shards do not add up
        Plan(16, 4, 2, (Group((0, 1), 8, (8, 8), (2, 2)),), block_size=1, name=f"mine-{rank}"),  # ranks disagree
    ]
    for plan in tries:
        try:
            build_context(plan)
            msgs.append("accepted")
        except PlanError as e:
            msgs.append(str(e))
    ctx = build_context(Plan(16, 4, 2, (Group((0, 1), 8, (8, 8), (2, 2)),), block_size=1))
    try:
        plan_attention(torch.zeros(8, 4, 4), torch.zeros(8, 4, 4), torch.zeros(8, 4, 4), ctx)
        msgs.append("accepted")
    except PlanError as e:
        msgs.append(str(e))
    return msgs


@pytest.mark.timeout(60)
def test_bad_plans_refused_with_reasons():
    for msgs in spawn_world(_refusals, 2, timeout_s=50):
        assert "3 ranks" in msgs[0] and "2 processes" in msgs[0]
        assert "head counts sum to 3, expected 4" in msgs[1]
        assert "shards sum to 15" in msgs[2]
        assert "different plans" in msgs[3]
        assert "expects q [8, 4, d] and k, v [8, 2, d]" in msgs[4]


def _dead_peer(rank: int, world: int, text: str, mode: str) -> dict:
    plan = Plan.from_json(text)
    ctx = build_context(plan, timeout_s=3)
    if rank == world - 1:
        if mode == "crash":
            os._exit(17)  # dies without a word, like a crashed host
        time.sleep(4)  # alive but silent (a hung peer): the others must time out, not wait forever
        os._exit(18)
    t0 = time.monotonic()
    try:
        s, H, Hkv = ctx.layout.num_tokens, plan.num_heads, plan.num_kv_heads
        plan_attention(torch.randn(s, H, 4), torch.randn(s, Hkv, 4), torch.randn(s, Hkv, 4), ctx)
        return {"raised": None, "seconds": time.monotonic() - t0}
    except Exception as e:  # the point: some error, within the process-group timeout
        return {"raised": f"{type(e).__name__}: {e}"[:300], "seconds": time.monotonic() - t0}


@pytest.mark.serial  # times how soon the survivors raise
@pytest.mark.timeout(80)
@pytest.mark.parametrize("mode", ["crash", "hang"])
def test_dead_peer_raises_instead_of_hanging(mode):
    # groups {0,1} and {2}: ranks 0 and 1 wait for K/V from rank 2, which is gone or silent
    plan = Plan(24, 2, 2, (Group((0, 1), 6, (5, 7), (1, 1)), Group((2,), 6, (12,), (2,))), block_size=1)
    res = run_world(_dead_peer, 3, plan.to_json(), mode, timeout_s=40, pg_timeout_s=3)
    assert not res.timed_out
    assert res.exitcodes[2] == (17 if mode == "crash" else 18) and 2 in res.errors
    for r in (0, 1):
        assert r in res.values, res.errors.get(r)
        assert res.values[r]["raised"], res.values[r]
        assert res.values[r]["seconds"] < (2.5 if mode == "crash" else 4.5), res.values[r]
    if mode == "hang":
        assert all("Timed out" in res.values[r]["raised"] for r in (0, 1)), res.values
