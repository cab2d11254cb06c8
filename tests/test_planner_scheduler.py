"""The scheduler end to end: valid, fitting plans never slower than any baseline; bounds; infeasibility."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel import estimate, simulate
from hexiseq.errors import InfeasibleError
from hexiseq.planner import explain_infeasible, memory_report, plan_cluster
from hexiseq.specs import ClusterSpec, Workload, get_model, load_cluster

WL = Workload(seq_len=32768, activation_checkpointing=True)
WL128 = Workload(seq_len=131072, activation_checkpointing=True)


def _check_result(res, cluster, model, wl):
    plan = res.plan
    assert plan.meta["recompute"] == res.recompute
    if wl.recompute == "auto":  # the plan runs under the policy the planner chose; baselines under their own
        assert res.recompute in ("none", "selective", "full") and res.recompute in res.policies_searched
        wl = wl.with_recompute(res.recompute)
    else:
        assert res.recompute == wl.recompute and res.policies_searched == [wl.recompute]
    assert plan.name == "hexiseq"
    assert plan.validate(cluster, model, wl) == []
    assert estimate(plan, cluster, model, wl).fits
    t = simulate(plan, cluster, model, wl).iteration_time_s
    assert t == pytest.approx(res.iteration_time_s, rel=1e-9)
    for b in res.baselines.values():
        if b.feasible:
            assert t <= b.iteration_time_s * (1 + 1e-9), b.name
    assert res.speedup_vs_best_baseline is None or res.speedup_vs_best_baseline >= 1 - 1e-9
    if math.isfinite(res.lower_bound_s):
        assert res.lower_bound_s <= res.linear_time_s * (1 + 1e-9)


@pytest.fixture(scope="module")
def testbed_result():
    cluster = load_cluster("testbed-8")
    model = get_model("llama2-7b")
    return cluster, model, plan_cluster(cluster, model, WL128, progress=False)


def test_testbed_plan(testbed_result):
    cluster, model, res = testbed_result
    _check_result(res, cluster, model, WL128)
    assert res.speedup_vs_best_symmetric > 1.05  # uneven beats every symmetric layout on a mixed testbed
    assert 0 <= res.gap <= 0.01
    assert 0 <= res.search_gap < 0.05
    assert res.search_lower_bound_s <= res.iteration_time_s
    assert res.solver_status == "optimal"
    assert res.solver == "pyomo_highs (screening: highs)"  # by default the returned plan comes from the Pyomo model
    assert 0 < res.efficiency_vs_bound < 1
    assert set(res.stage_times_s) == {"baselines", "I+II groupings+milp", "III refine"}
    assert res.plan_time_s < 10


def test_result_dict_keys(testbed_result):
    _, _, res = testbed_result
    d = res.to_dict()
    for key in ("throughput_tokens_per_s", "baselines", "speedup_vs_best_baseline", "gap", "plan_time_s", "plan"):
        assert key in d
    assert d["baselines"]["ring"] == res.baselines["ring"].tokens_per_s
    assert d["throughput_tokens_per_s"] == pytest.approx(WL128.tokens / res.iteration_time_s)


def test_homogeneous_cluster_matches_best_baseline():
    cluster = ClusterSpec.from_nodes("a100x8", [("A100-80GB", 4, 25)] * 2)
    model = get_model("llama2-7b")
    res = plan_cluster(cluster, model, WL, progress=False)
    _check_result(res, cluster, model, WL)
    assert res.speedup_vs_best_symmetric == pytest.approx(1.0, abs=0.01)
    # symmetric: every group of one size with one chunk length, even heads
    assert len({g.chunk_len for g in res.plan.groups}) == 1
    assert len({g.size for g in res.plan.groups}) == 1
    assert len(set(res.plan.heads)) == 1


def test_infeasible_is_explained():
    cluster = load_cluster("testbed-8")
    model = get_model("llama2-7b")
    wl = Workload(seq_len=131072)  # no recompute: activations do not fit
    with pytest.raises(InfeasibleError) as e:
        plan_cluster(cluster, model, wl, progress=False)
    msg = str(e.value)
    assert "GiB" in msg and "--recompute" in msg and "fits" in msg and "shorter sequence" in msg
    assert "Traceback" not in msg
    rep = memory_report(cluster, model, wl)
    assert rep.load > 1 and rep.needed_gib > rep.capacity_gib * 0.9 and rep.binding


def test_auto_recompute_picks_the_policy_that_fits_and_is_fastest():
    """gpt-13b at 1M tokens on the mixed 32-GPU cluster fits only with full recompute (selective keeps
    every layer's attention tensors: ~3,457 GiB vs ~2,146 GiB): auto finds that without being told,
    and skips the policies that cannot fit before any search. At 512K selective fits too, but its
    memory-bound layout is slower than full's: auto compares them and takes full."""
    cluster, model = load_cluster("sim-32"), get_model("gpt-13b")
    wl = Workload(seq_len=1 << 20, activation_checkpointing="auto")
    res = plan_cluster(cluster, model, wl, progress=False)
    _check_result(res, cluster, model, wl)
    assert res.recompute == "full" and res.policies_searched == ["full"]
    assert "none, selective cannot fit" in res.notes[0]
    with pytest.raises(InfeasibleError):
        plan_cluster(cluster, model, wl.with_recompute("selective"), progress=False)
    wl = Workload(seq_len=512 * 1024, activation_checkpointing="auto")
    res = plan_cluster(cluster, model, wl, progress=False)
    _check_result(res, cluster, model, wl)
    assert res.policies_searched == ["selective", "full"]
    alone = {p: plan_cluster(cluster, model, wl.with_recompute(p), progress=False) for p in res.policies_searched}
    assert res.iteration_time_s <= min(r.iteration_time_s for r in alone.values()) * (1 + 1e-9)
    assert res.recompute == min(alone, key=lambda p: alone[p].iteration_time_s)


def test_explain_bad_length():
    msg = explain_infeasible(load_cluster("testbed-8"), get_model("tiny"), Workload(seq_len=1000))
    assert "multiple of 2 x block size" in msg


# ------------------------------------------------------------------------------ properties

GPUS = ["H100-SXM", "A100-80GB", "L40S", "A100-40GB"]
MODELS = ["tiny", "llama2-7b", "llama3-8b", "llama3.2-3b"]


@st.composite
def scenarios(draw):
    nodes = draw(st.lists(st.tuples(st.sampled_from(GPUS), st.integers(1, 4), st.sampled_from([12.5, 25.0, 50.0])), min_size=1, max_size=3))
    cluster = ClusterSpec.from_nodes("random", nodes)
    model = get_model(draw(st.sampled_from(MODELS)))
    seq = draw(st.sampled_from([4096, 16384, 65536, 262144]))
    wl = Workload(
        seq_len=seq,
        global_batch=draw(st.sampled_from([1, 2])),
        activation_checkpointing=draw(st.sampled_from([False, True, "full", "auto"])),
        param_sharding=draw(st.sampled_from(["zero3", "zero3", "replicated"])),
        block_size=draw(st.sampled_from([64, 128])),
    )
    return cluster, model, wl


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scenarios())
def test_property_plans_valid_fit_and_beat_baselines(sc):
    cluster, model, wl = sc
    try:
        res = plan_cluster(cluster, model, wl, progress=False, refine_budget_s=0.3)
    except InfeasibleError as e:
        msg = str(e)
        assert msg and ("GiB" in msg or "block size" in msg)
        return
    _check_result(res, cluster, model, wl)


def test_refine_improves_an_even_plan_on_a_mixed_cluster():
    from hexiseq.plan import symmetric_plan
    from hexiseq.planner import refine

    cluster = load_cluster("testbed-8")
    model = get_model("llama2-7b")
    plan = symmetric_plan(range(8), WL128.seq_len, model.heads, model.kv_heads, cp=2, hp=4)
    t0 = simulate(plan, cluster, model, WL128).iteration_time_s
    new, t1, moves = refine(plan, t0, cluster, model, WL128, budget_s=2.0)
    assert moves > 0 and t1 < t0 * 0.97
    assert new.validate(cluster, model, WL128) == [] and estimate(new, cluster, model, WL128).fits
    assert t1 == pytest.approx(simulate(new, cluster, model, WL128).iteration_time_s)
    assert new.groups[0].tokens > new.groups[1].tokens  # chunk moved towards the H100 node


def test_planning_after_a_memory_report_in_the_same_process():
    """explain.memory_report solves through Pyomo's HiGHS, which starts HiGHS's process-global thread
    scheduler with its default thread count; the planner's own HiGHS runs (threads=1) must still
    solve afterwards (they used to fail silently, so a policy searched after an infeasibility
    explanation found nothing)."""
    cluster, model = load_cluster("sim-32"), get_model("gpt-13b")
    memory_report(cluster, model, Workload(seq_len=2 << 20))  # "none" at 2M: far out of memory
    res = plan_cluster(cluster, model, Workload(seq_len=512 * 1024, activation_checkpointing="selective"), progress=False)
    assert res.recompute == "selective" and res.tokens_per_s > 0
