"""Every number of the GPU catalog has a source: each numeric field of every GPU in data/gpus.yaml is
written out (none silently defaulted) and cites a key of data/validation/sources.yaml; the kernel
priors are what kernels.yaml gives (fidelity.kernel_priors) and the efficiencies what the recorded
fit (data/validation/fit.yaml) wrote."""

from __future__ import annotations

import pytest
import yaml

from hexiseq.specs import load_gpu_catalog
from hexiseq.specs.files import data_path
from hexiseq.specs.gpus import numeric_fields
from hexiseq.validation import fidelity as F


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(data_path("gpus.yaml").read_text())


@pytest.fixture(scope="module")
def sources():
    return yaml.safe_load((data_path("validation") / "sources.yaml").read_text())


def test_every_numeric_field_is_written_and_cited(raw, sources):
    fields = numeric_fields()
    assert {
        "eff_matmul",
        "eff_attention",
        "eff_hbm",
        "attn_block_half_keys",
        "overlap_slowdown",
        "link_efficiency",
        "nic_efficiency",
    } <= set(fields)
    for name, entry in raw.items():
        missing = [f for f in fields if f not in entry]
        assert not missing, f"gpus.yaml {name}: {missing} not written (a default would be an uncited number)"
        cited = entry.get("sources", {})
        uncited = [f for f in fields if f not in cited]
        assert not uncited, f"gpus.yaml {name}: no source for {uncited}"
        unknown = {f: k for f, k in cited.items() if k not in sources}
        assert not unknown, f"gpus.yaml {name}: source keys not in data/validation/sources.yaml: {unknown}"


def test_project_citations_say_where_and_what(sources):
    for key in (F.FIT_KEY, F.PRIOR_KEY):
        assert sources[key]["where"] and sources[key]["used"], key


def test_priors_are_what_the_kernel_evidence_gives(raw):
    catalog = load_gpu_catalog()
    priors = F.kernel_priors(F.load_kernels(), catalog)
    for name, entry in raw.items():
        for field, prior in priors[name].items():
            assert entry[field] == pytest.approx(prior.value, abs=1e-9), (
                f"{name}.{field}: rerun bench_fidelity.py --refit"
            )
            assert entry["sources"][field] == prior.source, f"{name}.{field}"


def test_efficiencies_are_the_recorded_fit(raw):
    """Fitted GPUs and their NEAREST carry fit.yaml's values; the GPUs with no published training
    run (RATE_GPUS) carry the kernel-measurement rates instead, checked against kernels.yaml."""
    record = F.load_fit()
    rates = F.catalog_rates(F.load_kernels(), load_gpu_catalog())
    recorded = F.load_kernels()["recommended_priors"]["catalog_rates"]
    assert set(rates) == set(F.RATE_GPUS) == set(recorded)
    assert not set(F.RATE_GPUS) & set(F.NEAREST)
    checked = {"fit": 0, "kernels": 0}
    for name, entry in raw.items():
        fit = record["fit"]["gpus"][name]
        for field in F.FITTED:
            assert entry[field] == pytest.approx(fit[field], abs=1e-9), (
                f"{name}.{field}: rerun bench_fidelity.py --refit"
            )
            if name in F.RATE_GPUS:
                assert entry[field] == pytest.approx(rates[name][field].value, abs=1e-9), f"{name}.{field}"
                assert entry[field] == pytest.approx(recorded[name][field]["value"], abs=1e-9), f"{name}.{field}"
                assert entry["sources"][field] == F.RATE_KEY
                checked["kernels"] += 1
            else:
                assert entry["sources"][field] == F.FIT_KEY
                checked["fit"] += 1
        assert fit["from"] == "fitted" or name in F.NEAREST or name in F.RATE_GPUS, name
    assert checked["kernels"] == 2 * len(F.RATE_GPUS) and checked["fit"] > 0
