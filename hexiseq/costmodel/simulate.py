"""Step-by-step replay of one training iteration: the judge of a plan.

Durations are the estimate's (estimate.Components: same compute, all-to-all and per-round KV
transfer times); what the replay adds is *waiting*, i.e. the coupling between ranks:

- all-to-all inside a group: it starts when the last member arrives; each member finishes
  `start + its own all-to-all time`;
- KV exchange, round j >= 1: rank r posts its round-j transfers at P_j (P_1 = after the
  all-to-all); the batched P2P of the round starts when r and every rank of its two partner
  groups, (g - j) and (g + j) mod k, have posted (group-level rendezvous), and takes r's own
  transfer time c_j: C_j = max(P_j, partners' P_j) + c_j. Round j's attention runs after round
  j-1's attention and after C_j: A_j = max(A_{j-1}, C_j) + att_j (round 0, the own K/V, starts at
  once). Double buffering: round j+1 can be posted only when round j's transfer is done and
  round j-1's attention has freed its buffer: P_{j+1} = max(C_j, A_{j-1}). Ranks without heads
  take no part;
- backward: the same per layer in reverse order (O/MLP backward, output all-to-all, exchange
  rounds with K/V in and dK/dV out, input all-to-all, QKV backward). Recompute by policy:
  "selective": the O/MLP part is recomputed before its backward and the norm/QKV part before its
  own; attention and its transfers are not replayed. "full": the layer's whole forward (with its
  all-to-all syncs and KV exchange rounds) is replayed before its backward;
- parameter collectives (estimate.py, `param_exposed`): zero3 gathers the root unit and the
  first layer at the start of each micro-step (a global collective: everyone waits for the last
  rank), then prefetches layer l+1's weights during layer l (`overlapped`: the collective is
  issued by each rank when it starts the layer, runs from the last issue, and each rank also pays
  its own exposed part max(0, AG - C_f) as in the estimate); in backward the last layer's gather
  overlaps the LM head, each further layer hides a gather + a reduce-scatter, and the final
  reduce-scatters are a global barrier. "replicated": in the last micro-step's backward each
  layer's bucket all-reduce overlaps the next layer's backward, the last bucket and the root
  unit's are a barrier. Then each rank's optimizer step. iteration_time_s = the last rank's finish.

Identical layers (and micro-steps) make the replay a max-plus linear system: once one layer
shifts every rank by the same amount the rest are extrapolated exactly; otherwise every layer
is replayed. Without any communication (`CostOptions(ignore_comm=True)`: no transfers, hence no
waits) every rank finishes at its own compute time and the iteration is their max (= estimate);
with one group there is no exchange. In general simulate >= estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import CostOptions
from .estimate import Components, components, head_backward, layer_compute, phase_times


@dataclass
class SimResult:
    iteration_time_s: float
    finish_s: np.ndarray  # [R] when each rank finishes its optimizer step
    busy_s: np.ndarray  # [R] the rank's own work (the estimate's per-rank time)
    wait_s: np.ndarray  # [R] finish - busy: time spent waiting for others
    steps_replayed: int  # layer passes (forward or backward) actually replayed (the rest extrapolated)

    @property
    def critical_rank(self) -> int:
        return int(np.argmax(self.finish_s))

    def to_dict(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "critical_rank": self.critical_rank,
            "finish_s": self.finish_s.tolist(),
            "wait_s": self.wait_s.tolist(),
        }


class _Replay:
    def __init__(self, c: Components, extrapolate: bool = True):
        self.c = c
        self.extrapolate = extrapolate
        a = c.a
        self.a = a
        self.active = a.eta > 0
        self.multi = a.gsize.max() > 1 and c.comm
        self.steps = 0

    def group_sync(self, t: np.ndarray) -> np.ndarray:
        if not self.multi:
            return t
        return np.maximum.reduceat(t, self.a.gstart)[self.a.grp]

    def exchange(self, t: np.ndarray, att: np.ndarray, comm: np.ndarray) -> np.ndarray:
        a = self.a
        A = t + att[:, 0]
        if a.k == 1:
            return A
        P = t.copy()
        grp, k = a.grp, a.k
        neg = np.full(a.R, -np.inf)
        for j in range(1, k):
            if not self.c.comm:  # no transfers: each round's attention follows the previous one
                A = A + att[:, j]
                continue
            gmax = np.maximum.reduceat(np.where(self.active, P, neg), a.gstart)
            partner = np.maximum(gmax[(grp - j) % k], gmax[(grp + j) % k])
            C = np.maximum(P, partner) + comm[:, j]
            A_new = np.maximum(A, C) + att[:, j]
            P = np.maximum(C, A)
            A = A_new
        return np.where(self.active, A, t)

    def fwd_layer(self, t: np.ndarray) -> np.ndarray:
        c = self.c
        self.steps += 1
        t = t + c.lin_pre
        t = self.group_sync(t) + c.a2a_in
        t = self.exchange(t, c.att, c.xc_f)
        t = self.group_sync(t) + c.a2a_out
        return t + c.lin_post

    def bwd_layer(self, t: np.ndarray) -> np.ndarray:
        c = self.c
        if c.recompute == "full":  # the whole layer forward again, collectives included
            t = self.fwd_layer(t)
        self.steps += 1
        rec = 1.0 if c.recompute == "selective" else 0.0  # selective checkpointing: the linear parts run again
        t = t + (2.0 + rec) * c.lin_post
        t = self.group_sync(t) + c.a2a_out
        t = self.exchange(t, c.bwd_factor * c.att, c.xc_b)
        t = self.group_sync(t) + c.a2a_in
        return t + (2.0 + rec) * c.lin_pre

    def repeat(self, step, t: np.ndarray, n: int) -> np.ndarray:
        """Apply `step` n times; extrapolate once a step shifts every rank by the same amount."""
        for i in range(n):
            new = step(t)
            delta = new - t
            t = new
            if self.extrapolate and np.ptp(delta) <= 1e-12 * max(1.0, float(np.abs(t).max())):
                return t + delta * (n - 1 - i)
        return t

    def overlapped(self, step, comm: float, window: np.ndarray):
        """`step` with a global collective of `comm` seconds prefetched during it: every rank issues
        the collective when it starts the step, so the collective runs from the last issue; a rank
        goes on when its step, its own exposed part max(0, comm - window) (the estimate's term: the
        collective hides behind compute kernels only) and the collective are done."""
        exposed = np.maximum(0.0, comm - window)

        def run(t: np.ndarray) -> np.ndarray:
            return np.maximum(step(t) + exposed, t.max() + comm)

        return run

    def barrier(self, t: np.ndarray, comm: float) -> np.ndarray:
        """An exposed global collective: it starts when the last rank arrives."""
        return np.full_like(t, t.max() + comm)

    def micro_step(self, t: np.ndarray, last: bool = True) -> np.ndarray:
        """One sequence: forward, LM head, backward; zero3 gathers / reduce-scatters per layer, the
        replicated all-reduce in the last micro-step's backward (estimate.py, `param_exposed`)."""
        c, p, n = self.c, self.c.params, self.c.layers - 1
        zero3 = c.comm and p.sharding == "zero3"
        ddp = c.comm and p.sharding == "replicated" and last
        c_f, c_b = layer_compute(c)
        head = lambda x: x + c.head  # noqa: E731
        if zero3:
            t = self.barrier(t, p.ag_root + p.ag_layer)
            t = self.repeat(self.overlapped(self.fwd_layer, p.ag_layer, c_f), t, n)
            t = self.fwd_layer(t)  # the LM head's weights are in the root unit: nothing to prefetch
            t = self.overlapped(head, p.ag_layer, head_backward(c))(t)
            t = self.repeat(self.overlapped(self.bwd_layer, p.ag_layer + p.rs_layer, c_b), t, n)
            t = self.bwd_layer(t)
            return self.barrier(t, p.rs_layer + p.rs_root)
        t = self.repeat(self.fwd_layer, t, c.layers)
        t = head(t)
        if not ddp:
            return self.repeat(self.bwd_layer, t, c.layers)
        t = self.bwd_layer(t)  # its bucket's all-reduce overlaps the next layer's backward
        t = self.repeat(self.overlapped(self.bwd_layer, p.ar_layer, c_b), t, n)
        return self.barrier(t, p.ar_layer + p.ar_root)

    def iteration(self) -> np.ndarray:
        c = self.c
        t = self.repeat(lambda x: self.micro_step(x, last=False), np.zeros(self.a.R), c.batch - 1)
        t = self.micro_step(t, last=True)
        return t + c.optimizer


def simulate_components(c: Components, extrapolate: bool = True) -> SimResult:
    """Replay one iteration from precomputed durations (`extrapolate=False` replays every layer)."""
    rep = _Replay(c, extrapolate)
    finish = rep.iteration()
    busy = sum(phase_times(c).values())
    return SimResult(float(finish.max()), finish, busy, finish - busy, rep.steps)


def simulate(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    extrapolate: bool = True,
) -> SimResult:
    """Replay one training iteration of `plan` step by step (see module doc); the judge of a plan."""
    return simulate_components(components(plan, cluster, model, workload, options), extrapolate)
