"""README's and data/validation/README.md's evidence figures are the generated ones (fit.yaml,
data/stacks.yaml, the benchmark's comparison): a refit or a new stack factor fails here until the
prose follows."""

from __future__ import annotations

from statistics import median

import pytest

from hexiseq.specs import load_gpu_catalog
from hexiseq.specs.files import data_path
from hexiseq.specs.stacks import stack_catalog
from hexiseq.validation import fidelity as F
from hexiseq.validation.public_path import public_reason

ROOT = data_path("validation").parent.parent


@pytest.fixture(scope="module")
def figures():
    k, pub, rec = F.load_kernels(), F.load_published(), F.load_fit()
    after = F.calibration(load_gpu_catalog(), rec, k, pub, "after")
    preds = [F.predict(p, after) for p in F.load_points(pub)]
    cmp = F.compare_flop_only(preds, after.gpus)
    loso = [abs(r - 1) for run in rec["leave_one_source_out"]["runs"] for r in run["ratios"].values()]
    st = rec["fit"]["statistics"]["holdout"]
    hp_st = F.by_layout(preds)[F.HEAD_PARALLEL].never_fitted
    points = F.load_points(pub)
    public = sum(public_reason(p) is None for p in points)
    return {
        "triton": f"{stack_catalog()['llmfoundry-triton-2023'].every_gpu.attention:.4f}",
        "fp8": f"{stack_catalog()['te-fp8'].every_gpu.layer_gemm:.4f}",
        "flop median": f"{cmp.flop_only.median:.1%}",
        "flop worst": f"{cmp.flop_only.worst:.1%}",
        "held median": f"{st['median']:.1%}",
        "held worst": f"{st['worst']:.1%}",
        "loso median": f"{median(loso):.0%}",
        "loso worst": f"{max(loso):.0%}",
        "head-parallel judged": f"{hp_st.n} judged",
        "head-parallel median": f"median {hp_st.median:.1%}",
        "head-parallel worst": f"worst {hp_st.worst:.1%}",
        "public path": f"{public} of {len(points)}",
    }


@pytest.mark.parametrize("doc", ["README.md", "data/validation/README.md"])
def test_evidence_figures_are_the_generated_ones(doc, figures):
    text = (ROOT / doc).read_text()
    for name, value in figures.items():
        assert value in text, f"{doc}: {name} is {value} in the generated files; update the prose"


def _bench_dp_rows():
    """benchmarks/dp_errors_by_cores.py's parser of bench_dp reports (plan_rows)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dp_errors_by_cores", ROOT / "benchmarks" / "dp_errors_by_cores.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_readme_dp_table_is_the_committed_benchmark():
    """README's CPU-emulation table quotes data/results/dp.txt (bench_dp): each cluster's plans,
    predicted / measured, and the per-operator line's slope, so a rerun fails here until the prose follows."""
    text = (ROOT / "data" / "results" / "dp.txt").read_text()
    readme = (ROOT / "README.md").read_text()
    table = {line.split(" |")[0].lstrip("| "): line for line in readme.splitlines() if line.startswith("| cpu-")}
    rows = _bench_dp_rows().plan_rows(text)
    for cluster in (block.split("\n", 1)[0].strip() for block in text.split("\n== ")[1:]):
        got = {r.plan: r for r in rows if r.cluster == cluster}
        for system in ("joint", "dp-baseline", "dp-even", "dp1"):
            if system not in got and system == "dp-even":
                continue  # no even-share DP plan fits (or a benchmark from before that row)
            assert system in got, (cluster, system)
            r = got[system]
            quoted = (f"{r.predicted} / {r.measured}", f"{r.predicted} / **{r.measured}**")  # the fastest is bold
            assert any(q in table[cluster] for q in quoted), (cluster, system, r.predicted, r.measured)
    fit = next(x for x in text.splitlines() if x.startswith("misses (measured - predicted)"))
    slope = fit.split(": ")[1].split(" us")[0]
    assert f"{slope} us per operator" in readme


def test_the_readme_crowding_figures_are_the_kept_runs():
    """README's split of bench_dp's errors by the cores a plan's ranks used is what
    benchmarks/dp_errors_by_cores.py computes from the reports kept in data/results/dp-runs/."""
    script = _bench_dp_rows()
    rows = [
        r
        for f in sorted((ROOT / "data" / "results" / "dp-runs").glob("2026-12-07T*.txt"))
        for r in script.plan_rows(f.read_text())
        if r.plan in script.COUNTED
    ]
    crowded = [r.error for r in rows if r.cores >= 1.0]
    calm = [r.error for r in rows if r.cores < 1.0]
    readme = (ROOT / "README.md").read_text()
    assert len(rows) == 30 and all(e < 0 for e in crowded)
    assert f"the {len(crowded)} plans whose ranks used at least one of the 2 cores" in readme
    assert f"measured a median {-median(crowded):.1f}% above their prediction" in readme
    assert f"-{-min(crowded):.1f}% to {max(crowded):.1f}%" in readme
    assert f"others a median {-median(calm):.1f}% ({min(calm):.1f}% to +{max(calm):.1f}%)" in readme
