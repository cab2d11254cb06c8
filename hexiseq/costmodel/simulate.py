"""Step replay of one training iteration: the judge of a plan.

Durations are durations.py's; what the replay adds is *waiting*, the coupling between ranks. One
layer pass is replayed event by event, from a synchronized start, exactly as the executor runs it:

- all-to-all inside a group: it starts when the last member arrives (every member takes part,
  with or without tokens or heads); each member finishes `start + its own all-to-all time`;
- KV exchange (ranks with heads; hexiseq.schedule): round 0 attends the own chunks at once; the
  round-1 transfer is posted at P_1 = after the all-to-all. Round j's batched P2P starts when the
  rank and every rank of its two partner groups, (g - j) and (g + j) mod k, have posted it
  (group-level rendezvous), M_j = max(P_j, partners' P_j), and takes the rank's own transfer time:
  C_j = M_j + c_j. Round j's attention runs after round j-1's and after C_j: A_j = max(A_{j-1}, C_j)
  + att_j. Double buffering: round j+1 is posted when round j's transfer is done and round j-1's
  attention has freed its buffer: P_{j+1} = max(C_j, A_{j-1}). Round j's attention is slowed by the
  transfer of round j+1 that overlaps it (kernels.py, overlap): att_j + slowdown × link_{j+1};
- backward: the same in reverse order (O/MLP backward, output all-to-all, exchange rounds with K/V
  in and dK/dV out, input all-to-all, QKV backward); "full" recompute first replays the layer's
  forward (with its all-to-all syncs and KV rounds), "selective" reruns the linear parts inside
  their backward (durations.py).

Layer passes are separated by a synchronization of all ranks (at every layer boundary, after the LM
head and at every exposed collective): each pass of a kind takes the same time D, its slowest
rank's. This is a conservative model of the cross-layer coupling (every group exchanges with every
other group in every layer, so the groups run in lockstep within a fraction of a layer; the
synchronization charges that fraction in full), and it makes the step time a sum of longest paths,
which the planner's optimization model reproduces exactly (planner/layout_model.py: its constraints are
this replay's critical paths, `trace=True`).

Parameter collectives: a prefetched collective of `c` seconds issued at the start of a pass runs
while the pass computes; the pass then takes max(c, max_r(chain_r + max(0, c - window_r) +
slowdown·c)): it hides only behind the rank's compute kernels (the all-to-alls and KV transfers
keep the links busy themselves) and slows the compute it overlaps. Per micro-step (one sequence):
  zero3       AG_root + AG, then (Λ-1) forward passes prefetching AG and one without, the LM head
              prefetching AG (behind its backward, 2/3 of it), (Λ-1) backward passes with AG + RS
              and one without, then RS + RS_root exposed;
  replicated  Λ forward passes, the head, Λ backward passes; in the last micro-step's backward each
              layer's all-reduce overlaps the next layer's backward (Λ-1 passes with AR, one
              without) and the last bucket and the root's all-reduce are exposed.
  hybrid      (joint plans, costmodel/step.py: sharded inside a replica or node, copies across) the
              all-reduce of each layer's gradient shard across the copies (XR) joins the last
              micro-step's Λ-1 backward passes; the last layer's and the root's are exposed.
Then every rank's optimizer step; iteration_time_s = the last rank's finish.

Every rank's time is split into phases (PHASES) that sum to the iteration time on every rank:
its own work (the per-operator time of its linear parts and attention rounds apart, "operators":
costmodel/operators.py), the exchange time not hidden behind its attention ("kv_exchange": exposed transfers,
partner waits and the overlap slowdown), exposed parameter traffic, and "wait" (for the group at an
all-to-all, or for the slowest rank at a layer boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PlanError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .durations import Durations, durations
from .kernels import CostOptions
from .paths import (
    AllToAllPiece,
    AttentionRound,
    BackwardTransfer,
    Barrier,
    Constant,
    ExposedCollective,
    ForwardTransfer,
    IterationShape,
    OverlapSlowdown,
    OwnWork,
    Pass,
    PathItem,
    Step,
)

PHASES = (
    "linear",
    "memory_bound",
    "attention",
    "alltoall",
    "kv_exchange",
    "lm_head",
    "recompute",
    "operators",
    "param_comm",
    "optimizer",
    "wait",
)
# a rank's own work: its kernels, their per-operator cost and the optimizer (no collective, no waiting)
DEVICE_PHASES = ("linear", "memory_bound", "attention", "lm_head", "recompute", "operators", "optimizer")


@dataclass
class SimResult:
    iteration_time_s: float
    phases: dict[str, np.ndarray]  # per rank seconds per phase (PHASES); each rank's sum = iteration_time_s
    passes: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # pass kind -> (count per iteration, seconds each)
    paths: dict[str, list[PathItem]] = field(default_factory=dict)  # with trace=True: each pass kind's critical path

    @property
    def busy_s(self) -> np.ndarray:
        """[R] the rank's own work (everything but waiting)."""
        return self.iteration_time_s - self.phases["wait"]

    @property
    def device_s(self) -> np.ndarray:
        """[R] the rank's own kernels, their per-operator cost and its optimizer step (DEVICE_PHASES):
        the time an emulated rank's pacing measures as f x its operators' CPU time."""
        return sum((self.phases[k] for k in DEVICE_PHASES), np.zeros_like(self.phases["wait"]))

    @property
    def wait_s(self) -> np.ndarray:
        return self.phases["wait"]

    @property
    def critical_rank(self) -> int:
        """The rank that waits least (it sets the pace)."""
        return int(np.argmin(self.phases["wait"]))

    def to_dict(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "critical_rank": self.critical_rank,
            "phases": {k: v.tolist() for k, v in self.phases.items()},
            "passes": {k: {"count": c, "seconds": s} for k, (c, s) in self.passes.items()},
        }


def _group_argmax(t: np.ndarray, gmax: np.ndarray, a) -> np.ndarray:
    """[k] the first rank of each group whose t equals the group's maximum."""
    cand = np.where(t == gmax[a.grp], np.arange(a.R), a.R)
    return np.minimum.reduceat(cand, a.gstart)


def _zeros(R: int) -> dict[str, np.ndarray]:
    return {p: np.zeros(R) for p in PHASES}


class _Chain:
    """One layer pass, event by event, for every rank at once (module doc); with `trace` it keeps
    every max's winner so that a rank's finish can be traced back to the path that sets it."""

    def __init__(self, d: Durations, trace: bool = False):
        self.d, self.a = d, d.a
        self.trace = trace
        self.log: dict = {}

    def group_sync(self, t: np.ndarray, ph: dict, tag: str) -> np.ndarray:
        """The all-to-all's rendezvous: every member starts when the last arrives. Without
        communication (CostOptions.ignore_comm) there is no all-to-all to wait for."""
        a = self.a
        if not self.d.comm:
            if self.trace:
                self.log[tag] = None
            return t
        start = np.maximum.reduceat(t, a.gstart)
        if self.trace:  # the member that arrives last (first of the ties)
            self.log[tag] = _group_argmax(t, start, a)
        start = start[a.grp]
        ph["wait"] += start - t
        return start

    def pieces(self, t: np.ndarray, pieces: np.ndarray, tag: str) -> np.ndarray:
        if self.trace:
            self.log[tag] = pieces.argmax(axis=1)
        return t + pieces.max(axis=1)

    def exchange(self, t: np.ndarray, att: np.ndarray, xc: np.ndarray, ph: dict, tag: str) -> np.ndarray:
        """xc: [R, k, pieces] (forward) or [R, k] (backward)."""
        a, d = self.a, self.d
        active, k = a.active, a.k
        att = att.copy()
        # round j is slowed by round j+1's transfer: its bytes in + out over the link, which the
        # backward doubles (K/V in and dK/dV back, both ways)
        att[:, :-1] += (2.0 if xc.ndim == 2 else 1.0) * d.slowdown[:, None] * d.link[:, 1:]
        xc = xc if xc.ndim == 3 else xc[:, :, None]
        A = t + att[:, 0]
        log = {"A_from_C": [], "M_from": [], "piece": [], "P_from_C": []} if self.trace else None
        if k > 1 and not d.comm:  # no transfers to wait for: the rounds' attention back to back
            for j in range(1, k):
                A = A + att[:, j]
                if log is not None:
                    log["A_from_C"].append(np.zeros(a.R, dtype=bool))
        elif k > 1:
            # what does not depend on the recurrence, for every round at once: the longest piece of
            # each rank's transfer, and the groups posting left and right of each rank's group
            grp = a.grp
            cmax = xc.max(axis=2)
            shift = np.arange(k)[:, None]
            left_of, right_of = (grp[None, :] - shift) % k, (grp[None, :] + shift) % k
            all_active = bool(active.all())
            singletons = a.R == k  # one rank per group (a ring without heads split): each group's max is its rank's
            if log is not None:  # the recurrence's values per round; who set what is derived after it
                rec = {n: np.empty((k - 1, a.R)) for n in ("P", "Pa", "A", "C", "M")}
                rec["gmax"] = np.empty((k - 1, k))
            P = t
            for j in range(1, k):
                Pa = P if all_active else np.where(active, P, -np.inf)
                gmax = Pa if singletons else np.maximum.reduceat(Pa, a.gstart)
                M = np.maximum(P, np.maximum(gmax[left_of[j]], gmax[right_of[j]]))
                C = M + cmax[:, j]
                if log is not None:
                    for name, v in (("P", P), ("Pa", Pa), ("A", A), ("C", C), ("M", M), ("gmax", gmax)):
                        rec[name][j - 1] = v
                P = np.maximum(A, C)  # the next post: after this round's transfer and attention start
                A = P + att[:, j]
            if log is not None:
                log.update(self._exchange_log(rec, xc, left_of[1:], right_of[1:]))
        if log is not None:
            self.log[tag] = log
        end = np.where(active, A, t)
        ph["kv_exchange"] += end - t  # the callers move the plain attention time out of it
        return end

    def _exchange_log(self, rec: dict, xc: np.ndarray, left_of: np.ndarray, right_of: np.ndarray) -> dict:
        """Per round j (row j-1): whether the round's attention waited for its transfer (A_from_C),
        the rank whose post set the transfer's start (M_from: the rank itself, or the active rank
        posting last in the group on its left or right), the longest piece, and whether the next
        post waited for the transfer (P_from_C)."""
        a = self.a
        idx = np.arange(a.R)
        Pa, gmax = rec["Pa"], rec["gmax"]
        cand = np.where(Pa == gmax[:, a.grp], idx, a.R)
        garg = np.minimum.reduceat(cand, a.gstart, axis=1)  # [rounds, k] first rank posting last in each group
        left, right = np.take_along_axis(gmax, left_of, axis=1), np.take_along_axis(gmax, right_of, axis=1)
        from_side = np.where(
            left >= right, np.take_along_axis(garg, left_of, axis=1), np.take_along_axis(garg, right_of, axis=1)
        )
        return {
            "A_from_C": rec["C"] > rec["A"],
            "M_from": np.where(rec["M"] == rec["P"], idx, from_side),
            "piece": xc[:, 1:, :].argmax(axis=2).T,
            "P_from_C": rec["C"] >= rec["A"],
        }

    def forward(self, t: np.ndarray, ph: dict, tag: str = "f") -> np.ndarray:
        d = self.d
        t = t + d.lin_pre_f
        t = self.pieces(self.group_sync(t, ph, tag + ":sync_in"), d.a2a_in, tag + ":a2a_in")
        t = self.exchange(t, d.att_f, d.xc_f, ph, tag + ":x")
        t = self.pieces(self.group_sync(t, ph, tag + ":sync_out"), d.a2a_out, tag + ":a2a_out")
        t = t + d.lin_post_f
        ph["alltoall"] += d.a2a_in.max(axis=1) + d.a2a_out.max(axis=1)
        lin = d.lin_pre_f + d.lin_post_f
        o = d.c.ops
        ops_lin, ops_att = 2.0 * o.linear_forward, np.where(self.a.active, self.a.k * o.round_forward, 0.0)
        ph["linear"] += d.matmul_f
        ph["memory_bound"] += lin - d.matmul_f - ops_lin
        att = np.where(self.a.active, d.att_f.sum(axis=1), 0.0)
        ph["attention"] += att - ops_att
        ph["operators"] += ops_lin + ops_att
        ph["kv_exchange"] -= att
        return t

    def backward(self, t: np.ndarray, ph: dict) -> np.ndarray:
        d = self.d
        if d.rule.replay_layer:  # the whole layer forward again, collectives included
            rec = _zeros(self.a.R)
            t1 = self.forward(t, rec, tag="r")
            ph["recompute"] += t1 - t - rec["wait"]
            ph["wait"] += rec["wait"]
            t = t1
        t = t + d.lin_post_b
        t = self.pieces(self.group_sync(t, ph, "b:sync_out"), d.a2a_out, "b:a2a_out")
        t = self.exchange(t, d.att_b, d.xc_b, ph, "b:x")
        t = self.pieces(self.group_sync(t, ph, "b:sync_in"), d.a2a_in, "b:a2a_in")
        t = t + d.lin_pre_b
        ph["alltoall"] += d.a2a_in.max(axis=1) + d.a2a_out.max(axis=1)
        lin = d.lin_pre_b + d.lin_post_b
        again = d.rule.backward_factors().rerun_linear  # the linear forward rerun inside the backward
        rerun = again * (d.lin_pre_f + d.lin_post_f)
        matmul = d.matmul_b - again * d.matmul_f
        o = d.c.ops
        ops_lin = 2.0 * (o.linear_backward - again * o.linear_forward)  # the rerun's operators are recompute
        ops_att = np.where(self.a.active, self.a.k * o.round_backward, 0.0)
        ph["recompute"] += rerun
        ph["linear"] += matmul
        ph["memory_bound"] += lin - rerun - matmul - ops_lin
        att = np.where(self.a.active, d.att_b.sum(axis=1), 0.0)
        ph["attention"] += att - ops_att
        ph["operators"] += ops_lin + ops_att
        ph["kv_exchange"] -= att
        return t

    # ------------------------------------------------------------------ tracing back
    def _exchange_path(self, tag: str, r: int, backward: bool) -> tuple[list[PathItem], int]:
        """Items from the exchange's start (t2 of the returned rank) to rank r's exchange end."""
        a, k = self.a, self.a.k
        items: list[PathItem] = []
        if not a.active[r]:
            return items, r
        log = self.log[tag]
        j, at = k - 1, "A"
        while True:
            if at == "A":
                items.append(AttentionRound(r, j, backward))
                if j + 1 < k:
                    items.append(OverlapSlowdown(r, j + 1, backward))
                if j == 0:
                    return items, r
                if not self.d.comm or not log["A_from_C"][j - 1][r]:
                    j -= 1
                    continue
                at = "C"
            if at == "C":  # C_j = M_j + c_j
                items.append(BackwardTransfer(r, j) if backward else ForwardTransfer(r, j, int(log["piece"][j - 1][r])))
                r = int(log["M_from"][j - 1][r])
                at = "P"
            if at == "P":  # P_j: t2 for j = 1, else max(C_{j-1}, A_{j-2})
                if j == 1:
                    return items, r
                if log["P_from_C"][j - 2][r]:
                    j, at = j - 1, "C"
                else:
                    j, at = j - 2, "A"

    def _last_arrival(self, tag: str, r: int) -> int:
        """The member of r's group the path jumps to at a rendezvous (r itself when there is none)."""
        log = self.log[tag]
        return r if log is None else int(log[self.a.grp[r]])

    def forward_path(self, r: int, tag: str = "f") -> list[PathItem]:
        """Rank r's forward finish traced back to the pass's start (a rank's own all-to-all time is
        added after its group's last arrival: each sync jumps to the member that arrived last)."""
        items: list[PathItem] = [OwnWork("post_f", r), AllToAllPiece("out", r, int(self.log[tag + ":a2a_out"][r]))]
        r = self._last_arrival(tag + ":sync_out", r)
        x, r = self._exchange_path(tag + ":x", r, backward=False)
        items += x
        items.append(AllToAllPiece("in", r, int(self.log[tag + ":a2a_in"][r])))
        r = self._last_arrival(tag + ":sync_in", r)
        items.append(OwnWork("pre_f", r))
        return items

    def backward_path(self, r: int) -> list[PathItem]:
        items: list[PathItem] = [OwnWork("pre_b", r), AllToAllPiece("in", r, int(self.log["b:a2a_in"][r]))]
        r = self._last_arrival("b:sync_in", r)
        x, r = self._exchange_path("b:x", r, backward=True)
        items += x
        items.append(AllToAllPiece("out", r, int(self.log["b:a2a_out"][r])))
        r = self._last_arrival("b:sync_out", r)
        items.append(OwnWork("post_b", r))
        if self.d.rule.replay_layer:
            items += self.forward_path(r, tag="r")
        return items


def _pass(
    end: np.ndarray, own: dict, comm: float, window: np.ndarray, slowdown: np.ndarray
) -> tuple[float, dict, int | None, bool]:
    """A layer pass (from a synchronized start) with a prefetched collective of `comm` seconds: its
    duration, every rank's phases (own work, exposed collective, waiting for the slowest), the rank
    that sets it (None: the collective itself) and whether that rank's exposed part is comm - window."""
    ph = {p: v.copy() for p, v in own.items()}
    if comm > 0:
        exposed = _exposed(comm, window, slowdown)
        total = end + exposed
        r = int(np.argmax(total))
        D = float(max(total[r], comm))
        ph["param_comm"] += exposed
        ph["wait"] += D - total  # (not D - end - exposed: exactly 0 for the rank that sets D)
        return D, ph, (r if total[r] >= comm else None), bool(comm - window[r] > 0)
    r = int(np.argmax(end))
    D = float(end[r])
    ph["wait"] += D - end
    return D, ph, r, False


def _exposed(comm: float, window: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
    """[R] seconds of a prefetched collective each rank does not hide behind its window."""
    return np.maximum(0.0, comm - window) + slowdown * comm


def _pass_seconds(end: np.ndarray, comm: float, window: np.ndarray, slowdown: np.ndarray) -> float:
    """`_pass`'s duration alone (the same arithmetic, bit for bit), without the phases."""
    if comm > 0:
        return float(max((end + _exposed(comm, window, slowdown)).max(), comm))
    return float(end.max())


def pass_schedule(d: IterationShape) -> list[Step]:
    """The passes of one iteration (module doc): layer passes with their prefetched collective and
    the exposed collectives between them. The planner's model and the bounds read the same list."""
    p, n, B = d.params, d.layers - 1, d.batch
    copies = d.comm and p.xr_layer > 0  # hybrid sharding: shards all-reduced across copies in the last backward
    if d.comm and p.sharding == "zero3":
        out = [
            Barrier("gather root + first layer", B, p.ag_root + p.ag_layer),
            Pass("forward, prefetching", "f", B * n, p.ag_layer),
            Pass("forward", "f", B, 0.0),
            Pass("LM head, prefetching", "h", B, p.ag_layer),
            Pass("backward, prefetching + reduce-scatter", "b", B * n - (n if copies else 0), p.ag_layer + p.rs_layer),
        ]
        if copies:
            out.append(Pass("backward, + all-reduce across copies", "b", n, p.ag_layer + p.rs_layer + p.xr_layer))
        out += [
            Pass("backward", "b", B, 0.0),
            Barrier("reduce-scatter last layer + root", B, p.rs_layer + p.rs_root),
        ]
        if copies:
            out.append(Barrier("all-reduce last layer + root across copies", 1, p.xr_layer + p.xr_root))
        return out
    # the gradient reduction of whole-parameter passes: inside a shard group (ar) and/or across its copies
    # (xr; a shard group of one rank has only the latter: ZeRO-1 inside one-device replicas or nodes)
    ddp = d.comm and p.sharding == "replicated" and (p.ar_layer > 0 or p.xr_layer > 0)
    out = [
        Pass("forward", "f", B * d.layers, 0.0),
        Pass("LM head", "h", B, 0.0),
        Pass("backward", "b", B * d.layers - (n if ddp else 0), 0.0),
    ]
    if ddp:
        out += [
            Pass("backward, all-reduce", "b", n, p.ar_layer + p.xr_layer),
            Barrier("all-reduce last bucket + root", 1, p.ar_layer + p.ar_root + p.xr_layer + p.xr_root),
        ]
    return out


@dataclass(frozen=True, eq=False)
class LayerChains:
    """One forward and one backward layer pass replayed from a synchronized start (`_Chain`): every
    rank's finish and phases. They depend on the durations of the layer only, not on the parameter
    collectives, the optimizer or the batch (which only schedule the passes), so a caller replaying
    the same layout under several strategies or batches replays its layer passes once. Read-only."""

    chain: _Chain
    end_f: np.ndarray
    own_f: dict[str, np.ndarray]
    end_b: np.ndarray
    own_b: dict[str, np.ndarray]


def layer_chains(d: Durations, trace: bool = False) -> LayerChains:
    """The layer passes of durations `d` (LayerChains)."""
    R = d.a.R
    chain = _Chain(d, trace)
    own_f, own_b = _zeros(R), _zeros(R)
    end_f = chain.forward(np.zeros(R), own_f)
    end_b = chain.backward(np.zeros(R), own_b)
    return LayerChains(chain, end_f, own_f, end_b, own_b)


def simulate_durations(
    d: Durations, trace: bool = False, chains: LayerChains | None = None, phases: bool = True
) -> SimResult:
    """Replay one iteration from precomputed durations (module doc); with `trace`, each pass kind's
    critical path (the planner's model turns them into constraints). `chains`: `layer_chains` of
    durations whose layer terms are d's (the same layout; the collectives, optimizer and batch may
    differ), replayed once by the caller; without a trace only. `phases=False`: the times only
    (iteration and passes, the same numbers), `SimResult.phases` left empty."""
    R = d.a.R
    if chains is None:
        chains = layer_chains(d, trace)
    elif trace:
        raise ValueError("a traced replay replays its own layer passes (chains only without trace)")
    if trace and not phases:
        raise ValueError("a traced replay keeps its phases")
    chain, end_f, own_f, end_b, own_b = chains.chain, chains.end_f, chains.own_f, chains.end_b, chains.own_b
    own_h = _zeros(R)
    own_h["lm_head"] += d.head
    slow = d.slowdown
    total = _zeros(R)
    passes: dict[str, tuple[float, float]] = {}
    paths: dict[str, list[PathItem]] = {}
    kinds = {
        "f": (end_f, own_f, chain.forward_path),
        "b": (end_b, own_b, chain.backward_path),
        "h": (d.head, own_h, lambda r: [OwnWork("head", r)]),
    }
    windows = {"f": d.window_f, "b": d.window_b, "h": d.window_h}

    def add(name: str, kind: str, count: float, comm: float = 0.0) -> None:
        if count <= 0:
            return
        end, own, path_of = kinds[kind]
        if not phases:
            D = _pass_seconds(end, comm, windows[kind], slow)
        else:
            D, ph, r, exposed = _pass(end, own, comm, windows[kind], slow)
            for key in PHASES:
                total[key] += count * ph[key]
        c0, _ = passes.get(name, (0.0, D))
        passes[name] = (c0 + count, D)
        if trace:
            if r is None:
                paths[name] = [Constant(comm)]
            else:
                extra = [ExposedCollective(kind, r, comm)] if comm > 0 and exposed else []
                paths[name] = path_of(r) + extra + ([Constant(float(slow[r] * comm))] if comm > 0 else [])

    def barrier(name: str, count: float, seconds: float) -> None:
        if count > 0 and seconds > 0:
            if phases:
                total["param_comm"] += count * seconds
            c0, _ = passes.get(name, (0.0, seconds))
            passes[name] = (c0 + count, seconds)
            if trace:
                paths[name] = [Constant(seconds)]

    for step in pass_schedule(d):
        if isinstance(step, Pass):
            add(step.name, step.chain, step.count, step.collective_s)
        else:
            barrier(step.name, step.count, step.seconds)
    r = int(np.argmax(d.optimizer))
    opt = float(d.optimizer[r])
    if phases:
        total["optimizer"] += d.optimizer
        total["wait"] += opt - d.optimizer
    passes["optimizer"] = (1.0, opt)
    if trace:
        paths["optimizer"] = [Constant(opt)]
    t = float(sum(c * s for c, s in passes.values()))
    return SimResult(t, total if phases else {}, passes, paths)


def path_length(d: Durations, items: list[PathItem]) -> float:
    """Seconds of a traced critical path: the sum of its items' durations (equals its pass's D)."""
    windows = {"f": d.window_f, "b": d.window_b, "h": d.window_h}
    own = {"pre_f": d.lin_pre_f, "post_f": d.lin_post_f, "pre_b": d.lin_pre_b, "post_b": d.lin_post_b, "head": d.head}
    total = 0.0
    for it in items:
        match it:
            case OwnWork(part, r):
                total += own[part][r]
            case AllToAllPiece(direction, r, piece):
                total += (d.a2a_in if direction == "in" else d.a2a_out)[r, piece]
            case AttentionRound(r, j, backward):
                total += (d.att_b if backward else d.att_f)[r, j]
            case OverlapSlowdown(r, j, backward):
                total += (2.0 if backward else 1.0) * d.slowdown[r] * d.link[r, j]
            case ForwardTransfer(r, j, piece):
                total += d.xc_f[r, j, piece]
            case BackwardTransfer(r, j):
                total += d.xc_b[r, j]
            case ExposedCollective(chain, r, comm):
                total += comm - windows[chain][r]
            case Constant(seconds):
                total += seconds
            case _:  # pragma: no cover - a new item kind must be added here and in the planner's model
                raise ValueError(f"unknown path item {it!r}")
    return float(total)


def one_replica(plan: Plan) -> None:
    """Refuse a plan of several data-parallel replicas: its step is costmodel.step.estimate_step's."""
    if plan.num_replicas > 1:
        raise PlanError(
            f"plan {plan.name!r} has {plan.num_replicas} data-parallel replicas: time its step with "
            "costmodel.step.estimate_step (or one replica, plan.replica(i))"
        )


def simulate(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    trace: bool = False,
) -> SimResult:
    """Replay one training iteration of `plan` (module doc); the judge of a plan."""
    one_replica(plan)
    return simulate_durations(durations(plan, cluster, model, workload, options), trace)
