"""Data-parallel replicas measured on the CPU emulation (issue 19, part 6).

    python benchmarks/bench_dp.py [--clusters cpu-4,cpu-8] [--seq-len 512] [--global-batch 6] [--steps 5]
                                  [--out data/results/dp.txt]

On each emulated cluster (data/clusters/README.md), the same model (tiny) and global batch under
three plans, each run for real (`hexiseq run`, every rank emulating its device and the link between
the nodes):
- DP = 1: the planner's one-replica HexiSeq plan over every rank (gradient accumulation in time);
- even DP: one replica per node (an even HP group over the node's ranks), the batch split evenly;
- uneven DP: the same replicas, the shares that minimise the predicted step (the slowest replica's
  micro-steps plus the gradient all-reduce over the world).
The choice is the plan of lowest predicted step time. Reported: measured (median after warm-up) and
predicted step time of each, per-replica compute and waiting, and the pacing overrun of every run
(1.00 = the emulation held; more: the machine's load pushed ranks past their emulated speed).
Every figure depends on the machine and its load, which the report states.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hexiseq.calibrate.calibrate import pacing_overrun
from hexiseq.calibrate.profile import machine
from hexiseq.plan import Group, Plan, Sharding
from hexiseq.rounding import even_split
from hexiseq.runs.config import predict_replicas, resolve_model
from hexiseq.specs import load_cluster, write_text_atomic

HEXISEQ = [sys.executable, "-m", "hexiseq.cli"]


def node_replica(plan_args: dict, devices: list[int]) -> Plan:
    """One replica on one node's devices: a single HP group, tokens and heads split evenly."""
    seq_len, heads, block = plan_args["seq_len"], plan_args["num_heads"], plan_args["block_size"]
    group = Group(tuple(devices), seq_len // 2, tuple(even_split(seq_len, len(devices))),
                  tuple(even_split(heads, len(devices))))  # fmt: skip
    return Plan(seq_len, heads, plan_args["num_kv_heads"], (group,), block, cluster=plan_args["cluster"])


def best_shares(replicas: list[Plan], batch: int, predict) -> tuple[int, ...]:
    """The two-replica shares of `batch` (each at least one) of the lowest predicted step."""
    options = [(n, batch - n) for n in range(1, batch)]
    return min(options, key=lambda s: predict(Plan.joint(replicas, list(s), Sharding("replicated", "all"))))


def run(plan: Plan, work: Path, name: str, steps: int, batch: int) -> dict:
    path = work / f"{name}.json"
    plan.save(path)
    out = work / f"run-{name}"
    cmd = [*HEXISEQ, "run", "--plan", str(path), "--model", "tiny", "--steps", str(steps), "--global-batch",
           str(batch), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default="cpu-4,cpu-8")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--global-batch", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="data/results/dp.txt")
    args = ap.parse_args()
    m = machine()
    lines = [
        f"bench_dp: {' '.join(sys.argv)}",
        f"machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"model tiny, S = {args.seq_len}, global batch {args.global_batch} sequences, {args.steps} steps per run "
        "(median after 2 warm-up steps)",
    ]
    print("\n".join(lines), flush=True)
    for name in args.clusters.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"hexiseq-bench-dp-{name}-"))
        cluster = load_cluster(name)
        dp1_path = work / "dp1.json"
        subprocess.run([*HEXISEQ, "plan", "--cluster", name, "--model", "tiny", "--seq-len", str(args.seq_len),
                        "--out", str(dp1_path)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        dp1 = Plan.load(dp1_path)
        base = dict(seq_len=dp1.seq_len, num_heads=dp1.num_heads, num_kv_heads=dp1.num_kv_heads,
                    block_size=dp1.block_size, cluster=dp1.cluster)  # fmt: skip
        replicas = [node_replica(base, devs) for devs in cluster.node_devices]
        cfg, model_name, _ = resolve_model(dp1, "tiny", None, 0)

        def predict(plan: Plan, cfg=cfg, model_name=model_name) -> float:
            return predict_replicas(plan, cfg, model_name, args.global_batch, "none")["step_time_s"]

        half = args.global_batch // 2
        even = Plan.joint(replicas, [half, args.global_batch - half], Sharding("replicated", "all"), name="even-dp")
        uneven = Plan.joint(replicas, list(best_shares(replicas, args.global_batch, predict)),
                            Sharding("replicated", "all"), name="uneven-dp")  # fmt: skip
        rows = []
        load0 = os.getloadavg()[0]
        for label, plan in (("DP = 1 (HexiSeq)", dp1), ("even DP", even), ("uneven DP", uneven)):
            s = run(plan, work, plan.name, args.steps, args.global_batch)
            shares = " : ".join(str(r.sequences) for r in plan.replicas) or str(args.global_batch)
            rows.append((label, shares, s))
        load1 = os.getloadavg()[0]
        chosen = min(rows, key=lambda r: r[2]["predicted_step_time_s"])
        fastest = min(rows, key=lambda r: r[2]["measured_step_time_s"])
        header = f"{'plan':18} {'shares':8} {'predicted s':>12} {'measured s':>11} {'pred/meas':>10} {'overrun':>8}"
        first = len(lines)
        lines += ["", f"== {name}: load average {load0:.2f} -> {load1:.2f}", header]
        for label, shares, s in rows:
            p, t = s["predicted_step_time_s"], s["measured_step_time_s"]
            lines.append(
                f"{label:18} {shares:8} {p:12.3f} {t:11.3f} {p / t:10.2f} {(pacing_overrun(s) or float('nan')):8.2f}"
            )
            for r in s.get("replicas") or []:
                lines.append(
                    f"    replica {r['replica']} ({r['ranks']} ranks, {r['sequences']} seq): compute "
                    f"{r['measured_compute_s']:.3f} s measured vs {r['predicted_compute_s']:.3f} s predicted, "
                    f"waiting {r['measured_waiting_s']:.3f} s"
                )
        t = {label: s["measured_step_time_s"] for label, _, s in rows}
        p = {label: s["predicted_step_time_s"] for label, _, s in rows}
        c = chosen[0]
        lines += [
            f"planned (lowest predicted): {c}; measured fastest: {fastest[0]}",
            f"planned plan's speedup, measured (predicted): over the even-share plan {t['even DP'] / t[c]:.2f}x "
            f"({p['even DP'] / p[c]:.2f}x), over DP = 1 {t['DP = 1 (HexiSeq)'] / t[c]:.2f}x "
            f"({p['DP = 1 (HexiSeq)'] / p[c]:.2f}x)",
        ]
        print("\n".join(lines[first:]), flush=True)
    write_text_atomic(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
