"""Head-parallel and hybrid points judged apart from ring/CP (issue 20): the fidelity report's
per-layout statistics are recomputed here from the points themselves, with the layout families and
the median written out independently of `fidelity.by_layout`."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from statistics import median

import pytest

from hexiseq.specs import load_gpu_catalog
from hexiseq.validation import fidelity as F

ROOT = Path(__file__).resolve().parent.parent
# The report's group names and the layout families each stands for (data/validation/README.md).
FAMILIES = {"head-parallel / hybrid": {"hp", "hybrid"}, "ring / CP": {"cp"}, "no sequence split": {"none"}}
LINE = re.compile(
    r"^  (?P<group>[a-zA-Z /-]+?)\s+never fitted\s+"
    r"(?:(?P<n>\d+) points: median \|pred/pub - 1\|\s+(?P<median>[\d.]+)%, "
    r"worst\s+(?P<worst>[\d.]+)% \((?P<worst_id>[^)]+)\)|no points)$"
)


@pytest.fixture(scope="module")
def data():
    return F.load_kernels(), F.load_published(), F.load_fit()


@pytest.fixture(scope="module")
def preds(data):
    after = F.calibration(load_gpu_catalog(), data[2], data[0], data[1], "after")
    return [F.predict(p, after) for p in F.load_points(data[1])]


@pytest.fixture(scope="module")
def report(data):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_fidelity
    finally:
        sys.path.pop(0)
    return bench_fidelity.report(*data)[0]


def _never_fitted(q: F.Prediction) -> bool:
    return q.point.judged and q.point.split in ("holdout", "unseen")


def _section(report: str) -> list[str]:
    start = report.index("Judged points by layout, apart")
    return report[start:].split("\n\n", 1)[0].splitlines()


def test_report_statistics_are_those_of_the_points(report, preds):
    """Every group's never-fitted line: count, median and worst of |pred/pub - 1| over its judged
    points of split holdout or unseen, recomputed from the predictions."""
    rows = {m["group"]: m for m in map(LINE.match, _section(report)) if m}
    assert set(rows) == set(FAMILIES)
    for group, fams in FAMILIES.items():
        mine = [q for q in preds if q.point.family in fams and _never_fitted(q)]
        m = rows[group]
        if not mine:
            assert m["n"] is None, group
            continue
        err = {q.point.id: abs(q.ratio - 1) for q in mine}
        assert int(m["n"]) == len(mine), group
        assert float(m["median"]) == pytest.approx(100 * median(err.values()), abs=0.051), group
        assert float(m["worst"]) == pytest.approx(100 * max(err.values()), abs=0.051), group
        assert m["worst_id"] == max(err, key=err.get), group


def test_report_target_and_reported_points_follow_the_numbers(report, preds):
    lines = _section(report)
    hp = [q for q in preds if q.point.family in {"hp", "hybrid"} and _never_fitted(q)]
    met = len(hp) >= 6 and median(abs(q.ratio - 1) for q in hp) <= 0.15
    target = next(x for x in lines if "target" in x)
    assert target.endswith("MET" if met else "FAILED")
    reported = next(x for x in lines if "reported only" in x)
    unjudged = [q for q in preds if q.point.family in {"hp", "hybrid"} and not q.point.judged]
    assert unjudged and all(f"{q.point.id} {q.ratio:.2f}" in reported for q in unjudged)
    assert not any(q.point.id + " " in reported for q in hp)


def test_by_layout_partitions_the_judged_points(preds):
    groups = F.by_layout(preds)
    assert list(groups) == list(FAMILIES)
    judged = [q for q in preds if q.point.judged]
    total = sum(s.never_fitted.n + s.fit.n for s in groups.values())
    assert total == len(judged)
    for name, s in groups.items():
        assert all(F.layout_group(q.point) == name for q in preds if q.point.id in dict(s.reported))


def test_by_layout_on_known_ratios(preds):
    """Synthetic ratios: the statistics move with the points, and a fit point never enters the never-fitted line."""
    base = next(q for q in preds if q.point.family == "hp" and q.point.judged)
    ring = next(q for q in preds if q.point.family == "cp" and q.point.judged)

    def fake(q, i, ratio, split="unseen", quality="B"):
        p = dataclasses.replace(q.point, id=f"{q.point.id}-{i}", split=split, quality=quality)
        return F.Prediction(p, ratio * p.published, 1.0, {})

    hp = [fake(base, i, r) for i, r in enumerate((1.05, 0.90, 1.30, 1.02))]
    extra = [fake(base, 9, 3.0, split="fit"), fake(base, 8, 5.0, quality="C"), fake(ring, 7, 1.5)]
    g = F.by_layout(hp + extra)
    s = g[F.HEAD_PARALLEL]
    assert s.never_fitted.n == 4
    assert s.never_fitted.median == pytest.approx(median([0.05, 0.10, 0.30, 0.02]))
    assert s.never_fitted.worst == pytest.approx(0.30) and s.never_fitted.worst_id.endswith("-2")
    assert s.fit.n == 1 and s.fit.worst == pytest.approx(2.0)
    assert [i for i, _ in s.reported] == [f"{base.point.id}-8"]
    assert g["ring / CP"].never_fitted.n == 1 and g["ring / CP"].never_fitted.worst == pytest.approx(0.5)
    assert not F.head_parallel_met(s)  # 4 points < 6
    six = hp + [fake(base, i, 1.01) for i in (10, 11)]
    assert F.head_parallel_met(F.by_layout(six)[F.HEAD_PARALLEL])
    loose = [fake(base, i, 1.2) for i in range(6)]
    assert not F.head_parallel_met(F.by_layout(loose)[F.HEAD_PARALLEL])  # median 20% > 15%
