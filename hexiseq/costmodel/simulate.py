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
  rounds with K/V in and dK/dV out, input all-to-all, QKV backward); with activation
  checkpointing the layer's forward is replayed first;
- zero3: the weight all-gathers before forward and backward and the gradient reduce-scatter
  after backward are global collectives (every rank waits for the last); "replicated": one
  global all-reduce at the end; then each rank's optimizer step. iteration_time_s = the last
  rank's finish.

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
from .estimate import Components, components, phase_times


@dataclass
class SimResult:
    iteration_time_s: float
    finish_s: np.ndarray  # [R] when each rank finishes its optimizer step
    busy_s: np.ndarray  # [R] the rank's own work (the estimate's per-rank time)
    wait_s: np.ndarray  # [R] finish - busy: time spent waiting for others
    steps_replayed: int  # layer passes actually replayed (the rest extrapolated)

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
        t = t + c.lin_pre
        t = self.group_sync(t) + c.a2a_in
        t = self.exchange(t, c.att, c.xc_f)
        t = self.group_sync(t) + c.a2a_out
        return t + c.lin_post

    def bwd_layer(self, t: np.ndarray) -> np.ndarray:
        c = self.c
        if c.recompute:
            t = self.fwd_layer(t)
        t = t + 2.0 * c.lin_post
        t = self.group_sync(t) + c.a2a_out
        t = self.exchange(t, c.bwd_factor * c.att, c.xc_b)
        t = self.group_sync(t) + c.a2a_in
        return t + 2.0 * c.lin_pre

    def repeat(self, step, t: np.ndarray, n: int) -> np.ndarray:
        """Apply `step` n times; extrapolate once a step shifts every rank by the same amount."""
        for i in range(n):
            new = step(t)
            self.steps += 1
            delta = new - t
            t = new
            if self.extrapolate and np.ptp(delta) <= 1e-12 * max(1.0, float(np.abs(t).max())):
                return t + delta * (n - 1 - i)
        return t

    def micro_step(self, t: np.ndarray) -> np.ndarray:
        c = self.c
        zero3 = c.param_micro > 0
        if zero3:
            t = np.full_like(t, t.max() + c.param_micro / 3)
        t = self.repeat(self.fwd_layer, t, c.layers)
        t = t + c.head
        if zero3:
            t = np.full_like(t, t.max() + c.param_micro / 3)
        t = self.repeat(self.bwd_layer, t, c.layers)
        if zero3:
            t = np.full_like(t, t.max() + c.param_micro / 3)
        return t

    def iteration(self) -> np.ndarray:
        c = self.c
        t = self.repeat(self.micro_step, np.zeros(self.a.R), c.batch)
        if c.param_iter > 0:
            t = np.full_like(t, t.max() + c.param_iter)
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
