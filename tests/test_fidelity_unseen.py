"""Sources the fit never sees (published.yaml `unseen_sources`, split unseen): their points never
enter the fit, their grades follow the sensitivity rule of data/validation/README.md, and the
head-parallel points are judged apart from the ring/CP ones."""

from __future__ import annotations

import dataclasses

import pytest

from hexiseq.specs import load_gpu_catalog
from hexiseq.specs.stacks import stack_catalog
from hexiseq.validation import fidelity as F


@pytest.fixture(scope="module")
def data():
    return F.load_kernels(), F.load_published(), F.load_fit()


@pytest.fixture(scope="module")
def after(data):
    return F.calibration(load_gpu_catalog(), data[2], data[0], data[1], "after")


def test_unseen_points_never_enter_the_fit(data):
    kernels, published, _ = data
    points = F.load_points(published)
    assert any(p.split == F.UNSEEN for p in points)
    start = F.Calibration(
        dict(F.calibration(load_gpu_catalog(), data[2], kernels, published, "after").gpus),
        F.without_fitted_factors(stack_catalog()),
    )
    coarse = (0.05,)
    with_unseen, _ = F.fit_catalog(points, start, kernels, steps=coarse)
    without, _ = F.fit_catalog([p for p in points if p.split != F.UNSEEN], start, kernels, steps=coarse)
    assert with_unseen.gpus == without.gpus and with_unseen.stacks == without.stacks


def test_grades_follow_the_nic_sensitivity_rule(data, after):
    """B only where halving the assumed NIC moves the prediction by less than the 5% uncertainty."""
    unseen = set(data[1]["unseen_sources"])
    for p in F.load_points(data[1]):
        if p.source not in unseen or "nic_gbps" not in F.ASSUMED.get(p.source, {}):
            continue
        base = F.predict(p, after).tokens_per_s_per_gpu
        half = F.predict(dataclasses.replace(p, nic_gbps=p.nic_gbps / 2), after).tokens_per_s_per_gpu
        sensitive = abs(half / base - 1) > 0.05
        assert p.quality == ("C" if sensitive else "B"), f"{p.id}: {half / base - 1:+.1%} at half the NIC"


def test_head_parallel_points_are_judged_only_out_of_the_fit(data):
    hp = [p for p in F.load_points(data[1]) if p.judged and p.family in ("hp", "hybrid")]
    assert len(hp) >= 6
    assert all(p.split != "fit" for p in hp)


def test_flop_only_reference_for_an_unseen_source(data, after):
    """The per-GPU FLOP-only reference predicts every judged unseen point from other sources' fit points."""
    points = F.load_points(data[1])
    preds = [F.predict(p, after) for p in points]
    c = F.compare_flop_only_unseen(preds, after)
    want = {p.id for p in points if p.split == F.UNSEEN and p.judged}
    assert set(c.ids) | set(c.uncovered) == want and c.ids
    rates = F.fit_flop_only_per_gpu(points, after)
    assert set(rates["A100-80GB"].points) == {
        p.id for p in points if p.gpu == "A100-80GB" and p.split == "fit" and p.judged
    }
    assert "unseen-source" in c.statement()
