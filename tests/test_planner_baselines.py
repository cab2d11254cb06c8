"""Baselines: every family tuned to its best legal configuration, judged by the simulator."""

from __future__ import annotations

import math

import pytest

from hexiseq.costmodel import estimate, simulate
from hexiseq.planner.baselines import (
    baselines,
    best_baseline,
    homogeneous_subsets,
    largest_remainder,
    proportional_plan,
    symmetric_candidates,
)
from hexiseq.specs import Workload, get_model, load_cluster


@pytest.fixture(scope="module")
def model7b():
    return get_model("llama2-7b")


@pytest.fixture(scope="module")
def base_results(mixed, model7b):
    # recompute "auto": every candidate runs with the first of none / selective / full it fits with,
    # as a competitor would turn checkpointing on; ring on the two H100s holds 32K of llama2-7b only
    # with full recompute (selective keeps q, k, v, out of every layer), so it is feasible here
    return baselines(mixed, model7b, Workload(seq_len=32768, activation_checkpointing="auto"))


def test_families_present_and_best_is_fastest_feasible(base_results):
    names = set(base_results)
    assert {"ring", "ulysses", "usp", "proportional", "ring[H100-SXM]", "ring[A100-80GB]", "usp[H100-SXM]"} <= names
    best = best_baseline(base_results)
    feasible = [b for b in base_results.values() if b.feasible]
    assert best.iteration_time_s == min(b.iteration_time_s for b in feasible)
    sym = best_baseline(base_results, symmetric_only=True)
    assert sym.name != "proportional"


def test_baseline_plans_valid_fit_and_simulated(base_results, mixed, model7b):
    for b in base_results.values():
        if not b.feasible:
            assert b.recompute is None
            continue
        wl = Workload(seq_len=32768, activation_checkpointing=b.recompute)
        assert b.plan.meta["recompute"] == b.recompute
        assert b.plan.validate(mixed, model7b, wl) == []
        assert b.plan.name == b.name
        assert estimate(b.plan, mixed, model7b, wl).fits
        assert b.iteration_time_s == pytest.approx(simulate(b.plan, mixed, model7b, wl).iteration_time_s)
        assert b.tokens_per_s == pytest.approx(wl.tokens / b.iteration_time_s)
        assert 1 <= b.fitting <= b.tried


def test_homogeneous_subset_baselines_use_only_that_type(base_results, mixed):
    for name in ("ring[H100-SXM]", "ulysses[H100-SXM]", "ring[A100-80GB]"):
        b = base_results[name]
        assert b.feasible
        assert {mixed.devices[d].gpu.name for d in b.plan.rank_devices} == {name[name.index("[") + 1 : -1]}
    assert base_results["ring[H100-SXM]"].recompute == "full"
    # the same family under one policy alone: it does not fit with selective recompute
    only = baselines(mixed, get_model("llama2-7b"), Workload(seq_len=32768, activation_checkpointing="selective"))
    assert not only["ring[H100-SXM]"].feasible
    for name, b in only.items():  # where selective fits, auto's choice is at least as fast
        if b.feasible:
            assert base_results[name].iteration_time_s <= b.iteration_time_s * (1 + 1e-9)
    # two devices have no CP x HP factorization with both > 1: said, not faked
    assert not base_results["usp[H100-SXM]"].feasible
    assert "no legal configuration" in base_results["usp[H100-SXM]"].notes[0]
    assert homogeneous_subsets(load_cluster("pair-a-a100")) == {}


def test_usp_tries_both_placements():
    cands = symmetric_candidates(list(range(8)), 32768, get_model("llama2-7b"), 128, "usp")
    labels = [label for label, _ in cands]
    assert any("inside" in x for x in labels) and any("across" in x for x in labels)
    across = next(p for label, p in cands if label == "cp=2 x hp=4, hp across nodes")
    assert across.groups[0].devices == (0, 2, 4, 6)
    for _, p in cands:
        assert p.validate() == []
        assert len(set(p.heads)) == 1 and len(set(g.chunk_len for g in p.groups)) == 1  # even


def test_ulysses_uses_a_divisor_subset_when_heads_do_not_divide():
    model = get_model("llama2-13b")  # 40 heads
    cands = symmetric_candidates(list(range(16)), 65536, model, 128, "ulysses", speed={i: float(16 - i) for i in range(16)})
    sizes = [p.world_size for _, p in cands]
    assert sizes[0] == 10 and all(40 % s == 0 for s in sizes)
    assert cands[0][1].rank_devices == tuple(range(10))  # the fastest devices


def test_proportional_plan_follows_flops(mixed, model7b):
    wl = Workload(seq_len=65536)
    plan = proportional_plan(mixed, model7b, wl)
    assert plan.validate(mixed, model7b, wl) == []
    h100, a100 = plan.groups
    assert h100.tokens > 2 * a100.tokens  # H100 ~2.7x the effective FLOP/s
    assert plan.groups[0].heads == (16, 16)


def test_largest_remainder_exact_and_granular():
    parts = largest_remainder(64, [3.0, 1.0, 1.0], unit=8)
    assert sum(parts) == 64 and all(p % 8 == 0 for p in parts)
    assert largest_remainder(10, [1, 1, 1], minimum=1) == [4, 3, 3]


def test_nothing_fits_reports_notes(mixed, model7b):
    res = baselines(mixed, model7b, Workload(seq_len=1 << 20))
    assert all(not b.feasible for b in res.values())
    assert best_baseline(res) is None
    assert all(b.notes and math.isinf(b.iteration_time_s) for b in res.values())
