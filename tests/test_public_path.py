"""Every published point (data/validation/published.yaml) through the public path: `hexiseq
estimate --plan` with the point's cluster, joint plan (data-parallel replicas of its layout),
recompute and `--stack` gives the validation benchmark's prediction exactly; a point the public path
cannot express is listed with its reason, and the benchmark reports the same count."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
import yaml

from hexiseq.cli import main
from hexiseq.specs import load_gpu_catalog
from hexiseq.validation import fidelity as F
from hexiseq.validation.public_path import public_predict, public_reason, public_run


@pytest.fixture(scope="module")
def after():
    k, pub, rec = F.load_kernels(), F.load_published(), F.load_fit()
    return F.calibration(load_gpu_catalog(), rec, k, pub, "after")


@pytest.fixture(scope="module")
def points():
    return F.load_points()


def test_every_point_is_expressed_or_has_a_reason(points):
    reasons = {p.id: public_reason(p) for p in points}
    shown = [f"{i}: {why}" for i, why in reasons.items() if why]
    print("\nnot expressible through the public path:\n  " + "\n  ".join(shown))
    assert len(reasons) == len(points)
    assert sum(why is None for why in reasons.values()) >= len(points) // 2  # 29 of 54 at this revision
    for p in points:
        if p.judged and p.family in ("hp", "hybrid"):  # the head-parallel evidence runs as a user would
            assert reasons[p.id] is None, p.id


def test_expressible_points_through_hexiseq_estimate_equal_the_benchmark(points, after, tmp_path, capsys):
    ran = 0
    for p in points:
        if public_reason(p) is not None:
            continue
        run = public_run(p, after.gpus[p.gpu])
        bench = F.predict(p, after).tokens_per_s_per_gpu
        if not run.through_cli:  # a published.yaml GPU no cluster file can name: the command's Python function
            assert public_predict(run, after) == pytest.approx(bench, rel=1e-12), p.id
            continue
        cluster, plan = tmp_path / f"{p.id}.yaml", tmp_path / f"{p.id}.json"
        cluster.write_text(yaml.safe_dump(run.cluster_file()))
        run.plan.save(plan)
        argv = ["estimate", "--plan", str(plan), "--cluster", str(cluster), "--stack", p.stack, "--json"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["tokens_per_s"] / run.cluster.size == pytest.approx(bench, rel=1e-12), p.id
        ran += 1
    assert ran >= 20


def test_the_benchmark_reports_the_count(points):
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fidelity.py"
    spec = importlib.util.spec_from_file_location("bench_fidelity", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text, _ = bench.report(F.load_kernels(), F.load_published(), F.load_fit())
    n = sum(public_reason(p) is None for p in points)
    assert f"Public path: {n} of {len(points)} published points" in text
