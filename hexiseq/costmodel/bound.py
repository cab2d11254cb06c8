"""The compute-bound throughput of a cluster for a workload: the limit no plan can beat.

The bound is the throughput of a perfectly balanced iteration with no communication and no
recompute, timed with the estimate's own per-kernel model (estimate.py), so that such a plan
has efficiency_vs_bound = 1 exactly and every loss below 1 is imbalance, communication or
recompute. Useful FLOPs (`useful_flops`, `Estimate.model_flops`) are a different number and
stay as they are: 3 × forward, recompute not counted.

Per-kernel time model (seconds; B = global_batch, S = seq_len, Λ = layers, H = heads, d = head_dim,
V = vocabulary; device i: m_i = peak × eff_matmul, a_i = peak × eff_attention FLOP/s, b_i = HBM bytes/s):
    token work      τ_i = 3·(Λ·F_layer + 2hV)/m_i + V·loss_bytes_per_logit/b_i   seconds per token
                    (all matmuls fwd + 2× bwd, and the loss's HBM traffic: estimate's linear + lm_head)
    attention work  ρ_i = (1 + attn_bwd_factor)·4d/a_i                            seconds per
                    (query, key) pair per head per layer (forward + the flash backward at 2.5×)
    total work      B·S tokens and B·Λ·H·S(S+1)/2 pair-heads (a zigzag group g does exactly
                    L_g·(S+1) pairs per head, so a plan's pairs always sum to this)
No imbalance, no communication, no memory limit: the fastest conceivable compute time is the LP

    t* = min t  s.t.  Σ_i x_i = B·S, Σ_i y_i = B·Λ·H·S(S+1)/2, x_i·τ_i + y_i·ρ_i ≤ t, x, y ≥ 0,

i.e. each device doing the kind of work it is relatively best at. Solved exactly by sorting the
devices by (1/ρ_i)/(1/τ_i) (attention to the front) and finding the split device; when every
device has the same ratio it reduces to t* = B·S/Σ(1/τ_i) + pairs/Σ(1/ρ_i).
The optimizer step is added as min_i of its per-rank time over the cluster's devices
(params/N under zero3, all params replicated; N = all devices): every plan's critical rank pays
at least that on top of its share of the work, so the bound stays a bound, and it is exact for
a balanced plan on identical devices. Bound = B·S / (t* + optimizer) tokens/s.
"""

from __future__ import annotations

import numpy as np

from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import CostOptions


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
    return max(f_lin / (M_after[i] + (1 - th) * m[i]) if M_after[i] + (1 - th) * m[i] > 0 else 0.0,
               f_att / (A_before[i] + th * a[i]) if A_before[i] + th * a[i] > 0 else 0.0)


def kernel_rates(cluster: ClusterSpec, model: ModelSpec, options: CostOptions = CostOptions()) -> tuple[np.ndarray, np.ndarray]:
    """Per device (tokens/s, pair-heads/s) of training work under the estimate's kernel time model:
    1/τ_i and 1/ρ_i of the module doc."""
    gpus = [d.gpu for d in cluster.devices]
    m = np.array([g.matmul_flops for g in gpus])
    a = np.array([g.attention_flops for g in gpus])
    hbm = np.array([g.hbm_bandwidth_gbps * 1e9 for g in gpus])
    tau = 3.0 * model.linear_flops_per_token / m + model.vocab * options.loss_bytes_per_logit / hbm
    rho = (1.0 + options.attn_bwd_factor) * model.attention_flops_per_pair / a
    return 1.0 / tau, 1.0 / rho


def min_iteration_time(cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()) -> float:
    """Seconds of the perfectly balanced, communication- and recompute-free iteration (module doc)."""
    tok_rate, att_rate = kernel_rates(cluster, model, options)
    S, B = workload.seq_len, workload.global_batch
    work = min_compute_time(tok_rate, att_rate, float(B * S), float(B * model.layers * model.heads * model.causal_pairs(S)))
    hbm = np.array([d.gpu.hbm_bandwidth_gbps * 1e9 for d in cluster.devices])
    local_params = model.param_count / (cluster.size if workload.param_sharding == "zero3" else 1)
    return work + float((local_params * options.optimizer_bytes_per_param / hbm).min())


def compute_bound(cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()) -> float:
    """Upper bound on tokens/s: the balanced, communication- and recompute-free iteration (module doc)."""
    return workload.tokens / min_iteration_time(cluster, model, workload, options)
