"""The joint planner (planner/joint.py, planner/replicas.py): exact batch shares, the replica
partitions of a cluster's structure, and a joint plan never slower than the DP = 1 planner's."""

import itertools
import math

import pytest
from _hand_built import best_dp_symmetric

from hexiseq import Plan, Workload, get_model, load_cluster
from hexiseq.costmodel.kernels import CostOptions
from hexiseq.costmodel.step import ReplicaLine, estimate_step, lockstep_time, replica_lines
from hexiseq.planner import plan_cluster
from hexiseq.planner.candidates import device_subsets
from hexiseq.planner.dp_baselines import dp_baselines
from hexiseq.planner.explain import may_fit
from hexiseq.planner.joint import _Shapes, plan_joint
from hexiseq.planner.replicas import (
    MAX_BALANCED_REPLICAS,
    Piece,
    balanced_unions,
    families,
    partitions,
    replica_devices,
    shape_key,
    sub_cluster,
)
from hexiseq.planner.shares import batch_shares, best_over_strategies, lower_lockstep_bound, lower_shares_bound
from hexiseq.specs import ClusterSpec, NodeSpec, get_gpu


def _brute(lines, G):
    best = None
    for shares in itertools.product(range(G + 1), repeat=len(lines)):
        if sum(shares) != G or any(s and not ln.fits for s, ln in zip(shares, lines)):
            continue
        t = max(ln.time_s(s) for ln, s in zip(lines, shares))
        best = t if best is None else min(best, t)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_batch_shares_are_exact(seed):
    import random

    rng = random.Random(seed)
    lines = [
        ReplicaLine(rng.uniform(0, 2), rng.uniform(0.5, 3), 0.0, rng.random() > 0.15 or i == 0, 0.0)
        for i in range(rng.randint(1, 4))
    ]
    G = rng.randint(1, 7)
    shares = batch_shares(lines, G)
    assert sum(shares) == G
    got = max(ln.time_s(s) for ln, s in zip(lines, shares))
    assert got == pytest.approx(_brute(lines, G))


@pytest.mark.parametrize("seed", range(30))
def test_lower_shares_bound_is_the_exact_min_max(seed):
    """lower_shares_bound: the least slowest replica over integer shares of per-sequence bounds
    (a brute force), and the value of batch_shares on those lines, to the bit."""
    import random

    rng = random.Random(seed)
    bounds = [rng.choice([rng.uniform(0.1, 3), rng.uniform(0.1, 3), math.inf]) for _ in range(rng.randint(1, 4))]
    G = rng.randint(0, 7)
    lines = [ReplicaLine(0.0, b, 0.0, True, 0.0) for b in bounds]
    got = lower_shares_bound(bounds, G)
    assert got == max(ln.time_s(s) for ln, s in zip(lines, batch_shares(lines, G)))
    assert got == pytest.approx(_brute(lines, G)) or got == _brute(lines, G)


@pytest.mark.parametrize("seed", range(30))
def test_lower_lockstep_bound_is_the_least_lockstep_time_of_two_or_more_replicas(seed):
    """lower_lockstep_bound: the least lockstep time (step.lockstep_time, no fixed parts) over every
    share vector that gives two replicas or more a sequence (a brute force); inf with fewer than two
    replicas that fit."""
    import itertools
    import random

    rng = random.Random(seed)
    bounds = [rng.choice([rng.uniform(0.1, 3), rng.uniform(0.1, 3), math.inf]) for _ in range(rng.randint(1, 4))]
    G = rng.randint(1, 6)
    lines = [ReplicaLine(0.0, b, 0.0, True, 0.0) for b in bounds]
    brute = min(
        (
            lockstep_time(lines, list(shares))
            for shares in itertools.product(range(G + 1), repeat=len(bounds))
            if sum(shares) == G and sum(b > 0 for b in shares) >= 2
        ),
        default=math.inf,
    )
    got = lower_lockstep_bound(bounds, G)
    assert got == pytest.approx(brute) or got == brute


@pytest.mark.parametrize("seed", range(40))
def test_lockstep_batch_shares_are_exact(seed):
    """Replicas in lockstep sets (costmodel/step.py): the shares equal a brute force over every
    share vector of the slowest set's lockstep time, fixed parts and unfitting replicas included."""
    import random

    rng = random.Random(seed)
    n = rng.randint(2, 5)
    lines = [
        ReplicaLine(
            rng.choice([0.0, 0.3, rng.uniform(0, 2)]), rng.uniform(0.5, 3), 0.0, rng.random() > 0.15 or i == 0, 0.0
        )
        for i in range(n)
    ]
    order = rng.sample(range(n), n)
    sets = []
    while order:
        k = rng.randint(1, len(order))
        sets.append(sorted(order[:k]))
        order = order[k:]
    G = rng.randint(1, 7)

    def worst(shares):
        return max(lockstep_time([lines[i] for i in m], [shares[i] for i in m]) for m in sets)

    brute = min(
        worst(sh)
        for sh in itertools.product(range(G + 1), repeat=n)
        if sum(sh) == G and not any(s and not ln.fits for s, ln in zip(sh, lines))
    )
    shares = batch_shares(lines, G, sets)
    assert sum(shares) == G and not any(s and not ln.fits for s, ln in zip(shares, lines))
    assert worst(shares) == pytest.approx(brute, rel=1e-12)


def test_partitions_of_a_two_type_cluster():
    c = load_cluster("testbed-16")
    fams = families(c)
    assert [f.label for f in fams] == ["1 x 8 H100-SXM", "1 x 8 A100-80GB"]
    parts = list(partitions(c))
    labels = [p.label for p in parts]
    assert "1 x 1 node of H100-SXM + 1 x 1 node of A100-80GB" in labels
    assert "1 x (H100-SXM node + A100-80GB node)" in labels
    assert "8 x 1 H100-SXM" in labels  # pure data parallelism inside the H100 node, the A100 left out
    for p in parts:  # replicas are disjoint
        devs = [d for r in p.replicas for d in replica_devices(c, r)]
        assert len(devs) == len(set(devs))
    one = next(p for p in parts if p.label == "2 x 4 H100-SXM + 2 x 4 A100-80GB")
    assert shape_key(c, one.replicas[0]) != shape_key(c, one.replicas[2])
    sub = sub_cluster(c, one.replicas[2], "r")
    assert sub.size == 4 and sub.devices[0].gpu.name == "A100-80GB"


def _shares(part) -> list[int]:
    """The shares a rate-balanced union's label gives its replicas, in order."""
    return [int(x) for x in part.label.split("(shares ")[1].rstrip(")").split(":")]


def _contiguous_best(rates: list[float], R: int, G: int) -> float:
    """Brute force: the least slowest share / rate over every cut of the rate order into R runs
    (leaving the slowest nodes out too) and every integer share."""
    best = float("inf")
    for used in range(R, len(rates) + 1):
        for cuts in itertools.combinations(range(1, used), R - 1):
            edges = (0, *cuts, used)
            runs = [sum(rates[a:b]) for a, b in zip(edges, edges[1:])]
            for shares in itertools.product(range(1, G + 1), repeat=R):  # every replica takes a sequence
                if sum(shares) == G:
                    best = min(best, max(b / r for b, r in zip(shares, runs)))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_balanced_unions_are_the_best_cuts_of_the_rate_order(seed):
    import random

    rng = random.Random(seed)
    gpus = ["H100-SXM", "A100-80GB", "L40S"]
    c = ClusterSpec.from_nodes(
        "t", [NodeSpec(get_gpu(rng.choice(gpus)), 2, 25.0, None) for _ in range(rng.randint(2, 7))], 5.0
    )
    rate = [rng.choice([0.5, 1.0, 1.7, 2.0]) for _ in c.nodes]
    G = rng.randint(2, 6)
    order = sorted(range(len(rate)), key=lambda n: (-rate[n], n))
    got = list(balanced_unions(c, G, lambda n: rate[n]))
    assert [len(p.replicas) for p in got] == list(range(2, min(G, len(rate)) + 1))
    for p in got:
        nodes = [piece.node for r in p.replicas for piece in r]
        assert len(nodes) == len(set(nodes)) and all(piece.count == 2 for r in p.replicas for piece in r)
        assert sorted(nodes) == list(range(len(rate)))  # every node, in runs of the rate order
        runs = [sorted(order.index(x.node) for x in r) for r in p.replicas]
        assert all(run == list(range(run[0], run[0] + len(run))) for run in runs)
        shares = _shares(p)
        assert sum(shares) == G and min(shares) >= 1
        value = max(b / sum(rate[x.node] for x in r) for b, r in zip(shares, p.replicas))
        assert value == pytest.approx(_contiguous_best([rate[n] for n in order], len(p.replicas), G), rel=1e-12)


def test_balanced_unions_stop_at_sixteen_replicas():
    c = ClusterSpec.from_nodes("t", [NodeSpec(get_gpu("A100-80GB"), 2, 25.0, None)] * 40, 5.0)
    got = list(balanced_unions(c, 64, lambda n: 1.0 + (n % 3)))
    assert MAX_BALANCED_REPLICAS == 16 and [len(p.replicas) for p in got] == list(range(2, 17))
    for p in got:  # every node used once, shares summing to the batch
        assert sorted(x.node for r in p.replicas for x in r) == list(range(40))
        assert sum(_shares(p)) == 64


def _h1a5() -> ClusterSpec:
    """One H100 node and five A100 nodes of 4 GPUs (50 / 25 GB/s NICs)."""
    return ClusterSpec.from_nodes(
        "h1a5",
        [NodeSpec(get_gpu("H100-SXM"), 4, 50.0, None)] + [NodeSpec(get_gpu("A100-80GB"), 4, 25.0, None)] * 5,
        5.0,
    )


def test_rate_balanced_unions_beat_the_family_partitions_where_shares_do_not_divide(monkeypatch):
    """One H100 node and five A100 nodes, 3 sequences: the families give no three replicas of equal
    speed (H100 alone is ~1.8 A100 nodes; five A100 nodes split only into 1 or 5); the unions
    H100+A100, A100+A100, A100+A100 do, and beat every family partition and baseline."""
    import hexiseq.planner.joint as joint

    c = _h1a5()
    m, w = get_model("gpt-7b"), Workload(seq_len=32 * 1024, global_batch=3, activation_checkpointing="auto")
    res = plan_joint(c, m, w)
    assert res.partition.startswith("3 rate-balanced unions of nodes (shares 1:1:1)"), res.partition
    assert res.plan.num_replicas == 3
    assert res.plan.validate(c, m, w) == [] and res.lower_bound_s <= res.step_time_s
    wl = w.with_recompute(res.recompute)
    assert estimate_step(res.plan, c, m, wl).step_time_s == pytest.approx(res.step_time_s, rel=1e-9)
    monkeypatch.setattr(joint, "balanced_unions", lambda *a: iter(()))
    without = plan_joint(c, m, w)
    # measured: 1.5068 s against 1.5091 s, DP x USP cp=2 x hp=4 (1.594 s, DP x Ulysses, while the DP
    # baselines skipped USP factorizations that share a rank order with another: stop 54)
    assert res.step_time_s < without.step_time_s


def test_replicas_that_hold_only_a_share_of_the_states_are_planned():
    """Four 2-GPU A100-40GB nodes, gpt-13b (208 GB of model states): no node holds its own states,
    but each holds an eighth of them beside one 8K sequence, so four one-node replicas with ZeRO-3
    over all devices run (the shapes are planned with the states sharded over the partition,
    CostOptions.state_shards). Without that the joint planner's own search found one replica."""
    c = ClusterSpec.from_nodes("tight", [NodeSpec(get_gpu("A100-40GB"), 2, 25.0, None)] * 4, 5.0)
    m, w = get_model("gpt-13b"), Workload(seq_len=8 * 1024, global_batch=4, activation_checkpointing="auto")
    node = (Piece(0, 0, 2),)
    one = sub_cluster(c, node, "replica")
    full = w.with_recompute("full")
    assert not may_fit(one, m, full) and may_fit(one, m, full, CostOptions(state_shards=8))
    assert CostOptions(state_shards=8).shards(2) == 8 and CostOptions(state_shards=8).shards(16) == 16
    shapes = _Shapes(c, m, w, CostOptions())
    assert shapes.plan(node) is None and shapes.plan(node, shards=8) is not None
    res = plan_joint(c, m, w, with_baselines=False)
    assert res.plan.num_replicas == 4 and str(res.plan.sharding.scope) == "all", res.explanation()
    assert res.plan.validate(c, m, w) == []
    wl = w.with_recompute(res.recompute)
    st = estimate_step(res.plan, c, m, wl)
    assert st.step_time_s == pytest.approx(res.step_time_s, rel=1e-9)
    assert all(r.fits for r in replica_lines(res.plan, c, m, wl))
    assert res.step_time_s < 0.3 * res.dp1_step_s  # measured: 3.49 s against one replica's 14.0 s
    with_base = plan_joint(c, m, w)
    assert with_base.step_time_s <= min(b.step_time_s for b in with_base.baselines.values() if b.feasible)


def test_joint_plan_on_testbed_8_uses_every_gpu_and_beats_dp1():
    c, m = load_cluster("testbed-8"), get_model("gpt-7b")
    w = Workload(seq_len=16 * 1024, global_batch=8, activation_checkpointing="auto")
    res = plan_joint(c, m, w)
    assert res.plan.world_size == 8 and res.plan.num_replicas >= 2
    today = plan_cluster(c, m, w)  # the DP = 1 planner at the same batch: never faster
    assert res.step_time_s <= today.iteration_time_s
    if res.dp1 is None:  # skipped by a proven bound above the joint plan
        assert any("DP = 1 planner was not run" in n for n in res.notes)
    else:
        assert res.step_time_s <= res.dp1_step_s <= res.dp1.iteration_time_s
    assert res.plan.validate(c, m, w) == []
    again = Plan.from_json(res.plan.to_json())
    assert again == res.plan and again.to_dict()["schema_version"] == 2
    wl = w.with_recompute(res.recompute)
    st = estimate_step(res.plan, c, m, wl)
    assert st.step_time_s == pytest.approx(res.step_time_s, rel=1e-9)
    lines = replica_lines(res.plan, c, m, wl)
    for ln, rep in zip(lines, st.replicas):
        assert ln.time_s(rep.sequences) == pytest.approx(rep.time_s, rel=1e-9)
    assert res.lower_bound_s <= res.step_time_s
    text = "\n".join(res.explanation())
    assert "replica 0:" in text and "sequences" in text and "bound: no plan at all" in text
    assert res.efficiency_vs_bound > 0.75  # today's DP = 1 plan: 0.61 on 4 of the 8 GPUs


def test_global_batch_one_is_todays_problem():
    c, m = load_cluster("testbed-8"), get_model("gpt-7b")
    w = Workload(seq_len=16 * 1024, global_batch=1, activation_checkpointing="full")
    res = plan_joint(c, m, w)
    assert res.plan.num_replicas == 1 and res.partitions == 0
    assert res.step_time_s <= res.dp1.iteration_time_s * (1 + 1e-9)


def test_cli_plan_global_batch_and_estimate_joint_plan(capsys, tmp_path):
    import json

    from hexiseq.cli import main

    out = tmp_path / "joint.json"
    args = ["plan", "--cluster", "testbed-8", "--model", "gpt-7b", "--seq-len", "16K", "--recompute", "none"]
    assert main(args + ["--global-batch", "8", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in ("joint plan", "global batch 8", "replica 0:", "sharding", "synchronisation", "bound: no plan"):
        assert needle in text
    plan = Plan.load(out)
    assert plan.num_replicas >= 2 and sum(r.sequences for r in plan.replicas) == 8
    assert main(["estimate", "--plan", str(out)]) == 0
    text = capsys.readouterr().out
    assert "replica 1:" in text and "synchronisation: copies allreduce" in text
    assert main(["estimate", "--plan", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["replicas"]) == plan.num_replicas and d["sync_s"]["optimizer"] > 0
    assert main(args + ["--global-batch", "4", "--dp", "2", "--no-progress", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["replicas"]) == 2 and sum(r["sequences"] for r in d["replicas"]) == 4
    assert d["workers"] == 1  # --workers auto: 8 GPUs plan in this process alone (planner/workers.py)
    assert main(args + ["--global-batch", "4", "--dp", "2", "--no-progress", "--json", "--workers", "2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["workers"] == 2 and two["plan"] == d["plan"] and two["step_time_s"] == d["step_time_s"]
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--global-batch", "4", "--dp", "0"])
    assert exit_.value.code == 2 and "--dp must be auto or a positive number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--global-batch", "4", "--workers", "0"])
    assert exit_.value.code == 2 and "--workers must be auto or a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("G", [4, 6])
def test_even_share_baselines_split_the_batch_equally(G):
    """dp_baselines(even=True): every family's best splits the global batch equally (DP divides G),
    is scored by the step model, and is never faster than the family's best with exact shares."""
    from hexiseq.planner import dp_baselines

    c, m = load_cluster("cpu-8"), get_model("tiny")
    w = Workload(
        seq_len=2048, global_batch=G, activation_checkpointing="none", param_sharding="replicated", block_size=32
    )
    free, even = dp_baselines(c, m, w), dp_baselines(c, m, w, even=True)
    assert any(b.feasible for b in even.values())
    for name, b in even.items():
        if not b.feasible:
            continue
        shares = [r.sequences for r in b.plan.replicas]
        assert len(set(shares)) == 1 and sum(shares) == G and G % b.plan.num_replicas == 0, name
        wl = w.with_recompute(b.recompute)
        assert estimate_step(b.plan, c, m, wl).step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
        assert free[name].step_time_s <= b.step_time_s * (1 + 1e-12)


@pytest.mark.parametrize(
    "cluster, model, seq_len, G, even",
    [
        ("testbed-8", "gpt-13b", 65536, 4, False),
        ("testbed-16", "gpt-13b", 131072, 4, False),
        ("testbed-8", "gpt-7b", 131072, 4, True),
        ("testbed-8", "llama2-7b", 262144, 2, False),
    ],
)
def test_dp_baselines_policy_floor_bounds_every_evaluation_and_changes_no_best(
    monkeypatch, cluster, model, seq_len, G, even
):
    """The per-policy floor and the layouts' micro-step floors that let dp_baselines skip an
    evaluation are below the step of every (blocks, policy) evaluation they could skip, and skipping
    changes no family's best (the same plan, step and configuration as with nothing skipped); they
    do skip some."""
    import importlib

    D = importlib.import_module("hexiseq.planner.dp_baselines")
    c, m = load_cluster(cluster), get_model(model)
    w = Workload(seq_len=seq_len, global_batch=G, activation_checkpointing="auto")
    seen = []
    evaluate = D.best_over_strategies

    def recorded(reps, cluster, model, wl, strategies, options, name, cache, even):
        out = evaluate(reps, cluster, model, wl, strategies, options, name, cache, even)
        seen.append((reps, wl, out[0]))
        return out

    pruned = D.dp_baselines(c, m, w, even=even)
    monkeypatch.setattr(D, "best_over_strategies", recorded)
    monkeypatch.setattr(D._PolicyFloor, "step", lambda self, blocks, policy, even: 0.0)
    monkeypatch.setattr(D.MicroStepFloors, "__call__", lambda self, plan, workload: 0.0)
    full = D.dp_baselines(c, m, w, even=even)
    monkeypatch.undo()
    floor, micro = D._PolicyFloor(c, m, w, CostOptions()), D.MicroStepFloors(c, m)
    assert seen
    for reps, wl, t in seen:
        blocks = [list(r.rank_devices) for r in reps]
        assert floor.step(blocks, str(wl.activation_checkpointing), even) <= t * (1 + 1e-9)
        per_seq = [micro(r, wl) for r in reps]
        layout = max(per_seq) * (G // len(reps)) if even else lower_shares_bound(per_seq, G)
        assert layout <= t * (1 + 1e-9), (blocks, wl.activation_checkpointing)
    for name, b in full.items():
        p = pruned[name]
        assert (p.step_time_s, p.config, p.recompute) == (b.step_time_s, b.config, b.recompute), name
        assert p.plan == b.plan, name
    assert sum(p.tried for p in pruned.values()) < sum(b.tried for b in full.values())


@pytest.mark.parametrize(
    "cluster, model, seq_len, G", [("testbed-8", "gpt-13b", 65536, 4), ("testbed-16", "gpt-7b", 131072, 8)]
)
def test_micro_step_floors_change_no_joint_plan(monkeypatch, cluster, model, seq_len, G):
    """The joint planner's pruning by the layouts' micro-step floors (DP x family configurations and
    partitions' strategy scoring) changes nothing it returns: the same plan, step and partition as
    with the floors at zero."""
    import importlib

    B, D, J = (importlib.import_module(f"hexiseq.planner.{n}") for n in ("baselines", "dp_baselines", "joint"))
    c, m = load_cluster(cluster), get_model(model)
    w = Workload(seq_len=seq_len, global_batch=G, activation_checkpointing="auto")
    calls = {"pruned": 0, "full": 0}

    def counted(key):
        def scored(*args, **kwargs):
            calls[key] += 1
            return best_over_strategies(*args, **kwargs)

        return scored

    for key in ("pruned", "full"):
        if key == "full":
            monkeypatch.setattr(B.MicroStepFloors, "__call__", lambda self, plan, workload: 0.0)
        monkeypatch.setattr(D, "best_over_strategies", counted(key))
        monkeypatch.setattr(J, "best_over_strategies", counted(key))
        calls[key + " plan"] = plan_joint(c, m, w)
    pruned, full = calls["pruned plan"], calls["full plan"]
    assert (pruned.step_time_s, pruned.partition, pruned.plan) == (full.step_time_s, full.partition, full.plan)
    assert calls["pruned"] < calls["full"]  # the floors did skip some scoring


def test_even_share_baselines_fit_in_memory():
    """An equal split gives every replica sequences, so every replica of an even-share baseline fits
    (it returned replicas that could not hold a sequence before: gpt-7b at 128K on 4 GPUs)."""
    from hexiseq.planner import dp_baselines

    c, m = load_cluster("testbed-8"), get_model("gpt-7b")
    w = Workload(seq_len=131072, global_batch=4, activation_checkpointing="auto")
    even = dp_baselines(c, m, w, even=True)
    assert any(b.feasible for b in even.values())
    for name, b in even.items():
        if b.feasible:
            lines = replica_lines(b.plan, c, m, w.with_recompute(b.recompute))
            assert all(ln.fits for ln in lines), name


def test_dp_baselines_try_every_factorization_that_shares_a_rank_order():
    """USP's cp=4 x hp=2 and cp=2 x hp=4 with HP inside nodes list 8 devices in the same rank order;
    each is its own layout. On one H100 node and five A100 nodes at 3 sequences the second is the
    strongest DP x family plan (dp=3 blocks of 8): dp_baselines finds it, as a by-hand search of
    every factorization on the same subsets does."""
    c = _h1a5()
    m, w = get_model("gpt-7b"), Workload(seq_len=32 * 1024, global_batch=3, activation_checkpointing="none")
    got = dp_baselines(c, m, w)
    by_hand = best_dp_symmetric(c, m, w, [tuple(range(c.size))], policies=("none",))
    assert got["dp x usp"].step_time_s <= by_hand["usp"][0] * (1 + 1e-12), by_hand["usp"]
    assert "cp=2 x hp=4, hp inside nodes" in got["dp x usp"].config
    assert got["dp x usp"].step_time_s < got["dp x ulysses"].step_time_s


def test_dp_baselines_cover_replicas_of_every_symmetric_size():
    """DP replicas of a symmetric layout on the fastest n devices for an n that is neither a power of
    two nor a divisor of the cluster (gpt-13b's 40 heads: blocks of 5, 10 and 20 GPUs): each DP x
    family baseline is at least as fast as every such hand-built plan, under every strategy."""
    c, m = load_cluster("sim-32"), get_model("gpt-13b")
    wl = Workload(seq_len=80 * 1024, global_batch=2, activation_checkpointing="none")
    got = dp_baselines(c, m, wl)
    plain = {len(d) for _, d in device_subsets(c)}
    new = [devs for _, devs in device_subsets(c, range(1, c.size + 1)) if len(devs) not in plain]
    by_hand = best_dp_symmetric(c, m, wl, new, policies=("none",))
    assert any(math.isfinite(t) for t, _ in by_hand.values())
    for name, (t, where) in by_hand.items():
        assert got[f"dp x {name}"].step_time_s <= t * (1 + 1e-12), (name, where, t)


def test_the_closing_pass_plans_every_partition_whose_floor_is_below_the_best(monkeypatch):
    """With the ordered search cut after one partition, the closing pass plans the partitions whose
    floors are below the best plan (lowest first): the same plan as the full search, and no partition
    left unplanned has a floor below it (the search's own bound is above the plan)."""
    from hexiseq.planner import joint
    from hexiseq.planner.search import DEFAULT_GAP

    cluster, model = load_cluster("sim-32"), get_model("gpt-13b")
    wl = Workload(seq_len=64 * 1024, global_batch=4)
    full = plan_joint(cluster, model, wl)
    monkeypatch.setattr(joint, "MAX_PARTITIONS_VISITED", 1)
    cut = plan_joint(cluster, model, wl)
    assert any("stopped after 1 partitions" in note for note in cut.notes)  # the ordered search was cut
    assert cut.step_time_s == full.step_time_s and cut.plan == full.plan
    assert cut.searched_bound_s >= cut.step_time_s * (1 - DEFAULT_GAP)
