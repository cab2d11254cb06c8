"""What a plan records of the cluster and the model it was made for, and how it is checked.

- The cluster's **fingerprint**: its devices (GPU type, node, count) and links (in-node bandwidth,
  NIC, inter-node latency, overrides), hashed, with a short summary beside it. Device indices of a
  plan mean particular GPUs of one cluster: a plan used with a cluster whose fingerprint differs is
  refused with what differs. GPU efficiencies are not in it (a profile or a refitted catalog
  changes the speeds, not which device is which).
- The **model**: a model that is not in the bundled catalog (a Hugging Face config.json) is
  recorded whole, so that `estimate`, `verify`, `run` and `export` find it by the plan's model name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..errors import SpecError
from .catalog import get_model, model_catalog
from .cluster import ClusterSpec
from .model import ModelSpec


def _structure(cluster: ClusterSpec) -> dict[str, Any]:
    return {
        "nodes": [
            [node.gpu.name, node.count, node.link_bandwidth_gbps or node.gpu.link_bandwidth_gbps, node.nic_gbps]
            for node in cluster.nodes
        ],
        "inter_node_latency_us": cluster.inter_node_latency_us,
        "overrides": [sorted(dataclasses.asdict(o).items()) for o in cluster.overrides],
    }


def cluster_fingerprint(cluster: ClusterSpec) -> dict[str, Any]:
    """The record a plan keeps of its cluster: a hash of devices and links, and a summary to say
    what differs (devices, GPU types per count, nodes)."""
    text = json.dumps(_structure(cluster), sort_keys=True, default=str)
    return {
        "hash": hashlib.sha256(text.encode()).hexdigest()[:16],
        "devices": cluster.size,
        "nodes": len(cluster.nodes),
        "gpus": dict(sorted(Counter(d.gpu.name for d in cluster.devices).items())),
    }


def fingerprint_mismatch(recorded: Mapping[str, Any], cluster: ClusterSpec) -> str | None:
    """None when `cluster` is the cluster `recorded` describes; else what differs, in words."""
    now = cluster_fingerprint(cluster)
    if recorded.get("hash") == now["hash"]:
        return None
    diffs = [
        f"{what} {recorded.get(key)} there, {now[key]} here"
        for key, what in (("devices", "devices"), ("nodes", "nodes"), ("gpus", "GPUs"))
        if recorded.get(key) != now[key]
    ]
    return "; ".join(diffs) or "the same devices, but other links or another device order"


def model_record(model: ModelSpec) -> dict[str, Any] | None:
    """The model as a plan records it: None for an unchanged catalog model (its name finds it),
    else the whole spec."""
    if model_catalog().get(model.name) == model:
        return None
    return json.loads(json.dumps(dataclasses.asdict(model)))  # plain JSON values (tuples as lists)


def model_named(name: str, recorded: Mapping[str, Any] | None = None) -> ModelSpec:
    """The model called `name`: the one a plan recorded under that name, else a catalog model or a
    Hugging Face config.json path (`get_model`)."""
    if recorded and recorded.get("name") == name:
        try:
            return ModelSpec(**recorded)
        except (TypeError, ValueError) as e:
            raise SpecError(f"the plan's recorded model {name!r} is damaged ({e}); pass --model") from None
    return get_model(name)
