"""Data-parallel replicas measured on CPU ranks (issue 19): on an emulated cluster, the joint
planner's plan (replicas x sharding x uneven CP x HP, its own batch shares) against the best
DP x symmetric baseline (every DP x ring / Ulysses / USP the baselines build, equal blocks, exact
shares), the best such plan with equal shares (DP dividing the global batch: the even split of a
framework's data parallelism) and DP = 1 HexiSeq (one replica over the planner's devices, gradient
accumulation in time), on the same model and global batch, each run for real on emulated ranks. A
plan equal to one already run (the planner's choice is the baseline itself) is run once: its row
says so and shares the measurement.
With `trials` > 1 every plan runs that many times in rounds (each round in an order turned by one)
and its measured step time is the median of its runs: the machine's own speed drifts by ~10% over
minutes (measured: the same plan 3.52 s in one run, 3.13 s two hours later), more than the gaps the
comparison is about.

With `recalibrate` the predictions come from a second calibration measured in the same minutes as the
runs: the calibration's plans again, on the same profile, plan k in round k mod trials after that
round's compared plans, fitted once all have run (the in-window calibration). The plans are chosen
with the first (planning) calibration, whose predictions stay beside (`planned_s`). It was built to
test whether the misses are the machine drifting between a calibration and the runs after it (on
cpu-8 one calibration fitted the compute rate x1.06 and the joint plan ran 3.531 s; twenty minutes
later another fitted x1.19 and the same plan ran 3.859 s). Measured in three bench_dp runs
(2026-12-05, data/results/dp.txt and README): it predicted no better than the planning calibration,
worse in two of the three (cpu-8 worst 12.0% against 5.9%, 22.0% against 11.6%), so drift is not
what the misses are.

Predictions come from the step model (costmodel/step.py, the one the joint planner optimises) with
this machine's calibrated figures of the cluster's own device types: `calibrate.py` (a profile, four
fitted multipliers) run on `calibration_slice(cluster)` -- the cluster itself when it is two nodes
of an even number of devices (cpu-4, cpu-8), else two ranks of its first node and two of its last
with its links -- measured now or read from a calibration.json. Not
figures derived from another cluster's types: cpu-8's CPU-x8 / CPU-x20 derived from a calibration of
cpu-4's CPU-x4 / CPU-x10 (cpu_types.with_derived_types) left its joint plan 11% short (measured
3.517 s, 2026-12-05); a calibration of its slice predicts 3.590 s (+2.1%). What the runs measure
depends on the machine and its load: the report states both, and each run's pacing overrun (1.00:
the emulation held).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..costmodel.step import estimate_step
from ..errors import HexiSeqError
from ..plan import Plan, Sharding
from ..planner import dp_baselines, plan_joint
from ..runs.config import WARMUP_EXCLUDED
from ..runs.rundir import default_run_dir
from ..specs import ClusterSpec, ModelSpec, NodeSpec, Workload, get_model, load_cluster, write_text_atomic
from .calibrate import (
    calibrate,
    copies_side_by_side,
    cores_used,
    device_times,
    factors_text,
    fit_calibration,
    measured_devices,
    operator_load,
    pacing_overrun,
    prepare_calibration,
    run_calibration,
    scaled_cluster,
)
from .compare import calibration_source, on_emulated, read_calibration, run_plan
from .cpu_types import with_derived_types
from .emulated_clusters import HEADROOM, check_emulated, cpu_factor
from .plans import WORLD
from .profile import DEFAULT_MODEL, Profile, _load


@dataclass
class DPComparison:
    """Measured vs predicted step times of the joint plan, the best DP x symmetric baseline and DP = 1."""

    cluster: str
    model: str
    seq_len: int
    global_batch: int
    steps: int
    rows: list[dict[str, Any]]  # "joint" first, then "dp-baseline", "dp-even" (when one fits), "dp1"
    out: str
    factors: dict[str, float]
    calibration: str
    load_average: dict[str, list[float]] = field(default_factory=dict)
    cores_needed: float = 0.0  # Σ 1/f over the cluster's emulated devices: the cores its ranks take
    cores: int = 0  # this machine's
    trials: int = 1  # runs of each plan, in interleaved rounds; measured_s is their median
    # with an in-window calibration: the planning calibration's multipliers (`factors` are the window's)
    planning_factors: dict[str, float] | None = None
    window: str = ""  # the in-window calibration's summary, when there is one

    def row(self, system: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["system"] == system)

    @property
    def chosen(self) -> str:
        """The planner's choice: the plan of least step time by the figures it was planned with (the
        planning calibration's; the in-window calibration only predicts what was run)."""
        return min(self.rows, key=lambda r: r.get("planned_s", r["predicted_s"]))["system"]

    @property
    def fastest(self) -> str:
        """The plan of least measured step time."""
        return min(self.rows, key=lambda r: r["measured_s"])["system"]

    def speedup(self, over: str, key: str) -> float:
        """The joint plan's speedup over `over` (the step-time ratio), measured or predicted (`key`)."""
        return self.row(over)[key] / self.row("joint")[key]

    @property
    def worst_error(self) -> float:
        return max(abs(r["error"]) for r in self.rows)

    def summary(self) -> str:
        lines = [
            f"{self.cluster} (emulated CPU ranks), {self.model}, S = {self.seq_len:,}, global batch "
            f"{self.global_batch}, {self.steps} steps per run (median after {WARMUP_EXCLUDED} warm-up steps)"
            + (f", {self.trials} runs of each plan in interleaved rounds (their median)" if self.trials > 1 else "")
            + "; load "
            f"average {self.load_average.get('before', [0])[0]:.2f} -> {self.load_average.get('after', [0])[0]:.2f}; "
            f"the ranks need {self.cores_needed:.2f} of {self.cores} cores"
            + (
                f" (more than 1/{HEADROOM:g} of them: the emulation's room for other load, emulated_clusters.HEADROOM, "
                "is not kept)"
                if self.cores_needed > self.cores / HEADROOM
                else ""
            ),
            *(
                [
                    "predicted: with the calibration measured in the same rounds as these runs (in-window); "
                    "planned: with the calibration the plans were chosen by, measured before them"
                ]
                if self.planning_factors is not None
                else []
            ),
            f"{'plan':<12} {'shares':<10} {'sharding':<22} {'predicted s':>11} {'measured s':>10} {'error':>7} "
            f"{'overrun':>7} {'cores':>5}"
            + (f" {'planned s':>9} {'error':>7}" if self.planning_factors is not None else ""),
        ]
        for r in self.rows:
            o, c = r.get("pacing_overrun"), r.get("cores_used")
            lines.append(
                f"{r['system']:<12} {r['shares']:<10} {r['sharding']:<22} {r['predicted_s']:>11.3f} "
                f"{r['measured_s']:>10.3f} {r['error']:>+7.1%} {'' if o is None else f'{o:.2f}':>7} "
                f"{'' if c is None else f'{c:.2f}':>5}"
                + (
                    f" {r['planned_s']:>9.3f} {r['planned_s'] / r['measured_s'] - 1:>+7.1%}"
                    if self.planning_factors is not None
                    else ""
                )
            )
            lines.append(f"    {r['config']}")
            if r.get("same_as"):
                continue  # its run is the twin's, shown above
            if len(r.get("trials_s") or ()) > 1:
                lines.append(
                    f"    runs: {' / '.join(f'{x:.3f}' for x in r['trials_s'])} s (median {r['measured_s']:.3f} s; "
                    f"spread {max(r['trials_s']) / min(r['trials_s']) - 1:.1%}); the records below are the median run's"
                )
            if op := r.get("operator_load"):
                lines.append(
                    f"    busiest device: rank {op['rank']} (f = {op['factor']:g}), {op['ops_per_step']:,.0f} "
                    f"operators per step at {op['cpu_us_per_op']:.1f} us of CPU each: "
                    f"{op['device_s_per_step']:.3f} s emulated per step (mean over "
                    + ("the steps after the warm-up)" if op.get("after_warmup") else "every step, warm-up included)")
                )
                beyond = [op.get(k, 0.0) for k in ("host_exposed_s", "link_wait_s", "link_sleep_s")]
                lines.append(
                    f"    beyond its device time, per step: {beyond[0]:.3f} s of host time nothing hid (waits on "
                    f"exchanges inside a node included), {beyond[1]:.3f} s waiting for emulated links' transfers, "
                    f"{beyond[2]:.3f} s held for them, {r['measured_s'] - op['device_s_per_step'] - sum(beyond):+.3f} "
                    "s elsewhere (the communication calls, the step's edges)"
                )
            if r.get("measured_device_s") and r.get("predicted_device_s"):
                lines.append(
                    "    each rank's device time per step, predicted / measured s: "
                    + " ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(r["predicted_device_s"], r["measured_device_s"]))
                )
            for q in r["replicas"]:
                lines.append(
                    f"    replica {q['replica']} ({q['ranks']} ranks, {q['sequences']} seq): predicted "
                    f"{q['predicted_s']:.3f} s, measured compute {q['measured_compute_s']:.3f} s, waiting "
                    f"{q['measured_waiting_s']:.3f} s"
                )
        crowded = [
            r["system"]
            for r in self.rows
            if (r.get("cores_used") or 0.0) > self.cores / HEADROOM and not r.get("same_as")
        ]
        lines.append(
            f"cores: what the ranks used of this machine's {self.cores} over the measured steps (their processes' CPU "
            "over the steps' wall time, calibrate.cores_used); the device work alone needs "
            f"{self.cores_needed:.2f}"
            + (
                f". Above 1/{HEADROOM:g} of the cores (emulated_clusters.HEADROOM): {', '.join(crowded)}: the "
                "host's work around each operator (Python, autograd, dispatch, the pacer's own; not slowed f "
                "times) crowds the cores, so part of such a step is this machine's, not the emulated cluster's"
                if crowded
                else f"; every plan stayed within 1/{HEADROOM:g} of the cores"
            )
        )
        lines += [
            f"planned (least predicted by its planning figures): {self.chosen}; measured fastest: {self.fastest}",
            f"joint plan's speedup, measured (predicted): over the best DP x symmetric baseline "
            f"{self.speedup('dp-baseline', 'measured_s'):.2f}x ({self.speedup('dp-baseline', 'predicted_s'):.2f}x), "
            + (
                f"over the best even-share DP plan {self.speedup('dp-even', 'measured_s'):.2f}x "
                f"({self.speedup('dp-even', 'predicted_s'):.2f}x), "
                if any(r["system"] == "dp-even" for r in self.rows)
                else ""
            )
            + f"over DP = 1 {self.speedup('dp1', 'measured_s'):.2f}x ({self.speedup('dp1', 'predicted_s'):.2f}x)",
            f"worst prediction error {self.worst_error:.1%} (goal 10%); calibration: {self.calibration}; multipliers "
            + factors_text(self.factors),
        ]
        if self.planning_factors is not None:
            planned = max(abs(r["planned_s"] / r["measured_s"] - 1) for r in self.rows)
            lines.append(
                f"with the planning calibration's multipliers ({factors_text(self.planning_factors)}): worst "
                f"error {planned:.1%}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "model": self.model,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "steps": self.steps,
            "rows": self.rows,
            "chosen": self.chosen,
            "fastest": self.fastest,
            "worst_error": self.worst_error,
            "out": self.out,
            "factors": self.factors,
            "calibration": self.calibration,
            "load_average": self.load_average,
            "cores_needed": self.cores_needed,
            "cores": self.cores,
            "trials": self.trials,
            "planning_factors": self.planning_factors,
            "window": self.window,
            "emulated": True,
        }


def calibration_slice(spec: ClusterSpec) -> ClusterSpec:
    """The world a cluster's device types are calibrated on (calibrate runs its plans on four ranks,
    ranks 0-1 one node and 2-3 another, or several copies of them side by side): the cluster itself
    when it is two nodes of an even number of devices each (cpu-4: one copy; cpu-8: two, so the
    calibration's ranks share the cores as the cluster's runs do); otherwise two devices of the
    first node and two of the last, with their node's links and the cluster's inter-node latency."""
    first, last = spec.nodes[0], spec.nodes[-1]
    if len(spec.nodes) < 2 or first.count < 2 or last.count < 2:
        raise HexiSeqError(
            f"{spec.name}: calibration runs two ranks of its first node and two of its last; it needs two "
            f"nodes of at least two devices each (it has {len(spec.nodes)} node(s) of "
            f"{', '.join(str(n.count) for n in spec.nodes)})"
        )
    if copies_side_by_side(spec) * WORLD == spec.size:
        return spec
    return ClusterSpec(
        f"{spec.name}-slice",
        tuple(NodeSpec(n.gpu, 2, n.nic_gbps, n.link_bandwidth_gbps) for n in (first, last)),
        spec.inter_node_latency_us,
        description=f"the calibration slice of {spec.name}: two ranks of its first node, two of its last",
    )


def calibrated_figures(
    calibration: str | Path | None,
    spec: ClusterSpec,
    *,
    model: str,
    seq_len: int,
    quick: bool,
    out: Path,
    timeout_s: float,
    say: Callable[[str], None],
) -> tuple[Profile, dict[str, float], str]:
    """This machine's figures of `spec`'s emulated device types: a calibration.json of its calibration
    slice read, or one measured now (profile + calibrate on the slice) under `out`."""
    part = calibration_slice(spec)
    if calibration is not None:
        record = read_calibration(calibration, part.name, model)
        return (
            Profile.from_dict(record["profile"]),
            dict(record["factors"]),
            calibration_source(calibration, record, say),
        )
    cal = calibrate(cluster=part, quick=quick, model=model, seq_len=seq_len, out=out, timeout_s=timeout_s, say=say)
    say(cal.summary())
    return cal.profile, dict(cal.factors), f"fitted now on {len(cal.rows)} plans of {part.name} ({cal.out})"


def cost_cluster(spec: ClusterSpec, profile: Profile, factors: dict[str, float]) -> ClusterSpec:
    """`spec` with the calibrated figures of its CPU types: the profile's, with any CPU type it did not
    measure derived from those it did (cpu_types.with_derived_types); refused when it lacks another type."""
    profile = with_derived_types(profile, spec.gpu_types)
    missing = [t for t in spec.gpu_types if t not in profile.gpus]
    if missing:
        raise HexiSeqError(
            f"the calibration's profile has no figures for {', '.join(missing)} of {spec.name}: calibrate a "
            f"cluster of those types"
        )
    return scaled_cluster(profile.apply(spec), factors)


def _replica_rows(est, summary: dict[str, Any]) -> list[dict[str, Any]]:
    measured = {r["replica"]: r for r in summary.get("replicas") or []}
    rows = []
    for r in est.replicas:
        m = measured.get(r.index, {})
        rows.append(
            {
                "replica": r.index,
                "ranks": len(r.devices),
                "sequences": r.sequences,
                "predicted_s": r.time_s + r.waiting_s,  # waits inside the micro-steps are in measured compute
                "measured_compute_s": m.get("measured_compute_s", summary.get("measured_step_time_s")),
                "measured_waiting_s": m.get("measured_waiting_s", 0.0),
            }
        )
    return rows


def _same_run(a: Plan, b: Plan) -> bool:
    """Whether two plans run the same (groups, replicas and their shares, sharding), whatever their names."""
    return (a.seq_len, a.block_size, a.groups, a.replicas, a.sharding) == (
        b.seq_len,
        b.block_size,
        b.groups,
        b.replicas,
        b.sharding,
    )


def compare_dp(
    cluster: str | ClusterSpec = "cpu-8",
    calibration: str | Path | None = None,
    *,
    model: str = DEFAULT_MODEL,
    seq_len: int = 2048,
    global_batch: int = 6,
    steps: int = 5,
    trials: int = 1,
    quick: bool = False,
    recalibrate: bool = False,
    out: str | Path | None = None,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] | None = None,
) -> DPComparison:
    """Calibrate (or read a calibration), plan `cluster` jointly with the calibrated figures, run the
    joint plan, the best DP x symmetric baseline and DP = 1, each `trials` times in interleaved rounds,
    and compare their median step times with the predictions (module doc). `recalibrate`: run the
    calibration's plans again, dealt over the same rounds, and predict with that in-window fit."""
    say = say or print
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    check_emulated(spec)
    mspec: ModelSpec = get_model(model)
    if steps <= WARMUP_EXCLUDED:
        raise HexiSeqError(f"steps must exceed the {WARMUP_EXCLUDED} warm-up steps left out, got {steps}")
    if trials < 1:
        raise HexiSeqError(f"trials must be 1 or more (runs of each plan), got {trials}")
    if global_batch < 2:
        raise HexiSeqError(f"a data-parallel comparison needs a global batch of 2 or more, got {global_batch}")
    stamp = default_run_dir()
    root = Path(out) if out is not None else stamp.with_name("compare-dp-" + stamp.name)
    if root.exists() and any(root.iterdir()):
        raise HexiSeqError(f"{root} already holds files; give another --out")
    profile, factors, source = calibrated_figures(
        calibration,
        spec,
        model=model,
        seq_len=seq_len,
        quick=quick,
        out=root / "calibration",
        timeout_s=timeout_s,
        say=say,
    )
    cost = cost_cluster(spec, profile, factors)
    block = 64 if seq_len >= 4096 else 32
    wl = Workload(seq_len, global_batch, "auto", "replicated", block)
    say(f"planning {spec.name} jointly for {mspec.name} at S = {seq_len:,}, G = {global_batch} ...")
    res = plan_joint(cost, mspec, wl)
    base = res.best_baseline
    if base is None or res.dp1 is None:
        raise HexiSeqError(f"no DP x symmetric baseline or DP = 1 plan fits {spec.name} at S = {seq_len:,}")
    dp1 = Plan.joint([res.dp1.plan], [global_batch], Sharding("replicated", "all"), name="dp1")
    even = min(
        (b for b in dp_baselines(cost, mspec, wl, even=True).values() if b.feasible),
        key=lambda b: (b.step_time_s, b.name),
        default=None,
    )
    picks = [
        ("joint", res.plan, res.recompute, res.partition),
        ("dp-baseline", base.plan, base.recompute, f"{base.name}: {base.config}"),
        *(
            [("dp-even", even.plan, even.recompute, f"{even.name} with equal shares: {even.config}")]
            if even is not None
            else []
        ),
        ("dp1", dp1, res.dp1.recompute, "HexiSeq at DP = 1 (one replica, replicated parameters)"),
    ]
    root.mkdir(parents=True, exist_ok=True)
    load0 = _load()
    # each distinct plan once (the planner's choice may be the baseline itself), then `trials` rounds,
    # each round in an order turned by one, so a drift of the machine's speed falls on every plan alike
    distinct: list[int] = []
    twin_of: dict[int, int] = {}
    for i, (_, plan, policy, _) in enumerate(picks):
        j = next((j for j in distinct if _same_run(picks[j][1], plan) and picks[j][2] == policy), None)
        if j is None:
            distinct.append(i)
        else:
            twin_of[i] = j

    workloads = {
        i: Workload(seq_len, global_batch, picks[i][2], "replicated", picks[i][1].block_size) for i in distinct
    }

    def estimates_on(c: ClusterSpec) -> dict[int, Any]:
        return {i: estimate_step(picks[i][1], c, mspec, workloads[i]) for i in distinct}

    estimates = estimates_on(cost)
    planned = {i: e.step_time_s for i, e in estimates.items()}
    # the in-window calibration: the same plans as the planning one, on the same profile, one run each,
    # dealt over the rounds (plan k in round k mod trials, after that round's compared plans)
    window = (
        prepare_calibration(
            profile=profile,
            quick=quick,
            cluster=calibration_slice(spec),
            model=model,
            seq_len=seq_len,
            out=root / "calibration-in-window",
            say=say,
        )
        if recalibrate
        else None
    )
    runs: dict[int, list[tuple[float, dict[str, Any], Path, float]]] = {i: [] for i in distinct}
    for t in range(trials):
        for i in distinct[t % len(distinct) :] + distinct[: t % len(distinct)]:
            system, plan, policy, config = picks[i]
            path = root / (system if t == 0 else f"{system}-trial{t + 1}")
            say(f"  running {system} (trial {t + 1} of {trials}): {config}, {plan.world_size} ranks, {steps} steps ...")
            t0 = time.perf_counter()
            summary = run_plan(
                on_emulated(plan, spec, cost),
                spec,
                policy,
                estimates[i].step_time_s,
                path,
                model,
                steps,
                timeout_s,
                global_batch=global_batch,
            )
            runs[i].append((float(summary["measured_step_time_s"]), summary, path, time.perf_counter() - t0))
        if window is not None:
            run_calibration(window, range(t, len(window.jobs), trials), timeout_s=timeout_s, say=say)
    planning_factors, window_text, final = None, "", cost
    if window is not None:
        cal = fit_calibration(window)
        window_text = cal.summary()
        say(window_text)
        planning_factors, factors = factors, dict(cal.factors)
        final = cost_cluster(spec, profile, factors)
        estimates = estimates_on(final)
        source = (
            f"in-window, fitted on {len(cal.rows)} plans of {window.spec.name} run in the same rounds ({cal.out}); "
            f"planned with: {source}"
        )
    rows: list[dict[str, Any]] = []
    for i, (system, plan, policy, config) in enumerate(picks):
        if i in twin_of:  # the same plan as one already run: its run is this one's
            twin = rows[twin_of[i]]
            say(f"  {system}: the same plan as {twin['system']}; its run is this one's")
            rows.append(
                {
                    **twin,
                    "system": system,
                    "config": f"{config} (the {twin['system']} plan itself)",
                    "same_as": twin["system"],
                }
            )
            continue
        est, done = estimates[i], runs[i]
        m, summary, run_dir, _ = middle(done)
        rows.append(
            {
                "system": system,
                "plan": plan.name,
                "config": config,
                "shares": ":".join(str(n) for n in plan.sequences_of(global_batch)),
                "sharding": plan.sharding.describe(),
                "recompute": policy,
                "ranks": plan.world_size,
                "measured_s": m,
                "trials_s": [r[0] for r in done],
                "predicted_s": est.step_time_s,
                "planned_s": planned[i],
                "error": est.step_time_s / m - 1,
                "sync_s": est.sync_s,
                "replicas": _replica_rows(est, summary),
                "pacing_overrun": max((o for r in done if (o := pacing_overrun(r[1])) is not None), default=None),
                "operator_load": operator_load(summary, steps),
                # the machine's cores the ranks really used, the most of any run (calibrate.cores_used)
                "cores_used": max((c for r in done if (c := cores_used(r[1])) is not None), default=None),
                # each rank's device time per step (f x its operators' reference CPU time), predicted and measured
                "predicted_device_s": device_times(plan, final, mspec, workloads[i]),
                "measured_device_s": measured_devices(summary),
                "run_dir": str(done[0][2]),
                "median_run_dir": str(run_dir),
                "wall_s": sum(r[3] for r in done),
            }
        )
    cmp = DPComparison(
        spec.name, mspec.name, seq_len, global_batch, steps, rows, str(root), factors, source,
        {"before": load0, "after": _load()},
        sum(1.0 / (cpu_factor(d.gpu) or 1.0) for d in spec.devices), os.cpu_count() or 1, trials,
        planning_factors, window_text,
    )  # fmt: skip
    write_text_atomic(root / "comparison-dp.json", json.dumps(cmp.to_dict(), indent=2, default=float) + "\n")
    return cmp


def middle(done: Sequence[tuple[float, Any, Any, Any]]) -> tuple[float, Any, Any, Any]:
    """The trial whose measured step time is the median of `done` (the lower of the two middle ones
    for an even count): one real run, so its per-replica and pacing records go with its time."""
    return sorted(done, key=lambda r: r[0])[(len(done) - 1) // 2]


def operator_fit(comparisons: Sequence[DPComparison]) -> dict[str, float] | None:
    """How far the step model's misses follow the per-operator cost it does not model: the least-squares
    line of (measured - predicted) against x = f x operators per step of each run's busiest device
    (`operator_load`), over every run of `comparisons`: slope (seconds per operator per unit of
    slowdown, i.e. the CPU per operator the pacing stretches), intercept and the correlation r.
    None with fewer than three runs or no spread in x or in the misses."""
    pts = [
        (r["operator_load"]["factor"] * r["operator_load"]["ops_per_step"], r["measured_s"] - r["predicted_s"])
        for c in comparisons
        for r in c.rows
        if r.get("operator_load") and not r.get("same_as")  # a plan run once counts once
    ]
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if len(pts) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    return {"runs": len(pts), "slope_s": slope, "intercept_s": intercept, "r": statistics.correlation(xs, ys)}


def device_check(root: str | Path) -> list[dict[str, Any]]:
    """Each rank's device time per step, predicted (the comparison's own figures: its profile and
    multipliers) and measured (the median run's pacing record), recomputed from a finished comparison
    directory (comparison-dp.json and its calibrations): one entry per plan run."""
    root = Path(root)
    cmp = json.loads((root / "comparison-dp.json").read_text())
    cal = next(
        (p for p in (root / "calibration-in-window" / "calibration.json", root / "calibration" / "calibration.json")
         if p.exists()),
        None,
    )  # fmt: skip
    if cal is None:
        raise HexiSeqError(f"{root} holds no calibration.json: give the directory of a comparison that measured one")
    spec, mspec = load_cluster(cmp["cluster"]), get_model(cmp["model"])
    cost = cost_cluster(spec, Profile.from_dict(json.loads(cal.read_text())["profile"]), cmp["factors"])
    out = []
    for r in cmp["rows"]:
        if r.get("same_as"):
            continue
        if r.get("median_run_dir"):
            run = Path(r["median_run_dir"])
        else:  # a comparison from before rows named it: the trial whose step time is the median
            trials = [root / r["system"]] + [root / f"{r['system']}-trial{t}" for t in range(2, len(r["trials_s"]) + 1)]
            run = min(trials, key=lambda d: abs(_step_of(d) - r["measured_s"]))
        plan = Plan.load(run / "plan.json")
        plan = replace(plan, meta={k: v for k, v in plan.meta.items() if k != "cluster_fingerprint"})
        wl = Workload(cmp["seq_len"], cmp["global_batch"], r["recompute"], "replicated", plan.block_size)
        summary = json.loads((run / "summary.json").read_text())
        out.append(
            {
                "system": r["system"],
                "run": str(run),
                "types": [spec.devices[d].gpu.name for g in plan.groups for d in g.devices],  # rank order
                "predicted_device_s": device_times(plan, cost, mspec, wl),
                "measured_device_s": measured_devices(summary),
            }
        )
    return out


def _step_of(run: Path) -> float:
    return float(json.loads((run / "summary.json").read_text())["measured_step_time_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hexiseq.calibrate.compare_dp",
        description="each rank's device time per step, predicted / measured, of a finished comparison",
    )
    ap.add_argument("dirs", nargs="+", help="comparison directories (bench_dp's <runs>/<cluster>)")
    args = ap.parse_args(argv)
    for d in args.dirs:
        for e in device_check(d):
            pairs = zip(e["predicted_device_s"], e["measured_device_s"] or [])
            print(
                f"{d} {e['system']}: "
                + " ".join(f"{t} {a:.2f}/{b:.2f} ({a / b - 1:+.0%})" for t, (a, b) in zip(e["types"], pairs))
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
