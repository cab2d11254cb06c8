"""The rate-range sensitivity report (hexiseq/reproduce/rate_sensitivity.py) in quick mode: real
planning of one simulation cell under every variant of the catalog, and the report's numbers
checked against the rows it computed and against the planner run directly."""

from __future__ import annotations

import csv
import math

import pytest

from hexiseq import planner
from hexiseq.reproduce import rate_sensitivity as RS
from hexiseq.reproduce.ceilings import compute_ceiling
from hexiseq.specs import get_model, load_cluster, load_gpu_catalog
from hexiseq.specs.stacks import get_stack

CLUSTER, MODEL, SEQ = RS.QUICK_CELL


@pytest.fixture(scope="module")
def rows():
    return RS.run(quick=True)


@pytest.fixture(scope="module")
def report(rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("rates")
    paths = RS.write_report(rows, out, load_gpu_catalog(), quick=True)
    return out, paths


def test_one_cell_under_every_variant(rows):
    assert [r.variant for r in rows] == list(RS.VARIANTS)
    assert {(r.cluster, r.model, r.seq_len) for r in rows} == {RS.QUICK_CELL}
    assert all(r.speedup is not None and r.speedup >= 1.0 - 1e-9 for r in rows)
    by = {r.variant: dict((n, (m, a)) for n, m, a in r.rates) for r in rows}
    g = load_gpu_catalog()["L40S"]
    lo, hi = g.ranges["eff_attention"]
    assert by["low"]["L40S"] == (g.eff_matmul, lo) and by["high"]["L40S"] == (g.eff_matmul, hi)
    assert by["mid"]["L40S"][1] == pytest.approx(g.eff_attention, abs=1e-12)
    a = load_gpu_catalog()[RS.DONOR]
    st = get_stack(None)
    assert by["borrowed"]["L40S"][0] == a.eff_matmul
    assert by["borrowed"]["L40S"][1] * st.factors("L40S")[2] == pytest.approx(a.eff_attention * st.factors(a.name)[2])


def test_the_midpoint_is_the_catalog_as_it_is(rows):
    """`mid` plans the bundled cluster exactly as `hexiseq plan` would (same speedup, same ceiling)."""
    mid = next(r for r in rows if r.variant == "mid")
    c, m = load_cluster(CLUSTER), get_model(MODEL)
    cell = RS.scenario_cells(quick=True)[0]
    direct = planner.plan_cluster(c, m, cell.workload_spec(), progress=False)
    assert mid.speedup == direct.speedup_vs_best_symmetric
    assert mid.ceiling == pytest.approx(compute_ceiling(CLUSTER, MODEL, SEQ, 1), rel=1e-12)


def test_the_rates_move_the_answer(rows):
    """The ends differ from each other: the range matters to the planner and to the ceiling."""
    sp = {r.variant: r.speedup for r in rows}
    ce = {r.variant: r.ceiling for r in rows}
    assert sp["low"] != sp["high"] and ce["low"] != ce["high"]
    assert ce["borrowed"] != ce["mid"]


def test_the_report_says_what_the_rows_say(rows, report):
    out, paths = report
    assert [p.name for p in paths] == ["rate_sensitivity.md", "rate_sensitivity.csv", "rate_sensitivity.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    with open(out / "rate_sensitivity.csv") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows)
    for r, line in zip(rows, got):
        assert (line["variant"], line["cluster"], line["model"], int(line["seq_len"])) == (
            r.variant,
            r.cluster,
            r.model,
            r.seq_len,
        )
        assert float(line["speedup"]) == pytest.approx(r.speedup, abs=1e-6)
        assert float(line["ceiling"]) == pytest.approx(r.ceiling, abs=1e-6)
        assert float(line["L40S_eff_attention"]) == pytest.approx(dict((n, a) for n, _, a in r.rates)["L40S"], abs=1e-6)
    md = (out / "rate_sensitivity.md").read_text()
    s = RS.summary(rows)
    table = {}
    for line in md.splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if cols and cols[0] in RS.VARIANTS and len(cols) == 4:  # variant | mean | max | ceiling sim-32
            table[cols[0]] = [float(x) for x in cols[1:]]
    assert set(table) == set(RS.VARIANTS)
    for v, (mean_, max_, ceil) in table.items():
        assert mean_ == pytest.approx(s[v]["speedup_mean"], abs=5e-4)
        assert max_ == pytest.approx(s[v]["speedup_max"], abs=5e-4)
        assert ceil == pytest.approx(s[v][f"ceiling_{CLUSTER}"], abs=5e-4)
        assert not math.isnan(mean_)


def test_bad_input_fails_before_work(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit) as e:
        RS.main(["--quick", "--out", str(f)])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="variant 'top'"):
        RS.variant_catalog(load_gpu_catalog(), "top")


def test_reproduce_rate_sensitivity_writes_the_report(tmp_path, capsys):
    """`hexiseq reproduce --rate-sensitivity --quick` is the module's report; it refuses what it ignores."""
    from hexiseq.cli import main

    out = tmp_path / "rs"
    assert main(["reproduce", "--rate-sensitivity", "--quick", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"rate_sensitivity.md", "rate_sensitivity.csv", "rate_sensitivity.png"}
    rows = list(csv.DictReader((out / "rate_sensitivity.csv").open()))
    assert {r["variant"] for r in rows} == set(RS.VARIANTS)
    assert main(["reproduce", "--rate-sensitivity", "--stack", "te-fp8", "--out", str(tmp_path / "x")]) != 0
    assert "takes no SCENARIO" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
