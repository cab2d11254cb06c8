"""`hexiseq calibrate` (hexiseq/calibrate/calibrate.py, plans.py): the quick calibration really runs its
plans (emulated cpu-4 ranks, the bundled profile) and reports every one with all fields; the fit is
deterministic and recovers known multipliers; bad input is refused before any rank starts. The
accuracy target is a benchmark (benchmarks/bench_calibrate.py), not a unit test."""

import json
import os

import pytest

from hexiseq.calibrate.calibrate import (
    FITTED,
    cores_used,
    fit,
    fitted_keys,
    measured_devices,
    predict,
    predict_with_devices,
    scaled_cluster,
)
from hexiseq.calibrate.plans import calibration_plans, side_by_side
from hexiseq.cli import main
from hexiseq.errors import HexiSeqError
from hexiseq.specs import get_model, load_cluster
from hexiseq.specs.files import data_path

ROW_KEYS = {
    "plan",
    "measured_s",
    "predicted_before_s",
    "predicted_after_s",
    "error_before",
    "error_after",
    "split",
    "recompute",
    "shape",
    "pacing_overrun",
    "run_dir",
}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    import contextlib
    import io

    out = tmp_path_factory.mktemp("cal") / "runs"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(
            [
                "calibrate",
                "--cluster",
                "cpu-4",
                "--quick",
                "--json",
                "--profile",
                str(data_path("profiles") / "cpu-4.yaml"),
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    return json.loads(buf.getvalue()), out


def test_quick_calibration_reports_every_plan(quick):
    d, out = quick
    rows = d["rows"]
    assert len(rows) >= 6 and {r["recompute"] for r in rows} == {"none", "selective", "full"}
    assert {"fit", "held-out"} == {r["split"] for r in rows}
    for r in rows:
        assert ROW_KEYS <= set(r), r["plan"]
        assert r["measured_s"] > 0 and r["predicted_before_s"] > 0 and r["predicted_after_s"] > 0
        assert r["error_after"] == pytest.approx(r["predicted_after_s"] / r["measured_s"] - 1)
    assert set(d["factors"]) == set(FITTED) | {"peak_bf16_tflops@CPU-x10"} and d["emulated"] is True
    assert d["stats"]["all_after"]["plans"] == len(rows)
    for r in rows:  # each rank's device time after the warm-up, fitted and reported
        assert len(r["measured_device_s"]) == 4 and min(r["measured_device_s"]) > 0, r["plan"]
        assert len(r["device_errors_after"]) == 4
    assert d["stats"]["all_devices_after"]["ranks"] == 4 * len(rows)
    for r in rows:  # the device type of each of those ranks
        assert len(r["device_types"]) == 4 and set(r["device_types"]) <= {"CPU-x4", "CPU-x10"}, r["plan"]
    by_type = d["stats"]["devices_after_by_type"]
    assert sum(t["ranks"] for t in by_type.values()) == 4 * len(rows)
    assert json.loads((out / "calibration.json").read_text())["rows"] == rows


def test_every_calibration_run_is_a_labelled_emulated_run(quick):
    d, _ = quick
    for r in d["rows"]:
        s = json.loads(open(f"{r['run_dir']}/summary.json").read())
        assert s["status"] == "completed" and s["emulated"] is True
        assert s["emulation"]["slowdown"] == [4.0, 4.0, 10.0, 10.0] and s["emulation"]["links"] == [
            {"gbps": 0.05, "latency_us": 1000.0}
        ]
        assert len(s["emulation"]["pacing"]) == 4 and s["measured_step_time_s"] == r["measured_s"]
        for p in s["emulation"]["pacing"]:  # the steps after the warm-up, apart: 3 steps, 2 of warm-up
            m = p["measured"]
            assert m["steps"] == s["measured_steps"] == 1 and 0 < m["ops"] < p["ops"] and 0 < m["cpu_s"] < p["cpu_s"]
            # the process's CPU over the paced step covers at least its operators' sampled CPU
            assert m["raw_cpu_s"] <= m["process_cpu_s"] and 0 < m["block_wall_s"] < p["block_wall_s"]
        # four ranks on this machine: at least their operators' CPU, at most every core
        used = cores_used(s)
        assert used is not None and 0 < used <= (os.cpu_count() or 1) + 0.1
        assert measured_devices(s) == pytest.approx(r["measured_device_s"])
        assert s["prediction"]["step_time_s"] == pytest.approx(r["predicted_before_s"])
        assert "emulating cluster cpu-4" in s["measured_on"]


def test_the_plan_set_covers_the_shapes():
    plans = calibration_plans(8192, 8, 4, 64)
    assert len(plans) >= 6 and len({p.name for p in plans}) == len(plans)
    shapes = {(p.plan.num_groups, max(g.size for g in p.plan.groups)) for p in plans}
    assert {(4, 1), (1, 4), (2, 2)} <= shapes  # CP, HP, CP x HP
    for policy in ("none", "selective", "full"):
        assert sum(p.recompute == policy for p in plans) >= 2
    even = [
        p
        for p in plans
        if len({g.chunk_len for g in p.plan.groups}) == 1 and all(len(set(g.shards)) == 1 for g in p.plan.groups)
    ]
    assert 1 <= len(even) < len(plans)
    assert all(p.plan.world_size == 4 for p in plans)
    # data-parallel replicas of one rank each, fitted and held out, their shares the plan's global batch
    dp = [p for p in plans if p.plan.num_replicas == 4]
    assert {p.fit for p in dp} == {True, False}
    assert all(sum(p.plan.sequences_of(p.global_batch)) == p.global_batch for p in dp)


def test_fit_reproduces_step_times_made_with_known_multipliers():
    """Measurements made by the cost model itself with other figures (a per-operator time included):
    the fit (deterministic) finds figures that reproduce every plan's time, the held-out ones
    included, far better than none."""
    c, m = load_cluster("cpu-4"), get_model("tiny")
    c = c.with_profile({"CPU-x4": {"op_overhead_us": 20.0}, "CPU-x10": {"op_overhead_us": 50.0}})  # 5 us x f
    plans = calibration_plans(8192, 8, 4, 64)
    truth = {"peak_bf16_tflops": 0.75, "eff_hbm": 0.5, "link_latency_us": 2.0, "op_overhead_us": 2.0}
    measured = [predict(scaled_cluster(c, truth), m, p) for p in plans]
    fit_on = [i for i, p in enumerate(plans) if p.fit]
    got = fit(c, m, [plans[i] for i in fit_on], [measured[i] for i in fit_on])
    after = [predict(scaled_cluster(c, got), m, p) / t - 1 for p, t in zip(plans, measured)]
    before = [predict(c, m, p) / t - 1 for p, t in zip(plans, measured)]
    assert max(map(abs, after)) < 0.03 < min(map(abs, before))


def test_fit_on_device_times_reproduces_every_rank():
    """With each rank's device time beside the step times (made by the cost model with other figures),
    the fit reproduces every rank's device time of every plan, held-out ones included: the step alone
    is the slowest rank's, the device times tell the fast ranks' large operators from the slow ranks'
    small ones, and one type's compute rate from the other's (the per-type multiplier)."""
    c, m = load_cluster("cpu-4"), get_model("tiny")
    plans = calibration_plans(2048, 8, 4, 32)
    truth = {"peak_bf16_tflops": 0.8, "eff_hbm": 1.5, "link_latency_us": 1.3, "op_overhead_us": 1.8}
    truth["peak_bf16_tflops@CPU-x10"] = 1.2  # the second type's compute rate off against the first's
    made = [predict_with_devices(scaled_cluster(c, truth), m, p) for p in plans]
    fit_on = [i for i, p in enumerate(plans) if p.fit]
    got = fit(c, m, [plans[i] for i in fit_on], [made[i][0] for i in fit_on], [made[i][1] for i in fit_on])
    for p, (step, dev) in zip(plans, made):
        a_step, a_dev = predict_with_devices(scaled_cluster(c, got), m, p)
        assert a_step == pytest.approx(step, rel=0.02), p.name
        assert a_dev == pytest.approx(dev, rel=0.02), p.name
        assert len(dev) == p.plan.world_size and min(dev) > 0


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--cluster", "nope"], "cluster file not found: nope"),
        (["--cluster", "mixed-4"], "can only emulate the CPU types"),
        (["--world", "3"], "calibrate runs its plans on 4 ranks"),
        (["--cluster", "cpu-4", "--steps", "2"], "--steps must exceed the 2 warm-up steps"),
        (["--compare"], "--compare needs an emulated heterogeneous --cluster"),
        (["--calibration", "x.json"], "--calibration is reused by --compare"),
        (["--cluster", "cpu-4", "--profile", "nope.yaml"], "nope.yaml"),
    ],
)
def test_bad_input_is_refused_before_any_work(argv, msg, capsys, tmp_path):
    assert main(["calibrate", *argv, "--out", str(tmp_path / "out")]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_profile_of_other_devices_is_refused(tmp_path, capsys):
    p = tmp_path / "p.yaml"
    p.write_text("gpus:\n  CPU-x1: {peak_bf16_tflops: 0.1}\n")
    assert main(["calibrate", "--cluster", "cpu-4", "--profile", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "the profile has no figures for CPU-x4, CPU-x10" in capsys.readouterr().err
    with pytest.raises(HexiSeqError, match="heads over 4 ranks in whole KV heads"):
        calibration_plans(8192, 8, 2, 64)


def test_plans_run_side_by_side_on_a_cluster_of_two_even_nodes():
    """On two nodes of 2k devices each, every calibration plan runs k times at once: copy c on devices
    2c, 2c+1 of each node, each replica with its own sequences, parameters replicated."""
    from hexiseq.calibrate.calibrate import copies_side_by_side
    from hexiseq.plan import ShardingStage

    cpu8 = load_cluster("cpu-8")
    assert copies_side_by_side(cpu8) == 2 and copies_side_by_side(load_cluster("cpu-4")) == 1
    for cp in calibration_plans(2048, 8, 4, 32, "cpu-8", "tiny"):
        two = side_by_side(cp, 2)
        assert two.plan.world_size == 8 and two.plan.num_replicas == 2 * cp.plan.num_replicas
        assert two.global_batch == 2 * cp.global_batch and two.fit == cp.fit and two.recompute == cp.recompute
        assert two.plan.sharding.stage == ShardingStage.REPLICATED
        n = cp.plan.num_replicas
        for c, where in enumerate(([0, 1, 4, 5], [2, 3, 6, 7])):
            for i in range(n):
                mine, orig = two.plan.replica(c * n + i), cp.plan.replica(i)
                assert [g.devices for g in mine.groups] == [tuple(where[d] for d in g.devices) for g in orig.groups]
                assert [(g.chunk_len, g.shards, g.heads) for g in mine.groups] == [
                    (g.chunk_len, g.shards, g.heads) for g in orig.groups
                ]
        two.plan.check(cpu8)
        assert side_by_side(cp, 1) is cp


def test_the_calibration_reports_each_device_types_signed_device_time_error():
    """Calibration.device_errors_by_type: each rank's device-time error after the fit, grouped by the
    rank's device type with its sign kept (a type whose profiled figures are off shows as a bias the
    shared multipliers cannot remove); rows without types count nowhere; the summary prints it."""
    from hexiseq.calibrate.calibrate import Calibration
    from hexiseq.calibrate.profile import Profile

    rows = [
        {"split": "fit", "measured_s": 1.0, "predicted_after_s": 1.0, "device_errors_after": [-0.1, -0.05, 0.06, 0.08],
         "device_types": ["CPU-x8", "CPU-x8", "CPU-x20", "CPU-x20"]},
        {"split": "fit", "measured_s": 1.0, "predicted_after_s": 1.0, "device_errors_after": [-0.2, 0.0, 0.1, -0.12],
         "device_types": ["CPU-x8", "CPU-x8", "CPU-x20", "CPU-x20"]},
        {"split": "fit", "measured_s": 1.0, "predicted_after_s": 1.0, "device_errors_after": [0.5, 0.5, 0.5, 0.5]},
    ]  # fmt: skip
    cal = Calibration(rows, {}, {"peak_bf16_tflops": 1.0}, Profile({}), "cpu-8", "tiny", 2048, 6, "/tmp/x")
    by = cal.device_errors_by_type()
    assert by["CPU-x8"] == {"median": pytest.approx(-0.075), "worst": pytest.approx(0.2), "ranks": 4}
    assert by["CPU-x20"] == {"median": pytest.approx(0.07), "worst": pytest.approx(0.12), "ranks": 4}
    assert "by device type (median, worst): CPU-x8 -7.5% / 20.0% (4 ranks), CPU-x20 +7.0% / 12.0% (4 ranks)" in (
        cal.summary()
    )


def test_a_per_type_multiplier_scales_only_its_type():
    """scaled_cluster: `field` scales every type, `field@TYPE` that type once more; fitted_keys names one
    per device type after the first."""
    c = load_cluster("cpu-4")
    got = scaled_cluster(c, {"peak_bf16_tflops": 0.5, "peak_bf16_tflops@CPU-x10": 1.5})
    peak = {d.gpu.name: d.gpu.peak_bf16_tflops for d in c.devices}
    new = {d.gpu.name: d.gpu.peak_bf16_tflops for d in got.devices}
    assert new["CPU-x4"] == pytest.approx(0.5 * peak["CPU-x4"]) and new["CPU-x10"] == pytest.approx(
        0.75 * peak["CPU-x10"]
    )
    assert fitted_keys(c) == [*FITTED, "peak_bf16_tflops@CPU-x10"]
