"""The global-batch scenario: joint cells (whole steps planned), their rows' replicas and
strategy, the paper's cells staying one replica under ZeRO-3, and the tokens/s-vs-G figure."""

import pytest

from hexiseq.errors import SpecError
from hexiseq.reproduce.cells import DP1, HEXISEQ, run_cell
from hexiseq.reproduce.figures import fig_global_batch
from hexiseq.reproduce.scenarios import load_scenario
from hexiseq.reproduce.table import BASE_COLUMNS, frame, rows_of


def test_scenario_expands_into_joint_cells_per_global_batch():
    full = load_scenario("global_batch")
    assert {c.cluster.name for c in full.cells} == {"testbed-16", "sim-64", "sim-128"}
    assert sorted({c.sweep_value for c in full.cells}) == [1, 2, 4, 8, 16]
    assert all(c.joint and c.sweep == "global_batch" for c in full.cells)
    assert all(dict(c.workload)["global_batch"] == c.sweep_value for c in full.cells)
    assert full.cells[0].compute_params()["joint"] is True
    paper = load_scenario("testbed", quick=True)
    assert all(not c.joint and "joint" not in c.compute_params() for c in paper.cells)  # their cache keys stay


def test_bad_global_batches_refused(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("name: x\nclusters: [testbed-8]\nmodels: [gpt-7b]\nseq_lens: [16K]\nglobal_batches: [0, 2]\n")
    with pytest.raises(SpecError, match="global_batches: a list of global batch sizes"):
        load_scenario(p)


def test_joint_cell_rows_and_figure():
    sc = load_scenario("global_batch", quick=True)
    cell = next(c for c in sc.cells if c.sweep_value == 8)
    rec = run_cell(cell)
    assert rec["status"] == "ok"
    rows = rows_of(cell, rec, "test")
    by = {r["system"]: r for r in rows}
    assert {HEXISEQ, DP1, "dp x ring", "dp x ulysses", "dp x usp"} <= set(by)
    h = by[HEXISEQ]
    assert h["replicas"] >= 2 and h["devices_used"] == 8
    assert by[DP1]["replicas"] == 1 and by[DP1]["sharding"] == "zero3 over all devices"
    feasible = [r for r in rows if r["feasible"]]
    assert all(h["tokens_per_s"] >= r["tokens_per_s"] * (1 - 1e-9) for r in feasible)  # never worse
    assert h["efficiency_vs_bound"] > 0.8
    df = frame(rows)
    assert {"replicas", "sharding"} <= set(BASE_COLUMNS) and df["replicas"].notna().all()
    fig = fig_global_batch(df)
    assert fig.axes and "global batch" in fig.axes[0].get_xlabel()


def test_explorer_view_of_a_global_batch_draws_the_replicas():
    from hexiseq.widgets import Settings, plan_view

    v = plan_view(Settings("testbed-8", "gpt-7b", 16384, "auto", "zero3", 8))
    assert v.ok and "batch 8" in v.headline and "replicas" in v.headline
    assert any(line.strip().startswith("replica 0:") for line in v.details)
    name, fig = v.figures[0]
    assert name == "allocation" and "devices by replica" in fig.axes[0].get_title()
