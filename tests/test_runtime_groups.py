"""Process-group tables derived from a Plan (pure: no process group needed)."""

from __future__ import annotations

import numpy as np
import pytest

from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.runtime.groups import build_context, derive_context, world_violations
from hexiseq.schedule import needed_segments, owned_kv_ranges


def _plans():
    out = [
        ring_plan(range(4), 64, 4, 2, block_size=8),
        ulysses_plan(range(4), 64, 4, 2, block_size=8),
        symmetric_plan(range(4), 64, 4, 4, cp=2, hp=2, block_size=8),
    ]
    for seed in range(40):
        world = 1 + seed % 5
        out.append(
            random_plan(
                world, 2 * world * (3 + seed % 4), 6, 3 - 2 * (seed % 2), seed=seed, whole_kv_heads=seed % 3 == 0
            )
        )
    return out


def _key_positions(plan: Plan, src: int, rows) -> np.ndarray:
    pos = np.array(plan.group_positions(src))
    return np.concatenate([pos[a:b] for a, b in rows])


@pytest.mark.parametrize("plan", _plans(), ids=lambda p: p.name)
def test_every_causal_pair_computed_exactly_once(plan):
    """Local pairs + all rounds cover each (query, key <= query) of every rank's heads exactly once,
    and only the KV heads the rank needs arrive, each from the rank that owns it."""
    S = plan.seq_len
    for rank in range(plan.world_size):
        ctx = derive_context(plan, rank)
        if not ctx.layout.heads:
            assert all(not r.recv and not r.send for r in ctx.rounds)
            continue
        qpos = np.array(plan.group_positions(ctx.group))
        seen = np.zeros((len(qpos), S), dtype=int)
        sources = [(ctx.group, ctx.local_pairs, [(0, len(qpos))])] + [
            (r.src_group, r.pairs, r.recv[0].rows) for r in ctx.rounds
        ]
        for src, pairs, rows in sources:
            kpos = _key_positions(plan, src, rows)
            for p in pairs:
                qp, kp = qpos[p.q_rows[0] : p.q_rows[1]], kpos[p.k_rows[0] : p.k_rows[1]]
                allowed = kp[None, :] <= qp[:, None]
                if p.kind == "full":
                    assert allowed.all()
                seen[p.q_rows[0] : p.q_rows[1]][:, kp] += allowed
        assert np.array_equal(seen, (np.arange(S)[None, :] <= qpos[:, None]).astype(int)), rank
        for r in ctx.rounds:
            heads = [h for t in r.recv for h in range(*t.kv_heads)]
            assert heads == list(range(*ctx.layout.kv_head_range))
            assert all(t.tokens == r.key_tokens == sum(b - a for a, b in t.rows) for t in r.recv)


@pytest.mark.parametrize("plan", _plans()[:25], ids=lambda p: p.name)
def test_sends_match_receives(plan):
    ctxs = [derive_context(plan, r) for r in range(plan.world_size)]
    for c in ctxs:
        assert sum(c.token_counts) == c.group_tokens
        assert c.head_ranges[0][0] == 0 and c.head_ranges[-1][1] == plan.num_heads
        assert all(a[1] == b[0] for a, b in zip(c.head_ranges, c.head_ranges[1:]))
        for j, rd in enumerate(c.rounds):
            for t in rd.send:
                assert t in ctxs[t.dst].rounds[j].recv
            for t in rd.recv:
                assert t in ctxs[t.src].rounds[j].send
                assert ctxs[t.src].owned_kv[0] <= t.kv_heads[0] and t.kv_heads[1] <= ctxs[t.src].owned_kv[1]
    for g in range(plan.num_groups):
        owned = owned_kv_ranges(plan, g)
        covered = [h for a, b in owned for h in range(a, b)]
        assert covered == list(range(plan.num_kv_heads))


def test_zigzag_needs_front_of_earlier_and_both_of_later():
    plan = Plan(
        40, 2, 1, (Group((0,), 4, (8,), (2,)), Group((1,), 10, (20,), (2,)), Group((2,), 6, (12,), (2,))), block_size=2
    )
    assert [s.start for s in needed_segments(plan, 0, 2)] == [0]  # earlier group: its front chunk only
    assert [s.start for s in needed_segments(plan, 2, 0)] == [14, 20]  # later group: both chunks
    ctx = derive_context(plan, 0)
    assert ctx.rounds[0].src_group == 2 and ctx.rounds[0].key_tokens == 12
    # group 0's front chunk sees nothing of group 2; its back chunk sees all of it
    assert {(p.q_rows, p.kind) for p in ctx.rounds[0].pairs} == {((4, 8), "full")}


def test_fine_gqa_split_duplicates_kv_heads_and_assigns_one_owner():
    plan = Plan(16, 6, 2, (Group((0, 1, 2), 8, (6, 5, 5), (2, 2, 2)),), block_size=1)
    ctx = [derive_context(plan, r) for r in range(3)]
    assert [c.layout.kv_head_range for c in ctx] == [(0, 1), (0, 2), (1, 2)]
    assert [c.owned_kv for c in ctx] == [(0, 1), (1, 2), (2, 2)]
    assert not ctx[1].gqa_aligned and ctx[1].kv_index == (0, 1)
    assert ctx[0].gqa_aligned is False and ctx[0].kv_index == (0, 0)


def test_world_mismatch_and_bad_plans_are_refused_with_reasons():
    plan = ring_plan(range(3), 48, 4, 2, block_size=8)
    msgs = world_violations(plan, 0, 4)
    assert any("3 ranks" in m and "4 processes" in m for m in msgs)
    bad = Plan(16, 4, 2, (Group((0, 1), 8, (8, 8), (2, 1)),), block_size=1)
    assert any("head counts sum to 3, expected 4" in m for m in world_violations(bad, 0, 2))
    with pytest.raises(PlanError, match="initialized"):
        build_context(plan, 0)
    with pytest.raises(PlanError, match="rank 5"):
        derive_context(plan, 5)
