"""The per-operator time (costmodel/operators.py, specs/operators.py, calibrate/operator_counts.py):
the replay charges exactly the pieces the counts describe, the bundled counts are a valid file, and
their fit recovers known counts."""

from __future__ import annotations

import numpy as np
import pytest

from hexiseq.calibrate.operator_counts import solve_counts
from hexiseq.costmodel import CostOptions, simulate
from hexiseq.costmodel.operators import operator_charges, operators_per_step, pieces_per_step
from hexiseq.costmodel.policy import RULES
from hexiseq.errors import HexiSeqError, SpecError
from hexiseq.plan import symmetric_plan
from hexiseq.specs import ClusterSpec, Workload, get_model
from hexiseq.specs.operators import COUNT_FIELDS, OperatorCounts, load_operator_counts, operator_counts

MODEL = get_model("llama2-7b")
NODE = ClusterSpec.from_nodes("a100x4", [("A100-80GB", 4, 25.0)])


def _with_ops(cluster: ClusterSpec, us: float) -> ClusterSpec:
    return cluster.with_profile({g: {"op_overhead_us": us} for g in cluster.gpu_types})


def test_the_bundled_counts_load_and_are_measured():
    n = operator_counts()
    assert all(getattr(n, f) > 0 for f in COUNT_FIELDS)
    assert n.measured["runs"] >= 1 and n.measured["torch"]  # where they came from


def test_a_bad_counts_file_is_refused(tmp_path):
    p = tmp_path / "ops.yaml"
    p.write_text("linear_forward: -3\n")
    with pytest.raises(SpecError, match="linear_forward"):
        load_operator_counts(p)


def test_charges_follow_the_ranks_roles():
    """A rank without query heads runs no attention round; a rank alone in its group no all-to-all."""
    n = OperatorCounts(10, 20, 5, 7, 3, 100)
    grp = np.array([0, 0, 1])  # a head-parallel pair, then one rank alone
    eta = np.array([2.0, 0.0, 2.0])  # the second rank of the pair holds no heads
    c = operator_charges(np.full(3, 1e-5), grp, eta, 2, RULES["selective"], n)
    np.testing.assert_allclose(c.round_forward, [5e-5, 0.0, 5e-5])
    np.testing.assert_allclose(c.all_to_all, [3e-5, 3e-5, 0.0])
    np.testing.assert_allclose(c.linear_backward, [(20 + 10) * 1e-5] * 3)  # the selective rerun's forward
    assert operator_charges(np.zeros(3), grp, eta, 2, RULES["none"], n).step.max() == 0.0


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
@pytest.mark.parametrize("cp, hp", [(1, 1), (4, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_replay_charges_each_counted_operator_once(policy, cp, hp, batch):
    """Identical ranks, an even plan, no transfers: nobody waits for anybody, so the per-operator time
    adds exactly op_s x the rank's operators per step (pieces_per_step x the counts) to the step."""
    devices = range(cp * hp)
    S = 2 * 128 * 8 * cp * hp
    plan = symmetric_plan(devices, S, MODEL.heads, MODEL.kv_heads, cp, hp, 128)
    node = ClusterSpec.from_nodes("n", [("A100-80GB", cp * hp, 25.0)])
    w = Workload(seq_len=S, activation_checkpointing=policy, param_sharding="replicated", global_batch=batch)
    opts = CostOptions(ignore_comm=True)
    base = simulate(plan, node, MODEL, w, opts).iteration_time_s
    us = 50.0
    charged = simulate(plan, _with_ops(node, us), MODEL, w, opts).iteration_time_s - base
    grp = np.repeat(np.arange(cp), hp)
    eta = np.full(cp * hp, MODEL.heads / hp)
    ops = operators_per_step(grp, eta, cp, RULES[policy], MODEL.layers, batch)
    assert np.ptp(ops) == 0
    assert charged == pytest.approx(us * 1e-6 * ops[0], rel=1e-9)


def test_more_small_pieces_cost_more_with_an_operator_time():
    """The same tokens over four ring rounds cost more operators than over one Ulysses all-to-all
    pair per layer; at 0 us per operator the term is absent (the catalog's GPUs)."""
    S = 2 * 128 * 32
    w = Workload(seq_len=S, activation_checkpointing="none", param_sharding="replicated")
    ring = symmetric_plan(range(4), S, MODEL.heads, MODEL.kv_heads, 4, 1, 128)
    assert simulate(ring, NODE, MODEL, w).phases["operators"].max() == 0.0
    slow = simulate(ring, _with_ops(NODE, 30.0), MODEL, w)
    assert slow.phases["operators"].min() > 0
    np.testing.assert_allclose(sum(slow.phases.values()), slow.iteration_time_s, rtol=1e-12)


def test_the_count_fit_recovers_known_counts():
    """Rows made from the pieces of several layouts, policies and batches with known counts are
    solved back exactly; rows that cannot tell the counts apart are refused."""
    truth = np.array([70.0, 150.0, 100.0, 180.0, 30.0, 200.0])
    rows = []
    for policy in ("none", "selective", "full"):
        for grp, eta, k in ((np.array([0, 0, 1, 1]), np.array([4.0, 4, 8, 0]), 2), (np.array([0]), np.array([8.0]), 1)):
            for batch in (1, 3):
                p = pieces_per_step(grp, eta, k, RULES[policy], 2, batch)
                for r in range(len(grp)):
                    x = np.array([p[f][r] for f in COUNT_FIELDS])
                    rows.append((x, float(x @ truth)))
    got = solve_counts(rows)
    np.testing.assert_allclose([got["counts"][f] for f in COUNT_FIELDS], truth, rtol=1e-9)
    assert got["worst_error"] < 1e-9
    one_shape = [r for r in rows[:4]] * 3  # one layout, one policy, one batch
    with pytest.raises(HexiSeqError, match="rank"):
        solve_counts(one_shape)
