"""`hexiseq profile` (hexiseq/calibrate/profile.py): a real 2-rank world measured briefly; the file
round-trips, `hexiseq estimate --profile` reads it; the bundled reference profile and the CPU catalog
written from it agree; bad input is refused before any rank starts."""

import json

import pytest
import yaml

from hexiseq.calibrate import Profile, profile
from hexiseq.calibrate.compare_dp import cost_cluster
from hexiseq.calibrate.cpu_types import catalog_text, with_derived_types
from hexiseq.calibrate.profile import resolve_world
from hexiseq.cli import main
from hexiseq.costmodel import simulate
from hexiseq.errors import HexiSeqError, SpecError
from hexiseq.plan import ring_plan
from hexiseq.specs import ClusterSpec, Workload, get_model, load_cluster, load_gpu_catalog, load_profile
from hexiseq.specs.files import data_path
from hexiseq.specs.gpus import numeric_fields

FIELDS = {
    "peak_bf16_tflops",
    "eff_matmul",
    "eff_attention",
    "attn_block_half_keys",
    "hbm_bandwidth_gbps",
    "eff_hbm",
    "link_bandwidth_gbps",
    "link_latency_us",
    "op_overhead_us",
}


@pytest.fixture(scope="module")
def measured():
    return profile(world=2, quick=True, repeats=1)


def test_profile_measures_every_field_of_the_world(measured):
    (name,) = measured.gpus  # one device type: two local ranks
    g = measured.gpus[name]
    assert FIELDS <= set(g)
    assert (
        g["peak_bf16_tflops"] > 0 and 0 < g["eff_matmul"] <= 1 and 0 < g["eff_attention"] <= 1 and 0 < g["eff_hbm"] <= 1
    )
    assert g["link_bandwidth_gbps"] > 0 and g["link_latency_us"] > 0 and g["op_overhead_us"] >= 0
    m = measured.measured
    assert m["world"]["ranks"] == 2 and m["world"]["types"] == [name, name] and m["machine"]["cores"]
    assert m["when"] and m["command"].startswith("hexiseq profile") and m["load_average"]["before"] is not None
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and len(m["links"]) == 1


def test_profile_round_trips_and_the_cost_model_reads_it(measured, tmp_path, capsys):
    path = measured.save(tmp_path / "p.yaml")
    assert path.read_text().startswith("# yaml-language-server: $schema=../schemas/profile.schema.json")
    back = Profile.load(path)
    assert back.gpus == load_profile(path) == measured.gpus
    assert back.measured["world"] == measured.measured["world"]
    (name,) = measured.gpus
    cluster_file = tmp_path / "two.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": [{"gpu": name, "count": 2, "nic_gbps": 1}]}))
    assert (
        main(
            [
                "estimate",
                "--cluster",
                str(cluster_file),
                "--model",
                "tiny",
                "--seq-len",
                "2048",
                "--layout",
                "ring",
                "--recompute",
                "none",
                "--block-size",
                "64",
                "--profile",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)["iteration_time_s"]
    c = ClusterSpec.from_nodes("two", [(name, 2, 1.0)])
    want = simulate(
        ring_plan([0, 1], 2048, 8, 4, block_size=64),
        measured.apply(c),
        get_model("tiny"),
        Workload(2048, 1, "none", "zero3", 64),
    ).iteration_time_s
    assert got == pytest.approx(want, rel=1e-9)
    assert measured.cluster().gpu_types == {name: 2}


def test_the_cpu_catalog_is_written_from_the_reference_profile():
    ref = data_path("profiles") / "cpu-4.yaml"
    prof = Profile.load(ref)
    assert prof.measured["world"]["cluster"] == "cpu-4" and set(prof.gpus) == {"CPU-x4", "CPU-x10"}
    assert data_path("gpus-cpu.yaml").read_text() == catalog_text(prof, "data/profiles/cpu-4.yaml"), (
        "data/gpus-cpu.yaml is stale: python -m hexiseq.calibrate.cpu_types data/profiles/cpu-4.yaml"
    )
    cat = load_gpu_catalog(data_path("gpus-cpu.yaml"))
    sources = yaml.safe_load((data_path("validation") / "sources.yaml").read_text())
    raw = yaml.safe_load(data_path("gpus-cpu.yaml").read_text())
    for name, entry in raw.items():
        assert set(numeric_fields()) <= set(entry) and set(entry["sources"]) == set(numeric_fields()), name
        assert all(k in sources for k in entry["sources"].values()), name
    base = cat["CPU-x1"]
    for name, g in cat.items():
        f = float(name.removeprefix("CPU-x"))
        assert g.peak_bf16_tflops == pytest.approx(base.peak_bf16_tflops / f, rel=1e-3)
        assert g.hbm_bandwidth_gbps == pytest.approx(base.hbm_bandwidth_gbps / f, rel=1e-3)
        assert (g.eff_matmul, g.eff_attention, g.link_bandwidth_gbps) == (
            base.eff_matmul,
            base.eff_attention,
            base.link_bandwidth_gbps,
        )


def test_a_slowed_rank_takes_f_times_as_long_per_operator():
    """emulated_clusters.at_factor / derived_type: rates over f, the per-operator time times f, and back."""
    from dataclasses import replace

    from hexiseq.calibrate.emulated_clusters import at_factor, derived_type

    base = replace(load_gpu_catalog(data_path("gpus-cpu.yaml"))["CPU-x1"], op_overhead_us=5.0)
    x4 = derived_type(base, 4.0)
    assert x4.op_overhead_us == 20.0 and x4.peak_bf16_tflops == pytest.approx(base.peak_bf16_tflops / 4)
    fields = {"peak_bf16_tflops": 2.0, "op_overhead_us": 3.0, "eff_hbm": 0.5}
    assert at_factor(at_factor(fields, 10.0), 0.1) == pytest.approx(fields)
    assert at_factor(fields, 10.0) == {"peak_bf16_tflops": 0.2, "op_overhead_us": 30.0, "eff_hbm": 0.5}


def test_a_profile_describes_the_cpu_types_it_did_not_measure_by_the_catalogs_rule():
    """cpu-8's CPU-x8 and CPU-x20 from a profile of cpu-4 (CPU-x4, CPU-x10): the catalog's figures of
    them (written from that profile, 4 significant digits), and the profile's own figures untouched;
    a type that is not an emulated CPU type is not invented."""
    prof = Profile.load(data_path("profiles") / "cpu-4.yaml")
    cat = load_gpu_catalog(data_path("gpus-cpu.yaml"))
    ext = with_derived_types(prof, ["CPU-x4", "CPU-x8", "CPU-x20", "H100-SXM"])
    assert set(ext.gpus) == {"CPU-x4", "CPU-x10", "CPU-x8", "CPU-x20"} and ext.gpus["CPU-x4"] == prof.gpus["CPU-x4"]
    for name in ("CPU-x8", "CPU-x20"):
        for key, value in ext.gpus[name].items():
            assert value == pytest.approx(getattr(cat[name], key), rel=1e-3), (name, key)
    assert ext.gpus["CPU-x8"]["peak_bf16_tflops"] == pytest.approx(2.5 * ext.gpus["CPU-x20"]["peak_bf16_tflops"])
    assert with_derived_types(prof, ["CPU-x4"]) is prof
    cpu8 = cost_cluster(load_cluster("cpu-8"), prof, {"peak_bf16_tflops": 0.5})
    assert cpu8.devices[0].gpu.peak_bf16_tflops == pytest.approx(0.5 * ext.gpus["CPU-x8"]["peak_bf16_tflops"])


def test_bad_worlds_are_refused_before_any_work(tmp_path):
    with pytest.raises(SpecError, match="cluster file not found: nope"):
        resolve_world(None, "nope")
    with pytest.raises(HexiSeqError, match="world of 8 ranks, but cluster 'cpu-4' has 4 devices"):
        resolve_world(8, "cpu-4")
    with pytest.raises(HexiSeqError, match="leaves devices 2..3 of cluster 'cpu-4' unmeasured"):
        resolve_world(2, "cpu-4")
    with pytest.raises(SpecError, match="can only emulate the CPU types"):
        resolve_world(None, "testbed-8")
    with pytest.raises(HexiSeqError, match="positive number of ranks"):
        resolve_world(0, None)
    out = tmp_path / "p.yaml"
    out.write_text("x")
    with pytest.raises(SystemExit):  # argparse refuses --world 0 with its rule
        main(["profile", "--world", "0"])
    assert main(["profile", "--world", "2", "--out", str(out)]) == 2  # exists, no --force: refused, nothing measured
    assert out.read_text() == "x"


def test_a_profile_with_an_unknown_type_or_key_is_refused(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("gpus:\n  CPU-x3: {peak_bf16_tflops: 0.1}\n")
    with pytest.raises(SpecError, match="CPU-x3 is not a GPU type of the catalog"):
        Profile.load(p)
    p.write_text("gpus:\n  CPU-x4: {peak_bf16_tflops: 0.1}\nmeasure: {}\n")
    with pytest.raises(SpecError, match="measure"):
        Profile.load(p)


def test_the_attention_blocks_per_row_cost_leaves_out_their_operators(monkeypatch):
    """measure_attention: a block's time = its operators at the per-operator time + the keys' work
    (+ a per-row cost): the operators' part is not a per-row cost (the cost model charges it per
    operator, costmodel/operators.py); a true per-row cost is still found. Synthetic times, no timing."""
    from types import SimpleNamespace

    import torch

    from hexiseq.calibrate import measure

    cfg = SimpleNamespace(heads=8, kv_heads=4, head_dim=16)
    lq, lks = measure.attention_blocks(2048, 8)
    assert lks == [lq // 4, lq // 2, lq, 2 * lq]
    ops = measure.operators_of(measure._attention_fwd_bwd(lq, lks[0], "full", cfg, torch.Generator().manual_seed(0)))
    op_us, per_key = 40.0, 2e-5

    def block_s(lk: int, per_row_keys: float) -> float:
        return ops * op_us * 1e-6 + per_key * (lk + per_row_keys)

    for per_row_keys, want in ((0.0, 0.0), (50.0, 50.0)):
        monkeypatch.setattr(measure, "_timed_together", lambda fns, r, k=per_row_keys: [block_s(x, k) for x in lks])
        monkeypatch.setattr(measure, "_timed", lambda fn, r, stat=min: 1.0)  # the forward and causal blocks
        att = measure.measure_attention(cfg, 2048, 8, 1, 1.0, torch.Generator().manual_seed(0), op_us)
        assert att["half_keys"] == pytest.approx(want, abs=1e-6) and att["operators"] == ops
        assert att["tflops"] == pytest.approx(2 * 4.0 * 16 * 8 * lq / per_key / 1e12, rel=1e-9)
    # without the per-operator time, the operators' fixed cost reads as a per-row cost of ops x op_us / per_key keys
    monkeypatch.setattr(measure, "_timed_together", lambda fns, r: [block_s(x, 0.0) for x in lks])
    att = measure.measure_attention(cfg, 2048, 8, 1, 1.0, torch.Generator().manual_seed(0))
    assert att["half_keys"] == pytest.approx(ops * op_us * 1e-6 / per_key, rel=1e-6)


def test_one_stretched_block_timing_moves_neither_the_attention_rate_nor_its_per_row_cost():
    """measure.fit_attention: one of four timings stretched (as one CPU-x4 rank's 64-key block was, 7.6
    ms against its partner's 5.7 ms in a cpu-4 profile) leaves the fitted rate and per-row cost exact,
    where the two-point slope the profile used before was 2-3x off; profile.type_attention fits all the
    type's ranks at once, so a rank stretched on every length, beside two calm ones, does not move the
    type's figures either, where the fastest timing of each length over the ranks does. Synthetic
    times, no timing."""
    from hexiseq.calibrate.measure import attention_blocks, fit_attention
    from hexiseq.calibrate.profile import type_attention

    lq, lks = attention_blocks(2048, 8)
    ops, op_us, per_key, per_row_keys, per_pair = 75, 55.0, 27.6e-6, 20.0, 4.0 * 16 * 8
    exact = [ops * op_us * 1e-6 + per_key * (lk + per_row_keys) for lk in lks]
    want = fit_attention(lq, [list(zip(lks, exact))], per_pair, 2.5, ops, op_us)
    assert want["half_keys"] == pytest.approx(per_row_keys, rel=1e-9)
    assert want["tflops"] == pytest.approx(3.5 * per_pair * lq / per_key / 1e12, rel=1e-9)
    for i in range(len(lks)):
        stretched = [t * (1.35 if j == i else 1.0) for j, t in enumerate(exact)]
        got = fit_attention(lq, [list(zip(lks, stretched))], per_pair, 2.5, ops, op_us)
        assert got["tflops"] == pytest.approx(want["tflops"], rel=1e-9)
        assert got["half_keys"] == pytest.approx(per_row_keys, rel=1e-9)
        two_point = (stretched[lks.index(lq)] - stretched[0]) / (lq - lks[0])
        if i in (0, lks.index(lq)):  # the old fit's two lengths: 2-3x off
            assert not 0.5 < two_point / per_key < 2.0

    def record(scale: list[float], fixed_s: float = 0.0) -> dict:
        blocks = [
            {"kind": "full", "lq": lq, "lk": lk, "seconds": t * x + fixed_s} for lk, t, x in zip(lks, exact, scale)
        ]
        blocks.append({"kind": "causal", "lq": lq, "lk": lq, "seconds": 1.0})
        return {"blocks": blocks, "per_pair_flops": per_pair, "bwd_factor": 2.5, "operators": ops}

    # ranks whose fixed costs differ (a rank 1 ms slower per block) and one rank stretched throughout
    calm, slower, busy = record([1.0] * 4), record([1.0] * 4, 1e-3), record([1.6, 1.2, 1.1, 1.05])
    got = type_attention([busy, calm, slower], op_us)
    assert got["tflops"] == pytest.approx(want["tflops"], rel=1e-9)
    # the fastest timing of each length over the ranks mixes ranks: here the long blocks come from the
    # ranks 1 ms slower per block, and the slope from that step
    long_stretched = record([1.0, 1.0, 1.3, 1.3])
    ranks = [long_stretched, slower, record([1.0] * 4, 1e-3)]
    assert type_attention(ranks, op_us)["tflops"] == pytest.approx(want["tflops"], rel=1e-9)
    fastest = [min(r["blocks"][j]["seconds"] for r in ranks) for j in range(len(lks))]
    mixed = fit_attention(lq, [list(zip(lks, fastest))], per_pair, 2.5, ops, op_us)["tflops"]
    assert abs(mixed / want["tflops"] - 1) > 0.1
    # one stretched timing on one rank of two
    one = record([1.0, 1.35, 1.0, 1.0])
    assert type_attention([one, calm], op_us)["tflops"] == pytest.approx(want["tflops"], rel=1e-9)


def _paced_latency(rank: int, world: int) -> dict:
    """One rank of an emulated two-rank world (f = 4, no emulated link): measure_paced_latency."""
    from hexiseq.calibrate.measure import PACED_MESSAGES, measure_paced_latency
    from hexiseq.runtime import emulation as emu

    with emu.activate(emu.Emulation((4.0, 4.0)), rank) as pacer:
        got = measure_paced_latency(world, rank, lambda peer: True)
        return {"latency": got, "messages": pacer.stats.messages, "ops": pacer.stats.ops, "timed": PACED_MESSAGES}


def test_an_emulated_worlds_latency_is_timed_between_paced_ranks():
    """measure.measure_paced_latency: the pair's exchanges come after paced work (operators charged and
    slept off), the first rank of the pair reports its mean in microseconds; profile.rank_figures takes
    it as the link's latency where it exists, the ping-pong's elsewhere."""
    from hexiseq.calibrate.profile import rank_figures
    from hexiseq.runtime.world import spawn_world

    r0, r1 = spawn_world(_paced_latency, 2, timeout_s=120)
    skip, timed = r0["timed"]
    assert set(r0["latency"]) == {(0, 1)} and r1["latency"] == {}
    assert 0.0 < r0["latency"][(0, 1)] < 1e6  # a mean of real exchanges, in microseconds
    assert r0["ops"] >= (skip + timed) * 20  # every message after its paced work
    pair = {"a": 0, "b": 1, "latency_us": 250.0, "gbps": 1.0}
    m = {
        "matmul": {"layer_tflops": 1.0, "square": {"tflops": 1.0}, "lm_head": {"tflops": 1.0}},
        "attention": {"tflops": 0.5, "half_keys": 1.0},
        "memory": {"gbps": 1.0, "copy": {"gbps": 2.0}, "op_us": 5.0},
    }
    assert rank_figures(m, [pair])["link_latency_us"] == 250.0
    assert rank_figures(m, [{**pair, "paced_latency_us": 2500.0}])["link_latency_us"] == 2500.0
