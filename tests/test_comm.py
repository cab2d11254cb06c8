"""Ragged all-to-all layouts, checked exactly with values that encode (token, head), and its
gradient (duplicated KV heads of a fine GQA split sum their gradients back). One spawned world."""

from __future__ import annotations

import pytest
import torch

from hexiseq.plan import Group, Plan, random_plan, ulysses_plan
from hexiseq.runtime.comm import gather_heads, ragged_all_to_all, scatter_qkv
from hexiseq.runtime.groups import build_context
from hexiseq.runtime.world import spawn_world

pytestmark = pytest.mark.numerics  # exact (values encode their origin): run under both thread settings too

D = 3


def _encode(positions: list[int], heads: int, kind: int) -> torch.Tensor:
    """x[t, h, c] = position * 1000 + head * 10 + kind + c / 10: every element tells where it came from."""
    p = torch.tensor(positions, dtype=torch.float64)[:, None, None]
    h = torch.arange(heads, dtype=torch.float64)[None, :, None]
    c = torch.arange(D, dtype=torch.float64)[None, None, :]
    return (p * 1000 + h * 10 + kind + c / 10).expand(len(positions), heads, D).contiguous()


def _comm_worker(rank: int, world: int, plans: list[str]) -> list[str]:
    failures = []
    for text in plans:
        plan = Plan.from_json(text)
        ctx = build_context(plan, timeout_s=30)
        lay = ctx.layout
        mine = lay.token_indices()
        q = _encode(mine, plan.num_heads, 0).requires_grad_()
        k = _encode(mine, plan.num_kv_heads, 1).requires_grad_()
        v = _encode(mine, plan.num_kv_heads, 2).requires_grad_()
        qg, kg, vg = scatter_qkv(q, k, v, ctx)
        group_pos = plan.group_positions(ctx.group)
        want = [
            _encode(group_pos, plan.num_heads, 0)[:, slice(*lay.head_range)],
            _encode(group_pos, plan.num_kv_heads, 1)[:, slice(*lay.kv_head_range)],
            _encode(group_pos, plan.num_kv_heads, 2)[:, slice(*lay.kv_head_range)],
        ]
        for name, got, exp in zip("qkv", (qg, kg, vg), want):
            if got.shape != exp.shape or not torch.equal(got.detach(), exp):
                failures.append(
                    f"{plan.name} rank {rank}: scattered {name} wrong, shape {tuple(got.shape)} vs {tuple(exp.shape)}"
                )
        back = gather_heads(qg, ctx)
        if not torch.equal(back.detach(), q.detach()):
            failures.append(f"{plan.name} rank {rank}: gather_heads(scatter(q)) != q")
        # d(sum back + sum kg + 2 sum vg)/dk = number of group peers that hold each KV head
        (back.sum() + kg.sum() + 2 * vg.sum()).backward()
        holders = torch.zeros(plan.num_kv_heads, dtype=torch.float64)
        for a, b in ctx.kv_ranges:
            holders[a:b] += 1
        if not torch.equal(q.grad, torch.ones_like(q)):
            failures.append(f"{plan.name} rank {rank}: dq wrong")
        if not torch.equal(k.grad, holders[None, :, None].expand_as(k)) or not torch.equal(
            v.grad, 2 * holders[None, :, None].expand_as(v)
        ):
            failures.append(
                f"{plan.name} rank {rank}: duplicated KV head gradients not summed: "
                f"{k.grad[:1, :, 0].tolist()} vs {holders.tolist()}"
            )
    # zero-size splits in a plain ragged exchange: rank r sends r elements to every peer
    x = torch.full((rank * world,), float(rank))
    y = ragged_all_to_all(x, [rank] * world, list(range(world)))
    if not torch.equal(y, torch.cat([torch.full((p,), float(p)) for p in range(world)])):
        failures.append(f"rank {rank}: ragged_all_to_all with zero splits wrong: {y.tolist()}")
    return failures


def _plans(world: int) -> list[Plan]:
    plans = [
        ulysses_plan(range(world), 8 * world, 2 * world, world, block_size=4),
        # tokens without heads, heads without tokens, KV heads split finely
        Plan(
            24,
            6,
            2,
            (Group(tuple(range(world)), 12, (0,) * (world - 2) + (10, 14), (1,) * (world - 2) + (5 - world, 3)),),
            block_size=1,
            name="zeros",
        ),
    ]
    plans += [random_plan(world, 40, 7 if s % 2 else 6, 1 if s % 2 else 2, seed=100 + s) for s in range(8)]
    plans += [random_plan(world, 36, 8, 4, seed=200 + s, whole_kv_heads=s % 2 == 0) for s in range(4)]
    return plans


@pytest.mark.timeout(90)
def test_ragged_all_to_all_layouts_and_gradients():
    plans = _plans(4)
    assert any(0 in p.shards for p in plans) and any(0 in p.heads for p in plans)
    results = spawn_world(_comm_worker, 4, [p.to_json() for p in plans], timeout_s=80)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:20])
