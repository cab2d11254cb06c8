"""The analytical estimate: per-rank time by phase, memory, throughput, MFU and the critical path.

Which number is which
---------------------
- `estimate(...)` is analytic and fast (numpy over ranks). Every rank's time is the sum of its
  own phase durations (below); the iteration time is the largest of these ("critical rank").
  It ignores the waiting that synchronization adds (a rank waiting at an all-to-all for a slower
  group member, or at a KV round for a slower partner), so it is a lower bound of `simulate`.
- `simulate(...)` (simulate.py) replays the same durations step by step with those waits; it is
  the judge of a plan. `Estimate.simulated_time_s` holds its number when asked for
  (`estimate(..., simulate=True)`).
- `linear_form(...)` (linear.py) is the affine relaxation of this estimate the planner optimizes.

Time model (seconds), one rank r of group g, per layer, forward
---------------------------------------------------------------
    lin_f   = s_r · F_layer / m_r            F_layer = linear FLOPs per token per layer, m_r = eff. matmul FLOP/s
    a2a_in  = α + max(send_in, recv_in)      ragged all-to-all q,k,v (comm.py)
    att_j   = η_r · M[g, (g-j) mod k] · 4d / a_r     attention of round j (a_r = eff. attention FLOP/s)
    c_j     = α_j + max(recv_j, send_j)      KV transfer of round j >= 1 (comm.py)
    E       = max_{m=0..k-1} ( Σ_{i=1..m} c_i + Σ_{i=m..k-1} att_i )
              = the finish time of: round-j transfers back to back from the start, round j's
              attention after round j-1's attention and round j's transfer (so each transfer
              overlaps the previous round's compute)
    a2a_out = α + max(send_out, recv_out)    ragged all-to-all of the attention output
Backward per layer: 2·lin_f, the two all-to-alls again (same sizes, directions swapped),
att_j × attn_bwd_factor (2.5: flash-attention recomputes QK^T), and per round
c_j^b = 2α_j + recv_j + send_j (K/V in, dK/dV back, comm.py). Recompute per layer, by the
workload's policy (Workload.recompute; as the runtime does it: runtime/model.py):
    "none"       nothing;
    "selective"  rec = lin_f: only the layer's linear parts run again in its backward (norms, QKV,
                 O projection, MLP); the attention core's inputs and outputs are kept, so no
                 attention forward, all-to-all or KV transfer is repeated;
    "full"       rec = lin_f + a2a_in + E + a2a_out = the whole layer forward again before its
                 backward: linear parts, both ragged all-to-alls and the attention with its KV
                 exchange (E, overlapped as in forward).
"auto" is not a policy the cost model can time (the planner picks one): it is refused.
Per micro-step (one sequence): Λ·(fwd + bwd + rec) + LM head (3·s·2hV/m_r + s·V·12 bytes of
loss traffic / HBM bandwidth) + exposed parameter traffic under zero3. Per iteration: B
micro-steps + exposed all-reduce under "replicated" + optimizer step (params_local · 28 bytes /
HBM bandwidth).

Parameter traffic and its overlap (`param_exposed`; per-call times AG, RS, AR from comm.py, the
same on every rank)
-------------------------------------------------------------------------------------------
The prefetched collectives hide behind the rank's own compute kernels of one layer only
(C_f = lin_f + Σ_j att_j forward; C_b = 2·lin_f + 2.5·Σ_j att_j in backward plus the recompute's
compute kernels: + lin_f (selective), + lin_f + Σ_j att_j (full)), not behind its all-to-all or KV transfers, which keep the links busy themselves.
- zero3 (FSDP, one unit per layer, root unit = embedding + final norm + LM head, kept gathered
  from forward to backward), per micro-step:
    forward   AG_root + AG + (Λ-1)·max(0, AG - C_f)      the root's and the first layer's gathers
              are exposed (the embedding lookup hides nothing); layer l+1's gather is prefetched
              during layer l's compute
    backward  max(0, AG - H_b) + (Λ-1)·max(0, AG + RS - C_b) + RS + RS_root
              the last layer's weights are re-gathered during the LM head's backward
              (H_b = 2/3 of the head's time); then each layer's backward hides one gather (the
              next layer's weights) and one reduce-scatter (the previous layer's gradients); the
              last reduce-scatters (layer 0 and the root unit) are exposed. Λ gathers and Λ + 1
              reduce-scatters in all; one layer's compute is not used for hiding (≤ one slot
              pessimistic).
- replicated (DDP, a gradient bucket per layer, accumulated without sync over the B
  micro-steps), once per iteration in the last micro-step's backward:
              (Λ-1)·max(0, AR - C_b) + AR + AR_root
              each layer's all-reduce runs during the next layer's backward; the last bucket
              (layer 0) and the root unit's gradients are exposed.
The global collectives couple all ranks (a collective starts when the last rank issues it); the
estimate ignores that wait, the simulator replays it.

Phases reported per rank (they sum to the rank's busy time): linear, lm_head, attention,
alltoall, kv_exchange (the part of the exchange not hidden behind attention: E - Σ att),
recompute (all of rec, its attention and transfers included), param_comm, optimizer.

Throughput: tokens_per_s = B·S / iteration_time_s. MFU = model_flops / (iteration_time ×
Σ peak BF16 FLOP/s of all cluster devices, used or not). efficiency_vs_bound =
tokens_per_s / compute_bound (bound.py): the bound times a perfectly balanced iteration with this
same kernel time model (attention backward at attn_bwd_factor, loss traffic, optimizer) but no
communication and no recompute, so such a plan scores exactly 1.0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..plan import Plan
from ..specs import GIB, ClusterSpec, ModelSpec, Workload
from .arrays import CostOptions, PlanArrays, plan_arrays, recompute_of
from .bound import compute_bound
from .comm import ParamComm, alltoall_times, exchange_times, param_collectives
from .memory import MEMORY_KEYS, memory_bytes

PHASES = ("linear", "lm_head", "attention", "alltoall", "kv_exchange", "recompute", "param_comm", "optimizer")


@dataclass(frozen=True)
class Components:
    """Durations (seconds) the estimate and the simulator share. [R] arrays are per layer unless noted."""

    a: PlanArrays
    lin_pre: np.ndarray  # forward QKV projection (and norm) per layer
    lin_post: np.ndarray  # forward O projection + MLP per layer
    a2a_in: np.ndarray
    a2a_out: np.ndarray
    att: np.ndarray  # [R, k] forward attention per round
    xc_f: np.ndarray  # [R, k] forward KV transfer per round (column 0 = 0)
    xc_b: np.ndarray  # [R, k] backward K/V + dK/dV transfer per round
    head: np.ndarray  # LM head + loss, forward + backward, per micro-step
    params: ParamComm  # per-call times of the parameter collectives (all 0 without communication)
    optimizer: np.ndarray
    recv_bytes: np.ndarray  # [R, k] KV bytes received per round (forward)
    bwd_factor: float
    layers: int
    batch: int
    recompute: str  # "none", "selective" or "full" (Workload.recompute, never "auto")
    comm: bool = True  # False with CostOptions(ignore_comm=True): no transfers, so nobody waits


def components(plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()) -> Components:
    """Validate the plan and compute every duration of the time model."""
    policy = recompute_of(workload)  # refuses "auto" before any work
    a = plan_arrays(plan, cluster, model, workload)
    H, Hkv, d, h = model.heads, model.kv_heads, model.head_dim, model.hidden
    qkv_flops = 2.0 * h * (H + 2 * Hkv) * d
    lin_tok = model.linear_flops_per_token_per_layer
    a2a = alltoall_times(a, model)
    xc = exchange_times(a, model)
    att = a.eta[:, None] * a.pairs[a.grp[:, None], a.src[a.grp]] * model.attention_flops_per_pair / a.att_rate[:, None]
    if options.ignore_comm:
        zero = np.zeros(a.R)
        a2a_in = a2a_out = zero
        xc_f = xc_b = np.zeros((a.R, a.k))
        params = ParamComm(workload.param_sharding)
    else:
        a2a_in = a2a["lat"] + np.maximum(a2a["in_send"], a2a["in_recv"])
        a2a_out = a2a["lat"] + np.maximum(a2a["out_send"], a2a["out_recv"])
        xc_f = xc["lat"] + np.maximum(xc["recv"], xc["send"])
        xc_b = 2.0 * xc["lat"] + xc["recv"] + xc["send"]
        params = param_collectives(a, model, workload)
    local_params = model.param_count / (a.R if workload.param_sharding == "zero3" else 1)
    return Components(
        a=a,
        lin_pre=a.s * qkv_flops / a.mm_rate,
        lin_post=a.s * (lin_tok - qkv_flops) / a.mm_rate,
        a2a_in=a2a_in,
        a2a_out=a2a_out,
        att=att,
        xc_f=xc_f,
        xc_b=xc_b,
        head=a.s * (3.0 * model.lm_head_flops_per_token / a.mm_rate + model.vocab * options.loss_bytes_per_logit / a.hbm),
        params=params,
        optimizer=local_params * options.optimizer_bytes_per_param / a.hbm,
        recv_bytes=xc["recv_bytes"],
        bwd_factor=options.attn_bwd_factor,
        layers=model.layers,
        batch=workload.global_batch,
        recompute=policy,
        comm=not options.ignore_comm,
    )


def exchange_exposed(att: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """[R] E - Σ att = max_m (Σ_{i=1..m} comm_i - Σ_{i<m} att_i) >= 0 for [R, k] arrays (comm[:, 0]
    ignored): the transfer time not hidden behind attention (0 at m = 0, exactly, when comm = 0)."""
    c = np.cumsum(comm[:, 1:], axis=1) - np.cumsum(att[:, :-1], axis=1)
    return np.maximum(c.max(axis=1, initial=0.0), 0.0)


def layer_compute(c: Components) -> tuple[np.ndarray, np.ndarray]:
    """[R] (C_f, C_b): seconds of the compute kernels of one layer's forward and of its backward
    (with the recompute, which runs inside the backward): the window a prefetched collective hides in."""
    lin_f = c.lin_pre + c.lin_post
    att_f = c.att.sum(axis=1)
    c_f = lin_f + att_f
    c_b = 2.0 * lin_f + c.bwd_factor * att_f
    if c.recompute == "selective":
        c_b = c_b + lin_f  # the linear parts only
    elif c.recompute == "full":
        c_b = c_b + c_f  # the whole forward's compute again (its transfers hide nothing)
    return c_f, c_b


def head_backward(c: Components) -> np.ndarray:
    """[R] H_b: the LM head's backward (2/3 of its fwd + bwd time), the window of the first backward gather."""
    return c.head * (2.0 / 3.0)


def param_exposed(c: Components) -> tuple[np.ndarray, np.ndarray]:
    """[R] (per micro-step, per iteration) seconds of parameter traffic not hidden behind compute
    (module doc: zero3 forward + backward per micro-step; replicated once per iteration)."""
    p, n = c.params, c.layers - 1
    c_f, c_b = layer_compute(c)
    zero = np.zeros(len(c_f))
    if p.sharding == "zero3":
        fwd = p.ag_root + p.ag_layer + n * np.maximum(0.0, p.ag_layer - c_f)
        bwd = np.maximum(0.0, p.ag_layer - head_backward(c)) + n * np.maximum(0.0, p.ag_layer + p.rs_layer - c_b) + p.rs_layer + p.rs_root
        return fwd + bwd, zero
    return zero, n * np.maximum(0.0, p.ar_layer - c_b) + p.ar_layer + p.ar_root


def recompute_layer(c: Components, lin_f: np.ndarray, att_f: np.ndarray, X_f: np.ndarray, a2a: np.ndarray) -> np.ndarray:
    """[R] seconds of one layer's recompute under the policy (module doc): 0, lin_f, or the whole
    forward lin_f + a2a_in + a2a_out + E (E = att_f + X_f, the exchange span)."""
    if c.recompute == "selective":
        return lin_f
    if c.recompute == "full":
        return lin_f + a2a + att_f + X_f
    return np.zeros(len(lin_f))


def phase_times(c: Components) -> dict[str, np.ndarray]:
    """Per-rank seconds per iteration by phase (PHASES)."""
    B, Lyr = c.batch, c.layers
    lin_f = c.lin_pre + c.lin_post
    att_f = c.att.sum(axis=1)
    X_f = exchange_exposed(c.att, c.xc_f)
    X_b = exchange_exposed(c.bwd_factor * c.att, c.xc_b)
    a2a = c.a2a_in + c.a2a_out
    p_micro, p_iter = param_exposed(c)
    out = {
        "linear": B * Lyr * 3.0 * lin_f,
        "lm_head": B * c.head,
        "attention": B * Lyr * (1.0 + c.bwd_factor) * att_f,
        "alltoall": B * Lyr * 2.0 * a2a,
        "kv_exchange": B * Lyr * (X_f + X_b),
        "recompute": B * Lyr * recompute_layer(c, lin_f, att_f, X_f, a2a),
        "param_comm": B * p_micro + p_iter,
        "optimizer": c.optimizer,
    }
    return out


@dataclass
class RankEstimate:
    rank: int
    device: int
    gpu: str
    group: int
    tokens: int
    heads: int
    time_s: dict[str, float]
    busy_s: float
    idle_s: float
    memory_gib: float
    capacity_gib: float
    memory_breakdown_gib: dict[str, float]
    fits: bool


@dataclass
class OOM:
    rank: int
    device: int
    gpu: str
    memory_gib: float
    capacity_gib: float
    shortfall_gib: float

    @property
    def message(self) -> str:
        return (
            f"rank {self.rank} (device {self.device}, {self.gpu}) needs {self.memory_gib:.2f} GiB "
            f"but has {self.capacity_gib:.2f} GiB: short by {self.shortfall_gib:.2f} GiB"
        )


@dataclass
class Estimate:
    plan: str
    iteration_time_s: float
    tokens_per_s: float
    model_flops: float
    mfu: float
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    fits: bool
    critical_rank: int
    critical_phase: str
    ranks: list[RankEstimate]
    oom: list[OOM] = field(default_factory=list)
    simulated_time_s: float | None = None

    @property
    def simulated_tokens_per_s(self) -> float | None:
        return None if self.simulated_time_s is None else self.tokens_per_s * self.iteration_time_s / self.simulated_time_s

    def to_dict(self) -> dict[str, Any]:
        d = {
            "plan": self.plan,
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops": self.model_flops,
            "mfu": self.mfu,
            "bound_tokens_per_s": self.bound_tokens_per_s,
            "efficiency_vs_bound": self.efficiency_vs_bound,
            "fits": self.fits,
            "critical_rank": self.critical_rank,
            "critical_phase": self.critical_phase,
            "simulated_time_s": self.simulated_time_s,
            "simulated_tokens_per_s": self.simulated_tokens_per_s,
            "oom": [{**asdict(o), "message": o.message} for o in self.oom],
            "ranks": [asdict(r) for r in self.ranks],
        }
        return d

    def summary(self) -> str:
        lines = [
            f"plan {self.plan!r}: {self.iteration_time_s:.4g} s/iteration, {self.tokens_per_s:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}, {self.efficiency_vs_bound:.1%} of the compute bound ({self.bound_tokens_per_s:,.0f} tokens/s)",
            f"critical path: rank {self.critical_rank} ({self.ranks[self.critical_rank].gpu}), phase {self.critical_phase}",
        ]
        if self.simulated_time_s is not None:
            lines.append(f"simulated: {self.simulated_time_s:.4g} s/iteration ({self.simulated_tokens_per_s:,.0f} tokens/s)")
        lines += [o.message for o in self.oom] or ["memory: every rank fits"]
        return "\n".join(lines)


def estimate(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    simulate: bool = False,
) -> Estimate:
    """Analytic time, memory and throughput of one training iteration of `plan` (see module doc)."""
    c = components(plan, cluster, model, workload, options)
    a = c.a
    phases = phase_times(c)
    busy = sum(phases.values())
    it = float(busy.max())
    crit = int(busy.argmax())
    mem = memory_bytes(a, model, workload, c.recv_bytes, options)
    total_mem = sum(mem.values())
    flops = model.training_flops(workload.seq_len) * workload.global_batch
    bound = compute_bound(cluster, model, workload, options)
    tps = workload.tokens / it
    ranks = []
    oom = []
    for r in range(a.R):
        dev = cluster.devices[int(a.dev[r])]
        fits = bool(total_mem[r] <= a.capacity[r])
        ranks.append(
            RankEstimate(
                rank=r,
                device=dev.index,
                gpu=dev.gpu.name,
                group=int(a.grp[r]),
                tokens=int(a.s[r]),
                heads=int(a.eta[r]),
                time_s={p: float(phases[p][r]) for p in PHASES},
                busy_s=float(busy[r]),
                idle_s=float(it - busy[r]),
                memory_gib=float(total_mem[r] / GIB),
                capacity_gib=float(a.capacity[r] / GIB),
                memory_breakdown_gib={k: float(mem[k][r] / GIB) for k in MEMORY_KEYS},
                fits=fits,
            )
        )
        if not fits:
            oom.append(OOM(r, dev.index, dev.gpu.name, float(total_mem[r] / GIB), float(a.capacity[r] / GIB), float((total_mem[r] - a.capacity[r]) / GIB)))
    crit_phase = max(PHASES, key=lambda p: phases[p][crit])
    sim = None
    if simulate:
        from .simulate import simulate_components

        sim = simulate_components(c).iteration_time_s
    peak = cluster.peak_pflops * 1e15
    return Estimate(
        plan=plan.name,
        iteration_time_s=it,
        tokens_per_s=tps,
        model_flops=flops,
        mfu=flops / (it * peak),
        bound_tokens_per_s=bound,
        efficiency_vs_bound=tps / bound,
        fits=not oom,
        critical_rank=crit,
        critical_phase=crit_phase,
        ranks=ranks,
        oom=oom,
        simulated_time_s=sim,
    )
