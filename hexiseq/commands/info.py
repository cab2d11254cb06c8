"""`hexiseq info CLUSTER [--model NAME]`: what a cluster holds and whether a model's states fit."""

from __future__ import annotations

import argparse

from ..specs import GIB, get_model, load_cluster
from .common import dump_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarize a cluster (devices, PFLOP/s, memory, bandwidth)", description=__doc__)
    p.add_argument("cluster", help="cluster YAML file or bundled name (e.g. testbed-8)")
    p.add_argument("--model", help="also report whether this model's training states fit")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def states_fit(cluster, model) -> dict:
    """Model states (bf16 weights+grads, fp32 master+Adam = 16 B/param) replicated vs sharded over all devices."""
    total = sum(model.state_bytes().values())
    min_mem = min(d.gpu.memory_gib for d in cluster.devices) * GIB
    return {
        "model": model.name,
        "params_b": round(model.param_count / 1e9, 3),
        "state_gib": round(total / GIB, 1),
        "replicated_fits": bool(total <= min_mem),
        "zero3_per_device_gib": round(total / cluster.size / GIB, 2),
        "zero3_fits": bool(total / cluster.size <= min_mem),
    }


def run(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    s = cluster.summary()
    fit = states_fit(cluster, get_model(args.model)) if args.model else None
    if args.json:
        dump_json({**s, "model_states": fit} if fit else s)
        return 0
    print(f"cluster {s['name']}: {s['devices']} GPUs in {s['nodes']} nodes — {cluster.description}")
    rows = [[name, t["count"], t["peak_bf16_tflops"], t["memory_gib"], t["link"]] for name, t in s["types"].items()]
    print_table(["GPU", "count", "BF16 TFLOP/s", "memory GiB", "intra-node link"], rows, indent="  ")
    print(f"  total: {s['peak_pflops']:.2f} PFLOP/s peak BF16, {s['memory_gib']:.0f} GiB")
    intra = ", ".join(f"{x:g}" for x in s["intra_node_gbps"]) or "-"
    inter = ", ".join(f"{x:g}" for x in s["inter_node_gbps"]) or "-"
    print(f"  bandwidth per direction: inside nodes {intra} GB/s; between nodes {inter} GB/s")
    if fit:
        print(
            f"  {fit['model']}: {fit['params_b']} B params, {fit['state_gib']} GiB of training states; "
            f"replicated: {'fits' if fit['replicated_fits'] else 'does NOT fit'}; "
            f"ZeRO-3 over {cluster.size} GPUs: {fit['zero3_per_device_gib']} GiB each, "
            f"{'fits' if fit['zero3_fits'] else 'does NOT fit'}"
        )
    return 0
