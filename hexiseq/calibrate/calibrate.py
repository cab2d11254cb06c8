"""`hexiseq calibrate`: run the calibration plans on the local world, measure their step times with the
real executor, fit what the profile cannot measure, and compare predicted (before and after the fit)
with measured, per plan.

1. The world: 4 CPU ranks of this machine in one node (each a CPU-x<f> type: one core slowed so that
   the ranks do not oversubscribe the cores), or an emulated cluster (`cluster="cpu-4"`).
2. The profile: measured now (profile.py) unless one is given; it turns the world into the cost
   model's cluster (`Profile.apply`). "Before" = that cluster's prediction (the step replay).
3. Every plan of plans.py runs as a real run (hexiseq.runs: run directory, metrics.jsonl,
   summary.json with `emulated`, `prediction`, the measured step = median after warm-up), all in one
   spawned world, one after another.
4. The fit (`FITTED`): four multipliers, the same for every device type, on the profile's figures
   for what a kernel timed alone cannot show: the compute rate inside a step (`peak_bf16_tflops`:
   the linear and attention kernels interleaved with everything else a step does, caches shared
   with the other ranks), the memory-bound rate (`eff_hbm`: the norms, RoPE, activations, loss and
   optimizer as the framework runs them), the per-message latency (`link_latency_us`: the cost model
   charges it per all-to-all and per exchange round) and the time of each executed operator beyond
   its work (`op_overhead_us`: dispatch, allocation, small kernels, charged per operator of
   data/operators.yaml by costmodel/operators.py; the profile measures it on one layer's
   memory-bound kernels at two sizes), and on a cluster of several device types a multiplier on each
   type's compute rate after the first (`fitted_keys`, PER_TYPE) — minimising
   Σ log²(predicted / measured) over the fit plans -- their step times and each rank's device time
   per step (f x its operators' reference CPU time after the warm-up, from the pacing record: the step alone
   is the slowest rank's, so a fit on it could trade a slow rank's many small operators against a
   fast rank's large ones; measured on cpu-8, such a fit left its slower ranks' device time 26-34%
   short on plans of small shards) -- plus a small penalty on the multipliers' log2
   (RIDGE: of near-equal fits, the one nearest the profile), by fitting.grid_search then
   fitting.least_squares (deterministic: a coarse grid, then damped least squares from its best
   node). "After" = the fitted cluster's prediction; the held-out plans show whether the fit
   generalises. On long sequences the per-operator time is a small part of every plan and trades
   off against the memory-bound rate (the penalty then keeps the profile's measurement); the
   comparisons of data-parallel plans (compare_dp.py; bench_dp at S = 4K) are where it decides.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..costmodel import simulate
from ..costmodel.step import estimate_step
from ..errors import HexiSeqError
from ..fitting import grid_search, least_squares
from ..plan import Plan
from ..runs.config import WARMUP_EXCLUDED
from ..runs.loop import RunJob, run_worker
from ..runs.rundir import RunDir, default_run_dir
from ..runs.settings import ModelSettings, ParallelSettings, RecordSettings, RunSettings, TrainSettings
from ..runs.start import start_run
from ..runtime.emulation import Emulation, warm_cores
from ..runtime.world import spawn_world
from ..specs import ClusterSpec, ModelSpec, Workload, get_model, write_text_atomic
from .emulated_clusters import emulation_for
from .plans import WORLD, CalPlan, calibration_plans, side_by_side
from .profile import DEFAULT_MODEL, Profile, _load, resolve_world
from .profile import profile as measure_profile

# what the fit may change, with the search box of its multiplier (log2 of the factor on the profile's
# figure); the per-operator time is the profile's two-size measurement of the memory-bound kernels
# (measure.py), which a whole step's operators (autograd, allocation, small kernels) may exceed
FITTED = {
    "peak_bf16_tflops": (-1.0, 1.0),
    "eff_hbm": (-2.0, 2.0),
    "link_latency_us": (-3.0, 3.0),
    "op_overhead_us": (-2.0, 2.0),
}
# Beside them, for every device type after the first, a multiplier on its compute rate alone
# (`peak_bf16_tflops@TYPE`), fitted from the ranks' device times: the profile measures each type on its
# own ranks and those figures can be off against each other. Measured on this project's 2-core VM
# (the cpu-8 calibration of bench_dp at 2026-12-07 06:16 UTC, committed in ffb6621's
# data/results/dp-calibration/), with the shared multipliers alone the CPU-x8 ranks' device time came
# out a median 6.8% short and the CPU-x20 ranks' +0.2%, 15 points apart on the dp-4 plans. Its box is
# narrower: a correction of a measured ratio.
PER_TYPE = "peak_bf16_tflops"
PER_TYPE_BOX = (-0.5, 0.5)


def fitted_keys(cluster: ClusterSpec) -> list[str]:
    """The multipliers a calibration of `cluster` fits: FITTED, then PER_TYPE@type for each of its device
    types after the first (the shared PER_TYPE multiplier stands for the first)."""
    return list(FITTED) + [f"{PER_TYPE}@{t}" for t in list(cluster.gpu_types)[1:]]


# the start of the least squares: a full grid at 1 (1,575 nodes), then one at 0.5 over ± half a step
# around its best (81 nodes); the least squares follows the ridges between nodes from there
GRID_STEPS = (1.0, 0.5)
GRID_REACH = 0.5
# The four move step times in similar ways on these plans, so fits far apart can be almost equally
# good: a small penalty on the log2 multipliers picks, among those, the one closest to the profile.
RIDGE = 1e-3


@dataclass
class Calibration:
    """The outcome: one row per plan, the fitted figures, where the runs are."""

    rows: list[dict[str, Any]]
    fitted: dict[str, dict[str, float]]  # {device type: {field: fitted value}}
    factors: dict[str, float]  # {field: multiplier on every type's figure, field@type: on that type's once more}
    profile: Profile
    cluster: str
    model: str
    seq_len: int
    steps: int
    out: str
    load_average: dict[str, list[float]] = field(default_factory=dict)

    def errors(self, key: str, split: str | None = None) -> list[float]:
        return [
            abs(r[key] / r["measured_s"] - 1)
            for r in self.rows
            if r.get(key) is not None and r["measured_s"] and (split is None or r["split"] == split)
        ]

    def stats(self) -> dict[str, Any]:
        """Median and worst |predicted / measured - 1|, before and after, for all plans, the fit and
        the held-out ones."""
        out: dict[str, Any] = {}
        for split in (None, "fit", "held-out"):
            name = split or "all"
            for key, label in (("predicted_before_s", "before"), ("predicted_after_s", "after")):
                e = self.errors(key, split)
                out[f"{name}_{label}"] = {
                    "median": statistics.median(e) if e else None,
                    "worst": max(e) if e else None,
                    "plans": len(e),
                }
            dev = [abs(x) for r in self.rows if split in (None, r["split"]) for x in r.get("device_errors_after") or []]
            out[f"{name}_devices_after"] = {
                "median": statistics.median(dev) if dev else None,
                "worst": max(dev) if dev else None,
                "ranks": len(dev),
            }
        out["devices_after_by_type"] = self.device_errors_by_type()
        return out

    def device_errors_by_type(self) -> dict[str, dict[str, float | int]]:
        """{device type: signed median, worst |error| and count} of each rank's device time per step
        after the fit, over every plan: a type whose profiled figures are off against the others' beyond
        what its own compute multiplier (PER_TYPE) corrects shows as a signed bias here (rows from
        before `device_types` was kept count nowhere)."""
        by: dict[str, list[float]] = {}
        for r in self.rows:
            for t, e in zip(r.get("device_types") or [], r.get("device_errors_after") or []):
                by.setdefault(t, []).append(e)
        return {
            t: {"median": statistics.median(e), "worst": max(abs(x) for x in e), "ranks": len(e)} for t, e in by.items()
        }

    def summary(self) -> str:
        """The median and worst error, before and after the fit, over every plan and over the held-out ones."""
        s = self.stats()

        def f(d: dict[str, Any]) -> str:
            return (
                "n/a"
                if d["median"] is None
                else f"median {d['median']:.1%}, worst {d['worst']:.1%} ({d['plans']} plans)"
            )

        lines = [
            f"calibration of {self.cluster} ({self.model}, S={self.seq_len:,}, {self.steps} steps per plan; emulated "
            f"CPU ranks)",
            f"  before the fit: {f(s['all_before'])}",
            f"  after the fit:  {f(s['all_after'])}",
            f"  held out (not fitted): before {f(s['held-out_before'])}; after {f(s['held-out_after'])}",
            *(
                [
                    f"  each rank's device time per step after the fit: median {d['median']:.1%}, worst "
                    f"{d['worst']:.1%} ({d['ranks']} ranks of every plan)"
                ]
                if (d := s["all_devices_after"])["median"] is not None
                else []
            ),
            *(
                [
                    "  by device type (median, worst): "
                    + ", ".join(
                        f"{t} {d['median']:+.1%} / {d['worst']:.1%} ({d['ranks']} ranks)"
                        for t, d in s["devices_after_by_type"].items()
                    )
                ]
                if s["devices_after_by_type"]
                else []
            ),
            "  fitted: " + factors_text(self.factors),
        ]
        return "\n".join(lines)

    def table(self) -> str:
        head = (
            f"{'plan':<16} {'shape':<46} {'recompute':<9} {'split':<8} {'measured s':>10} {'before s':>9} {'err':>7} "
            f"{'after s':>9} {'err':>7} {'overrun':>7}"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            o = r.get("pacing_overrun")
            lines.append(
                f"{r['plan']:<16} {r['shape']:<46} {r['recompute']:<9} {r['split']:<8} {r['measured_s']:>10.3f} "
                f"{r['predicted_before_s']:>9.3f} {r['error_before']:>+7.1%} {r['predicted_after_s']:>9.3f} "
                f"{r['error_after']:>+7.1%} "
                f"{'' if o is None else f'{o:.2f}':>7}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "model": self.model,
            "seq_len": self.seq_len,
            "steps": self.steps,
            "out": self.out,
            "rows": self.rows,
            "stats": self.stats(),
            "factors": self.factors,
            "fitted": self.fitted,
            "load_average": self.load_average,
            "emulated": True,
            "profile": self.profile.to_dict(),
        }


# ---------------------------------------------------------------------- prediction and fit


def predict(cluster: ClusterSpec, model: ModelSpec, cp: CalPlan) -> float:
    """The step time of a calibration plan (replicated parameters: the executor's default): the step
    replay's iteration, or for a plan of replicas the step model (costmodel/step.py)."""
    return predict_with_devices(cluster, model, cp)[0]


def predict_with_devices(cluster: ClusterSpec, model: ModelSpec, cp: CalPlan) -> tuple[float, list[float]]:
    """`predict`'s step time and each rank's device time per step (rank order): its kernels, their
    per-operator cost and its optimizer step (SimResult.device_s), each replica replayed at its own
    sequences -- what the emulation's pacing measures on that rank (`measured_devices`)."""
    plan, wl = cp.plan, Workload(cp.plan.seq_len, cp.global_batch, cp.recompute, "replicated", cp.plan.block_size)
    if plan.num_replicas == 1:  # the step model's step of one replica is its replay, bit for bit
        sim = simulate(plan.replica(0), cluster, model, wl)
        return float(sim.iteration_time_s), [float(x) for x in sim.device_s]
    return float(estimate_step(plan, cluster, model, wl).step_time_s), device_times(plan, cluster, model, wl)


def device_times(plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> list[float]:
    """Each rank's device time per step (rank order): every replica replayed at its own sequences
    (SimResult.device_s: its kernels, their per-operator cost, its optimizer step) -- what an emulated
    rank's pacing measures (`measured_devices`)."""
    shares = [r.sequences for r in plan.replicas] or [workload.global_batch]
    out: list[float] = []
    for i, n in enumerate(shares):
        sim = simulate(plan.replica(i), cluster, model, replace(workload, global_batch=n))
        out += [float(x) for x in sim.device_s]
    return out


def measured_devices(summary: dict[str, Any]) -> list[float] | None:
    """Each rank's emulated device time per measured step: f x its operators' (reference) CPU time over the steps
    after the warm-up (the pacing record's `measured` part). None for a run without that record."""
    emu = summary.get("emulation") or {}
    out = []
    for f, p in zip(emu.get("slowdown") or [], emu.get("pacing") or []):
        m = (p or {}).get("measured")
        if not m or not m.get("steps") or not m.get("cpu_s"):
            return None
        out.append(f * m["cpu_s"] / m["steps"])
    return out or None


def scaled_cluster(cluster: ClusterSpec, factors: dict[str, float]) -> ClusterSpec:
    """`cluster` with every device type's fitted fields multiplied by `factors` (efficiencies capped at
    1); a key `field@TYPE` multiplies that type's field once more."""
    changes: dict[str, dict[str, float]] = {}
    for name in cluster.gpu_types:
        g = next(d.gpu for d in cluster.devices if d.gpu.name == name)
        mults: dict[str, float] = {}
        for key, mult in factors.items():
            field_name, _, only = key.partition("@")
            if not only or only == name:
                mults[field_name] = mults.get(field_name, 1.0) * mult
        changes[name] = {}
        for key, mult in mults.items():
            v = getattr(g, key) * mult
            changes[name][key] = min(1.0, v) if key.startswith("eff_") else v
    return cluster.with_profile(changes)


def factors_text(factors: dict[str, float]) -> str:
    """The fitted multipliers in words."""
    return ", ".join(f"{k} x{v:.3g}" for k, v in factors.items())


def fit(
    cluster: ClusterSpec,
    model: ModelSpec,
    plans: Sequence[CalPlan],
    measured: Sequence[float],
    devices: Sequence[Sequence[float] | None] | None = None,
) -> dict[str, float]:
    """Multipliers on the FITTED fields minimising Σ log²(predicted / measured) over `plans` -- their
    step times, and each rank's device time per step where `devices` holds it (`measured_devices`) --
    plus RIDGE x Σ log2(multiplier)² (module doc): a coarse grid, then damped least squares from its
    best node (fitting.least_squares)."""
    keys = fitted_keys(cluster)
    box = [FITTED.get(k, PER_TYPE_BOX) for k in keys]
    shared = len(FITTED)
    ridge = math.sqrt(RIDGE)
    devices = list(devices) if devices is not None else [None] * len(plans)

    def figures(x: Sequence[float]) -> dict[str, float]:
        return {k: 2.0**v for k, v in zip(keys, x)}

    def residuals(x: Sequence[float]) -> list[float]:
        c = scaled_cluster(cluster, figures(x))
        out = []
        for p, m, dev in zip(plans, measured, devices):
            step, pred = predict_with_devices(c, model, p)
            out.append(math.log(step / m))
            out += [math.log(a / b) for a, b in zip(pred, dev, strict=True)] if dev else []
        return out + [ridge * v for v in x]

    def loss(*x: float) -> float:
        return float(sum(r * r for r in residuals(x)))

    # the grid over the shared multipliers (the per-type ones at 1), then least squares over all
    at_one = [0.0] * (len(keys) - shared)
    start, _ = grid_search(lambda *x: loss(*x, *at_one), box[:shared], GRID_STEPS, GRID_REACH)
    best, _ = least_squares(residuals, [*start, *at_one], box)
    return figures(best)


# ---------------------------------------------------------------------- running the plans


def calibration_run_settings(
    model: str,
    seq_len: int,
    steps: int,
    recompute: str,
    emulation: Emulation,
    prediction: dict[str, Any],
    global_batch: int = 1,
) -> RunSettings:
    """The settings of one measured run of calibration or comparison: `steps` steps of `model` at
    `seq_len` tokens on synthetic data, a constant learning rate, no warmup, no TensorBoard, emulated
    as `emulation` says, `global_batch` sequences per step; `prediction` is the caller's own (the cost
    model with the profile)."""
    return RunSettings(
        model=ModelSettings(name=model, seq_len=seq_len),
        parallel=ParallelSettings(recompute=recompute),
        train=TrainSettings(
            steps=steps, global_batch=global_batch, lr=1e-3, warmup_steps=0, schedule="constant", timeout_s=300.0
        ),
        record=RecordSettings(tensorboard=False),
        emulation=emulation,
        prediction=prediction,
    )


def copies_side_by_side(spec: ClusterSpec) -> int:
    """How many copies of the four-rank plans fill `spec` (plans.side_by_side): k for two nodes of 2k
    devices each, 1 for anything else (which calibrate then refuses unless it has four devices)."""
    nodes = [n.count for n in spec.nodes]
    if len(nodes) == 2 and nodes[0] == nodes[1] and nodes[0] % 2 == 0:
        return nodes[0] // 2
    return 1


def calibrate_worker(rank: int, world: int, jobs: list[Any]) -> list[dict[str, Any]]:
    """Body of one rank: every calibration run, one after another, in the same world."""
    return [run_worker(rank, world, job) for job in jobs]


@dataclass
class CalibrationRuns:
    """The calibration's plans set up as runs (run directories written, nothing run yet): what
    `run_calibration` runs, in one go or a few at a time, and `fit_calibration` fits."""

    spec: ClusterSpec
    model: ModelSpec
    seq_len: int
    steps: int
    plans: list[CalPlan]
    profile: Profile
    cost_cluster: ClusterSpec  # spec with the profile's figures: the "before" predictions
    before: list[float]
    root: Path
    jobs: list[RunJob]
    load_before: list[float] = field(default_factory=list)


def prepare_calibration(
    world: int | None = None,
    profile: Profile | str | Path | None = None,
    quick: bool = False,
    *,
    cluster: str | ClusterSpec | None = None,
    model: str = DEFAULT_MODEL,
    seq_len: int | None = None,
    steps: int | None = None,
    out: str | Path | None = None,
    say: Callable[[str], None] | None = None,
) -> CalibrationRuns:
    """Check the world, measure (or read) the profile and write every calibration plan's run directory
    under `out` (default runs/calibrate-<time>); `calibrate`'s arguments."""
    say = say or print
    spec, named = resolve_world(world, cluster)
    copies = copies_side_by_side(spec) if named else 1
    if spec.size != WORLD * copies:
        raise HexiSeqError(
            f"calibrate runs its plans on {WORLD} ranks, or side by side on two nodes of an even number of devices "
            f"each; {'cluster ' + repr(spec.name) if named else 'the world'} has {spec.size}"
            + (f" in nodes of {', '.join(str(n.count) for n in spec.nodes)}" if named else "")
        )
    mspec = get_model(model)
    S = seq_len or (1024 if quick else 8192)
    n_steps = steps or (3 if quick else 6)

    if n_steps <= WARMUP_EXCLUDED:
        raise HexiSeqError(
            f"--steps must exceed the {WARMUP_EXCLUDED} warm-up steps left out of the measurement, got {n_steps}"
        )
    block = 32 if S < 4096 else 64
    plans = [
        side_by_side(p, copies)
        for p in calibration_plans(S, mspec.heads, mspec.kv_heads, block, spec.name if named else "", mspec.name)
    ]
    # the profile: measured now, or given (file or object); it must describe this world's device types
    if profile is None:
        prof = measure_profile(
            cluster=spec if named else None,
            world=None if named else spec.size,
            model=model,
            seq_len=min(S, 8192),
            quick=quick,
            say=say,
        )
    else:
        prof = profile if isinstance(profile, Profile) else Profile.load(profile)
    missing = [t for t in spec.gpu_types if t not in prof.gpus]
    if missing:
        raise HexiSeqError(
            f"the profile has no figures for {', '.join(missing)} (the device types of {spec.name}); profile this "
            f"world first: hexiseq profile {'--cluster ' + spec.name if named else '--world ' + str(spec.size)}"
        )
    cost_cluster = prof.apply(spec)
    before = [predict(cost_cluster, mspec, p) for p in plans]
    stamp = default_run_dir()
    root = Path(out) if out is not None else stamp.with_name("calibrate-" + stamp.name)
    if root.exists() and any(root.iterdir()):
        raise HexiSeqError(f"{root} already holds files; give another --out")
    jobs = []
    for p, pred in zip(plans, before):
        settings = calibration_run_settings(
            model,
            S,
            n_steps,
            p.recompute,
            emulation=emulation_for(p.plan, spec),
            prediction={
                "step_time_s": pred,
                "cluster": spec.name,
                "note": f"simulated iteration on {spec.name} with the profile ({prof.measured.get('when')})",
            },
            global_batch=p.global_batch,
        )
        run, cfg = start_run(p.plan, settings, root / p.name)
        jobs.append(RunJob(str(run.path), cfg))
    return CalibrationRuns(spec, mspec, S, n_steps, plans, prof, cost_cluster, before, root, jobs, _load())


def run_calibration(
    runs: CalibrationRuns,
    indices: Sequence[int] | None = None,
    *,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] | None = None,
) -> None:
    """Run the calibration plans `indices` (default: all), one after another in one spawned world."""
    say = say or print
    todo = list(range(len(runs.jobs)) if indices is None else indices)
    if not todo:
        return
    say(
        f"running {len(todo)} calibration plan(s) x {runs.steps} steps on {runs.spec.size} CPU ranks "
        f"({runs.spec.name}, S={runs.seq_len:,}) ..."
    )
    t0 = time.perf_counter()
    with warm_cores():
        spawn_world(
            calibrate_worker, runs.spec.size, [runs.jobs[i] for i in todo], timeout_s=timeout_s, pg_timeout_s=300.0
        )
    say(f"  done in {time.perf_counter() - t0:.0f} s")


def fit_calibration(runs: CalibrationRuns) -> Calibration:
    """Read every calibration run's measured step and device times, fit the multipliers on the fit
    plans, and write calibration.json (module doc): the Calibration."""
    mspec, plans, cost_cluster = runs.model, runs.plans, runs.cost_cluster
    measured, overrun, devices = [], [], []
    for job in runs.jobs:
        summary = RunDir(job.run_dir).read_json(RunDir(job.run_dir).summary) or {}
        if summary.get("measured_step_time_s") is None:
            raise HexiSeqError(
                f"run {job.run_dir} recorded no step time ({summary.get('status')}: {summary.get('error')})"
            )
        measured.append(float(summary["measured_step_time_s"]))
        overrun.append(pacing_overrun(summary))
        devices.append(measured_devices(summary))
    fit_idx = [i for i, p in enumerate(plans) if p.fit]
    factors = fit(
        cost_cluster,
        mspec,
        [plans[i] for i in fit_idx],
        [measured[i] for i in fit_idx],
        [devices[i] for i in fit_idx],
    )
    fitted_cluster = scaled_cluster(cost_cluster, factors)
    after_both = [predict_with_devices(fitted_cluster, mspec, p) for p in plans]
    after = [a for a, _ in after_both]
    rows = []
    for p, m, b, a, o, job, dev, (_, dev_after) in zip(
        plans, measured, runs.before, after, overrun, runs.jobs, devices, after_both
    ):
        rows.append(
            {
                "plan": p.name,
                "shape": p.shape,
                "recompute": p.recompute,
                "split": "fit" if p.fit else "held-out",
                "measured_s": m,
                "predicted_before_s": b,
                "predicted_after_s": a,
                "error_before": b / m - 1,
                "error_after": a / m - 1,
                "pacing_overrun": o,
                "run_dir": job.run_dir,
                # each rank's device time per measured step, and the fitted model's error on it
                "measured_device_s": dev,
                "device_errors_after": None if dev is None else [a / d - 1 for a, d in zip(dev_after, dev)],
                "device_types": [cost_cluster.devices[d].gpu.name for d in p.plan.rank_devices],
            }
        )
    fitted = {
        name: {k: getattr(next(d.gpu for d in fitted_cluster.devices if d.gpu.name == name), k) for k in FITTED}
        for name in fitted_cluster.gpu_types
    }
    cal = Calibration(
        rows,
        fitted,
        factors,
        runs.profile,
        runs.spec.name,
        mspec.name,
        runs.seq_len,
        runs.steps,
        str(runs.root),
        {"before": runs.load_before, "after": _load()},
    )
    write_text_atomic(runs.root / "calibration.json", json.dumps(cal.to_dict(), indent=2, default=float) + "\n")
    return cal


def calibrate(
    world: int | None = None,
    profile: Profile | str | Path | None = None,
    quick: bool = False,
    *,
    cluster: str | ClusterSpec | None = None,
    model: str = DEFAULT_MODEL,
    seq_len: int | None = None,
    steps: int | None = None,
    out: str | Path | None = None,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] | None = None,
) -> Calibration:
    """Run the calibration (module doc) and return its rows; runs and calibration.json go under `out`
    (default runs/calibrate-<time>). `quick`: a short sequence and 3 steps per plan (tests, notebooks)."""
    runs = prepare_calibration(
        world, profile, quick, cluster=cluster, model=model, seq_len=seq_len, steps=steps, out=out, say=say
    )
    run_calibration(runs, timeout_s=timeout_s, say=say)
    return fit_calibration(runs)


def pacing_overrun(summary: dict[str, Any]) -> float | None:
    """How far the machine's load pushed the slowest-held rank past its emulated speed: the largest,
    over the ranks, of (operator wall time + host time hidden behind the device's work + the
    emulation's bookkeeping + pacing sleep)
    / (f x operator CPU time). 1.0: the emulation held (every rank ran at exactly 1/f of a core);
    1.5: some rank got only 2/3 of what it emulates, because the cores were busy with other work (its
    measured time is then too long). Host time the device could not hide (`host_exposed_s`, e.g.
    waiting for a slower replica) is not counted: it is no fault of the pacing."""
    emu = summary.get("emulation") or {}
    worst = None
    for f, p in zip(emu.get("slowdown") or [], emu.get("pacing") or []):
        if p and p.get("cpu_s"):
            r = (p["wall_s"] + p.get("host_s", 0.0) + p.get("bookkeeping_s", 0.0) + p["compute_sleep_s"]) / (
                f * p["cpu_s"]
            )
            worst = r if worst is None else max(worst, r)
    return worst


def cores_used(summary: dict[str, Any]) -> float | None:
    """How many of the machine's cores the ranks really used over the measured steps: the sum over the
    ranks of their processes' CPU time (every thread: the operators, Python, autograd, gloo, the
    emulation's own bookkeeping) over the paced steps' wall time (PacerStats.process_cpu_s, block_wall_s;
    the longest rank's). The device work alone needs Σ 1/f cores; a plan of many small operators needs
    more, since each operator's host-side CPU is not slowed f times. Near the machine's cores, the ranks
    queue for them and the step is the machine's, not the emulated cluster's (compare_dp's doc). None for
    a record without these figures."""
    emu = summary.get("emulation") or {}
    cpu, wall = 0.0, 0.0
    for p in emu.get("pacing") or []:
        m = (p or {}).get("measured") or p or {}
        if not m.get("block_wall_s"):
            return None
        cpu += m.get("process_cpu_s", 0.0)
        wall = max(wall, m["block_wall_s"])
    return cpu / wall if wall > 0 else None


def operator_load(summary: dict[str, Any], steps: int) -> dict[str, float] | None:
    """The rank with the most emulated device time per step, and what makes it: its operators per step,
    their mean CPU time and f x that CPU per step (the device time its pacing emulates), and the time
    its step held beyond it (host time nothing hid, the emulated links' wait and hold), over the steps
    after the warm-up where the pacing record has them (`after_warmup` 1.0), else over all `steps`.
    A plan whose ranks hold few tokens runs many small operators, whose per-operator CPU (dispatch,
    allocation) the pacing stretches f times like any kernel's work (compare_dp.operator_fit measures
    how far the misses follow it). None without pacing statistics."""
    emu = summary.get("emulation") or {}
    best: dict[str, float] | None = None
    for rank, (f, p) in enumerate(zip(emu.get("slowdown") or [], emu.get("pacing") or [])):
        m = (p or {}).get("measured")
        part, n = (m, m["steps"]) if m and m.get("steps") else (p, steps)
        if not part or not part.get("ops") or n < 1:
            continue
        device_s = f * part["cpu_s"] / n
        if best is None or device_s > best["device_s_per_step"]:
            best = {
                "rank": rank,
                "factor": f,
                "ops_per_step": part["ops"] / n,
                "cpu_us_per_op": 1e6 * part["cpu_s"] / part["ops"],
                "device_s_per_step": device_s,
                "after_warmup": float(part is m),
                # what else its step held, per step: host time nothing hid, waiting for an emulated
                # link's real transfers and the hold after them (runtime/emulation.py, PacerStats)
                **{k: part.get(k, 0.0) / n for k in ("host_exposed_s", "link_wait_s", "link_sleep_s")},
            }
    return best
