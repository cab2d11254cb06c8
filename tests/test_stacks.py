"""Software stacks (data/stacks.yaml, hexiseq.specs.stacks): the file's schema, the default stack
has no factor, the factors act where efficiencies become rates (costmodel/kernels.py), every
published point runs on its source's stack with no correction private to the validation study, the
public path (`hexiseq estimate --stack`) gives the validation benchmark's prediction, and the
fitted factors in the file are those fit.yaml records."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from hexiseq import load_cluster
from hexiseq.cli import main
from hexiseq.costmodel import CostOptions
from hexiseq.costmodel.kernels import rates, work_times
from hexiseq.errors import SpecError
from hexiseq.specs import load_gpu_catalog, model_catalog
from hexiseq.specs.files import data_path
from hexiseq.specs.stacks import DEFAULT_STACK_NAME, get_stack, load_stacks, stack_catalog
from hexiseq.validation import fidelity as F


@pytest.fixture(scope="module")
def data():
    return F.load_kernels(), F.load_published(), F.load_fit()


@pytest.fixture(scope="module")
def after(data):
    return F.calibration(load_gpu_catalog(), data[2], data[0], data[1], "after")


def test_the_default_stack_is_explicit():
    stacks = stack_catalog()
    assert CostOptions().stack == stacks[DEFAULT_STACK_NAME] == get_stack(None) == get_stack(DEFAULT_STACK_NAME)
    assert stacks["reference-bf16"].is_identity  # the catalog's rates as they are
    with pytest.raises(SpecError, match="unknown stack 'te-fp9'.*te-fp8"):
        get_stack("te-fp9")


def test_the_default_stack_runs_the_flash_attention_2_kernels(data):
    """fa2-bf16's attention factors are the FA2 kernel long-block fractions over the catalog's
    eff_attention (kernels.yaml), so its H100:A100 attention ratio is the kernels' (about 1.72)."""
    kernels, catalog = data[0], load_gpu_catalog()
    st = stack_catalog()[DEFAULT_STACK_NAME]
    frac = {}
    for gpu, entry in (("H100-SXM", "fa2-h100-fwdbwd-causal-hd128"), ("A100-80GB", "fa2-a100-fwdbwd-causal-hd128")):
        e = F.kernel_entry(kernels, entry)
        R, _ = F.block_curve_fit(e["seq_len"], e["value"])
        frac[gpu] = R / catalog[gpu].peak_bf16_tflops
        assert st.factors(gpu)[2] * catalog[gpu].eff_attention == pytest.approx(frac[gpu], abs=1e-4), gpu
    h, a = (catalog[g] for g in ("H100-SXM", "A100-80GB"))
    ratio = (h.attention_flops * st.factors(h.name)[2]) / (a.attention_flops * st.factors(a.name)[2])
    assert ratio == pytest.approx(1.72, abs=0.01)


def test_the_loader_refuses_an_undefined_default_and_unknown_keys(tmp_path):
    raw = yaml.safe_load(data_path("stacks.yaml").read_text())
    del raw["stacks"][DEFAULT_STACK_NAME]
    bad = tmp_path / "stacks.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match="not defined"):
        load_stacks(bad)
    raw = yaml.safe_load(data_path("stacks.yaml").read_text())
    raw["stacks"]["te-fp8"]["every_gpu"]["layer_gem"] = 2.0
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match="layer_gem"):
        load_stacks(bad)


def test_factors_scale_the_rates_in_one_place():
    gpus = [load_gpu_catalog()[n] for n in ("H100-SXM", "A100-80GB")]
    base, fp8, tri = (rates(gpus, get_stack(n)) for n in ("reference-bf16", "te-fp8", "llmfoundry-triton-2023"))
    gain = stack_catalog()["te-fp8"].every_gpu.layer_gemm
    assert fp8.layer_matmul == pytest.approx(base.layer_matmul * gain) and (fp8.matmul == base.matmul).all()
    factor = stack_catalog()["llmfoundry-triton-2023"].every_gpu.attention
    assert tri.attention == pytest.approx(base.attention * factor) and (tri.layer_matmul == base.layer_matmul).all()


def test_every_source_has_one_stack_and_fp8_points_run_fp8_gemms(data):
    for p in F.load_points(data[1]):
        st = stack_catalog()[p.stack]
        assert p.source in st.used_by, p.id
        assert (st.factors(p.gpu)[1] > 1.0) == p.fp8, f"{p.id}: fp8 {p.fp8} but stack {p.stack}"


def test_no_correction_is_private_to_the_validation_study(data, after):
    """The kernel times a prediction uses are the cost model's own on the point's stack."""
    for p in F.load_points(data[1]):
        got = F.predict(p, after)
        opts = CostOptions(stack=get_stack(p.stack))
        s = F.setup(p, after.gpus[p.gpu])
        w = work_times([after.gpus[p.gpu]] * s.arrays.R, p.model, opts)
        again = F.predict(s, dataclasses.replace(after, stacks={p.stack: opts.stack}))
        assert again.tokens_per_s_per_gpu == got.tokens_per_s_per_gpu, p.id
        assert w.pair[0] == pytest.approx(
            p.model.attention_flops_per_pair / (after.gpus[p.gpu].attention_flops * opts.stack.factors(p.gpu)[2])
        )


def _public(p: F.Point) -> bool:
    """Points `hexiseq estimate` can express: one replica, no tensor parallelism, one sequence per
    micro-step, a catalog GPU and model."""
    return (
        p.dp == p.tp == p.pp == p.micro_batch == 1
        and p.gpu in load_gpu_catalog()
        and p.model.name in model_catalog()
        and p.model == model_catalog()[p.model.name]
    )


def test_published_points_through_hexiseq_estimate_give_the_benchmark_prediction(data, after, tmp_path, capsys):
    points = [p for p in F.load_points(data[1]) if _public(p)]
    assert points, "no published point hexiseq estimate can express"
    for p in points:
        replica, _ = F.clusters_of(p, after.gpus[p.gpu])
        cluster = tmp_path / f"{p.id}.yaml"
        nodes = [{"gpu": n.gpu.name, "count": n.count, "nic_gbps": n.nic_gbps} for n in replica.nodes]
        cluster.write_text(yaml.safe_dump({"name": replica.name, "nodes": nodes}))
        layout = {"cp": "ring", "none": "ring", "hp": "ulysses"}.get(p.family, f"usp:{p.cp}x{p.hp}")
        argv = ["estimate", "--cluster", str(cluster), "--model", p.model.name, "--seq-len", str(p.seq_len)]
        argv += ["--layout", layout, "--recompute", p.recompute, "--sharding", p.sharding, "--block-size", "1"]
        argv += ["--global-batch", str(F.workload_of(p).global_batch), "--stack", p.stack, "--json"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        per_gpu = out["tokens_per_s"] / p.replica_gpus
        assert per_gpu == pytest.approx(F.predict(p, after).tokens_per_s_per_gpu, rel=1e-9), p.id


def test_the_default_stack_is_said(tmp_path, capsys):
    argv = ["estimate", "--cluster", "testbed-8", "--seq-len", "32K", "--layout", "ring", "--json"]
    assert main(argv) == 0
    assert f"stack: {DEFAULT_STACK_NAME} assumed" in capsys.readouterr().err


def test_fitted_factors_in_the_file_are_the_recorded_fit(data):
    record = data[2]["fit"]
    for name, rec in record["stack_attention"].items():
        assert stack_catalog()[name].every_gpu.attention == pytest.approx(rec["value"], abs=1e-4)
    for gpu, rec in record["extra_gpus"].items():
        near = data[1]["extra_gpus"][gpu]["closest_catalog_key"]
        base = load_gpu_catalog()[near]
        (stack,) = [st for st in stack_catalog().values() if gpu in st.gpus]
        f = stack.gpus[gpu]
        assert f.matmul * base.eff_matmul == pytest.approx(rec["eff_matmul"], abs=2e-4)
        assert f.attention * base.eff_attention == pytest.approx(rec["eff_attention"], abs=2e-4)
    fp8 = data[2]["fp8_speedup"]["value"]
    assert stack_catalog()["te-fp8"].every_gpu.layer_gemm == pytest.approx(fp8, abs=1e-4)
    assert F.fp8_speedup(data[0]) == pytest.approx(fp8, abs=1e-4)


def test_a_measured_rate_takes_no_stack_factor():
    # A profile measured the user's own stack: the default stack's FA2 factor must not apply twice.
    stack = get_stack(DEFAULT_STACK_NAME)
    cluster = load_cluster("testbed-8")
    h100 = cluster.devices[0].gpu
    assert stack.factors(h100.name)[2] != 1.0  # the default stack does correct the catalog's H100
    measured = cluster.with_profile({h100.name: {"eff_attention": 0.5}}).devices[0].gpu
    assert measured.is_measured("eff_attention") and not measured.is_measured("eff_matmul")
    r_catalog, r_measured = rates([h100], stack), rates([measured], stack)
    assert r_measured.attention[0] == pytest.approx(h100.peak_bf16_tflops * 1e12 * 0.5, rel=1e-12)
    assert r_measured.matmul[0] == r_catalog.matmul[0]  # the unmeasured field keeps the stack's factor
