"""The data-parallel comparison on the CPU emulation (hexiseq/calibrate/compare_dp.py, behind
benchmarks/bench_dp.py): the joint plan, the best DP x symmetric baseline, the best one with equal
shares and DP = 1 really run on emulated ranks, each predicted by the step model with the
calibration's figures. Its accuracy and which plan is measured fastest depend on the machine and its
load: a benchmark, not a unit test."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from hexiseq.calibrate.calibrate import FITTED, cores_used, device_times, measured_devices, operator_load
from hexiseq.calibrate.compare import calibration_source, other_machine
from hexiseq.calibrate.compare_dp import _same_run, compare_dp, cost_cluster, device_check, operator_fit
from hexiseq.calibrate.profile import Profile, machine
from hexiseq.costmodel.step import estimate_step
from hexiseq.errors import HexiSeqError
from hexiseq.plan import Plan, Sharding, ring_plan
from hexiseq.specs import Workload, get_model, load_cluster
from hexiseq.specs.files import data_path


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """A calibration.json of cpu-4: the bundled profile, multipliers of 1 (no fit: the figures as profiled)."""
    prof = Profile.load(data_path("profiles") / "cpu-4.yaml")
    path = tmp_path_factory.mktemp("cal") / "calibration.json"
    record = {"cluster": "cpu-4", "model": "tiny", "factors": dict.fromkeys(FITTED, 1.0), "profile": prof.to_dict()}
    path.write_text(json.dumps(record))
    return path


def test_three_plans_run_and_are_predicted_by_the_step_model(calibration, tmp_path):
    G, S = 3, 512
    cmp = compare_dp("cpu-4", calibration, seq_len=S, global_batch=G, steps=3, out=tmp_path / "cdp", say=lambda s: None)
    assert [r["system"] for r in cmp.rows] == ["joint", "dp-baseline", "dp-even", "dp1"]
    assert len(set(cmp.row("dp-even")["shares"].split(":"))) == 1  # the even split: every replica G / DP
    prof = Profile.load(data_path("profiles") / "cpu-4.yaml")
    cost = cost_cluster(load_cluster("cpu-4"), prof, dict.fromkeys(FITTED, 1.0))
    runs = json.loads((tmp_path / "cdp" / "comparison-dp.json").read_text())
    assert runs["rows"] == json.loads(json.dumps(cmp.rows, default=float))
    for r in cmp.rows:
        assert r["measured_s"] > 0 and sum(map(int, r["shares"].split(":"))) == G
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert len(r["replicas"]) == len(r["shares"].split(":"))
        run = Path(r["run_dir"])  # a plan equal to one already run shares that run (its row says so)
        assert run.name == r.get("same_as", r["system"])
        plan = Plan.load(run / "plan.json")  # the run's plan: recorded for cpu-4 itself
        assert plan.validate(load_cluster("cpu-4")) == []
        plan = replace(plan, meta={k: v for k, v in plan.meta.items() if k != "cluster_fingerprint"})
        wl = Workload(S, G, r["recompute"], "replicated", plan.block_size)
        assert estimate_step(plan, cost, get_model("tiny"), wl).step_time_s == pytest.approx(r["predicted_s"], rel=1e-9)
        # the busiest emulated device, from the run's own pacing record
        summary = json.loads((run / "summary.json").read_text())
        assert r["operator_load"] == operator_load(summary, 3)
        assert r["operator_load"]["ops_per_step"] > 0 and r["operator_load"]["device_s_per_step"] > 0
        # each rank's device time per step: the model's per replica, and the median run's pacing record
        assert r["predicted_device_s"] == pytest.approx(device_times(plan, cost, get_model("tiny"), wl), rel=1e-9)
        median = json.loads((Path(r["median_run_dir"]) / "summary.json").read_text())
        assert r["measured_device_s"] == measured_devices(median) and len(r["measured_device_s"]) == r["ranks"]
        # the cores its ranks used: the most over its runs, from the pacing record
        assert r["cores_used"] == cores_used(summary)  # one trial: its run's
        assert 0 < r["cores_used"] <= cmp.cores + 0.1
    # the planner is never worse than the plans it is compared with, by its own model
    joint = cmp.row("joint")["predicted_s"]
    assert joint <= cmp.row("dp-baseline")["predicted_s"] * (1 + 1e-9)
    assert joint <= cmp.row("dp1")["predicted_s"] * (1 + 1e-9)
    assert cmp.row("dp-baseline")["predicted_s"] <= cmp.row("dp-even")["predicted_s"] * (1 + 1e-9)
    assert cmp.chosen == "joint"
    assert "measured fastest" in cmp.summary() and "busiest device: rank" in cmp.summary()
    assert "each rank's device time per step, predicted / measured" in cmp.summary()
    assert "over the measured steps (their processes' CPU" in cmp.summary()
    # recomputed from the finished directory (python -m hexiseq.calibrate.compare_dp DIR): the same
    (tmp_path / "cdp" / "calibration").mkdir()
    (tmp_path / "cdp" / "calibration" / "calibration.json").write_text(calibration.read_text())
    again = {e["system"]: e for e in device_check(tmp_path / "cdp")}
    for r in cmp.rows:
        if not r.get("same_as"):
            assert again[r["system"]]["predicted_device_s"] == pytest.approx(r["predicted_device_s"], rel=1e-9)
            assert again[r["system"]]["measured_device_s"] == r["measured_device_s"]
            types = again[r["system"]]["types"]
            assert len(types) == r["ranks"] and set(types) <= {"CPU-x4", "CPU-x10"}


def test_the_busiest_device_is_the_one_with_most_emulated_time():
    """operator_load reads the pacing record: f x CPU per step decides, not the operator count."""
    pacing = [
        {"ops": 4000, "cpu_s": 2.0},  # f = 4: 2.0 s emulated per step over 4 steps
        {"ops": 1000, "cpu_s": 1.0},  # f = 10: 2.5 s, fewer operators
        {},  # a rank without a record is passed over
    ]
    summary = {"emulation": {"slowdown": [4.0, 10.0, 20.0], "pacing": pacing}}
    got = operator_load(summary, 4)
    assert got == {
        "rank": 1,
        "factor": 10.0,
        "ops_per_step": 250.0,
        "cpu_us_per_op": pytest.approx(1000.0),
        "device_s_per_step": pytest.approx(2.5),
        "after_warmup": 0.0,
        "host_exposed_s": 0.0,  # a record from before these fields: none
        "link_wait_s": 0.0,
        "link_sleep_s": 0.0,
    }
    assert operator_load({}, 4) is None
    # with the record of the steps after the warm-up, those steps count: rank 0's 1.6 s per step beats
    # rank 1's 0.5 s there, whatever the warm-up did
    pacing[0]["measured"] = {"ops": 2000, "cpu_s": 0.8, "steps": 2, "host_exposed_s": 0.3, "link_wait_s": 0.1}
    pacing[1]["measured"] = {"ops": 200, "cpu_s": 0.1, "steps": 2}
    got = operator_load(summary, 4)
    assert got["rank"] == 0 and got["after_warmup"] == 1.0
    assert got["device_s_per_step"] == pytest.approx(1.6) and got["ops_per_step"] == 1000.0
    # and the rest of that rank's step, per step of the same record
    assert (got["host_exposed_s"], got["link_wait_s"], got["link_sleep_s"]) == pytest.approx((0.15, 0.05, 0.0))


def test_bad_input_is_refused_before_any_run(calibration, tmp_path):
    with pytest.raises(HexiSeqError, match="global batch of 2 or more"):
        compare_dp("cpu-4", calibration, global_batch=1, out=tmp_path / "a")
    with pytest.raises(HexiSeqError, match="warm-up"):
        compare_dp("cpu-4", calibration, steps=2, out=tmp_path / "b")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(calibration.read_text()), "cluster": "cpu-8"}))
    with pytest.raises(HexiSeqError, match="calibrated cpu-8 with tiny, not cpu-4"):
        compare_dp("cpu-4", other, out=tmp_path / "c")
    assert not any((tmp_path / d).exists() for d in "abc")


def test_the_operator_fit_recovers_a_known_per_operator_cost():
    """Misses made exactly 10 us x f x operators - 0.5 s are fitted back: slope, intercept, r = 1."""

    def row(f, ops):
        return {
            "measured_s": 3.0 + 10e-6 * f * ops - 0.5,
            "predicted_s": 3.0,
            "operator_load": {"factor": f, "ops_per_step": ops},
        }

    runs = [SimpleNamespace(rows=[row(10.0, 13_000), row(10.0, 1_800)]), SimpleNamespace(rows=[row(20.0, 14_800)])]
    fit = operator_fit(runs)
    assert fit["runs"] == 3
    assert fit["slope_s"] == pytest.approx(10e-6) and fit["intercept_s"] == pytest.approx(-0.5)
    assert fit["r"] == pytest.approx(1.0)
    assert operator_fit(runs[1:]) is None  # one run: nothing to fit


def test_a_plan_is_run_once_whatever_its_name():
    """compare_dp's `_same_run`: the planner's choice equal to the baseline (other name, model, meta)
    is the same run; another sharding or share is not."""
    reps = [ring_plan([d], 512, 8, 4, block_size=32) for d in range(2)]
    a = Plan.joint(reps, [2, 1], Sharding("zero2", "node"), name="joint")
    b = replace(a, name="dp x ring", model="tiny", meta={"partition": "baseline"})
    assert _same_run(a, b)
    assert not _same_run(a, Plan.joint(reps, [2, 1], Sharding("zero1", "node")))
    assert not _same_run(a, Plan.joint(reps, [1, 2], Sharding("zero2", "node")))


def test_trials_run_in_turning_rounds_and_the_median_run_counts(calibration, tmp_path, monkeypatch):
    """With trials = 3 every distinct plan runs three times, each round in an order turned by one, and
    a row takes the median of its runs, with that run's own records (a fake run: no world is spawned)."""
    import hexiseq.calibrate.compare_dp as cdp

    calls: list[str] = []
    times = iter([3.0, 2.0, 1.0, 9.0, 5.0, 4.0, 2.5, 7.0, 8.0, 6.0, 1.5, 3.5])

    def fake_run(plan, spec, policy, predicted, path, model, steps, timeout_s, global_batch=1):
        calls.append(path.name)
        return {"measured_step_time_s": next(times), "replicas": [], "tag": path.name}

    monkeypatch.setattr(cdp, "run_plan", fake_run)
    cmp = compare_dp(
        "cpu-4", calibration, seq_len=512, global_batch=3, steps=3, trials=3, out=tmp_path, say=lambda s: None
    )
    systems = [r["system"] for r in cmp.rows if not r.get("same_as")]
    n = len(systems)
    assert len(calls) == 3 * n
    rounds = [[c.split("-trial")[0] for c in calls[t * n : (t + 1) * n]] for t in range(3)]
    for t, order in enumerate(rounds):
        assert order == systems[t % n :] + systems[: t % n]
    assert calls[:n] == systems  # round 1 writes each plan's own directory, later rounds -trial2, -trial3
    for r in cmp.rows:
        assert len(r["trials_s"]) == 3 and r["measured_s"] == sorted(r["trials_s"])[1]
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        # the records (here: each replica's measured compute, which a fake run takes from its own
        # step time) are the median run's, not another run's
        assert {q["measured_compute_s"] for q in r["replicas"]} == {r["measured_s"]}
    assert "runs of each plan in interleaved rounds" in cmp.summary() and "spread" in cmp.summary()
    with pytest.raises(HexiSeqError, match="trials must be 1 or more"):
        compare_dp("cpu-4", calibration, trials=0, out=tmp_path / "z")


def test_each_cluster_is_calibrated_on_its_own_world_or_a_slice_of_its_device_types():
    """cpu-4 and cpu-8 (two nodes of an even count) are calibrated on themselves; a cluster of unequal
    nodes on two ranks of its first node and two of its last, with their types, links and the
    inter-node latency; a cluster without two nodes of two devices is refused, saying why."""
    from hexiseq.calibrate.compare_dp import calibration_slice
    from hexiseq.specs import ClusterSpec

    cpu4, cpu8 = load_cluster("cpu-4"), load_cluster("cpu-8")
    assert calibration_slice(cpu4) is cpu4 and calibration_slice(cpu8) is cpu8
    uneven = ClusterSpec.from_nodes("uneven", [("CPU-x8", 3, 0.05), ("CPU-x4", 1, 0.5), ("CPU-x20", 2, 0.05)])
    part = calibration_slice(uneven)
    assert part.name == "uneven-slice" and part.size == 4
    assert [d.gpu.name for d in part.devices] == ["CPU-x8", "CPU-x8", "CPU-x20", "CPU-x20"]
    assert [d.node for d in part.devices] == [0, 0, 1, 1]
    assert part.inter_node_latency_us == uneven.inter_node_latency_us
    assert [n.nic_gbps for n in part.nodes] == [0.05, 0.05]
    one = ClusterSpec.from_nodes("one-node", [("CPU-x4", 4, 0.05)])
    with pytest.raises(HexiSeqError, match="two nodes of at least two devices each"):
        calibration_slice(one)


def test_the_in_window_calibration_runs_in_the_rounds_and_makes_the_predictions(calibration, tmp_path, monkeypatch):
    """With recalibrate, the calibration's plans run again on the same profile, plan k in round
    k mod trials after that round's compared plans, each once; the fit of those runs predicts every
    row, and the figures the plans were chosen by stay beside it (`planned_s`, the planner's choice).
    Fake runs and a fake fit: no world is spawned."""
    import importlib

    import hexiseq.calibrate.compare_dp as cdp

    calmod = importlib.import_module("hexiseq.calibrate.calibrate")  # the module, not the package's function
    calls: list[tuple[str, object]] = []
    ran: dict[str, Plan] = {}

    def fake_run(plan, spec, policy, predicted, path, model, steps, timeout_s, global_batch=1):
        calls.append(("plan", path.name.split("-trial")[0]))
        ran[path.name.split("-trial")[0]] = plan
        return {"measured_step_time_s": 2.0, "replicas": []}

    def fake_calibration(runs, indices, *, timeout_s, say):
        for i in indices:
            calls.append(("cal", i))
            (Path(runs.jobs[i].run_dir) / "summary.json").write_text(json.dumps({"measured_step_time_s": 1.0 + i}))

    window_factors = {"peak_bf16_tflops": 0.5, "eff_hbm": 2.0, "link_latency_us": 1.5, "op_overhead_us": 0.75}
    fitted_on: list[list[float]] = []

    def fake_fit(cluster, model, plans, measured, devices=None):
        fitted_on.append(list(measured))
        return dict(window_factors)

    monkeypatch.setattr(cdp, "run_plan", fake_run)
    monkeypatch.setattr(cdp, "run_calibration", fake_calibration)
    monkeypatch.setattr(calmod, "fit", fake_fit)
    G, S, trials = 3, 1024, 2  # the calibration plans need 768+ tokens
    cmp = compare_dp(
        "cpu-4", calibration, seq_len=S, global_batch=G, steps=3, trials=trials, recalibrate=True, out=tmp_path,
        say=lambda s: None,
    )  # fmt: skip
    window = json.loads((tmp_path / "calibration-in-window" / "calibration.json").read_text())
    n_cal = len(window["rows"])
    systems = [r["system"] for r in cmp.rows if not r.get("same_as")]
    n = len(systems)
    # each round: the compared plans, then its share of the calibration plans; every one runs once
    expected: list[tuple[str, object]] = []
    for t in range(trials):
        expected += [("plan", s) for s in systems[t % n :] + systems[: t % n]]
        expected += [("cal", i) for i in range(t, n_cal, trials)]
    assert calls == expected
    fit_rows = [r for r in window["rows"] if r["split"] == "fit"]
    assert fit_rows and fitted_on == [[r["measured_s"] for r in fit_rows]]
    assert cmp.factors == window_factors and cmp.planning_factors == dict.fromkeys(FITTED, 1.0)
    # every row predicted with the window's figures; planned_s with those the plans were chosen by
    prof = Profile.load(data_path("profiles") / "cpu-4.yaml")
    spec, tiny = load_cluster("cpu-4"), get_model("tiny")
    now, then = cost_cluster(spec, prof, window_factors), cost_cluster(spec, prof, dict.fromkeys(FITTED, 1.0))
    for r in cmp.rows:
        plan = ran[r.get("same_as", r["system"])]  # recorded for cpu-4 itself: its fingerprint left out
        plan = replace(plan, meta={k: v for k, v in plan.meta.items() if k != "cluster_fingerprint"})
        wl = Workload(S, G, r["recompute"], "replicated", plan.block_size)
        assert r["predicted_s"] == pytest.approx(estimate_step(plan, now, tiny, wl).step_time_s, rel=1e-9)
        assert r["planned_s"] == pytest.approx(estimate_step(plan, then, tiny, wl).step_time_s, rel=1e-9)
        assert r["predicted_s"] != pytest.approx(r["planned_s"], rel=1e-3)
    # the planner's choice is by the planning figures, whatever the window's predictions say
    assert cmp.chosen == min(cmp.rows, key=lambda r: r["planned_s"])["system"] == "joint"
    assert "in-window" in cmp.summary() and "planning calibration's multipliers" in cmp.summary()


def test_a_calibration_from_another_machine_is_named_as_such():
    here = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "torch": "2.13.0+cpu", "memory_gib": 23.5}
    record = {"profile": {"measured": {"machine": {**here, "memory_gib": 31.0}}}}
    assert other_machine(record, here) is None  # memory does not move a rank's speed
    record["profile"]["measured"]["machine"].update(cpu="AMD EPYC", cores=4)
    assert other_machine(record, here) == "cpu AMD EPYC there, Intel(R) Xeon(R) Processor here, cores 4 there, 2 here"
    assert other_machine({"profile": {"measured": {}}}, here) is None  # not recorded: nothing to say

    # the reports name it: a calibration that records a machine other than this one
    record = json.loads(json.dumps({"profile": {"measured": {"machine": {**machine(), "cpu": "Some other CPU"}}}}))
    said: list[str] = []
    source = calibration_source("cal/cpu-4", record, said.append)
    assert source.startswith("cal/cpu-4, measured on another machine (cpu Some other CPU there, ")
    assert "the predictions are that machine's" in source and said == [f"warning: --calibration {source}"]
    record["profile"]["measured"]["machine"] = machine()
    assert calibration_source("cal/cpu-4", record, said.append) == "cal/cpu-4" and len(said) == 1
