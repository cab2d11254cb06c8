"""Sweeps behind the paper's figures: scenario files in `data/scenarios/` name clusters, models
and sequence lengths; `run_scenario` plans every combination (HexiSeq and all baselines on the
same cost model) and returns one row per case; results can be cached in `data/results/`.

Rows are plain dicts so notebooks can tabulate and plot them without knowing the planner.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from .errors import HexiSeqError, SpecError
from .specs import DATA_DIR, ClusterSpec, Workload, get_model, load_cluster, parse_tokens

SCENARIO_DIR = DATA_DIR / "scenarios"
RESULT_DIR = DATA_DIR / "results"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    clusters: tuple[str, ...]
    models: tuple[str, ...]
    seq_lens: tuple[int, ...]
    workload: dict[str, Any] = field(default_factory=dict)
    pairs: tuple[tuple[str, str], ...] = ()  # (mixed, homogeneous) for FLOP-comparable pairs


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A bundled scenario by name (`testbed`, `simulation`, `pairs`) or a YAML path."""
    p = Path(name_or_path)
    if not p.exists():
        p = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in SCENARIO_DIR.glob("*.yaml")))
        raise SpecError(f"scenario not found: {name_or_path}; bundled: {known}")
    raw = yaml.safe_load(p.read_text())
    return Scenario(
        name=raw.get("name", p.stem),
        description=raw.get("description", ""),
        clusters=tuple(raw.get("clusters", ())),
        models=tuple(raw["models"]),
        seq_lens=tuple(parse_tokens(s) for s in raw["seq_lens"]),
        workload=dict(raw.get("workload") or {}),
        pairs=tuple((x["mixed"], x["homogeneous"]) for x in raw.get("pairs", ())),
    )


def plan_case(cluster: ClusterSpec, model_name: str, seq_len: int, workload_kw: dict[str, Any] | None = None, **plan_kw: Any) -> dict[str, Any]:
    """Plan one (cluster, model, length) case; a row with HexiSeq's and every baseline's tokens/s.

    An infeasible case returns a row with `feasible: False` and the explanation rather than raising,
    so one impossible corner does not stop a sweep.
    """
    from .planner import plan_cluster

    model = get_model(model_name)
    # recompute "auto" unless the scenario says otherwise: the planner picks the fastest policy that fits
    wl = Workload(seq_len=seq_len, **{"activation_checkpointing": "auto", **(workload_kw or {})})
    row: dict[str, Any] = {"cluster": cluster.name, "gpus": cluster.size, "model": model_name, "seq_len": seq_len}
    t0 = time.perf_counter()
    try:
        result = plan_cluster(cluster, model, wl, progress=False, **plan_kw)
    except HexiSeqError as e:
        row.update(feasible=False, reason=str(e), plan_time_s=time.perf_counter() - t0)
        return row
    d = result.to_dict()
    base = {k: v for k, v in d["baselines"].items() if v}
    best_name = max(base, key=base.get) if base else None
    row.update(
        feasible=True,
        hexiseq_tokens_per_s=d["throughput_tokens_per_s"],
        baselines=d["baselines"],
        best_baseline=best_name,
        best_baseline_tokens_per_s=base.get(best_name, 0.0) if best_name else 0.0,
        speedup=d["speedup_vs_best_baseline"],  # over every baseline, the proportional heuristic included
        best_symmetric=d.get("best_symmetric_baseline"),
        speedup_vs_symmetric=d.get("speedup_vs_best_symmetric"),  # over the best CP/HP baseline (the paper's measure)
        gap=d["gap"],
        efficiency_vs_bound=d.get("efficiency_vs_bound"),
        plan_time_s=d["plan_time_s"],
        recompute=result.recompute,
        groups=len(result.plan.groups),
        ranks=result.plan.world_size,
    )
    return row


def run_scenario(scenario: Scenario | str, progress: bool = True, **plan_kw: Any) -> list[dict[str, Any]]:
    """Every case of a scenario, one row each (see `plan_case`); pairs add a `pair` row per case."""
    from tqdm.auto import tqdm

    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    cases: list[tuple[str, str, int]] = [(c, m, s) for c in sc.clusters for m in sc.models for s in sc.seq_lens]
    pair_cases = [(p, m, s) for p in sc.pairs for m in sc.models for s in sc.seq_lens]
    rows: list[dict[str, Any]] = []
    clusters: dict[str, ClusterSpec] = {}

    def cluster(name: str) -> ClusterSpec:
        if name not in clusters:
            clusters[name] = load_cluster(name)
        return clusters[name]

    bar = tqdm(total=len(cases) + len(pair_cases), desc=f"scenario {sc.name}", disable=not progress)
    for c, m, s in cases:
        bar.set_postfix_str(f"{c} {m} {s // 1024}K")
        rows.append(plan_case(cluster(c), m, s, sc.workload, **plan_kw))
        bar.update()
    for (mixed, homo), m, s in pair_cases:
        bar.set_postfix_str(f"{mixed} vs {homo} {m} {s // 1024}K")
        a = plan_case(cluster(mixed), m, s, sc.workload, **plan_kw)
        b = plan_case(cluster(homo), m, s, sc.workload, **plan_kw)
        ratio = a["hexiseq_tokens_per_s"] / b["best_baseline_tokens_per_s"] if a.get("feasible") and b.get("feasible") and b["best_baseline_tokens_per_s"] else None
        rows.append({"pair": f"{mixed} vs {homo}", "model": m, "seq_len": s, "mixed": a, "homogeneous": b, "mixed_hexiseq_over_homogeneous_best": ratio})
        bar.update()
    bar.close()
    return rows


def save_results(name: str, rows: Iterable[dict[str, Any]], directory: Path = RESULT_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(list(rows), indent=1, default=float) + "\n")
    return path


def load_results(name: str, directory: Path = RESULT_DIR) -> list[dict[str, Any]] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def summarize(rows: list[dict[str, Any]], key: str = "speedup_vs_symmetric") -> dict[str, float]:
    """Mean / max / min of a speedup column over the feasible cases of a sweep (default: over the
    best symmetric CP/HP baseline, as the paper reports; `key="speedup"` includes the heuristic)."""
    speedups = [r[key] for r in rows if r.get("feasible") and r.get(key)]
    if not speedups:
        return {"cases": 0}
    return {
        "cases": len(speedups),
        "mean_speedup": round(sum(speedups) / len(speedups), 4),
        "max_speedup": round(max(speedups), 4),
        "min_speedup": round(min(speedups), 4),
    }


def mixed_cluster(gpus: int, types: tuple[str, ...] = ("H100-SXM", "A100-80GB", "A800", "L40S"), node_size: int = 8) -> ClusterSpec:
    """A cluster of `gpus` devices split evenly over `types` in nodes of `node_size` (scaling studies)."""
    if gpus % (len(types) * node_size):
        raise SpecError(f"{gpus} GPUs do not split into {len(types)} types x nodes of {node_size}")
    nodes_per_type = gpus // (len(types) * node_size)
    nic = {"H100-SXM": 50.0, "L40S": 12.5}
    nodes = [(t, node_size, nic.get(t, 25.0)) for t in types for _ in range(nodes_per_type)]
    return ClusterSpec.from_nodes(f"mixed-{gpus}", nodes)
