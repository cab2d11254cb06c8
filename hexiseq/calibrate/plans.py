"""The plans `hexiseq calibrate` runs on a world of 4 ranks: even and uneven, pure CP, pure HP and
CP x HP groups, each recompute policy at least twice, data-parallel replicas of one rank each (the
shape the DP baselines take: whole sequences on one rank, few operators per token), one replica of
all four ranks accumulating several sequences per step (the shape DP = 1 takes), and which of them
the fit may see.

Why the accumulating plans: a plan of one sequence per step times one micro-step plus one optimizer
step, so a fit on those alone can trade the one for the other (measured on cpu-8's DP = 1 plan: exact
at one sequence, 18% short at six, the optimizer over-charged by 2.5x). Plans of 3 and 4 micro-steps
tell the two apart.

Every plan uses devices 0..3 (one spawned world runs them all). A cluster of two nodes of 2k devices
each is calibrated on its whole world (`side_by_side`): every plan runs k times at once, copy c on
devices 2c, 2c+1 of each node, as data-parallel replicas. Its ranks then share the cores as the
cluster's own runs do: on this project's 2-core VM (2026-12-05) the four-rank plans took up to 8.5%
longer (median 3.3%) with a second copy running beside them, and cpu-8's eight-rank runs came out
8-16% slower than a four-rank calibration predicted. Chunk lengths, shards and heads are
whole blocks / whole KV heads; uneven splits are fixed proportions, so the set is the same on every
machine. `FIT` names the plans the calibration fits on; the others are held out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import HexiSeqError
from ..plan import Group, Plan, Sharding, ShardingStage, symmetric_plan
from ..rounding import largest_remainder

WORLD = 4


@dataclass(frozen=True)
class CalPlan:
    """One plan of the calibration set and the recompute policy it runs with."""

    name: str
    plan: Plan
    recompute: str
    fit: bool  # the fit sees it; False: held out
    shape: str  # "CP", "HP" or "CPxHP", even or uneven, in words
    global_batch: int = 1  # sequences per step (a plan of replicas: the sum of their shares)


def _groups(
    seq_len: int,
    block: int,
    sizes: list[int],
    chunk_w: list[int],
    shard_w: list[list[int]],
    head_w: list[list[int]],
    heads: int,
    gq: int,
) -> tuple[Group, ...]:
    chunks = largest_remainder(chunk_w, seq_len // 2, unit=block)
    out, dev = [], 0
    for size, L, sw, hw in zip(sizes, chunks, shard_w, head_w):
        out.append(
            Group(
                tuple(range(dev, dev + size)),
                L,
                tuple(largest_remainder(sw, 2 * L, unit=block)),
                tuple(largest_remainder(hw, heads, unit=gq)),
            )
        )
        dev += size
    return tuple(out)


def calibration_plans(
    seq_len: int, heads: int, kv_heads: int, block: int = 64, cluster: str = "", model: str = ""
) -> list[CalPlan]:
    """The calibration set for 4 ranks (module doc)."""
    gq = heads // kv_heads
    if heads % (4 * gq):
        raise HexiSeqError(
            f"the calibration plans split {heads} heads over 4 ranks in whole KV heads ({gq} query heads each): "
            f"use a model whose heads are a multiple of {4 * gq}"
        )
    if seq_len % (2 * WORLD * block) or seq_len < 24 * block:
        raise HexiSeqError(
            f"the calibration plans need a sequence of at least {24 * block} tokens, a multiple of "
            f"{2 * WORLD * block} (blocks of {block}); got {seq_len}"
        )
    kw = dict(cluster=cluster, model=model)

    def plan(name: str, groups: tuple[Group, ...]) -> Plan:
        return Plan(seq_len, heads, kv_heads, groups, block, name, cluster, model).check()

    def sym(cp: int, hp: int, name: str) -> Plan:
        return symmetric_plan(range(WORLD), seq_len, heads, kv_heads, cp, hp, block, name=name, **kw)

    def dp(name: str, shares: list[int]) -> Plan:
        """One-rank replicas on ranks 0..3 with these shares, parameters replicated."""
        ones = [symmetric_plan([d], seq_len, heads, kv_heads, 1, 1, block, name=name, **kw) for d in range(WORLD)]
        return Plan.joint(ones, shares, Sharding(ShardingStage.REPLICATED), name=name).check()

    def accumulating(name: str, one: Plan, sequences: int) -> Plan:
        """One replica over ranks 0..3 taking `sequences` micro-steps per step, parameters replicated."""
        return Plan.joint([one], [sequences], Sharding(ShardingStage.REPLICATED), name=name).check()

    g = lambda *a: _groups(seq_len, block, *a, heads=heads, gq=gq)  # noqa: E731
    return [
        CalPlan("ring-even", sym(4, 1, "ring-even"), "none", True, "CP 4, even"),
        CalPlan("ulysses-even", sym(1, 4, "ulysses-even"), "selective", True, "HP 4, even"),
        CalPlan("usp-2x2-even", sym(2, 2, "usp-2x2-even"), "full", False, "CP 2 x HP 2, even"),
        CalPlan(
            "ring-uneven",
            plan("ring-uneven", g([1, 1, 1, 1], [4, 3, 2, 1], [[1]] * 4, [[1]] * 4)),
            "full",
            True,
            "CP 4, chunks 4:3:2:1",
        ),
        CalPlan(
            "ulysses-uneven",
            plan("ulysses-uneven", g([4], [1], [[4, 3, 2, 1]], [[2, 1, 1, 0]])),
            "none",
            False,
            "HP 4, shards 4:3:2:1, heads 2:1:1:0",
        ),
        CalPlan(
            "usp-1+3",
            plan("usp-1+3", g([1, 3], [2, 3], [[1], [1, 1, 1]], [[1], [2, 1, 1]])),
            "selective",
            True,
            "CP 2 (groups of 1 and 3) x HP, chunks 2:3",
        ),
        CalPlan(
            "usp-2x2-uneven",
            plan("usp-2x2-uneven", g([2, 2], [3, 2], [[2, 1], [1, 1]], [[3, 1], [1, 1]])),
            "selective",
            False,
            "CP 2 x HP 2, chunks 3:2, shards and heads uneven",
        ),
        CalPlan(
            "ring-2+2-uneven",
            plan("ring-2+2-uneven", g([2, 2], [1, 1], [[3, 1], [1, 3]], [[1, 1], [1, 1]])),
            "none",
            True,
            "CP 2 x HP 2, even chunks, shards 3:1 / 1:3",
        ),
        # ranks 0-1 and 2-3 of the emulated clusters differ in speed: 1:1:1:1 times the slower ranks'
        # whole sequence, 3:3:1:1 the faster ranks' three
        CalPlan("dp-4-even", dp("dp-4-even", [1, 1, 1, 1]), "none", True, "DP 4 x one rank, shares 1:1:1:1", 4),
        CalPlan("dp-4-uneven", dp("dp-4-uneven", [3, 3, 1, 1]), "none", False, "DP 4 x one rank, shares 3:3:1:1", 8),
        CalPlan(
            "usp-2x2-even-x4",
            accumulating("usp-2x2-even-x4", sym(2, 2, "usp-2x2-even-x4"), 4),
            "none",
            True,
            "CP 2 x HP 2, even, 4 sequences per step",
            4,
        ),
        # the slower ranks hold one eighth of the sequence (128 tokens each at S = 2,048): operators so
        # small that their fixed cost, not their work, decides the time -- the regime of an eight-rank
        # replica's slower ranks (cpu-8's DP = 1 plan: 112 tokens each), which the plans above never reach
        CalPlan(
            "usp-2x2-7to1-x3",
            accumulating(
                "usp-2x2-7to1-x3", plan("usp-2x2-7to1-x3", g([2, 2], [7, 1], [[1, 1], [1, 1]], [[1, 1], [1, 1]])), 3
            ),
            "none",
            True,
            "CP 2 x HP 2, chunks 7:1, 3 sequences per step",
            3,
        ),
        CalPlan(
            "usp-1+3-x3",
            accumulating("usp-1+3-x3", plan("usp-1+3-x3", g([1, 3], [2, 3], [[1], [1, 1, 1]], [[1], [2, 1, 1]])), 3),
            "none",
            False,
            "CP 2 (groups of 1 and 3) x HP, chunks 2:3, 3 sequences per step",
            3,
        ),
    ]


def side_by_side(cp: CalPlan, copies: int) -> CalPlan:
    """`cp` run `copies` times at once on two nodes of 2 x `copies` devices each (module doc): copy c
    takes the first node's devices 2c, 2c+1 for ranks 0-1 and the second node's for ranks 2-3; every
    replica of every copy keeps its sequences; parameters replicated (gradients all-reduced over the
    copies). One copy is `cp` itself."""
    if copies == 1:
        return cp
    if not isinstance(copies, int) or copies < 1:
        raise HexiSeqError(f"a calibration plan runs a whole number of copies side by side, got {copies!r}")
    plan, node = cp.plan, 2 * copies
    replicas, shares = [], []
    for c in range(copies):
        where = {0: 2 * c, 1: 2 * c + 1, 2: node + 2 * c, 3: node + 2 * c + 1}
        for i in range(plan.num_replicas):
            groups = tuple(replace(g, devices=tuple(where[d] for d in g.devices)) for g in plan.replica(i).groups)
            replicas.append(
                Plan(plan.seq_len, plan.num_heads, plan.num_kv_heads, groups, plan.block_size, cp.name,
                     plan.cluster, plan.model)
            )  # fmt: skip
            shares.append(plan.replicas[i].sequences if plan.replicas else cp.global_batch)
    joint = Plan.joint(replicas, shares, Sharding(ShardingStage.REPLICATED), name=cp.name).check()
    return replace(cp, plan=joint, shape=f"{cp.shape}; {copies} copies side by side", global_batch=sum(shares))
