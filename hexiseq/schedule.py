"""The exchange schedule of a Plan: who sends which K/V head range of which chunk to whom, in which
round. Derived once, torch-free; the cost model counts its bytes and the executor posts its transfers.

Rules (docs/architecture.md names this module their one home):

- Groups sit in ring order g = 0..k-1. In round j = 1..k-1 group g receives from group
  (g - j) mod k and sends to (g + j) mod k.
- Zigzag need: group g needs, of a group h *before* it in the ring (h < g), only h's front chunk
  (L_h tokens); of a group *after* it (h > g), both chunks (2·L_h tokens, rows [0, 2·L_h) of h's
  group order). Every other key is masked for every query of g.
- KV-head ownership: the KV head κ (query heads [κ·gq, (κ+1)·gq), gq = H / H_kv) of a group is
  *served* by the rank of that group that holds its first query head κ·gq: rank r serves
  [ceil(h0_r/gq), ceil(h1_r/gq)). With whole-KV-head splits these are exactly the rank's own KV
  heads; with a finer split a KV head touched by two ranks is served by the first, so each KV
  head travels once per round and its gradient returns to exactly one copy.
- A receiver (a rank with query heads) gets from each server of the source group the intersection
  of the served range with the KV heads its own query heads touch, [floor(h0/gq), ceil(h1/gq)).
  Ranks without heads take no part.

`exchange_table(plan)` gives every transfer of every round as flat arrays (vectorized: a ring of
1024 ranks has ~1M transfers); `rank_rounds(plan, rank)` gives one rank's view with token rows
and the causal block pairs its kernels run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .plan import Plan, RankLayout

Range = tuple[int, int]

FULL, CAUSAL, NONE = "full", "causal", "none"
MASK_KINDS = (FULL, CAUSAL, NONE)


def block_mask(q_start: int, q_len: int, k_start: int, k_len: int) -> tuple[str, int]:
    """Causal mask kind of the query positions [q_start, q_start+q_len) against the key positions
    [k_start, k_start+k_len): a key is visible when its position is <= the query's position.
    Returns ("full", 0), ("none", 0) or ("causal", offset) where query i sees key j iff j <= i + offset."""
    if q_len <= 0 or k_len <= 0 or k_start > q_start + q_len - 1:
        return NONE, 0
    if k_start + k_len - 1 <= q_start:
        return FULL, 0
    return CAUSAL, q_start - k_start


def chunks_needed(src_group, dst_group):
    """The zigzag need (module doc): how many chunks of group `src_group` some query of group
    `dst_group` sees — 1 (the front chunk) of a group before it in the ring, 2 (both) of a group
    after it. The one place the rule is written; works on ints and numpy arrays alike."""
    return 1 + (src_group > dst_group)


# ------------------------------------------------------------------------------ the whole table


@dataclass(frozen=True)
class ExchangeTable:
    """Every K/V transfer of one layer's forward exchange (the backward returns dK/dV along the same
    transfers, reversed). One entry per (round, sender, receiver); arrays of equal length."""

    num_ranks: int
    num_groups: int
    round: np.ndarray  # j in 1..k-1
    src: np.ndarray  # sending rank
    dst: np.ndarray  # receiving rank
    kv0: np.ndarray  # first KV head sent
    kv1: np.ndarray  # one past the last
    tokens: np.ndarray  # tokens of each KV head sent: L_h (front chunk) or 2·L_h (both chunks)
    both_chunks: np.ndarray  # bool: the source group is after the receiver's in the ring

    @property
    def num_kv_heads(self) -> np.ndarray:
        return self.kv1 - self.kv0

    @cached_property
    def kv_token_heads(self) -> np.ndarray:
        """[transfers] KV heads × tokens of each transfer (its bytes are this × head_dim × 2 (K and V) ×
        element size)."""
        return self.num_kv_heads * self.tokens

    def per_rank_round(self, which: str = "dst") -> np.ndarray:
        """[R, k] KV head-tokens received ("dst") or sent ("src") by each rank in each round (column 0 = 0)."""
        ranks = self.dst if which == "dst" else self.src
        flat = np.bincount(
            ranks * self.num_groups + self.round,
            self.kv_token_heads.astype(np.float64),
            minlength=self.num_ranks * self.num_groups,
        )
        return flat.reshape(self.num_ranks, self.num_groups)


def _served(h0: np.ndarray, eta: np.ndarray, gq: int) -> tuple[np.ndarray, np.ndarray]:
    """[ceil(h0/gq), ceil(h1/gq)): the KV heads each rank serves to other groups."""
    return -(-h0 // gq), -(-(h0 + eta) // gq)


def exchange_table(plan: Plan, layouts: list[RankLayout] | tuple[RankLayout, ...] | None = None) -> ExchangeTable:
    """The exchange schedule of `plan` (module doc), vectorized over rounds and ranks."""
    lay = layouts or plan.layout()
    R, k = len(lay), plan.num_groups
    gq = plan.num_heads // plan.num_kv_heads
    grp = np.array([x.group for x in lay], dtype=np.int64)
    h0 = np.array([x.head_range[0] for x in lay], dtype=np.int64)
    eta = np.array([x.heads for x in lay], dtype=np.int64)
    kv0 = np.array([x.kv_head_range[0] for x in lay], dtype=np.int64)
    kv1 = np.array([x.kv_head_range[1] for x in lay], dtype=np.int64)
    L = np.array([g.chunk_len for g in plan.groups], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if k <= 1:
        return ExchangeTable(R, k, empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=bool))
    sa, sb = _served(h0, eta, gq)
    srv = np.nonzero(sb > sa)[0]  # rank order = (group, head) order
    sg, ssa, ssb = grp[srv], sa[srv], sb[srv]
    # servers of all groups on one sorted axis: key = group·M + KV head (ascending at both ends)
    M = plan.num_kv_heads + 1
    key_a, key_b = sg * M + ssa, sg * M + ssb
    rr = np.nonzero(eta > 0)[0]  # receivers
    g = grp[rr]
    J = np.arange(1, k)
    h = (g[None, :] - J[:, None]) % k  # [k-1, receivers]: source group of round j
    lo = np.searchsorted(key_b, h * M + kv0[rr][None, :], side="right")  # first server ending after kv0
    hi = np.searchsorted(key_a, h * M + kv1[rr][None, :], side="left")  # servers starting before kv1
    n = (hi - lo).ravel()
    cell = np.repeat(np.arange(n.size), n)  # one entry per (round, receiver, server)
    first = np.cumsum(n) - n
    sidx = lo.ravel()[cell] + (np.arange(cell.size) - first[cell])
    jj, ii = np.divmod(cell, len(rr))
    dst = rr[ii]
    hs = sg[sidx]
    need = chunks_needed(hs, grp[dst])
    return ExchangeTable(
        num_ranks=R,
        num_groups=k,
        round=jj + 1,
        src=srv[sidx],
        dst=dst,
        kv0=np.maximum(kv0[dst], ssa[sidx]),
        kv1=np.minimum(kv1[dst], ssb[sidx]),
        tokens=L[hs] * need,
        both_chunks=need == 2,
    )


# ------------------------------------------------------------------------------ one rank's view


@dataclass(frozen=True)
class Segment:
    """A run of consecutive global positions and where it sits in a buffer (first row)."""

    start: int
    length: int
    row: int


@dataclass(frozen=True)
class BlockPair:
    """One kernel call: query rows of the group buffer against key rows of a K/V buffer."""

    q_rows: Range
    k_rows: Range
    kind: str
    offset: int


@dataclass(frozen=True)
class Transfer:
    """One K/V message: `src` sends KV heads `kv_heads` of the source group's `rows` (group-order
    rows, packed in this order; `tokens` in all) to `dst`. Its gradient travels back the same way."""

    src: int
    dst: int
    kv_heads: Range
    rows: tuple[Range, ...]
    tokens: int

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


@dataclass(frozen=True)
class Round:
    """Round j of the exchange as seen by one rank."""

    index: int
    src_group: int
    dst_group: int
    recv: tuple[Transfer, ...]  # sorted by KV head: concatenated they cover this rank's KV heads
    send: tuple[Transfer, ...]
    key_tokens: int  # rows of the received K/V buffer
    pairs: tuple[BlockPair, ...]


def group_segments(plan: Plan, g: int) -> tuple[Segment, Segment]:
    """The front and back chunk of group g: global start, length, row in the group order."""
    (f0, b0), L = plan.chunk_starts()[g], plan.groups[g].chunk_len
    return (Segment(f0, L, 0), Segment(b0, L, L))


def block_pairs(q_segs: tuple[Segment, ...], k_segs: tuple[Segment, ...]) -> tuple[BlockPair, ...]:
    """Every (query segment, key segment) block some query can see, with its mask from global positions."""
    out = []
    for qs in q_segs:
        for ks in k_segs:
            kind, off = block_mask(qs.start, qs.length, ks.start, ks.length)
            if kind != NONE:
                out.append(BlockPair((qs.row, qs.row + qs.length), (ks.row, ks.row + ks.length), kind, off))
    return tuple(out)


def needed_segments(plan: Plan, src: int, dst: int) -> tuple[Segment, ...]:
    """Segments of group `src` (rows in src's group order) that some query of group `dst` can see:
    the front chunk of an earlier group, both chunks of a later one (module doc)."""
    return group_segments(plan, src)[: chunks_needed(src, dst)]


def packed(segs: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """The same segments with rows renumbered as they lie in a message (concatenated in order)."""
    out, row = [], 0
    for s in segs:
        out.append(Segment(s.start, s.length, row))
        row += s.length
    return tuple(out)


def owned_kv_ranges(
    plan: Plan, g: int, layouts: list[RankLayout] | tuple[RankLayout, ...] | None = None
) -> list[Range]:
    """The KV heads each rank of group g serves (disjoint; the first holder of a shared KV head)."""
    lay = layouts or plan.layout()
    gq = plan.num_heads // plan.num_kv_heads
    out = []
    for r in plan.group_ranks(g):
        a, b = (-(-lay[r].head_range[0] // gq), -(-lay[r].head_range[1] // gq))
        out.append((a, b) if b > a else (a, a))
    return out


def rank_rounds(
    plan: Plan,
    rank: int,
    layouts: list[RankLayout] | tuple[RankLayout, ...] | None = None,
    table: ExchangeTable | None = None,
) -> tuple[Round, ...]:
    """The k-1 rounds of the exchange as seen by `rank`: its messages (from `exchange_table`), their
    token rows, and the block pairs of its queries against the K/V it receives."""
    lay = layouts or plan.layout()
    table = table if table is not None else exchange_table(plan, lay)
    k, me = plan.num_groups, lay[rank]
    mine_in = np.nonzero(table.dst == rank)[0]
    mine_out = np.nonzero(table.src == rank)[0]
    rounds = []
    for j in range(1, k):
        src, dst = (me.group - j) % k, (me.group + j) % k
        recv_segs = needed_segments(plan, src, me.group)
        recv_rows = tuple((s.row, s.row + s.length) for s in recv_segs)
        send_rows = tuple((s.row, s.row + s.length) for s in needed_segments(plan, me.group, dst))
        recv = tuple(
            Transfer(int(table.src[i]), rank, (int(table.kv0[i]), int(table.kv1[i])), recv_rows, int(table.tokens[i]))
            for i in mine_in[table.round[mine_in] == j]
        )
        send = tuple(
            Transfer(rank, int(table.dst[i]), (int(table.kv0[i]), int(table.kv1[i])), send_rows, int(table.tokens[i]))
            for i in mine_out[table.round[mine_out] == j]
        )
        pairs = block_pairs(group_segments(plan, me.group), packed(recv_segs)) if recv else ()
        rounds.append(
            Round(
                j,
                src,
                dst,
                tuple(sorted(recv, key=lambda t: t.kv_heads)),
                send,
                sum(s.length for s in recv_segs),
                pairs,
            )
        )
    return tuple(rounds)
