"""Scenario files (`data/scenarios/*.yaml`) and the cells they expand into.

A scenario names clusters, models and sequence lengths; every combination is a *cell*, planned
for HexiSeq and every baseline. Keys of a scenario file:

- `name`, `description`
- `clusters`: bundled cluster names or paths, or `{mixed: N}` for N GPUs split evenly over
  H100/A100/A800/L40S in nodes of 8 (`types:` and `node_size:` override; scaling studies)
- `models`, `seq_lens` (e.g. `16K`, `1M`), `workload` (Workload fields; recompute defaults to auto)
- `pairs`: `[{mixed: A, homogeneous: B}]`, FLOP-comparable pairs: both clusters of each pair
  become cells (roles `mixed` and `homogeneous`) for every model and length
- `sweeps`: sensitivity studies (see `sensitivity.py`): `{sweep name: parameters}`
- `global_batches`: `[1, 2, 4, ...]`: the clusters x models x lengths planned as whole steps of each
  global batch G (planner/joint.py: replicas x sharding x CP x HP), cells with `sweep`
  "global_batch" and `sweep_value` G (the paper's cells are one sequence, DP = 1, ZeRO-3)
- `quick`: the same keys again, for `--quick`: they replace the full ones (a sweep's parameters
  are merged into the full sweep's)

Bad files fail here, before any planning, with the file and the key at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..specs import DATA_DIR, Workload, parse_tokens, read_yaml
from .recipes import Cell, checked_models, cluster_recipe
from .sensitivity import sweep_cells

SCENARIO_DIR = DATA_DIR / "scenarios"
SCENARIO_KEYS = {
    "name",
    "description",
    "clusters",
    "models",
    "seq_lens",
    "workload",
    "pairs",
    "sweeps",
    "quick",
    "global_batches",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    cells: tuple[Cell, ...] = field(default=())
    quick: bool = False


def _workload(raw: Any, where: str) -> tuple[tuple[str, Any], ...]:
    wl = {"activation_checkpointing": "auto", **dict(raw or {})}  # the planner picks the recompute policy
    if "seq_len" in wl:
        raise SpecError(f"{where}: workload must not set seq_len (use seq_lens)")
    try:
        Workload(seq_len=1 << 20, **wl)
    except (TypeError, SpecError) as e:
        raise SpecError(f"{where}: bad workload {wl!r}: {e}") from None
    return tuple(sorted(wl.items()))


def _lens(raw: Any, where: str) -> tuple[int, ...]:
    if raw is not None and not isinstance(raw, (list, tuple)):  # a bare "abc" would be read letter by letter
        raise SpecError(f"{where}: a list of token counts (e.g. [16K, 32K]), got {raw!r}")
    try:
        return tuple(parse_tokens(s) for s in (raw or ()))
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def _batches(raw: Any, where: str) -> tuple[int, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(
        isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in raw
    ):
        raise SpecError(f"{where}: a list of global batch sizes (positive integers), got {raw!r}")
    return tuple(raw)


def scenario_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix and p.exists():
        return p
    p = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise SpecError(f"scenario not found: {name_or_path}; bundled: {', '.join(bundled_scenarios())}")
    return p


def bundled_scenarios() -> list[str]:
    return sorted(x.stem for x in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path, quick: bool = False) -> Scenario:
    """A bundled scenario by name or a YAML path, expanded into its cells (`quick`: the file's
    `quick:` subset). Every cluster is built and every model looked up here, so a bad entry fails
    before any planning starts."""
    path = scenario_path(name_or_path)
    raw = read_yaml(path)  # the specs' strict reader: one clear error for a missing or malformed file
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a scenario is a mapping with keys {sorted(SCENARIO_KEYS)}")
    unknown = set(raw) - SCENARIO_KEYS
    if unknown:
        raise SpecError(f"{path.name}: unknown keys {sorted(unknown)}; known: {sorted(SCENARIO_KEYS)}")
    if quick:
        q = dict(raw.get("quick") or {})
        bad = set(q) - (SCENARIO_KEYS - {"name", "description", "quick"})
        if bad:
            raise SpecError(f"{path.name}: quick: unknown keys {sorted(bad)}")
        sweeps = {k: {**v, **((q.get("sweeps") or {}).get(k) or {})} for k, v in (raw.get("sweeps") or {}).items()}
        raw = {**raw, **q, "sweeps": sweeps}
    name = str(raw.get("name", path.stem))
    where = f"{path.name}"
    wl = _workload(raw.get("workload"), f"{where}: workload")
    models = checked_models(raw.get("models"), f"{where}: models")
    lens = _lens(raw.get("seq_lens"), f"{where}: seq_lens")
    cells: list[Cell] = []
    batches = _batches(raw.get("global_batches"), f"{where}: global_batches")
    for i, entry in enumerate(raw.get("clusters") or ()):
        recipe = cluster_recipe(entry, f"{where}: clusters[{i}]")
        if batches:
            cells += [
                Cell(
                    name,
                    recipe,
                    m,
                    s,
                    tuple(sorted({**dict(wl), "global_batch": g}.items())),
                    sweep="global_batch",
                    sweep_value=float(g),
                    joint=True,
                )
                for m in models
                for s in lens
                for g in batches
            ]
        else:
            cells += [Cell(name, recipe, m, s, wl) for m in models for s in lens]
    for i, pair in enumerate(raw.get("pairs") or ()):
        if not isinstance(pair, Mapping) or set(pair) != {"mixed", "homogeneous"}:
            raise SpecError(f"{where}: pairs[{i}] must be {{mixed: CLUSTER, homogeneous: CLUSTER}}, got {pair!r}")
        mixed = cluster_recipe(pair["mixed"], f"{where}: pairs[{i}].mixed")
        homo = cluster_recipe(pair["homogeneous"], f"{where}: pairs[{i}].homogeneous")
        label = f"{mixed.name} vs {homo.name}"
        for m in models:
            for s in lens:
                cells += [
                    Cell(name, mixed, m, s, wl, pair=label, role="mixed"),
                    Cell(name, homo, m, s, wl, pair=label, role="homogeneous"),
                ]
    sweeps = raw.get("sweeps") or {}
    if not isinstance(sweeps, Mapping):
        raise SpecError(f"{where}: sweeps must map a sweep name to its parameters")
    for sweep, params in sweeps.items():
        cells += sweep_cells(name, sweep, params, wl, f"{where}: sweeps.{sweep}")
    if not cells:
        raise SpecError(f"{where}: no cells (give clusters + models + seq_lens, pairs, or sweeps)")
    return Scenario(name, str(raw.get("description", "")), str(path), tuple(cells), quick)


def load_scenarios(names: list[str] | tuple[str, ...] | None = None, quick: bool = False) -> list[Scenario]:
    """The named scenarios (default: every bundled one), all validated before any work."""
    scenarios: list[Scenario] = []
    seen: dict[str, str] = {}
    for n in names or bundled_scenarios():
        sc = load_scenario(n, quick=quick)
        if sc.name in seen:
            if seen[sc.name] != sc.path:
                raise SpecError(f"two scenarios are named {sc.name!r}: {seen[sc.name]} and {sc.path}")
            continue  # the same file named twice
        seen[sc.name] = sc.path
        scenarios.append(sc)
    return scenarios
