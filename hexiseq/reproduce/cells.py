"""One cell computed: HexiSeq planned and every baseline the planner tuned, each judged by the
cost model, as a JSON-ready record (what the cache stores and the results table is made of).

The systems are whatever `PlanResult.baselines` holds, in its order, after HexiSeq: adding a
baseline to the planner adds a system here with no change. A cell where nothing fits (the planner
raises) is a record with status "infeasible" and the planner's explanation; a cell where HexiSeq
fits but a baseline does not has that baseline's row with `feasible: False`.

Every row says its replicas and sharding: the paper's cells are one replica under the workload's
sharding (ZeRO-3 over all devices: the paper's setting). A joint cell (`Cell.joint`, the
global-batch scenario) plans the whole step (planner.plan_joint): its systems are HexiSeq's joint
plan, the DP = 1 planner's plan at the same global batch ("hexiseq dp=1"), and the DP x family
baselines, each with its replicas and strategy.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import time
from typing import Any

from .. import planner  # planner.plan_cluster looked up at call time: tests replace it
from ..costmodel import CostOptions, estimate
from ..costmodel.kernels import rates
from ..costmodel.step import estimate_step
from ..errors import HexiSeqError
from ..planner.joint import to_dict as joint_to_dict
from ..specs import ClusterSpec, ModelSpec, Workload, get_model, load_cluster
from ..specs.stacks import get_stack

HEXISEQ = "hexiseq"
DP1 = "hexiseq dp=1"  # a joint cell's DP = 1 planner at the same global batch


def machine_info() -> dict[str, Any]:
    """What a wall-clock figure was measured on (timings are only comparable on one machine)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_avg_1m": round(load[0], 2),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def _clean(x: Any) -> Any:
    """NaN/inf -> None, tuples -> lists: valid JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _paper_sharding(workload: Any) -> str:
    """One replica under the workload's sharding, in the words of Sharding.describe."""
    return "zero3 over all devices" if workload.param_sharding == "zero3" else "replicated"


def _result_system(
    name: str,
    result: Any,
    cluster: ClusterSpec,
    model: ModelSpec,
    wl: Workload,
    options: CostOptions,
    **extra: Any,
) -> dict:
    """The row of a planner's result (a PlanResult): its plan under its recompute policy, as planned."""
    return _system(
        name,
        result.plan,
        cluster,
        model,
        wl.with_recompute(result.recompute),
        options,
        result.estimate,
        tokens_per_s=result.tokens_per_s,
        step_time_s=result.iteration_time_s,
        recompute=result.recompute,
        config=result.grouping_label,
        plan_time_s=result.plan_time_s,
        efficiency_vs_bound=result.efficiency_vs_bound,
        **extra,
    )


def _system(
    name: str, plan: Any, cluster: Any, model: Any, workload: Any, options: CostOptions, est: Any = None, **fields: Any
) -> dict[str, Any]:
    """The row facts of one system that fits: its estimate's memory and phase times (on the
    options' stack, the one it was planned on)."""
    est = est if est is not None else estimate(plan, cluster, model, workload, options)
    crit = est.ranks[est.critical_rank]
    headroom = min(r.capacity_gib - r.memory_gib for r in est.ranks)
    return {
        "system": name,
        "feasible": True,
        "devices_used": plan.world_size,
        "replicas": 1,
        "sharding": _paper_sharding(workload),
        "memory_headroom_gib": headroom,
        "memory_peak_frac": max(r.memory_gib / r.capacity_gib for r in est.ranks),
        "critical_phase": est.critical_phase,
        "phases_s": dict(crit.time_s),  # the critical rank's time by cost-model phase
        "estimate_time_s": est.iteration_time_s,
        **fields,
    }


def systems_of(
    result: Any, cluster: Any, model: Any, wl: Any, options: CostOptions | None = None
) -> list[dict[str, Any]]:
    """One dict per system of a PlanResult: HexiSeq first, then every baseline it holds; `options`
    are the cost options it was planned with (default CostOptions(): the default stack)."""
    options = options if options is not None else CostOptions()
    systems = [
        _result_system(HEXISEQ, result, cluster, model, wl, options, gap=result.gap, lower_bound_s=result.lower_bound_s)
    ]
    for name, b in result.baselines.items():
        if b.feasible:
            systems.append(
                _system(
                    name,
                    b.plan,
                    cluster,
                    model,
                    wl.with_recompute(b.recompute),
                    options,
                    tokens_per_s=b.tokens_per_s,
                    step_time_s=b.iteration_time_s,
                    recompute=b.recompute,
                    config=b.config,
                    efficiency_vs_bound=b.tokens_per_s / result.bound_tokens_per_s,
                )
            )
        else:
            systems.append(
                {
                    "system": name,
                    "feasible": False,
                    "config": b.config,
                    "reason": "; ".join(b.notes) or f"none of its {b.tried} configurations fits in memory",
                }
            )
    return systems


def stack_options(stack: str | None = None) -> CostOptions:
    """The cost options of a cell or a setting: the defaults on the named stack (None: the default
    stack). An unknown name fails here, with the known ones."""
    return CostOptions(stack=get_stack(stack))


def plan_setting(
    cluster_name: str,
    model_name: str,
    seq_len: int,
    recompute: str = "auto",
    sharding: str = "zero3",
    stack: str | None = None,
) -> tuple[ClusterSpec, ModelSpec, Workload, Any]:
    """One setting (a bundled cluster, a model, a length) planned as the plan explorer plans it, on
    the software stack `stack` (None: the default): (cluster, model, workload, PlanResult). Planner
    errors (nothing fits, a bad name) propagate."""
    options = stack_options(stack)
    cluster, model = load_cluster(cluster_name), get_model(model_name)
    wl = Workload(seq_len=seq_len, activation_checkpointing=recompute, param_sharding=sharding)
    return cluster, model, wl, planner.plan_cluster(cluster, model, wl, progress=False, options=options)


def _joint_system(
    name: str, plan: Any, cluster: Any, model: Any, workload: Any, options: CostOptions, **fields: Any
) -> dict[str, Any]:
    """The row facts of one joint plan: its step, replicas, strategy and fullest rank."""
    st = estimate_step(plan, cluster, model, workload, options)
    return {
        "system": name,
        "feasible": True,
        "devices_used": plan.world_size,
        "replicas": plan.num_replicas,
        "sharding": plan.sharding.describe(),
        "memory_headroom_gib": min(r.capacity_gib - r.memory_gib for r in st.replicas),
        "memory_peak_frac": max(r.memory_gib / r.capacity_gib for r in st.replicas),
        "tokens_per_s": st.tokens_per_s,
        "step_time_s": st.step_time_s,
        "estimate_time_s": st.step_time_s,
        "efficiency_vs_bound": st.efficiency_vs_bound,
        **fields,
    }


def run_joint_cell(
    cell: Any, record: dict[str, Any], cluster: Any, model: Any, wl: Any, options: CostOptions
) -> dict[str, Any]:
    """A global-batch cell (module doc): the joint plan, the DP = 1 plan, the DP x family baselines."""
    t0 = time.perf_counter()
    try:
        res = planner.plan_joint(cluster, model, wl, options=options)
    except HexiSeqError as e:
        record.update(
            status="infeasible",
            reason=str(e),
            wall_s=time.perf_counter() - t0,
            systems=[{"system": HEXISEQ, "feasible": False, "plan_time_s": time.perf_counter() - t0, "reason": str(e)}],
        )
        return _clean(record)
    wall = time.perf_counter() - t0
    systems = [
        _joint_system(
            HEXISEQ,
            res.plan,
            cluster,
            model,
            wl.with_recompute(res.recompute),
            options,
            recompute=res.recompute,
            config=res.partition,
            plan_time_s=res.plan_time_s,
            gap=res.gap,
            lower_bound_s=res.lower_bound_s,
        )
    ]
    d1 = res.dp1
    if d1 is None:  # the joint planner proved it slower without running it: planned here for the row
        try:
            d1 = planner.plan_cluster(cluster, model, wl, progress=False, options=options)
        except HexiSeqError:
            d1 = None
    if d1 is not None:
        systems.append(_result_system(DP1, d1, cluster, model, wl, options))
    for name, b in res.baselines.items():
        if b.feasible:
            systems.append(
                _joint_system(
                    name,
                    b.plan,
                    cluster,
                    model,
                    wl.with_recompute(b.recompute),
                    options,
                    recompute=b.recompute,
                    config=b.config,
                )
            )
        else:
            systems.append({"system": name, "feasible": False, "config": b.config, "reason": "nothing fits in memory"})
    bb = res.best_baseline
    record.update(
        status="ok",
        wall_s=wall,
        systems=systems,
        best_symmetric=bb.name if bb else None,
        speedup=res.speedup_vs_best_baseline,
        best_baseline=bb.name if bb else None,
        speedup_vs_all=res.speedup_vs_best_baseline,
        bound_tokens_per_s=res.bound_tokens_per_s,
        planner={k: v for k, v in joint_to_dict(res).items() if k != "plan"},
        plan=res.plan.to_dict(),
    )
    return _clean(record)


def joint_setting(
    cluster_name: str,
    model_name: str,
    seq_len: int,
    global_batch: int,
    recompute: str = "auto",
    sharding: str = "zero3",
    stack: str | None = None,
) -> tuple[ClusterSpec, ModelSpec, Workload, Any]:
    """One setting with a global batch planned as a whole step (planner.plan_joint) on the
    software stack `stack` (None: the default): (cluster, model, workload, JointResult)."""
    options = stack_options(stack)
    cluster, model = load_cluster(cluster_name), get_model(model_name)
    wl = Workload(
        seq_len=seq_len, global_batch=global_batch, activation_checkpointing=recompute, param_sharding=sharding
    )
    return cluster, model, wl, planner.plan_joint(cluster, model, wl, options=options)


def run_cell(cell: Any) -> dict[str, Any]:
    """Plan one cell (HexiSeq and every baseline) on the cell's software stack (`Cell.stack`) and
    return its record (module doc)."""
    options = stack_options(cell.stack)
    cluster, model, wl = cell.cluster.build(), get_model(cell.model), cell.workload_spec()
    record: dict[str, Any] = {
        "inputs": cell.compute_params(),
        "cluster": {
            "name": cluster.name,
            "gpus": cluster.size,
            "nodes": len(cluster.nodes),
            "types": cluster.gpu_types,
            "peak_pflops": cluster.peak_pflops,
            # the layers' GEMM rate on the cell's stack (FP8 stacks raise it; the default's is the catalog's)
            "matmul_pflops": float(rates([d.gpu for d in cluster.devices], options.stack).layer_matmul.sum()) / 1e15,
            "memory_gib": cluster.memory_gib,
        },
        "model": cell.model,
        "seq_len": cell.seq_len,
        "global_batch": wl.global_batch,
        "stack": cell.stack,
        "machine": machine_info(),
        "computed_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if getattr(cell, "joint", False):
        return run_joint_cell(cell, record, cluster, model, wl, options)
    t0 = time.perf_counter()
    try:
        result = planner.plan_cluster(cluster, model, wl, progress=False, options=options)
    except HexiSeqError as e:
        record.update(
            status="infeasible",
            reason=str(e),
            wall_s=time.perf_counter() - t0,
            systems=[{"system": HEXISEQ, "feasible": False, "plan_time_s": time.perf_counter() - t0, "reason": str(e)}],
        )
        return _clean(record)
    wall = time.perf_counter() - t0
    systems = systems_of(result, cluster, model, wl, options)
    summary = result.to_dict(include_plan=False)
    summary.pop("estimate", None)  # per-rank detail: large, and the rows keep what the figures need
    bs, bb = result.best_symmetric_baseline, result.best_baseline
    record.update(
        status="ok",
        wall_s=wall,
        systems=systems,
        best_symmetric=bs.name if bs else None,
        speedup=result.speedup_vs_best_symmetric,
        best_baseline=bb.name if bb else None,
        speedup_vs_all=result.speedup_vs_best_baseline,
        bound_tokens_per_s=result.bound_tokens_per_s,
        planner=summary,
        plan=result.plan.to_dict(),
    )
    return _clean(record)
