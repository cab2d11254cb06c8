"""Every catalog GPU's eff_matmul / eff_attention traces to a record: the fit (data/validation/fit.yaml,
fitted or a NEAREST GPU of the same silicon) or kernel measurements (kernels.yaml
`recommended_priors.catalog_rates`, recomputed here by fidelity.catalog_rates); ranged fields are
well-formed intervals whose midpoint is the catalog value, and `at_range_end` gives either end."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from hexiseq.specs import load_gpu_catalog
from hexiseq.specs.files import data_path
from hexiseq.specs.gpus import GPUType, at_range_end, numeric_fields
from hexiseq.validation import fidelity as F


@pytest.fixture(scope="module")
def catalog():
    return load_gpu_catalog()


@pytest.fixture(scope="module")
def kernels():
    return F.load_kernels()


def test_every_gpu_rate_traces_to_a_fit_or_a_kernel_measurement(catalog, kernels):
    fit = F.load_fit()["fit"]["gpus"]
    rates = F.catalog_rates(kernels, catalog)
    for name, g in catalog.items():
        for field in F.FITTED:
            src = g.sources[field]
            if src == F.FIT_KEY:
                assert fit[name]["from"] == "fitted" or name in F.NEAREST, f"{name}.{field}: a fit key but not fitted"
                assert name not in F.RATE_GPUS
            else:
                assert src == F.RATE_KEY, f"{name}.{field}: source {src!r} is neither the fit nor the kernel rates"
                assert getattr(g, field) == pytest.approx(rates[name][field].value, abs=1e-12), f"{name}.{field}"
    # the borrowed analogy is gone: no GPU without a published run takes another's fitted values
    assert set(F.RATE_GPUS) == {"L40S", "RTX-4090", "RTX-A6000"}
    assert not set(F.RATE_GPUS) & set(F.NEAREST)


def test_the_recorded_rates_are_what_the_rule_computes(catalog, kernels):
    recorded = kernels["recommended_priors"]["catalog_rates"]
    for name, d in F.catalog_rates(kernels, catalog).items():
        for field, r in d.items():
            rec = recorded[name][field]
            assert rec["value"] == pytest.approx(r.value, abs=1e-9), f"{name}.{field}"
            if r.range is None:
                assert "range" not in rec
            else:
                assert tuple(rec["range"]) == pytest.approx(r.range, abs=1e-9), f"{name}.{field}"
            assert r.source == F.RATE_KEY and r.how


def test_the_kernel_entries_fractions_are_their_values_over_the_peaks(catalog, kernels):
    for name, (gemm, _fa2) in F.RATE_GPUS.items():
        e = F.kernel_entry(kernels, gemm)
        vals = e["value"] if isinstance(e["value"], list) else [e["value"]]
        fr = e["fraction_of_peak"] if isinstance(e["fraction_of_peak"], list) else [e["fraction_of_peak"]]
        assert fr == pytest.approx([v / catalog[name].peak_bf16_tflops for v in vals], abs=6e-5), gemm
    v = F.kernel_entry(kernels, "fa2-rtx4090-fwd-bwd-2k")["value"]
    r = F.fa2_fwd_bwd(v["fwd"]["causal_hd128"], v["bwd"]["causal_hd128"])
    assert r == pytest.approx(3.5 / (1 / 151.19 + 2.5 / 99.23), rel=1e-12)
    assert r == pytest.approx(110.03, abs=0.01)


def test_the_rule_follows_its_evidence(catalog, kernels):
    """Change a measurement and the rate moves (the rule reads kernels.yaml, nothing is hard-coded)."""
    base = F.catalog_rates(kernels, catalog)
    k = copy.deepcopy(kernels)
    F.kernel_entry(k, "torchmm-l40s")["value"] = 181.0
    moved = F.catalog_rates(k, catalog)
    assert moved["L40S"]["eff_matmul"].value == pytest.approx(0.5, abs=1e-4)
    lo, hi = moved["L40S"]["eff_attention"].range
    assert (lo, hi) == pytest.approx(
        (base["L40S"]["eff_attention"].range[0] * 0.5 / 0.7435, base["L40S"]["eff_attention"].range[1] * 0.5 / 0.7435),
        abs=2e-4,
    )
    F.kernel_entry(k, "torchmm-l40s")["value"] = 400.0  # above the peak: capped at the field's limit
    assert F.catalog_rates(k, catalog)["L40S"]["eff_matmul"].value == 1.0
    assert base["RTX-4090"]["eff_matmul"].value == 1.0  # the 4090's median GEMM reaches its 165 TFLOP/s peak


def test_ranges_are_intervals_around_the_catalog_value(catalog):
    raw = yaml.safe_load(data_path("gpus.yaml").read_text())
    ranged = {n: g for n, g in catalog.items() if g.ranges}
    assert set(ranged) == set(F.RATE_GPUS)
    rates = F.catalog_rates(F.load_kernels(), catalog)
    for name, g in ranged.items():
        assert raw[name]["ranges"], name
        for field, (lo, hi) in g.ranges.items():
            assert field in numeric_fields() and field in F.FITTED
            assert lo < getattr(g, field) < hi, f"{name}.{field}"
            assert getattr(g, field) == pytest.approx((lo + hi) / 2, abs=1e-9), f"{name}.{field}: not the midpoint"
            assert (lo, hi) == rates[name][field].range
            assert "midpoint" in rates[name][field].how  # the record says the value is the midpoint
    for name, g in catalog.items():
        if name not in ranged:
            assert "ranges" not in raw[name] and g.ranges == {}


def test_at_range_end_gives_either_end(catalog):
    g = catalog["L40S"]
    lo, hi = g.ranges["eff_attention"]
    assert at_range_end(g, "low").eff_attention == lo and at_range_end(g, "high").eff_attention == hi
    assert at_range_end(g, "mid").eff_attention == pytest.approx(g.eff_attention, abs=1e-12)
    assert at_range_end(g, "low").eff_matmul == g.eff_matmul  # only ranged fields move
    h = catalog["H100-SXM"]
    assert at_range_end(h, "high") == h
    with pytest.raises(ValueError, match="range end 'top'"):
        at_range_end(g, "top")


def test_bad_ranges_fail_clearly(catalog):
    g = catalog["L40S"]
    with pytest.raises(Exception, match="'eff_atention' is not a numeric field.*did you mean 'eff_attention'"):
        dataclasses.replace(g, ranges={"eff_atention": (0.5, 0.6)})
    with pytest.raises(Exception, match=r"eff_attention is \[0.7, 0.6\]; give \[low, high\]"):
        dataclasses.replace(g, ranges={"eff_attention": (0.7, 0.6)})
    # a measured rate (a profile) replaces the range of that field
    m = g.measured({"eff_attention": 0.5})
    assert "eff_attention" not in m.ranges and m.is_measured("eff_attention")
    assert isinstance(m, GPUType)
