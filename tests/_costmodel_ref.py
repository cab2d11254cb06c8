"""Independent references shared by the cost-model and schedule tests: the exchange schedule derived
by brute force from the layout rules (positions, head ownership: hexiseq/plan.py, hexiseq/schedule.py), plan
generators that reach the edge cases (uneven chunks, fine GQA splits, ranks with no heads or no tokens),
and ways to set the kernel-model knobs of every GPU of a cluster (the catalog's refitted values, data/gpus.yaml, are
nonzero; a claim that needs a knob neutral sets it explicitly).

Written from the module docstrings (hexiseq/schedule.py, hexiseq/costmodel/*.py), not from their
code, so that a test comparing the two can fail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hexiseq.costmodel import CostOptions
from hexiseq.plan import Group, Plan, random_plan
from hexiseq.schedule import NONE, block_mask, block_pairs, group_segments, needed_segments, packed
from hexiseq.specs import ClusterSpec, GPUType

BF16 = 2


@dataclass(frozen=True, order=True)
class Xfer:
    """One K/V message of round j: src sends KV heads [kv0, kv1) of `tokens` tokens each to dst."""

    round: int
    src: int
    dst: int
    kv0: int
    kv1: int
    tokens: int


def kv_owner(plan: Plan, g: int, kv: int) -> int:
    """The rank of group g that serves KV head `kv`: the one holding its first query head kv·gq."""
    gq = plan.num_heads // plan.num_kv_heads
    lay = plan.layout()
    for r in plan.group_ranks(g):
        h0, h1 = lay[r].head_range
        if h0 <= kv * gq < h1:
            return r
    raise AssertionError(f"no rank of group {g} holds query head {kv * gq}")


def needed_key_tokens(plan: Plan, g: int, h: int) -> int:
    """Tokens of group h's K/V some query of group g can see, from the causal mask of the real
    chunks (`block_mask` on global positions); checked against counting positions one by one."""
    via_mask = sum(
        ks.length
        for ks in group_segments(plan, h)
        if any(block_mask(qs.start, qs.length, ks.start, ks.length)[0] != NONE for qs in group_segments(plan, g))
    )
    qpos, kpos = np.array(plan.group_positions(g)), np.array(plan.group_positions(h))
    by_position = int((kpos <= qpos.max()).sum())
    assert via_mask == by_position, (g, h, via_mask, by_position)
    return via_mask


def brute_exchange(plan: Plan) -> list[Xfer]:
    """Every transfer of the forward KV exchange, by loops over rounds, receivers and KV heads."""
    lay = plan.layout()
    k, gq = plan.num_groups, plan.num_heads // plan.num_kv_heads
    out = []
    for j in range(1, k):
        for me in lay:
            if me.heads == 0:
                continue  # ranks without heads take no part
            h = (me.group - j) % k
            need = sorted({q // gq for q in range(*me.head_range)})  # KV heads my query heads touch
            tokens = needed_key_tokens(plan, me.group, h)
            by_server: dict[int, list[int]] = {}
            for kv in need:
                by_server.setdefault(kv_owner(plan, h, kv), []).append(kv)
            for server, kvs in by_server.items():
                assert kvs == list(range(kvs[0], kvs[-1] + 1)), "a server's KV heads are contiguous"
                out.append(Xfer(j, server, me.rank, kvs[0], kvs[-1] + 1, tokens))
    return sorted(out)


def table_transfers(table) -> list[Xfer]:
    """The rows of a schedule.ExchangeTable as Xfer records."""
    return sorted(
        Xfer(int(j), int(s), int(d), int(a), int(b), int(t))
        for j, s, d, a, b, t in zip(table.round, table.src, table.dst, table.kv0, table.kv1, table.tokens)
    )


def executor_bytes(plan: Plan, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """[R, k] bytes each rank receives and sends in each round, summed over the executor's transfer
    tables (`rank_rounds`): KV heads × tokens × 2 (K and V) × head_dim × 2 bytes (bf16)."""
    from hexiseq.schedule import rank_rounds

    R, k = plan.world_size, plan.num_groups
    recv, send = np.zeros((R, k)), np.zeros((R, k))
    for r in range(R):
        for rd in rank_rounds(plan, r):
            recv[r, rd.index] = sum(t.num_kv_heads * t.tokens * 2 * head_dim * BF16 for t in rd.recv)
            send[r, rd.index] = sum(t.num_kv_heads * t.tokens * 2 * head_dim * BF16 for t in rd.send)
    return recv, send


# ------------------------------------------------------------------------------ plans


def on_devices(plan: Plan, devices) -> Plan:
    """The same plan with rank i's device replaced by devices[i] (a plan on a device subset)."""
    devs, groups, pos = list(devices), [], 0
    for g in plan.groups:
        groups.append(Group(tuple(devs[pos : pos + g.size]), g.chunk_len, g.shards, g.heads))
        pos += g.size
    return Plan(plan.seq_len, plan.num_heads, plan.num_kv_heads, tuple(groups), plan.block_size, plan.name)


def random_plans(
    n: int, world: int, heads: int, kv_heads: int, blocks: int, block_size: int, seed0: int = 0
) -> list[Plan]:
    """n random uneven plans of `world` ranks over 2·block_size·blocks tokens, half of them with
    fine GQA splits (head counts that are not whole KV heads)."""
    S = 2 * block_size * blocks
    return [
        random_plan(world, S, heads, kv_heads, seed=seed0 + i, block_size=block_size, whole_kv_heads=bool(i % 2))
        for i in range(n)
    ]


def edge_plan() -> Plan:
    """Three groups in ring order with every edge case at once (H = 6, H_kv = 2, gq = 3): uneven
    chunks; a rank with heads and no tokens (rank 0) and one with tokens and no heads (rank 2); fine
    GQA splits (heads [0, 2) | [2, 6) in group 0 and [0, 1) | [1, 6) in group 2: KV head 0 is touched
    by two ranks of the group); shards straddling the front/back boundary (ranks 1 and 4)."""
    return Plan(
        40,
        6,
        2,
        (
            Group((0, 1, 2), 4, (0, 5, 3), (2, 4, 0)),  # rank 0: heads, no tokens; rank 2: tokens, no heads
            Group((3,), 10, (20,), (6,)),
            Group((4, 5), 6, (7, 5), (1, 5)),  # fine split: KV head 0 touched by both ranks
        ),
        block_size=2,
        name="edges",
    )


# ------------------------------------------------------------------------------ kernel knobs

# The knobs at which they take no effect: every memory-bound kernel at the datasheet bandwidth, no
# per-row attention block cost, no overlap slowdown, every link and NIC at its line rate.
NEUTRAL_KNOBS = {
    "eff_hbm": 1.0,
    "attn_block_half_keys": 0.0,
    "overlap_slowdown": 0.0,
    "link_efficiency": 1.0,
    "nic_efficiency": 1.0,
}


def with_fields(cluster: ClusterSpec, **fields: float) -> ClusterSpec:
    """The cluster with these profile fields set on every GPU type (the others keep the catalog's)."""
    knobs = {key: float(v) for key, v in fields.items()}
    return cluster.with_profile({name: knobs for name in cluster.gpu_types})


def neutral(cluster: ClusterSpec, **fields: float) -> ClusterSpec:
    """The cluster with every knob of NEUTRAL_KNOBS neutral, and `fields` on top."""
    return with_fields(cluster, **{**NEUTRAL_KNOBS, **fields})


def with_knobs(
    cluster: ClusterSpec, block_half_keys: float = 0.0, overlap_slowdown: float = 0.0, op_overhead_us: float = 0.0
) -> ClusterSpec:
    """The cluster with every GPU given this per-row attention block cost, overlap slowdown and
    per-operator time (all set, 0 by default: the catalog's values are replaced), as a profile."""
    return with_fields(
        cluster,
        attn_block_half_keys=block_half_keys,
        overlap_slowdown=overlap_slowdown,
        op_overhead_us=op_overhead_us,
    )


def gpu_with_knobs(gpu: GPUType, **fields: float) -> GPUType:
    """One GPU type with some of its profile fields replaced."""
    return dataclasses.replace(gpu, **fields)


def rank_gpus(plan: Plan, cluster: ClusterSpec) -> list[GPUType]:
    """The GPU of every rank of the plan, from the cluster."""
    return [cluster.devices[dev].gpu for dev in plan.rank_devices]


def attention_row_seconds(plan: Plan, cluster: ClusterSpec, head_dim: int) -> np.ndarray:
    """[R] seconds per layer forward of each rank's per-row attention cost (kernels.py's doc: a block
    of Lq query rows costs η·Lq·attn_block_half_keys·4d / (peak·eff_attention) on top of its pairs),
    summed over the blocks the rank runs in every round, from the schedule's block pairs of the real
    chunks (round 0: the own chunks; later rounds: the source's needed segments)."""
    k = plan.num_groups
    out = np.zeros(plan.world_size)
    for me, g in zip(plan.layout(), rank_gpus(plan, cluster)):
        rows = 0
        for j in range(k):
            src = (me.group - j) % k
            keys = group_segments(plan, src) if j == 0 else packed(needed_segments(plan, src, me.group))
            rows += sum(p.q_rows[1] - p.q_rows[0] for p in block_pairs(group_segments(plan, me.group), keys))
        row_s = (
            g.attn_block_half_keys * 4 * head_dim / (g.peak_bf16_tflops * 1e12 * g.eff_attention * stack_attention(g))
        )
        out[me.rank] = me.heads * rows * row_s
    return out


def stack_attention(g) -> float:
    """The default stack's attention factor on GPU type g (costmodel/kernels.py: rate = peak x
    eff_attention x the stack's factor)."""
    return CostOptions().stack.factors(g.name)[2]
