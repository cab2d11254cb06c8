"""Sensitivity studies: how HexiSeq's speedup moves with the network, the share of old GPUs and
the sequence length. Each sweep of a scenario's `sweeps:` becomes cells with `sweep` and
`sweep_value` set (the x of its figure); the cluster variants are built in `recipes.py`.

- `inter_node_bandwidth`: `{cluster, model, seq_len, nic_gbps: [12.5, ..., 100]}`; every NIC of the
  cluster set to each value (GB/s per GPU, per direction)
- `old_fraction`: `{nodes, node_size, new, old, nic_gbps, model, seq_len, fractions: [0, ..., 1]}`;
  `nodes` nodes of `node_size` GPUs, a fraction of them of the `old` type, the rest `new`
- `seq_len`: `{cluster, model, seq_lens: [16K, ..., 1M]}`
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..specs import get_gpu, parse_tokens
from .recipes import Cell, ClusterRecipe, checked_models, cluster_recipe


@dataclass(frozen=True)
class Sweep:
    name: str
    title: str  # figure title
    xlabel: str
    xkind: str  # "gbps" | "fraction" | "tokens": how the x axis is scaled and labelled
    keys: frozenset[str]  # the parameters the sweep takes


SWEEPS: dict[str, Sweep] = {
    s.name: s
    for s in (
        Sweep(
            "inter_node_bandwidth",
            "speedup vs inter-node bandwidth",
            "inter-node bandwidth per GPU (GB/s)",
            "gbps",
            frozenset({"cluster", "model", "seq_len", "nic_gbps"}),
        ),
        Sweep(
            "old_fraction",
            "speedup vs the share of old GPUs",
            "fraction of old GPUs",
            "fraction",
            frozenset({"nodes", "node_size", "new", "old", "nic_gbps", "model", "seq_len", "fractions"}),
        ),
        Sweep(
            "seq_len",
            "speedup vs sequence length",
            "sequence length (tokens)",
            "tokens",
            frozenset({"cluster", "model", "seq_lens"}),
        ),
    )
}


def _need(params: Mapping[str, Any], sweep: Sweep, where: str) -> None:
    missing, unknown = sweep.keys - set(params), set(params) - sweep.keys
    if missing or unknown:
        raise SpecError(
            f"{where}: {sweep.name} takes {sorted(sweep.keys)}"
            + (f"; missing {sorted(missing)}" if missing else "")
            + (f"; unknown {sorted(unknown)}" if unknown else "")
        )


def _numbers(values: Any, where: str, key: str, lo: float, hi: float) -> list[float]:
    if not isinstance(values, (list, tuple)) or not values:
        raise SpecError(f"{where}: {key} must be a non-empty list")
    out = []
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
            raise SpecError(f"{where}: {key} values must be numbers in [{lo:g}, {hi:g}], got {v!r}")
        out.append(float(v))
    return out


def sweep_cells(scenario: str, name: str, params: Any, workload: tuple, where: str) -> list:
    """The cells of one sweep (see module doc)."""
    if name not in SWEEPS:
        raise SpecError(f"{where}: unknown sweep {name!r}; known: {', '.join(SWEEPS)}")
    sweep = SWEEPS[name]
    if not isinstance(params, Mapping):
        raise SpecError(f"{where}: parameters must be a mapping")
    _need(params, sweep, where)
    (model,) = checked_models([params["model"]], where)

    def cell(recipe: ClusterRecipe, seq_len: int, x: float) -> Cell:
        return Cell(scenario, recipe, model, seq_len, workload, sweep=name, sweep_value=x)

    if name == "seq_len":
        base = cluster_recipe(params["cluster"], where)
        try:
            lens = [parse_tokens(s) for s in params["seq_lens"]]
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
        return [cell(base, s, float(s)) for s in lens]
    seq_len = parse_tokens(params["seq_len"])
    if name == "inter_node_bandwidth":
        base = cluster_recipe(params["cluster"], where)
        out = []
        for x in _numbers(params["nic_gbps"], where, "nic_gbps", 1e-3, 1e5):
            r = ClusterRecipe(f"{base.name}@{x:g}GB/s", "nic", base.source, (("base", base), ("nic_gbps", x)))
            out.append(cell(_checked(r, where), seq_len, x))
        return out
    # old_fraction
    nodes, size = params["nodes"], params["node_size"]
    for key, v in (("nodes", nodes), ("node_size", size)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise SpecError(f"{where}: {key} must be a positive integer, got {v!r}")
    for key in ("new", "old"):
        try:
            get_gpu(params[key])
        except SpecError as e:
            raise SpecError(f"{where}: {key}: {e}") from None
    (nic,) = _numbers([params["nic_gbps"]], where, "nic_gbps", 1e-3, 1e5)
    out = []
    for f in _numbers(params["fractions"], where, "fractions", 0.0, 1.0):
        old = f * nodes
        if abs(old - round(old)) > 1e-9:
            raise SpecError(f"{where}: fraction {f:g} of {nodes} nodes is not a whole number of nodes")
        p = (
            ("nodes", nodes),
            ("node_size", size),
            ("new", params["new"]),
            ("old", params["old"]),
            ("nic_gbps", nic),
            ("old_nodes", int(round(old))),
        )
        r = ClusterRecipe(
            f"{params['new']}+{params['old']} {f:.0%} old ({nodes * size} GPUs)", "old_fraction", params=p
        )
        out.append(cell(_checked(r, where), seq_len, f))
    return out


def _checked(recipe: Any, where: str) -> Any:
    try:
        recipe.build()
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    return recipe
