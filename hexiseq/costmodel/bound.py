"""The compute-bound throughput of a cluster for a workload: the limit no plan can beat.

Work (useful FLOPs of one iteration, B = global_batch, S = seq_len, Λ = layers):
    F_lin = 3·B·S·(Λ·linear_flops_per_token_per_layer + 2·h·V)         (all matmuls, fwd + bwd)
    F_att = 3·B·Λ·H·4d·S(S+1)/2                                          (causal attention, fwd + bwd)
Device i runs matmuls at m_i = peak_i × eff_matmul_i and attention at a_i = peak_i × eff_attention_i
(FLOP/s). No communication, no imbalance, no memory limit, recompute and kernel overheads
(e.g. the flash-attention backward's extra QK^T) not charged: the fastest conceivable time is
the linear program

    t* = min t  s.t.  Σ_i x_i = F_lin, Σ_i y_i = F_att, x_i/m_i + y_i/a_i ≤ t, x, y ≥ 0,

i.e. all useful FLOPs at the sum of the effective rates, each device doing the kind of work it
is relatively best at. Solved exactly by sorting devices by a_i/m_i (attention to the front)
and finding the split device; when every device has the same a_i/m_i it reduces to
t* = F_lin/Σm_i + F_att/Σa_i. Bound = B·S / t* tokens/s.
"""

from __future__ import annotations

import numpy as np

from ..specs import ClusterSpec, ModelSpec, Workload


def useful_flops(model: ModelSpec, workload: Workload) -> tuple[float, float]:
    """(F_lin, F_att): useful FLOPs of one iteration split into matmuls and attention."""
    S, B = workload.seq_len, workload.global_batch
    f_lin = 3.0 * B * S * model.linear_flops_per_token
    f_att = 3.0 * B * model.layers * model.heads * model.attention_flops_per_pair * model.causal_pairs(S)
    return f_lin, f_att


def min_compute_time(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float) -> float:
    """t* of the LP above for devices with matmul rates m and attention rates a (FLOP/s)."""
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


def compute_bound(cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> float:
    """Upper bound on tokens/s: all useful FLOPs at the sum of the devices' effective rates."""
    m = np.array([d.gpu.matmul_flops for d in cluster.devices])
    a = np.array([d.gpu.attention_flops for d in cluster.devices])
    f_lin, f_att = useful_flops(model, workload)
    return workload.tokens / min_compute_time(m, a, f_lin, f_att)
