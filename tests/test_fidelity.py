"""The cost model against published points (hexiseq.validation.fidelity): the mapping builds valid
plans for every point, one point reproduces a hand computation, the DP / micro-batch / TP / FP8 /
attention-kernel rules do what the module doc says, the statistics, and the recorded fit is the
fit of the model as it is."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

from hexiseq.costmodel import CostOptions
from hexiseq.links import ring_allgather_s
from hexiseq.specs import GPUType, ModelSpec, load_gpu_catalog
from hexiseq.specs.stacks import DEFAULT_STACK_NAME, Stack, StackFactors
from hexiseq.validation import fidelity as F

ROOT = Path(__file__).resolve().parent.parent
FREE = CostOptions(ignore_comm=True)


@pytest.fixture(scope="module")
def data():
    return F.load_kernels(), F.load_published(), F.load_fit()


@pytest.fixture(scope="module")
def points(data):
    return F.load_points(data[1])


@pytest.fixture(scope="module")
def after(data):
    return F.calibration(load_gpu_catalog(), data[2], data[0], data[1], "after")


def by_id(points, pid):
    return next(p for p in points if p.id == pid)


# ------------------------------------------------------------------------------ the mapping


def test_every_point_maps_to_a_valid_plan(points, after):
    assert len(points) == 58  # 43 + the 15 points of the unseen sources (XTuner 11, Odysseus-Transformer 4)
    for p in points:
        assert p.cp * p.hp * p.tp * p.dp * p.pp == p.num_gpus, p.id
        plan = F.plan_of(p)
        replica, job = F.clusters_of(p, after.gpus[p.gpu])
        plan.check(replica, p.model, F.workload_of(p))
        assert plan.world_size == replica.size == p.cp * p.hp, p.id
        assert job.size == p.cp * p.hp * p.dp, p.id
        assert plan.num_groups == {"none": 1, "cp": p.cp, "hp": 1, "hybrid": p.cp}[p.family], p.id
        q = F.predict(p, after)
        assert math.isfinite(q.tokens_per_s_per_gpu) and q.tokens_per_s_per_gpu > 0, p.id


def test_unpublished_configuration_is_assumed_and_said(points):
    ds = by_id(points, "dsulysses-a100-40gb-gpt7b-64k")
    assert (ds.hp, ds.dp, ds.recompute) == (8, 4, "full")
    assert {"hp", "dp", "recompute", "global_sequences"} <= set(ds.assumed)
    assert "Ulysses degree 8" in F.assumptions(ds)
    tt = by_id(points, "torchtitan-h100hbm2e-llama3.1-8b-128k")
    assert tt.assumed == () and F.assumptions(tt) == "" and tt.recompute == "full" and tt.fp8
    assert F.excluded_reason(by_id(points, "llama3-405b-h100-128k")).startswith("pipeline parallelism (pp=16)")
    assert not by_id(points, "usp-a800-llama3-8b-208k").judged  # grade C


def _tiny_gpu(**kw) -> GPUType:
    base = dict(
        name="T",
        peak_bf16_tflops=100.0,
        memory_gib=80.0,
        hbm_bandwidth_gbps=1000.0,
        link_kind="nvlink4",
        link_bandwidth_gbps=100.0,
        link_latency_us=5.0,
        eff_matmul=0.5,
        eff_attention=0.25,
        eff_hbm=0.8,
        attn_block_half_keys=100.0,
        overlap_slowdown=0.1,
        link_efficiency=0.9,
        nic_efficiency=0.9,
    )
    return GPUType(**{**base, **kw})


def _stacks(fp8: float = 1.7, triton: float | None = None) -> dict[str, Stack]:
    """The default stack, an FP8-GEMM stack ("fp8") and, given a factor, a Triton-attention stack ("triton")."""
    out = {
        DEFAULT_STACK_NAME: Stack(name=DEFAULT_STACK_NAME, description="t"),
        "fp8": Stack(name="fp8", description="t", every_gpu=StackFactors(source="t", how="t", layer_gemm=fp8)),
    }
    if triton is not None:
        out["triton"] = Stack(
            name="triton", description="t", every_gpu=StackFactors(source="t", how="t", attention=triton)
        )
    return out


def _tiny_point(**kw) -> F.Point:
    model = ModelSpec(name="tiny", layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1000)
    base = dict(
        id="tiny",
        source="test",
        gpu="T",
        num_gpus=2,
        nodes=1,
        gpus_per_node=8,
        nic_gbps=25.0,
        model=model,
        seq_len=4096,
        global_sequences=4,
        micro_batch=1,
        family="none",
        cp=1,
        hp=1,
        tp=1,
        dp=2,
        pp=1,
        recompute="none",
        sharding="zero3",
        fp8=False,
        published=1000.0,
        alt=None,
        quality="A",
        split="fit",
    )
    return F.Point(**{**base, **kw})


def test_one_point_reproduces_a_hand_computation():
    """No sequence split, 2 data-parallel replicas, no transfers: every duration by hand from the
    kernel model's definitions (kernels.py doc)."""
    g, p = _tiny_gpu(), _tiny_point()
    cal = F.Calibration({"T": g}, _stacks(), options=FREE)
    m, S = p.model, p.seq_len
    h, H, Hkv, d, f, V = m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab
    Rm, Ra, Rh = 100e12 * 0.5, 100e12 * 0.25, 1000e9 * 0.8
    lin = 2 * (h * H * d + 2 * h * Hkv * d + H * d * h + 3 * h * f)  # forward FLOPs per token per layer
    qk = (H + Hkv) * d
    mem_f = 2 * (2 * h + 2 * qk) + 2 * (3 * h + 2 * h + 3 * f + 3 * h)  # bytes per token: norms, RoPE, adds, SwiGLU
    mem_b = 2 * (3 * h + 2 * qk) + 2 * (3 * h + 3 * h + 5 * f + 3 * h)
    L, tile, hk = S // 2, 128, 100.0
    att_f = H * ((L * (2 * L + 1) + L * tile) + 3 * L * hk) * 4 * d / Ra  # one group: round 0's three blocks
    layer = S * (3 * lin / Rm + (mem_f + mem_b) / Rh) + 3.5 * att_f  # forward + backward (2x matmul, 2.5x attention)
    head = S * (3 * 2 * h * V / Rm + V * 12.0 / Rh)
    optimizer = m.param_count / 2 * 28.0 / Rh  # sharded over the 2 replicas
    seqs = 2  # per replica
    expected = seqs * S / (seqs * (m.layers * layer + head) + optimizer)
    assert F.predict(p, cal).tokens_per_s_per_gpu == pytest.approx(expected, rel=1e-9)


def test_dp_parameter_collectives_span_the_job(points, after):
    p = by_id(points, "torchtitan-h100hbm2e-llama3.1-8b-64k")  # cp 2 x dp 4 = 8 ranks of one node, FSDP
    s = F.setup(p, after.gpus[p.gpu])
    g = after.gpus[p.gpu]
    bw, lat = g.link_bandwidth_gbps * 1e9 * g.link_efficiency, g.link_latency_us * 1e-6
    layer = 2.0 * p.model.params_per_layer
    assert s.job_ranks == 8
    assert s.params.sharding == "zero3"
    assert s.params.ag_layer == pytest.approx(ring_allgather_s(layer, 8, bw, lat), rel=1e-12)
    assert s.params.ag_layer > ring_allgather_s(layer, 2, bw, lat)  # not the plan's own two ranks


def test_micro_batches_change_nothing_without_transfers():
    cal = F.Calibration({"T": _tiny_gpu()}, _stacks(), options=FREE)
    one = F.predict(_tiny_point(global_sequences=12), cal).tokens_per_s_per_gpu
    three = F.predict(_tiny_point(global_sequences=12, micro_batch=3), cal).tokens_per_s_per_gpu
    assert three == pytest.approx(one, rel=1e-12)
    with_comm = F.Calibration({"T": _tiny_gpu()}, _stacks())  # with FSDP gathers: fewer micro-steps, fewer gathers
    assert (
        F.predict(_tiny_point(global_sequences=12, micro_batch=3), with_comm).iteration_s
        <= F.predict(_tiny_point(global_sequences=12), with_comm).iteration_s
    )


def test_tensor_parallel_group_scales_perfectly_but_for_its_collectives():
    g = _tiny_gpu()
    free = F.Calibration({"T": g}, _stacks(), options=FREE)
    base = F.predict(_tiny_point(), free)
    tp2 = F.predict(_tiny_point(tp=2, num_gpus=4), free)
    assert tp2.tokens_per_s_per_gpu == pytest.approx(base.tokens_per_s_per_gpu, rel=1e-9)
    # with transfers, but the parameter collectives made free, the difference is the TP collectives
    cal = F.Calibration({"T": g}, _stacks())
    s1, s2 = F.setup(_tiny_point(), g), F.setup(_tiny_point(tp=2, num_gpus=4), g)
    s1, s2 = (
        dataclasses.replace(s, params=dataclasses.replace(s.params, ag_layer=0, rs_layer=0, ag_root=0, rs_root=0))
        for s in (s1, s2)
    )
    p = s2.point
    per_token = 0.5 * p.model.hidden * 2 / (g.link_bandwidth_gbps * 1e9 * g.link_efficiency)
    tp_s = 2 * 4 * per_token * p.seq_len * p.model.layers * 2  # 4 collectives each way, per layer, 2 sequences
    assert F.predict(s2, cal).iteration_s - F.predict(s1, cal).iteration_s / 2 == pytest.approx(tp_s, rel=1e-6)


def test_fp8_and_the_attention_kernel_scale_their_own_phase():
    g = _tiny_gpu()
    cal = F.Calibration({"T": g}, _stacks(triton=0.5), options=FREE)
    bf16, fp8 = F.predict(_tiny_point(), cal), F.predict(_tiny_point(fp8=True, stack="fp8"), cal)
    assert fp8.phases["linear"] == pytest.approx(bf16.phases["linear"] / 1.7, rel=1e-12)
    assert fp8.phases["lm_head"] == pytest.approx(bf16.phases["lm_head"], rel=1e-12)  # the head stays bf16
    triton = F.predict(_tiny_point(source="llmfoundry_bench", stack="triton"), cal)
    assert triton.phases["attention"] == pytest.approx(bf16.phases["attention"] / 0.5, rel=1e-12)
    assert triton.phases["linear"] == pytest.approx(bf16.phases["linear"], rel=1e-12)


# ------------------------------------------------------------------------------ evidence helpers and the fit


def test_block_curve_fit_recovers_the_block_model():
    R, hk = 300.0, 150.0
    n = [512, 1024, 2048, 4096, 8192, 16384]
    r = [R * x / (x + 1 + 128 + 2 * hk) for x in n]
    got = F.block_curve_fit(n, r)
    assert got == pytest.approx((R, hk), rel=1e-9)


def test_fp8_speedup_is_the_kernel_ratio(data):
    assert F.fp8_speedup(data[0]) == pytest.approx(1377.3 / 794.5)


def test_grid_search_is_deterministic_and_refines():
    calls = []

    def loss(x, y):
        calls.append((x, y))
        return (x - 0.3137) ** 2 + (y - 0.6021) ** 2

    best, value = F.grid_search(loss, [(0.0, 1.0), (0.0, 1.0)])
    assert best == pytest.approx((0.314, 0.602), abs=1e-9)
    assert F.grid_search(loss, [(0.0, 1.0), (0.0, 1.0)]) == (best, value)


def test_fit_recovers_known_efficiencies(points, after, data):
    """Published values made by the model itself at known efficiencies come back from the fit."""
    pts = [
        by_id(points, i)
        for i in ("llmfoundry-a100-mpt-3b-16k", "llmfoundry-a100-mpt-7b-32k", "llmfoundry-a100-mpt-13b-16k")
    ]
    truth = after.with_gpu("A100-80GB", eff_matmul=0.62, eff_attention=0.41)
    fake = [dataclasses.replace(p, published=F.predict(p, truth).tokens_per_s_per_gpu) for p in pts]
    fit = F.fit_gpu(fake, after, data[0], steps=(0.05, 0.01))
    assert (fit.eff_matmul, fit.eff_attention) == pytest.approx((0.62, 0.41), abs=1e-9)
    assert fit.loss == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------------------ statistics


def test_statistics_and_pairs():
    s = F.statistics([("a", 1.1), ("b", 0.8), ("c", 1.0)])
    assert (s.n, s.median, s.worst, s.worst_id) == (3, pytest.approx(0.1), pytest.approx(0.2), "b")
    assert F.statistics([]).n == 0
    fast, slow = (
        _tiny_point(id="h", gpu="H100-SXM", pair="x", published=200.0),
        _tiny_point(id="a", gpu="A100-80GB", pair="x", published=100.0),
    )
    preds = [F.Prediction(fast, 360.0, 1.0, {}), F.Prediction(slow, 150.0, 1.0, {})]
    (r,) = F.pair_ratios(preds)
    assert (r.published, r.predicted) == (2.0, 2.4) and r.error == pytest.approx(0.2)
    v = F.verdict([dataclasses.replace(q, point=dataclasses.replace(q.point, split="holdout")) for q in preds])
    assert v.holdout.median == pytest.approx(0.65) and v.ratio_median_error == pytest.approx(0.2)
    assert [f.split()[1] for f in v.failures] == ["median", "worst", "ratio"]
    good = [
        dataclasses.replace(
            q, point=dataclasses.replace(q.point, split="holdout", published=q.tokens_per_s_per_gpu * 1.05)
        )
        for q in preds
    ]
    assert F.verdict(good).failures == []


def test_recorded_fit_is_the_fit_of_this_model(data, points, after):
    """fit.yaml's residuals are today's predictions: a cost-model change needs `bench_fidelity.py --refit`."""
    record = data[2]
    for p in points:
        r = record["residuals"][p.id]
        assert F.predict(p, after).ratio == pytest.approx(r["ratio"], rel=2e-3), (
            f"{p.id}: the cost model moved since the fit; run `python benchmarks/bench_fidelity.py --refit`"
        )
    judged_fit = {p.id for p in points if p.split == "fit" and p.judged}
    used = {i for g in record["fit"]["gpus"].values() for i in g.get("points", [])}
    used |= {i for g in record["fit"]["extra_gpus"].values() for i in g.get("points", [])}
    assert used == judged_fit


def test_bench_reports_and_meets_the_held_out_targets(data):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_fidelity
    finally:
        sys.path.pop(0)
    text, ok = bench_fidelity.report(*data)
    assert "held-out" in text and "H100/A100" in text
    assert ok, text[text.index("Held-out targets") :]


# ------------------------------------------------------------------------------ evidence that can fail


def test_flop_only_reference_fits_its_own_points():
    g = _tiny_gpu()
    pts = [_tiny_point(id=f"p{S}", seq_len=S) for S in (2048, 8192)]
    truth = F.FlopRates("test", "T", 0.4 * 100e12, 0.2 * 100e12, ())
    fake = [dataclasses.replace(p, published=F.flop_only_predict(p, truth)) for p in pts]
    (r,) = F.fit_flop_only(fake, {"T": g}).values()
    for p in fake:  # two rates, two points: the grid fit reproduces them within 2%
        assert F.flop_only_predict(p, r) == pytest.approx(p.published, rel=0.02)


def test_flop_only_comparison_uses_the_same_held_out_points(points, after):
    preds = [F.predict(p, after) for p in points]
    c = F.compare_flop_only(preds, after.gpus)
    held = {p.id for p in points if p.split == "holdout" and p.judged}
    assert set(c.ids) | set(c.uncovered) == held
    assert c.cost_model.n == c.flop_only.n == len(c.ids)
    assert ("does not beat" in c.statement()) == (c.cost_model.median >= c.flop_only.median)


def test_leave_one_source_out_record_covers_every_gpu_with_two_sources(data, points):
    runs = data[2]["leave_one_source_out"]["runs"]
    sources: dict[str, set[str]] = {}
    for p in points:
        if p.judged:
            sources.setdefault(p.gpu, set()).add(p.source)
    want = {(g, s) for g, ss in sources.items() if len(ss) >= 2 for s in ss}
    assert {(r["gpu"], r["left_out"]) for r in runs} == want
    for r in runs:
        assert set(r["ratios"]) == {
            p.id for p in points if p.judged and p.gpu == r["gpu"] and p.source == r["left_out"]
        }
