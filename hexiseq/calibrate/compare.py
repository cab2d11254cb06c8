"""The central claim measured on CPU ranks: on an emulated heterogeneous cluster (cpu-4: two fast and two
2.5x slower CPU ranks, two nodes joined by a slower link), the planner's uneven plan beats the best
even plan in *measured* step time, and the cost model predicted both.

`compare("cpu-4")` is the whole workflow a user follows: profile the emulated cluster (or take a
profile), calibrate the cost model on it (calibrate.py: the eight calibration plans run on cpu-4, three
multipliers fitted; or take a calibration.json), plan it with the calibrated figures (`hexiseq plan`:
recompute auto, replicated parameters as the executor runs), take the planner's plan and its best
symmetric baseline (ring / Ulysses / USP on any device subset: the best even plan), run both as real
emulated runs and report measured against predicted — calibrated, and with the profile alone. Neither
plan is one the fit saw.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..costmodel import simulate
from ..errors import HexiSeqError
from ..planner import plan_cluster
from ..runs.config import WARMUP_EXCLUDED
from ..runs.loop import RunJob, run_worker
from ..runs.rundir import default_run_dir
from ..runs.start import start_run
from ..runtime.emulation import warm_cores
from ..runtime.world import spawn_world
from ..specs import ClusterSpec, Workload, get_model, load_cluster, write_text_atomic
from ..specs.identity import cluster_fingerprint, fingerprint_mismatch
from .calibrate import calibrate, calibration_run_settings, factors_text, pacing_overrun, scaled_cluster
from .emulated_clusters import check_emulated, emulation_for
from .profile import DEFAULT_MODEL, Profile, _load, machine
from .profile import profile as measure_profile


@dataclass
class Comparison:
    """Measured vs predicted step times of the planner's plan and the best even plan."""

    cluster: str
    model: str
    seq_len: int
    steps: int
    rows: list[dict[str, Any]]  # "hexiseq" first, then the best even baseline
    out: str
    profile: Profile
    factors: dict[str, float]  # the calibration's multipliers
    calibration: str  # where the calibration came from
    load_average: dict[str, list[float]] = field(default_factory=dict)

    @property
    def measured_speedup(self) -> float:
        return self.rows[1]["measured_s"] / self.rows[0]["measured_s"]

    @property
    def predicted_speedup(self) -> float:
        return self.rows[1]["predicted_s"] / self.rows[0]["predicted_s"]

    @property
    def claim_holds(self) -> bool:
        """The uneven plan is faster when measured, and both predictions are within 15%."""
        return self.measured_speedup > 1.0 and all(abs(r["error"]) <= 0.15 for r in self.rows)

    def summary(self) -> str:
        lines = [f"{self.cluster} (emulated CPU ranks), {self.model}, S={self.seq_len:,}, {self.steps} steps each:"]
        for r in self.rows:
            o = r.get("pacing_overrun")
            lines.append(
                f"  {r['system']:<8} {r['config']:<52} measured {r['measured_s']:7.3f} s, predicted "
                f"{r['predicted_s']:7.3f} s "
                f"({r['error']:+.1%}; profile alone {r['predicted_profile_s']:.3f} s, {r['error_profile']:+.1%})"
                + (f", pacing overrun {o:.2f}" if o else "")
            )
        lines.append(
            f"  speedup of the uneven plan over the best even one: measured {self.measured_speedup:.3f}x, predicted "
            f"{self.predicted_speedup:.3f}x -> claim {'holds' if self.claim_holds else 'does NOT hold'} "
            f"(measured faster and both calibrated predictions within 15%)"
        )
        lines.append(f"  calibration: {self.calibration}; multipliers " + factors_text(self.factors))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "model": self.model,
            "seq_len": self.seq_len,
            "steps": self.steps,
            "rows": self.rows,
            "measured_speedup": self.measured_speedup,
            "predicted_speedup": self.predicted_speedup,
            "claim_holds": self.claim_holds,
            "out": self.out,
            "load_average": self.load_average,
            "emulated": True,
            "factors": self.factors,
            "calibration": self.calibration,
            "profile": self.profile.to_dict(),
        }


def on_emulated(plan: Any, spec: ClusterSpec, cost: ClusterSpec) -> Any:
    """`plan`, made on `cost` (`spec` with this machine's calibrated figures), recorded as a plan of
    `spec`, the cluster its runs emulate: the same devices and links, whose measured figures (a
    profiled link bandwidth among them) change the fingerprint. A plan without the record (a baseline's) takes
    `spec`'s name only; one of another cluster is refused."""
    recorded = plan.meta.get("cluster_fingerprint")
    if recorded is None:  # a plan without the record (a baseline's) is checked by its devices only
        return replace(plan, cluster=spec.name)
    differs = fingerprint_mismatch(recorded, cost)
    if differs:
        raise HexiSeqError(f"plan {plan.name!r} was not made on the calibrated {spec.name}: {differs}")
    return replace(plan, cluster=spec.name, meta={**plan.meta, "cluster_fingerprint": cluster_fingerprint(spec)})


def run_plan(
    plan: Any,
    cluster: ClusterSpec,
    recompute: str,
    predicted: float,
    run_path: Path,
    model: str,
    steps: int,
    timeout_s: float,
    global_batch: int = 1,
) -> dict[str, Any]:
    """One real emulated run of `plan` (its own spawned world) over `global_batch` sequences per step;
    its summary."""
    settings = calibration_run_settings(
        model,
        plan.seq_len,
        steps,
        recompute,
        emulation=emulation_for(plan, cluster),
        prediction={"step_time_s": predicted, "cluster": cluster.name, "note": "simulated with the profile"},
        global_batch=global_batch,
    )
    run, cfg = start_run(plan, settings, run_path)
    with warm_cores():
        spawn_world(run_worker, plan.world_size, RunJob(str(run.path), cfg), timeout_s=timeout_s, pg_timeout_s=300.0)
    summary = run.read_json(run.summary) or {}
    if summary.get("measured_step_time_s") is None:
        raise HexiSeqError(f"run {run.path} recorded no step time ({summary.get('status')}: {summary.get('error')})")
    return summary


def compare(
    cluster: str | ClusterSpec = "cpu-4",
    profile: Profile | str | Path | None = None,
    calibration: str | Path | None = None,
    *,
    model: str = DEFAULT_MODEL,
    seq_len: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    out: str | Path | None = None,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] | None = None,
) -> Comparison:
    """Profile, calibrate, plan the emulated cluster, run the planner's plan and the best even plan,
    compare (module doc). `calibration`: a calibration.json of this cluster to reuse (its profile too)."""
    say = say or print
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    check_emulated(spec)
    mspec = get_model(model)
    S = seq_len or (2048 if quick else 8192)
    n_steps = steps or (3 if quick else 8)
    if n_steps <= WARMUP_EXCLUDED:
        raise HexiSeqError(
            f"--steps must exceed the {WARMUP_EXCLUDED} warm-up steps left out of the measurement, got {n_steps}"
        )
    stamp = default_run_dir()
    root = Path(out) if out is not None else stamp.with_name("compare-" + stamp.name)
    if root.exists() and any(root.iterdir()):
        raise HexiSeqError(f"{root} already holds files; give another --out")
    record = None
    if calibration is not None:
        record = read_calibration(calibration, spec.name, mspec.name)
        if profile is None:
            profile = Profile(
                record["profile"]["gpus"], record["profile"].get("measured") or {}, record["profile"].get("notes") or ""
            )
    if profile is None:
        prof = measure_profile(cluster=spec, model=model, seq_len=min(S, 8192), quick=quick, say=say)
    else:
        prof = profile if isinstance(profile, Profile) else Profile.load(profile)
    missing = [t for t in spec.gpu_types if t not in prof.gpus]
    if missing:
        raise HexiSeqError(
            f"the profile has no figures for {', '.join(missing)}; profile the cluster: hexiseq profile --cluster "
            f"{spec.name}"
        )
    base = prof.apply(spec)
    if record is None:
        cal = calibrate(
            cluster=spec,
            profile=prof,
            quick=quick,
            model=model,
            seq_len=S,
            out=root / "calibration",
            timeout_s=timeout_s,
            say=say,
        )
        factors, source = cal.factors, f"fitted now on {len(cal.rows)} plans ({cal.out})"
        say(cal.summary())
    else:
        factors, source = dict(record["factors"]), calibration_source(calibration, record, say)
    cost = scaled_cluster(base, factors)
    block = 64 if S >= 4096 else 32
    say(f"planning {spec.name} for {mspec.name} at S={S:,} with the calibrated figures ...")
    result = plan_cluster(cost, mspec, Workload(S, 1, "auto", "replicated", block), progress=False)
    even = result.best_symmetric_baseline
    if even is None:
        raise HexiSeqError(f"no even plan fits {spec.name} for {mspec.name} at S={S:,}")
    picks = [
        (
            "hexiseq",
            result.plan,
            result.recompute,
            result.iteration_time_s,
            _uneven_label(result.plan, result.recompute),
        ),
        ("even", even.plan, even.recompute, even.iteration_time_s, f"{even.name}: {even.config}"),
    ]
    root.mkdir(parents=True, exist_ok=True)
    load0 = _load()
    rows = []
    for system, plan, policy, pred, config in picks:
        say(f"  running {system}: {config}, {plan.world_size} ranks, {n_steps} steps ...")
        t0 = time.perf_counter()
        summary = run_plan(on_emulated(plan, spec, cost), spec, policy, pred, root / system, model, n_steps, timeout_s)
        m = float(summary["measured_step_time_s"])
        alone = _simulate(base, mspec, plan, policy)
        rows.append(
            {
                "system": system,
                "plan": plan.name,
                "config": config,
                "recompute": policy,
                "ranks": plan.world_size,
                "devices": list(plan.rank_devices),
                "measured_s": m,
                "predicted_s": pred,
                "error": pred / m - 1,
                "predicted_profile_s": alone,
                "error_profile": alone / m - 1,
                "pacing_overrun": pacing_overrun(summary),
                "run_dir": str(root / system),
                "wall_s": time.perf_counter() - t0,
            }
        )
    cmp = Comparison(
        spec.name, mspec.name, S, n_steps, rows, str(root), prof, factors, source, {"before": load0, "after": _load()}
    )
    write_text_atomic(root / "comparison.json", json.dumps(cmp.to_dict(), indent=2, default=float) + "\n")
    return cmp


def _uneven_label(plan: Any, policy: str) -> str:
    """What the planner's plan is, in one line: its groups, their tokens per rank and heads."""
    groups = " | ".join(
        f"{'+'.join(map(str, g.devices))}: {'/'.join(map(str, g.shards))} tokens, heads {'/'.join(map(str, g.heads))}"
        for g in plan.groups
    )
    return f"CP {plan.num_groups} x HP ({groups}), recompute {policy}"


def _simulate(cluster: ClusterSpec, model: Any, plan: Any, policy: str) -> float:
    return float(
        simulate(
            plan, cluster, model, Workload(plan.seq_len, 1, policy, "replicated", plan.block_size)
        ).iteration_time_s
    )


MACHINE_FIELDS = ("cpu", "cores", "torch")  # what moves a CPU rank's speed: a calibration holds for these only


def other_machine(record: dict[str, Any], here: dict[str, Any] | None = None) -> str | None:
    """How the machine a calibration.json was measured on (its profile's) differs from this one
    (`here`: profile.machine()) in MACHINE_FIELDS, in words; None when they agree or it is not recorded."""
    then = ((record.get("profile") or {}).get("measured") or {}).get("machine") or {}
    if not then:
        return None
    here = here if here is not None else machine()
    differ = [k for k in MACHINE_FIELDS if then.get(k) != here.get(k)]
    if not differ:
        return None
    return ", ".join(f"{k} {then.get(k)} there, {here.get(k)} here" for k in differ)


def calibration_source(path: str | Path, record: dict[str, Any], say: Callable[[str], None]) -> str:
    """The reused calibration as a report names it, saying so (and warning) when it was measured on
    another machine: its figures then predict that machine's ranks, not these."""
    differ = other_machine(record)
    if differ is None:
        return str(path)
    note = (
        f"{path}, measured on another machine ({differ}): the predictions are that machine's; calibrate on "
        "this one (leave out --calibration) to compare like with like"
    )
    say(f"warning: --calibration {note}")
    return note


def read_calibration(path: str | Path, cluster: str, model: str) -> dict[str, Any]:
    """A calibration.json of `cluster` and `model` (hexiseq calibrate --cluster ... --out DIR)."""
    p = Path(path)
    if p.is_dir():
        p = p / "calibration.json"
    try:
        record = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise HexiSeqError(f"--calibration {path}: cannot read a calibration.json ({e})") from None
    if not isinstance(record, dict) or "factors" not in record or "profile" not in record:
        raise HexiSeqError(f"--calibration {path}: not a calibration.json of hexiseq calibrate (no factors / profile)")
    if record.get("cluster") != cluster or record.get("model") != model:
        raise HexiSeqError(
            f"--calibration {path} calibrated {record.get('cluster')} with {record.get('model')}, not {cluster} with "
            f"{model}"
        )
    return record
