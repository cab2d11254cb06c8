"""The compute-bound throughput of a cluster for a workload: the limit no plan can beat.

The bound is the throughput of a perfectly balanced iteration with no communication, no
recompute and no waiting, timed with the kernel-time model every other part uses (kernels.py), so
every loss below it is imbalance, communication, recompute or a kernel cost the bound leaves out
(the causal-tile waste and the per-row block cost of attention, both >= 0, are left out: the
bound stays a bound). Useful FLOPs (`useful_flops`, `Estimate.model_flops`) are a different
number: 3 × forward, recompute not counted.

Per device i (kernels.WorkTimes; B = global_batch, S = seq_len, Λ = layers, H = heads):
    token work      τ_i = Λ·(pre + post, forward and backward) + head   seconds per token
    attention work  ρ_i = (1 + attn_bwd_factor)·pair                    seconds per (query, key)
                                                                        pair per head per layer
    total work      B·S tokens and B·Λ·H·S(S+1)/2 pair-heads (a zigzag group g does exactly
                    L_g·(S+1) pairs per head, so a plan's pairs always sum to this)
The fastest conceivable compute time is the LP

    t* = min t  s.t.  Σ_i x_i = B·S, Σ_i y_i = B·Λ·H·S(S+1)/2, x_i·τ_i + y_i·ρ_i ≤ t, x, y ≥ 0,

each device doing the kind of work it is relatively best at; solved exactly by sorting the devices
by (1/ρ_i)/(1/τ_i) and finding the split device. The optimizer step is added as the least of its
per-rank times over the cluster (params/N under zero3, all params replicated): every plan's last
rank pays at least that on top of its share of the work. Bound = B·S / (t* + optimizer) tokens/s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import link_matrices
from .comm import ParamComm, param_collectives
from .kernels import CostOptions, work_times
from .paths import Pass, StepShape
from .policy import rule_of
from .simulate import pass_schedule


def useful_flops(model: ModelSpec, workload: Workload) -> tuple[float, float]:
    """(F_lin, F_att): useful FLOPs of one iteration split into matmuls and attention."""
    S, B = workload.seq_len, workload.global_batch
    f_lin = 3.0 * B * S * model.linear_flops_per_token
    f_att = 3.0 * B * model.layers * model.heads * model.attention_flops_per_pair * model.causal_pairs(S)
    return f_lin, f_att


def min_compute_time(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float) -> float:
    """t* of the LP above for devices with rates m (token work / s) and a (attention work / s)."""
    m = np.asarray(m, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    if f_att <= 0:
        return f_lin / m.sum()
    if f_lin <= 0:
        return f_att / a.sum()
    order = np.argsort(-(a / m), kind="stable")
    m, a = m[order], a[order]
    A_before = np.concatenate([[0.0], np.cumsum(a)[:-1]])  # attention capacity of devices before i
    M_after = m.sum() - np.cumsum(m)  # matmul capacity of devices after i
    # device i splits: attention share θ, t·(A_before + θ a_i) = F_att, t·(M_after + (1-θ) m_i) = F_lin
    theta = (f_att * (M_after + m) - f_lin * A_before) / (f_att * m + f_lin * a)
    # along the device order the balance moves monotonically: the split device is the first with θ <= 1
    i = int(np.argmax(theta <= 1.0)) if (theta <= 1.0).any() else len(m) - 1
    th = min(max(float(theta[i]), 0.0), 1.0)
    return max(
        f_lin / (M_after[i] + (1 - th) * m[i]) if M_after[i] + (1 - th) * m[i] > 0 else 0.0,
        f_att / (A_before[i] + th * a[i]) if A_before[i] + th * a[i] > 0 else 0.0,
    )


def kernel_rates(
    cluster: ClusterSpec, model: ModelSpec, options: CostOptions = CostOptions()
) -> tuple[np.ndarray, np.ndarray]:
    """Per device (tokens/s, pair-heads/s) of training work under the kernel-time model: 1/τ_i, 1/ρ_i."""
    w = work_times([d.gpu for d in cluster.devices], model, options)
    tau = model.layers * w.token_fwd_bwd + w.head
    rho = (1.0 + w.attn_bwd_factor) * w.pair
    return 1.0 / tau, 1.0 / rho


def min_iteration_time(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """Seconds of the perfectly balanced, communication- and recompute-free iteration (module doc)."""
    tok_rate, att_rate = kernel_rates(cluster, model, options)
    S, B = workload.seq_len, workload.global_batch
    work = min_compute_time(
        tok_rate, att_rate, float(B * S), float(B * model.layers * model.heads * model.causal_pairs(S))
    )
    w = work_times([d.gpu for d in cluster.devices], model, options)
    local_params = model.param_count / (cluster.size if workload.param_sharding == "zero3" else 1)
    return work + float((local_params * w.optimizer).min())


def subset_time_bound(
    cluster: ClusterSpec,
    devices: Sequence[int],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
) -> float:
    """Seconds no plan on exactly these devices can beat under the workload's (concrete) recompute
    policy: the larger of two bounds. (1) The balanced, communication-free iteration of
    `min_compute_time` with the policy's recompute counted (selective: the linear forward again;
    full: the whole layer forward again) plus the least optimizer step. (2) The step replay's pass
    structure (simulate.pass_schedule): every pass of a kind takes at least the balanced compute of
    one such pass and its prefetched parameter collective with the slowdown it causes; the
    exposed collectives add; the collectives are those of these devices (comm.param_collectives:
    they depend on the set of devices only). The planner prunes a candidate whose subset cannot beat
    the best plan found."""
    again = rule_of(workload).backward_factors()
    w = work_times([cluster.devices[d].gpu for d in devices], model, options)
    fwd_tok = w.pre_fwd + w.post_fwd
    tau = model.layers * (w.token_fwd_bwd + again.rerun_linear * fwd_tok + again.replay_layer * fwd_tok) + w.head
    rho = (1.0 + w.attn_bwd_factor + again.replay_layer) * w.pair
    S, B = workload.seq_len, workload.global_batch
    pairs = float(model.heads * model.causal_pairs(S))  # per layer and sequence
    work = min_compute_time(1.0 / tau, 1.0 / rho, float(B * S), float(B * model.layers) * pairs)
    local_params = model.param_count / (len(devices) if workload.param_sharding == "zero3" else 1)
    optimizer = float((local_params * w.optimizer).min())
    # (2) pass by pass
    per_pass = {
        "f": min_compute_time(1.0 / fwd_tok, 1.0 / w.pair, float(S), pairs),
        "b": min_compute_time(
            1.0 / (w.pre_bwd + w.post_bwd + again.forward_linear * fwd_tok),
            1.0 / (again.attention(w.attn_bwd_factor) * w.pair),
            float(S),
            pairs,
        ),
        "h": min_compute_time(1.0 / w.head, np.full(len(devices), np.inf), float(S), 0.0),
    }
    comm = not options.ignore_comm
    if comm:
        bw, lat = link_matrices(cluster)
        idx = np.asarray(list(devices), dtype=np.int64)
        pc = param_collectives(bw[np.ix_(idx, idx)], lat[np.ix_(idx, idx)], model, workload)
    else:
        pc = ParamComm(workload.param_sharding)
    # a pass with a prefetched collective c takes max_r(chain_r + max(0, c - window_r) + slowdown_r·c)
    # (simulate._pass), and chain_r ≥ window_r, own work_r: at least c·(1 + slowdown_r) on every
    # rank, and the slowest rank's work + slowdown·c
    slow_lo, slow_hi = float(w.overlap_slowdown.min()), float(w.overlap_slowdown.max())
    passes = optimizer
    for step in pass_schedule(StepShape(params=pc, layers=model.layers, batch=B, comm=comm)):
        if isinstance(step, Pass):
            c = step.collective_s
            passes += step.count * max(c * (1.0 + slow_hi), per_pass[step.chain] + slow_lo * c)
        else:
            passes += step.count * step.seconds
    return max(work + optimizer, passes)


def compute_bound(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """Upper bound on tokens/s: the balanced, communication- and recompute-free iteration (module doc)."""
    return workload.tokens / min_iteration_time(cluster, model, workload, options)
