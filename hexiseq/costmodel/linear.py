"""The linear form of the cost model for one fixed grouping: what the planner's MILP optimizes.

For fixed groups (cluster device indices, in ring order; ranks numbered group by group as in
Plan) every rank's iteration time and memory are written as affine functions of the plan
variables:

    ("s", r)      s_r, tokens of rank r's shard
    ("L", g)      L_g, chunk length of group g (n_g = 2·L_g)
    ("eta", r)    η_r, query heads of rank r
    ("w", r)      w_r = η_r · L_g (g = r's group), the bilinear attention / all-to-all term
    ("wx", r, h)  η_r · L_h for another group h: K/V bytes rank r receives from h (only when
                  heads are free; the MILP linearizes it like w)

When `heads` is given (η fixed) η is folded into the coefficients and only s and L appear.

Time: time_r = Σ_terms max(pieces) (`time_terms[r]`, a list of terms, each a list of Affine
pieces); `time_pieces(r)` expands it into one list whose max is time_r ("time_r ≥ every piece").
A MILP should use the terms: t_{r,i} ≥ piece for each piece of term i, T ≥ Σ_i t_{r,i}.
Terms, per iteration (B = global_batch, Λ = layers; by recompute policy (estimate.py): ac = 1 with
"selective" or "full" (the linear forward runs again), fu = 1 with "full" (the all-to-alls and the
attention with its KV exchange run again too), else 0):
  base    B·(Λ·(3+ac)·F_layer/m_r + head_r)·s_r + optimizer_r + the always exposed parameter
          collectives: B·(AG_root + AG + RS + RS_root) (zero3) or AR + AR_root (replicated)
  params  the overlapped parameter collectives (estimate.py, `param_exposed`): a sum of slots
          max(0, x_i), x_i = comm - window, with the windows affine in the variables
          (C_f = s_r·F_layer/m_r + A, C_b = (2+ac)·s_r·F_layer/m_r + (2.5+fu)·A, H_b = 2/3·head_r·s_r):
          zero3       B·(Λ-1)·max(0, AG - C_f) + B·max(0, AG - H_b) + B·(Λ-1)·max(0, AG + RS - C_b)
          replicated  (Λ-1)·max(0, AR - C_b)
          written exactly as ONE term, Σ_i max(0, x_i) = max over subsets U of Σ_{i∈U} x_i
          (2^n pieces, the empty subset = 0), so it costs the MILP one variable per rank class;
          no term when the collectives are free (one rank, or ignore_comm)
  a2a in  B·Λ·(2+fu)·(α + max(send_in, recv_in))     send_in ∝ s_r, recv_in ∝ s_r' of the group
  a2a out B·Λ·(2+fu)·(α + max(send_out, recv_out))   send_out ∝ s_r', recv_out ∝ s_r
  exch f  B·Λ·(1+fu)·max(A, Σ_j(α_j + x_j) + a_last for x_j in recv_j, send_j, dom_j)
          (dom_j: whichever of recv_j / send_j is larger at equal chunk lengths; each sum ≤ Σ_j c_j)
  exch b  B·Λ·max(2.5·A, Σ_j(2α_j + recv_j + send_j) + 2.5·a_last)
with A = w_r·(S+1)·4d/a_r the rank's attention (exact: a zigzag group does L_g(S+1) pairs per
head), recv_j ∝ L_{(g-j) mod k}, send_j ∝ L_g, and a_last = 2·w_r·L̄·4d/a_r (L̄ = S/(2k)) the
attention of the last round, whose true value η_r·2·L_g·L_h is trilinear.

Relation to `estimate`: identical durations (same comm.py tables) wherever the estimate is
affine; the differences are (1) the exchange: the estimate takes
max_m (Σ_{i≤m} c_i + Σ_{i≥m} att_i) with c_i = α_i + max(recv_i, send_i) per round; the form keeps
the two extreme m (all compute; all transfers + last round) and bounds Σ_j max(recv_j, send_j)
from below by three sums — equal when one regime dominates every round and send/recv links match (symmetric plans on
uniform links), otherwise lower; (2) a_last uses L̄ instead of L_h (exact for even chunks);
(3) memory: with a large vocabulary (chunked loss) the logits are charged a whole chunk,
loss_chunk_tokens·V·6 bytes, instead of min(s_r, chunk)·V·6 (min is concave: no affine or
max-of-affine form; conservative by at most one chunk, 1.5 GiB for V = 128K). With free heads
(heads=None) the all-to-all and KV terms use κ_r = η_r/(H/H_kv) (whole KV heads) and the
slowest link of the rank to the other group, dropping the small self-share of the all-to-all
(an upper bound there). `simulate` adds synchronization waits on top of the estimate.

Memory (bytes): memory_r = memory[r] + max(kv_buffer[r]) (kv_buffer empty for one group);
memory[r] is memory.py's sum, affine in s_r and L_g (or w_r), for the workload's recompute policy;
`memory_pieces(r)` gives memory[r] + each piece, every one of which must be ≤ capacity_bytes[r].
The pieces are the double-buffered K/V receive buffers of consecutive rounds (memory.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import PlanError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import CostOptions, grouping_arrays, recompute_of
from .comm import BF16, ParamComm, _intra_group_pairs, exchange_times, param_collectives
from .memory import FP32, checkpoint_token_bytes, state_bytes, token_activation_bytes

Key = tuple


@dataclass
class Affine:
    """const + Σ coef[key] · variable[key]."""

    const: float = 0.0
    coef: dict[Key, float] = field(default_factory=dict)

    def evaluate(self, values: Mapping[Key, float]) -> float:
        return self.const + sum(c * values[k] for k, c in self.coef.items())

    def __add__(self, other: "Affine") -> "Affine":
        coef = dict(self.coef)
        for k, c in other.coef.items():
            coef[k] = coef.get(k, 0.0) + c
        return Affine(self.const + other.const, coef)

    def scaled(self, f: float) -> "Affine":
        return Affine(self.const * f, {k: c * f for k, c in self.coef.items()})


def _add(coef: dict, key: Key, value: float) -> None:
    if value:
        coef[key] = coef.get(key, 0.0) + float(value)


@dataclass
class LinearForm:
    """Affine time and memory of every rank of one grouping (see the module doc).

    time_terms[r]   list of terms; each term a list of Affine pieces; time_r = Σ_terms max(pieces)
                    (seconds per iteration)
    memory[r]       Affine, bytes, everything but the K/V receive buffers
    kv_buffer[r]    Affine pieces (bytes); memory_r = memory[r] + max(kv_buffer[r]) (0 if empty)
    capacity_bytes  per rank; feasibility: every `memory_pieces(r)` ≤ capacity_bytes[r]
    """

    seq_len: int
    groups: list[list[int]]
    heads: list[list[int]] | None
    rank_device: list[int]
    rank_group: list[int]
    capacity_bytes: list[float]
    time_terms: list[list[list[Affine]]]
    memory: list[Affine]
    kv_buffer: list[list[Affine]]

    @property
    def num_ranks(self) -> int:
        return len(self.rank_device)

    def time_pieces(self, r: int) -> list[Affine]:
        """All sums of one piece per term: time_r = max of these (product expansion; prefer time_terms)."""
        return [sum(combo, Affine()) for combo in itertools.product(*self.time_terms[r])]

    @property
    def time(self) -> list[list[Affine]]:
        """Per rank, the expanded pieces (time_r ≥ every piece). Up to 256 pieces per rank (prefer time_terms)."""
        return [self.time_pieces(r) for r in range(self.num_ranks)]

    def memory_pieces(self, r: int) -> list[Affine]:
        """memory_r = max of these (bytes); each must be ≤ capacity_bytes[r]."""
        return [self.memory[r] + p for p in self.kv_buffer[r]] or [self.memory[r]]

    # ---- evaluation at a plan
    def variables(self, plan: Plan) -> dict[Key, float]:
        """The variable values of a plan with this grouping."""
        if [list(g.devices) for g in plan.groups] != [list(g) for g in self.groups]:
            raise PlanError("plan's groups differ from the linear form's grouping")
        if self.heads is not None and [list(g.heads) for g in plan.groups] != [list(h) for h in self.heads]:
            raise PlanError("plan's head counts differ from the linear form's fixed heads")
        v: dict[Key, float] = {}
        L = [g.chunk_len for g in plan.groups]
        for g, gl in enumerate(L):
            v[("L", g)] = float(gl)
        for r, (s, eta, g) in enumerate(zip(plan.shards, plan.heads, plan.group_of_rank)):
            v[("s", r)] = float(s)
            v[("eta", r)] = float(eta)
            v[("w", r)] = float(eta * L[g])
            for h, lh in enumerate(L):
                if h != g:
                    v[("wx", r, h)] = float(eta * lh)
        return v

    def evaluate(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """(time [R] seconds, memory [R] bytes) of the plan under this linear form."""
        v = self.variables(plan)
        t = np.array([sum(max(p.evaluate(v) for p in term) for term in terms) for terms in self.time_terms])
        m = np.array([max(p.evaluate(v) for p in self.memory_pieces(r)) for r in range(self.num_ranks)])
        return t, m


def linear_form(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    groups: Sequence[Sequence[int]],
    heads: Sequence[Sequence[int]] | None = None,
    options: CostOptions = CostOptions(),
) -> LinearForm:
    """Affine time and memory of every rank for a fixed grouping (see module doc)."""
    groups = [list(map(int, g)) for g in groups]
    fixed = heads is not None
    hlist = [list(map(int, h)) for h in heads] if fixed else None
    a = grouping_arrays(cluster, model, groups, hlist)
    R, k = a.R, a.k
    H, Hkv, d, h = model.heads, model.kv_heads, model.head_dim, model.hidden
    gq = H // Hkv
    S, B, Lyr = workload.seq_len, workload.global_batch, model.layers
    policy = recompute_of(workload)  # refuses "auto"
    ac = 1 if policy in ("selective", "full") else 0  # the linear forward runs again
    fu = 1 if policy == "full" else 0  # ... and so do the all-to-alls, the attention and the KV exchange
    f = options.attn_bwd_factor
    off = not options.ignore_comm
    attn_pp = model.attention_flops_per_pair
    Lbar = S / (2.0 * k)

    # ---- base term
    pc = param_collectives(a, model, workload) if off else ParamComm(workload.param_sharding)
    local_params = model.param_count / (R if workload.param_sharding == "zero3" else 1)
    head_tok = 3.0 * model.lm_head_flops_per_token / a.mm_rate + model.vocab * options.loss_bytes_per_logit / a.hbm
    lin_tok = model.linear_flops_per_token_per_layer / a.mm_rate  # [R] seconds per token of one layer's forward matmuls
    base_s = B * (Lyr * (3 + ac) * lin_tok + head_tok)
    base_c = B * (pc.ag_root + pc.ag_layer + pc.rs_layer + pc.rs_root) + pc.ar_layer + pc.ar_root
    base_c = base_c + local_params * options.optimizer_bytes_per_param / a.hbm

    # ---- all-to-all pieces: per-pair coefficients
    a2a_scale = B * Lyr * (2 + fu)  # selective recompute repeats no all-to-all, full does
    src, dst = _intra_group_pairs(a)
    inv = 1.0 / a.bw[src, dst] if len(src) else np.zeros(0)
    cnt_s = np.bincount(src, minlength=R)
    off_s = np.cumsum(cnt_s) - cnt_s  # src is sorted: rank r's outgoing pairs are a slice
    by_dst = np.argsort(dst, kind="stable")
    cnt_d = np.bincount(dst, minlength=R)
    off_d = np.cumsum(cnt_d) - cnt_d
    lat_in = np.zeros(R)
    if len(src):
        np.maximum.at(lat_in, src, a.lat[src, dst])
    # with free heads: the slowest link inside each rank's group
    bw_min_grp = np.full(R, np.inf)
    if len(src):
        np.minimum.at(bw_min_grp, src, a.bw[src, dst])

    # ---- exchange per unit L
    xc = exchange_times(a, model) if (off and k > 1) else None
    xf_scale, xb_scale = B * Lyr * (1 + fu), B * Lyr  # ... nor the attention and KV exchange
    if not fixed and k > 1:
        bw_grp = np.minimum.reduceat(np.where(np.isfinite(a.bw), a.bw, np.inf), a.gstart, axis=0)  # [k, R]

    # ---- memory constants
    st = sum(state_bytes(model, workload, R).values())
    tok_act = token_activation_bytes(model)
    # token side (memory.py): full keeps the layer inputs + one layer being recomputed; selective
    # the checkpointed parts' inputs + one layer rebuilt; none every layer's activations
    mem_s = {"full": Lyr * BF16 * h + tok_act, "selective": Lyr * checkpoint_token_bytes(model) + tok_act}.get(policy, Lyr * tok_act)
    act_layers = 1 if fu else Lyr  # head side: full keeps q, k, v, out, lse of the recomputed layer only
    mem_s += BF16 * (H + 2 * Hkv) * d
    large = model.vocab >= options.large_vocab
    logit_c = options.loss_chunk_tokens * model.vocab * (BF16 + FP32) if large else 0.0
    logit_s = 0.0 if large else model.vocab * (BF16 + FP32)

    time_terms: list[list[list[Affine]]] = []
    memory: list[Affine] = []
    kv_buffer: list[list[Affine]] = []
    for r in range(R):
        g = int(a.grp[r])
        terms: list[list[Affine]] = [[Affine(float(base_c[r]) if np.ndim(base_c) else float(base_c), {("s", r): float(base_s[r])})]]
        # all-to-alls
        if a.gsize[g] > 1 and off:
            sel_s = slice(off_s[r], off_s[r] + cnt_s[r])
            sel_d = by_dst[off_d[r] : off_d[r] + cnt_d[r]]
            peers_out = dst[sel_s]
            peers_in = src[sel_d]
            lat = float(lat_in[r])
            if fixed:
                in_send = {("s", r): float(np.sum((a.eta[peers_out] + 2 * a.kvc[peers_out]) * inv[sel_s])) * d * BF16}
                in_recv: dict = {}
                for p, iv in zip(peers_in, inv[sel_d]):
                    _add(in_recv, ("s", int(p)), (a.eta[r] + 2 * a.kvc[r]) * iv * d * BF16)
                out_send: dict = {}
                for p, iv in zip(peers_out, inv[sel_s]):
                    _add(out_send, ("s", int(p)), a.eta[r] * iv * d * BF16)
                out_recv = {("s", r): float(np.sum(a.eta[peers_in] * inv[sel_d])) * d * BF16}
            else:
                ib = d * BF16 / bw_min_grp[r]
                in_send = {("s", r): H * (1 + 2 / gq) * ib}
                in_recv = {("w", r): 2 * (1 + 2 / gq) * ib}
                out_send = {("w", r): 2 * ib}
                out_recv = {("s", r): H * ib}
            for pair in ((in_send, in_recv), (out_send, out_recv)):
                terms.append([Affine(lat, dict(x)).scaled(a2a_scale) for x in pair])
        # exchange
        att_rate = float(a.att_rate[r])
        A = {("w", r): (S + 1) * attn_pp / att_rate} if not fixed else {("L", g): a.eta[r] * (S + 1) * attn_pp / att_rate}
        a_last = {("w", r): 2 * Lbar * attn_pp / att_rate} if not fixed else {("L", g): a.eta[r] * 2 * Lbar * attn_pp / att_rate}
        if xc is None or a.eta[r] == 0:
            terms.append([Affine(0.0, dict(A)).scaled(xf_scale)])
            terms.append([Affine(0.0, dict(A)).scaled(f * xb_scale)])
            kvb: list[Affine] = []
        else:
            lat_sum = float(xc["lat"][r, 1:].sum())
            recv: dict = {}
            send: dict = {}
            dom: dict = {}  # per round the side that dominates at equal chunk lengths (still ≤ Σ max)
            recv_b = []  # per round: (coef dict of the received bytes)
            for j in range(1, k):
                hsrc = int(a.src[g, j])
                tgt = int(a.src[g, (k - j) % k])  # group that receives from g in round j: (g + j) mod k
                if fixed:
                    _add(recv, ("L", hsrc), xc["recv"][r, j])
                    _add(send, ("L", g), xc["send"][r, j])
                    if xc["recv"][r, j] >= xc["send"][r, j]:
                        _add(dom, ("L", hsrc), xc["recv"][r, j])
                    else:
                        _add(dom, ("L", g), xc["send"][r, j])
                    recv_b.append({("L", hsrc): float(xc["recv_bytes"][r, j])})
                else:
                    mult_in = a.need[g, hsrc]
                    mult_out = a.need[tgt, g]
                    bw_in = bw_grp[hsrc, r]
                    bw_out = bw_grp[tgt, r]
                    per = d * 2.0 * BF16 / gq
                    _add(recv, ("wx", r, hsrc), mult_in * per / bw_in)
                    _add(send, ("w", r), mult_out * per / bw_out)
                    if mult_in / bw_in >= mult_out / bw_out:
                        _add(dom, ("wx", r, hsrc), mult_in * per / bw_in)
                    else:
                        _add(dom, ("w", r), mult_out * per / bw_out)
                    recv_b.append({("wx", r, hsrc): mult_in * per})
            pieces_f = [Affine(0.0, dict(A))] + [Affine(lat_sum, dict(x)) + Affine(0.0, dict(a_last)) for x in (recv, send, dom)]
            terms.append([p.scaled(xf_scale) for p in pieces_f])
            pieces_b = [Affine(0.0, dict(A)).scaled(f), Affine(2 * lat_sum, dict(recv)) + Affine(0.0, dict(send)) + Affine(0.0, dict(a_last)).scaled(f)]
            terms.append([p.scaled(xb_scale) for p in pieces_b])
            kvb = []
            for j in range(len(recv_b)):
                nxt = recv_b[j + 1] if j + 1 < len(recv_b) else {}
                kvb.append((Affine(0.0, dict(recv_b[j])) + Affine(0.0, dict(nxt))).scaled(2.0))
        # overlapped parameter collectives: slot x = scale·(comm - window), window = (per token)·s_r + (× A)·A
        (akey, aval), = A.items()
        lt, ht = float(lin_tok[r]), float(head_tok[r]) * 2.0 / 3.0
        slots = [Affine(scale * comm, {("s", r): -scale * tok, **({akey: -scale * att * aval} if att else {})})
                 for comm, tok, att, scale in ((pc.ag_layer, lt, 1.0, B * (Lyr - 1)), (pc.ag_layer, ht, 0.0, B),
                                               (pc.ag_layer + pc.rs_layer, (2 + ac) * lt, f + fu, B * (Lyr - 1)),
                                               (pc.ar_layer, (2 + ac) * lt, f + fu, Lyr - 1))
                 if comm > 0 and scale > 0]
        if slots:  # Σ_i max(0, x_i) = max over subsets of Σ_{i∈subset} x_i: one term, one MILP variable
            subsets = [Affine()]
            for x in slots:
                subsets += [p + x for p in subsets]
            terms.append(subsets)
        time_terms.append(terms)
        kv_buffer.append(kvb)
        # memory
        per_tok_head = lambda eta, kv: BF16 * (2 * eta + 2 * kv) * d + FP32 * eta  # noqa: E731
        mem = Affine(st + logit_c + options.reserved_fraction * float(a.capacity[r]), {("s", r): mem_s + logit_s})
        if fixed:
            eta, kv = float(a.eta[r]), float(a.kvc[r])
            _add(mem.coef, ("L", g), 2.0 * (act_layers * per_tok_head(eta, kv) + BF16 * (2 * eta + 2 * kv) * d))
        else:
            _add(mem.coef, ("w", r), 2.0 * (act_layers * per_tok_head(1.0, 1.0 / gq) + BF16 * (2 + 2.0 / gq) * d))
        memory.append(mem)
    return LinearForm(
        seq_len=S,
        groups=groups,
        heads=hlist,
        rank_device=[int(x) for x in a.dev],
        rank_group=[int(x) for x in a.grp],
        capacity_bytes=[float(x) for x in a.capacity],
        time_terms=time_terms,
        memory=memory,
        kv_buffer=kv_buffer,
    )

