"""The Plan: layout coverage, JSON round trip, symmetric constructors, validation messages."""

import json

import pytest

from hexiseq import (
    Group,
    Plan,
    PlanError,
    get_model,
    load_cluster,
    random_plan,
    ring_plan,
    symmetric_plan,
    ulysses_plan,
)
from hexiseq.plan import SCHEMA_VERSION


def _coverage(plan: Plan) -> None:
    """Every token exactly once overall and once per group; every head once per group."""
    lay = plan.layout()
    assert sorted(t for r in lay for t in r.token_indices()) == list(range(plan.seq_len))
    for g in range(plan.num_groups):
        ranks = [lay[r] for r in plan.group_ranks(g)]
        group_tokens = sorted(plan.group_positions(g))
        assert sorted(t for r in ranks for t in r.token_indices()) == group_tokens
        heads = [h for r in ranks for h in range(*r.head_range)]
        assert heads == list(range(plan.num_heads))


@pytest.mark.parametrize("seed", range(60))
def test_random_plans_cover_every_token_and_head(seed):
    plan = random_plan(
        1 + seed % 6, 96, 12, 4 if seed % 3 else 12, seed=seed, block_size=4, whole_kv_heads=seed % 2 == 0
    )
    assert plan.validate() == []
    _coverage(plan)


def test_zigzag_chunk_positions():
    plan = Plan(
        20,
        4,
        4,
        (Group((0,), 3, (6,), (4,)), Group((1, 2), 5, (4, 6), (1, 3)), Group((3,), 2, (4,), (4,))),
        block_size=1,
    )
    # Sequence reads L0 L1 L2 L2 L1 L0 = 3 5 2 2 5 3
    assert plan.chunk_starts() == [(0, 17), (3, 12), (8, 10)]
    lay = plan.layout()
    assert lay[0].token_ranges == ((0, 3), (17, 20))
    assert lay[1].token_ranges == ((3, 7),)  # first 4 of group 1's front chunk
    assert lay[2].token_ranges == ((7, 8), (12, 17))  # straddles front/back
    assert lay[2].head_range == (1, 4)
    assert lay[3].token_ranges == ((8, 10), (10, 12))
    _coverage(plan)


def test_kv_head_ranges_with_gqa():
    plan = Plan(8, 8, 2, (Group((0, 1, 2), 4, (3, 3, 2), (3, 2, 3)),), block_size=1)
    lay = plan.layout()
    assert [r.kv_head_range for r in lay] == [(0, 1), (0, 2), (1, 2)]  # query heads 0-2, 3-4, 5-7 with 4 per KV head


def test_json_round_trip(tmp_path):
    plan = random_plan(4, 256, 8, 2, seed=7, block_size=8)
    plan = Plan(**{**plan.__dict__, "meta": {"note": "x"}, "cluster": "testbed-8", "model": "tiny"})
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.meta == {"note": "x"}
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path) == plan
    # a plan of one replica under ZeRO-3 over all devices stays a version-1 file (joint plans write SCHEMA_VERSION)
    assert json.loads(path.read_text())["schema_version"] == 1 < SCHEMA_VERSION


def test_other_schema_version_refused():
    d = ring_plan(range(2), 512, 8, 8).to_dict()
    d["schema_version"] = 99
    with pytest.raises(PlanError, match="schema_version 99; this HexiSeq reads schema_version 1"):
        Plan.from_dict(d)


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda d: [d], "must be a JSON object, got list"),
        (
            lambda d: {**d, "groups": [{**g, "chunk_len": "abc"} for g in d["groups"]]},
            r"groups\[1\]\.chunk_len must be an integer",
        ),
        (lambda d: {**d, "groups": 5}, "groups must be a list, got 5"),
        (lambda d: {**d, "seq_len": "big"}, "seq_len must be an integer"),
        (lambda d: {**d, "meta": [1]}, "meta must be a mapping"),
    ],
)
def test_malformed_plan_files_refused_with_plan_error(change, msg):
    """A hand-edited or foreign plan file gets a PlanError (the CLI's exit 2), never a traceback."""
    d = ring_plan(range(2), 512, 8, 8).to_dict()
    with pytest.raises(PlanError, match=msg):
        Plan.from_json(json.dumps(change(d)))


def test_random_plan_and_scaled_refuse_bad_block_size():
    with pytest.raises(PlanError, match="block_size must be positive, got 0"):
        random_plan(2, 256, 8, 8, block_size=0)
    with pytest.raises(PlanError, match="block_size must be positive, got 0"):
        random_plan(2, 256, 8, 8).scaled(128, block_size=0)


def test_symmetric_constructors():
    r = ring_plan(range(4), 1024, 8, 8)
    assert r.num_groups == 4 and all(g.heads == (8,) for g in r.groups) and r.name == "ring"
    u = ulysses_plan(range(4), 1024, 8, 8)
    assert u.num_groups == 1 and u.groups[0].heads == (2, 2, 2, 2) and u.name == "ulysses"
    usp = symmetric_plan(range(8), 2048, 8, 8, cp=2, hp=4)
    assert usp.name == "usp-2x4" and usp.groups[1].devices == (4, 5, 6, 7)
    for p in (r, u, usp):
        assert p.validate() == []
        _coverage(p)
    with pytest.raises(PlanError, match="not a multiple of 2 x cp x block_size"):
        ring_plan(range(3), 1000, 8, 8)
    with pytest.raises(PlanError, match="do not split evenly over hp=3"):
        symmetric_plan(range(3), 768, 8, 8, cp=1, hp=3)


def test_validation_messages_are_precise():
    bad = Plan(
        100,
        8,
        8,
        (Group((0, 1), 20, (30, 12), (4, 3)), Group((1,), 25, (50,), (8,))),
        block_size=10,
    )
    v = "\n".join(bad.validate())
    assert "group 0: shards sum to 42 but the group holds 40 tokens (2 x chunk_len 20); over by 2" in v
    assert "group 0: head counts sum to 7, expected 8; short by 1" in v
    assert "group 1: chunk_len 25 is not a multiple of block_size 10 (remainder 5)" in v
    assert "group 1: device 1 already appears in group 0" in v
    assert "chunks cover 90 tokens (2 x sum of chunk_len) but seq_len is 100; short by 10" in v
    with pytest.raises(PlanError, match="5 problems"):
        bad.check()


def test_validation_against_cluster_model_workload():
    from hexiseq import Workload

    plan = ring_plan(range(4), 1024, 8, 8)
    c = load_cluster("testbed-8")
    assert plan.validate(c) == []
    m = get_model("llama2-7b")
    v = plan.validate(c, m, Workload(2048))
    assert "plan has 8 heads but model 'llama2-7b' has 32" in v
    assert "plan is for seq_len 1024 but the workload has 2048" in v
    far = ring_plan([0, 9], 1024, 8, 8)
    assert "device 9 is not in cluster 'testbed-8' (devices 0..7)" in far.validate(c)


def test_rank_without_tokens_or_heads_is_refused():
    plan = Plan(8, 2, 2, (Group((0, 1), 4, (8, 0), (2, 0)),), block_size=1)
    assert any("has no tokens and no heads" in x for x in plan.validate())


def test_scaled_plan_keeps_groups_heads_and_proportions():
    plan = random_plan(8, 131072, 32, 8, seed=3, block_size=128)
    small = plan.scaled(1024)
    assert small.validate() == []
    assert [g.devices for g in small.groups] == [g.devices for g in plan.groups]
    assert [g.heads for g in small.groups] == [g.heads for g in plan.groups]
    for g, h in zip(plan.groups, small.groups):
        assert abs(h.chunk_len / 512 - g.chunk_len / 65536) < 0.01
        assert all(abs(a / h.tokens - b / g.tokens) < 0.02 for a, b in zip(h.shards, g.shards))
    _coverage(small)


def test_scaling_below_the_plan_shape_is_refused_clearly():
    # 4 groups need at least 2 x 4 blocks of tokens
    with pytest.raises(PlanError, match="cannot scale plan 'ring'"):
        ring_plan(range(4), 1024, 8, 8).scaled(6)
    # a group of 3 token-only ranks (2 without heads) cannot keep tokens on all of them in 2 tokens
    plan = Plan(64, 2, 2, (Group((0, 1, 2), 32, (30, 17, 17), (2, 0, 0)),), block_size=1)
    with pytest.raises(PlanError, match="too few to keep the shape"):
        plan.scaled(2)


@pytest.mark.parametrize("seed", range(40))
def test_scaled_random_plans_are_valid_or_refused_clearly(seed):
    plan = random_plan(1 + seed % 8, 8192, 16, 4, seed=seed, block_size=64)
    for n in (64, 256, 1000):
        try:
            small = plan.scaled(n)
        except PlanError as e:
            assert "too few to keep the shape" in str(e) or "cannot scale" in str(e)
            continue
        assert small.validate() == []
        _coverage(small)
