"""paper_comparison.md's reasons are computed per row: every bullet quotes numbers of results.csv
rows (checked against the table here) or a compute ceiling (recomputed from the catalog), and the
universal catalog-ratio bullet is gone."""

from __future__ import annotations

import math

import pytest

from hexiseq.reproduce import comparison as C
from hexiseq.reproduce.table import read_csv
from hexiseq.specs.files import data_path

RESULTS = data_path("results") / "results.csv"


@pytest.fixture(scope="module")
def df():
    if not RESULTS.exists():
        pytest.skip("no data/results/results.csv")
    return read_csv(RESULTS)


@pytest.fixture(scope="module")
def rows(df):
    return C.compare(df)


def _value(df, q):
    scenario, cluster, model, seq_len, system, role, column, value = q
    r = df[
        (df["scenario"] == scenario)
        & (df["cluster"] == cluster)
        & (df["model"] == model)
        & (df["seq_len"] == seq_len)
        & (df["system"] == system)
        & (df["pair_role"] == role)
    ]
    assert len(r), q
    return float(r.iloc[0][column])


def test_every_quoted_number_is_a_results_cell(df, rows):
    n = 0
    for c in rows:
        for f in c.facts:
            if not isinstance(f, C.Fact):
                continue
            for q in f.quotes:
                got = _value(df, q)
                assert got == pytest.approx(q[-1], rel=1e-12), (c.figure.key, q)
                shown = f"{int(got)}" if q[6] == "devices_used" else f"{got:.2f}"
                assert shown in f.text or f"{got:.1f}" in f.text, (c.figure.key, q, f.text)
                n += 1
            for cluster, model, seq_len, batch, ceiling in f.ceilings:
                assert C.compute_ceiling(cluster, model, seq_len, batch) == pytest.approx(ceiling, rel=1e-12)
    assert n > 0


def test_a_bullet_appears_only_where_the_numbers_support_it(df, rows):
    for c in rows:
        for f in c.facts:
            if not isinstance(f, C.Fact):
                continue
            if "exceeds the compute ceiling" in f.text:
                ((*_, speedup),) = f.quotes
                ((*_, ceiling),) = f.ceilings
                assert speedup > ceiling, f.text
            if "spends less on recompute" in f.text:
                (h, b) = f.quotes
                assert h[-1] < b[-1], f.text
            if "spends more on recompute" in f.text:
                (h, b) = f.quotes
                assert h[-1] > b[-1], f.text
            if "parameter traffic" in f.text and f.quotes:
                assert f.quotes[0][-1] / f.quotes[1][-1] >= C.PARAM_SHARE
        assert not any("sets the speedup" in r for r in c.reasons)


def test_compute_ceiling_is_one_on_a_homogeneous_cluster_and_above_on_a_mixed_one():
    assert C.compute_ceiling("pair-a-a100", "gpt-13b", 65536, 1) == pytest.approx(1.0)
    assert C.compute_ceiling("testbed-8", "gpt-7b", 32768, 1) > 1.2
    assert not math.isnan(C.compute_ceiling_time("testbed-8", "gpt-7b", 32768))
