"""The exchange schedule (hexiseq/schedule.py) against a brute-force derivation from its rules: the
causal mask on real positions, the zigzag need, KV-head ownership with fine GQA splits, ranks with
no heads or no tokens; and the executor's per-rank view (`rank_rounds`) against the table."""

import numpy as np
import pytest
from _costmodel_ref import Xfer, brute_exchange, edge_plan, kv_owner, needed_key_tokens, random_plans, table_transfers

from hexiseq.plan import Group, Plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.schedule import (
    CAUSAL,
    FULL,
    NONE,
    block_mask,
    block_pairs,
    exchange_table,
    group_segments,
    needed_segments,
    owned_kv_ranges,
    packed,
    rank_rounds,
)

# (heads, kv heads): MHA, GQA with gq = 2, 3, 4, 6 and MQA
HEAD_SHAPES = [(8, 4), (6, 3), (6, 2), (12, 4), (32, 8), (4, 4), (6, 1)]


def _plans() -> list[Plan]:
    out = [
        edge_plan(),
        ring_plan(range(4), 64, 4, 2, block_size=8),
        ulysses_plan(range(3), 48, 6, 2, block_size=8),
        symmetric_plan(range(6), 96, 6, 3, cp=3, hp=2, block_size=8),
    ]
    for i, (H, Hkv) in enumerate(HEAD_SHAPES):
        for world in (2, 3, 5, 8):
            out += random_plans(
                2, world, H, Hkv, blocks=world + 3 + i, block_size=1 + (i + world) % 3, seed0=100 * i + 10 * world
            )
    return out


PLANS = _plans()


def test_the_plans_reach_every_edge_case():
    """The random plans include what the schedule must handle: many groups, uneven chunks, fine
    GQA splits, ranks with heads but no tokens and with tokens but no heads."""
    lay = [(p, x) for p in PLANS for x in p.layout()]
    gq = {id(p): p.num_heads // p.num_kv_heads for p in PLANS}
    assert any(x.heads == 0 for _, x in lay)
    assert any(x.num_tokens == 0 and x.heads > 0 for _, x in lay)
    assert any(x.heads and (x.head_range[0] % gq[id(p)] or x.head_range[1] % gq[id(p)]) for p, x in lay)
    assert any(len({g.chunk_len for g in p.groups}) > 1 for p in PLANS)
    assert max(p.num_groups for p in PLANS) >= 5


def test_block_mask_against_positions():
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(400):
        qa, ka = (int(x) for x in rng.integers(0, 40, 2))
        lq, lk = (int(x) for x in rng.integers(0, 12, 2))
        kind, off = block_mask(qa, lq, ka, lk)
        q, k = np.arange(qa, qa + lq), np.arange(ka, ka + lk)
        vis = k[None, :] <= q[:, None]
        kinds.add(kind)
        if kind == NONE:
            assert not vis.any()
        elif kind == FULL:
            assert vis.all()
        else:
            assert kind == CAUSAL and vis.any() and not vis.all()
            i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
            assert np.array_equal(vis, j <= i + off)
    assert kinds == {NONE, FULL, CAUSAL}


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p.name}-{p.num_heads}h{p.num_kv_heads}kv-{p.group_sizes}")
def test_exchange_table_equals_brute_force(plan):
    t = exchange_table(plan)
    assert t.num_ranks == plan.world_size and t.num_groups == plan.num_groups
    assert table_transfers(t) == brute_exchange(plan)
    lengths = {len(x) for x in (t.round, t.src, t.dst, t.kv0, t.kv1, t.tokens, t.both_chunks)}
    assert len(lengths) == 1
    # derived columns: the source group is after the receiver's exactly when both chunks travel
    grp = np.array(plan.group_of_rank)
    L = np.array([g.chunk_len for g in plan.groups])
    assert np.array_equal(t.both_chunks, grp[t.src] > grp[t.dst])
    assert np.array_equal(t.tokens, L[grp[t.src]] * (1 + t.both_chunks))
    assert np.array_equal(t.kv_token_heads, (t.kv1 - t.kv0) * t.tokens)
    assert np.all(t.kv1 > t.kv0)


@pytest.mark.parametrize("plan", PLANS[::3], ids=lambda p: p.name)
def test_every_receiver_gets_each_kv_head_it_touches_once(plan):
    """Per (round, receiver): the received KV ranges, in order, tile the receiver's KV heads, all
    from the source group; and the zigzag need in tokens: front chunk of an earlier group, both
    chunks of a later one."""
    t, lay, k = exchange_table(plan), plan.layout(), plan.num_groups
    for j in range(1, k):
        for me in lay:
            rows = np.nonzero((t.round == j) & (t.dst == me.rank))[0]
            if me.heads == 0:
                assert len(rows) == 0
                continue
            rows = rows[np.argsort(t.kv0[rows])]
            heads = [h for i in rows for h in range(t.kv0[i], t.kv1[i])]
            assert heads == list(range(*me.kv_head_range))
            h = (me.group - j) % k
            assert {lay[s].group for s in t.src[rows]} == {h}
            want = plan.groups[h].chunk_len * (1 if h < me.group else 2)
            assert set(t.tokens[rows]) == {want} == {needed_key_tokens(plan, me.group, h)}
    assert not np.isin(t.src, [x.rank for x in lay if x.heads == 0]).any()  # no heads: serves nothing


@pytest.mark.parametrize("plan", PLANS[::2], ids=lambda p: p.name)
def test_rank_rounds_agree_with_the_table(plan):
    t = exchange_table(plan)
    table = table_transfers(t)
    k = plan.num_groups
    seen: list[Xfer] = []
    for r, me in enumerate(plan.layout()):
        rounds = rank_rounds(plan, r)
        assert [rd.index for rd in rounds] == list(range(1, k))
        for rd in rounds:
            j = rd.index
            assert rd.src_group == (me.group - j) % k and rd.dst_group == (me.group + j) % k
            assert sorted(Xfer(j, x.src, x.dst, *x.kv_heads, x.tokens) for x in rd.recv) == [
                x for x in table if x.round == j and x.dst == r
            ]
            assert sorted(Xfer(j, x.src, x.dst, *x.kv_heads, x.tokens) for x in rd.send) == [
                x for x in table if x.round == j and x.src == r
            ]
            assert [x.kv_heads for x in rd.recv] == sorted(x.kv_heads for x in rd.recv)
            seen += [Xfer(j, x.src, x.dst, *x.kv_heads, x.tokens) for x in rd.recv]
            # the rows of each message are the needed segments of the source, in its group order
            want_recv = tuple((s.row, s.row + s.length) for s in needed_segments(plan, rd.src_group, me.group))
            want_send = tuple((s.row, s.row + s.length) for s in needed_segments(plan, me.group, rd.dst_group))
            assert all(x.rows == want_recv and x.tokens == sum(b - a for a, b in x.rows) for x in rd.recv)
            assert all(x.rows == want_send and x.tokens == sum(b - a for a, b in x.rows) for x in rd.send)
            assert rd.key_tokens == needed_key_tokens(plan, me.group, rd.src_group)
            # block pairs: masks from real positions; none without heads
            if not me.heads:
                assert rd.pairs == () and rd.recv == () and rd.send == ()
                continue
            qpos = np.array(plan.group_positions(me.group))
            kpos = np.concatenate([np.array(plan.group_positions(rd.src_group))[a:b] for a, b in want_recv])
            for p in rd.pairs:
                q, kk = qpos[p.q_rows[0] : p.q_rows[1]], kpos[p.k_rows[0] : p.k_rows[1]]
                assert (p.kind, p.offset) == block_mask(int(q[0]), len(q), int(kk[0]), len(kk))
                assert np.array_equal(q, np.arange(q[0], q[0] + len(q))) and np.array_equal(
                    kk, np.arange(kk[0], kk[0] + len(kk))
                )
    assert sorted(seen) == table  # every transfer is in exactly one receiver's view


@pytest.mark.parametrize("plan", PLANS[::4], ids=lambda p: p.name)
def test_per_rank_round_sums(plan):
    t = exchange_table(plan)
    R, k = plan.world_size, plan.num_groups
    want_in, want_out = np.zeros((R, k)), np.zeros((R, k))
    for x in brute_exchange(plan):
        want_in[x.dst, x.round] += (x.kv1 - x.kv0) * x.tokens
        want_out[x.src, x.round] += (x.kv1 - x.kv0) * x.tokens
    assert np.array_equal(t.per_rank_round("dst"), want_in)
    assert np.array_equal(t.per_rank_round("src"), want_out)
    assert np.all(want_in[:, 0] == 0) and want_in.sum() == want_out.sum()


def test_one_group_has_no_exchange():
    plan = ulysses_plan(range(4), 64, 8, 4, block_size=8)
    t = exchange_table(plan)
    assert len(t.src) == 0 and t.per_rank_round().shape == (4, 1) and not t.per_rank_round().any()
    assert all(rank_rounds(plan, r) == () for r in range(4))


def test_ring_of_whole_heads_closed_form():
    """A ring of k single-rank groups: every rank receives all KV heads from every other group,
    L tokens from an earlier group and 2·L from a later one, in one message per round."""
    k, L, H, Hkv = 16, 8, 8, 2
    plan = ring_plan(range(k), 2 * k * L, H, Hkv, block_size=8)
    t = exchange_table(plan)
    assert len(t.src) == k * (k - 1)
    assert np.all(t.kv0 == 0) and np.all(t.kv1 == Hkv)
    assert np.array_equal(t.src, (t.dst - t.round) % k)
    assert np.array_equal(t.tokens, np.where(t.src > t.dst, 2 * L, L))


def test_zigzag_need_of_earlier_and_later_groups():
    plan = Plan(
        40, 2, 1, (Group((0,), 4, (8,), (2,)), Group((1,), 10, (20,), (2,)), Group((2,), 6, (12,), (2,))), block_size=2
    )
    for g in range(3):
        for h in range(3):
            if g == h:
                continue
            segs = needed_segments(plan, h, g)
            front, back = group_segments(plan, h)
            assert segs == ((front, back) if h > g else (front,))
            assert sum(s.length for s in segs) == needed_key_tokens(plan, g, h)
    assert [s.start for s in needed_segments(plan, 2, 0)] == [14, 20]
    assert [s.row for s in packed(needed_segments(plan, 2, 0))] == [0, 6]


@pytest.mark.parametrize("plan", PLANS[::3], ids=lambda p: p.name)
def test_owned_kv_ranges_partition_the_kv_heads(plan):
    """Each group serves every KV head exactly once, by the rank holding its first query head."""
    for g in range(plan.num_groups):
        owned = owned_kv_ranges(plan, g)
        assert [h for a, b in owned for h in range(a, b)] == list(range(plan.num_kv_heads))
        ranks = plan.group_ranks(g)
        for i, (a, b) in enumerate(owned):
            assert all(kv_owner(plan, g, kv) == ranks[i] for kv in range(a, b))


def test_local_block_pairs_of_a_group():
    """Round 0 (the own chunks): front·front causal, back·front full, back·back causal."""
    plan = edge_plan()
    for g in range(plan.num_groups):
        L = plan.groups[g].chunk_len
        pairs = block_pairs(group_segments(plan, g), group_segments(plan, g))
        assert [(p.q_rows, p.k_rows, p.kind, p.offset) for p in pairs] == [
            ((0, L), (0, L), CAUSAL, 0),
            ((L, 2 * L), (0, L), FULL, 0),
            ((L, 2 * L), (L, 2 * L), CAUSAL, 0),
        ]
