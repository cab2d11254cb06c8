"""Every plan layout of a small cluster, up to identical devices, for the exhaustive tests: every
device subset, every grouping into HP groups (groups of different sizes inside a node, groups
spanning nodes), every ring order and every head split in whole KV-head units, and the best plan of
each found by a fine grid of chunk lengths and token shards, every plan judged by the step replay
(costmodel.estimate). Written independently of the planner's candidate list."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from hexiseq.costmodel import estimate
from hexiseq.costmodel.kernels import CostOptions
from hexiseq.errors import HexiSeqError
from hexiseq.plan import Group, Plan
from hexiseq.planner.layout import Layout
from hexiseq.planner.layout_model import LayoutModel
from hexiseq.planner.search import roundings
from hexiseq.specs import ClusterSpec, ModelSpec, Workload


def _kinds(cluster: ClusterSpec) -> dict[int, tuple]:
    """What makes two devices interchangeable in a plan: node, GPU type and links."""
    return {d.index: (d.node, d.gpu.name, d.nic_gbps, d.link_bandwidth_gbps) for d in cluster.devices}


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of `items` into non-empty blocks."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for p in set_partitions(rest):
        yield [[head]] + p
        for i in range(len(p)):
            yield p[:i] + [[head] + p[i]] + p[i + 1 :]


def splits(total: int, parts: int, step: int = 1) -> Iterator[tuple[int, ...]]:
    """Ordered sums of `parts` non-negative multiples of `step` equal to `total` (the last part takes the rest)."""
    if parts == 1:
        yield (total,)
        return
    for x in range(0, total + 1, step):
        for rest in splits(total - x, parts - 1, step):
            yield (x,) + rest


def layouts(
    cluster: ClusterSpec, model: ModelSpec, min_devices: int = 1, devices: tuple[int, ...] | None = None
) -> list[tuple[tuple, tuple]]:
    """Every (groups in ring order, heads per member) of every subset of at least `min_devices`
    devices, each once up to identical devices and the rotation of the ring; `devices`: only the
    layouts that use exactly these devices (all of them)."""
    kind = _kinds(cluster)
    units, unit = model.heads // model.group_size, model.group_size
    out, seen = [], set()
    sizes = range(min_devices, cluster.size + 1) if devices is None else [len(devices)]
    for r in sizes:
        pool = itertools.combinations(range(cluster.size), r) if devices is None else [tuple(sorted(devices))]
        for subset in pool:
            for part in set_partitions(list(subset)):
                for order in itertools.permutations(part):
                    for heads in itertools.product(*[list(splits(units, len(g))) for g in order]):
                        sig = [tuple(sorted((kind[d], h) for d, h in zip(g, hs))) for g, hs in zip(order, heads)]
                        key = min(tuple(sig[i:] + sig[:i]) for i in range(len(sig)))  # rotations: one ring
                        if key in seen:
                            continue
                        seen.add(key)
                        out.append((tuple(tuple(g) for g in order), tuple(tuple(h * unit for h in hs) for hs in heads)))
    return out


def best_plan(
    cluster: ClusterSpec, model: ModelSpec, wl: Workload, groups, heads, chunk_step: int, shard_parts: int
) -> tuple[float, Plan | None, int]:
    """The fastest plan that fits of one layout over a grid of chunk lengths (blocks in steps of
    `chunk_step`) and token shards (multiples of 1/`shard_parts` of a group's tokens)."""
    B, S = wl.block_size, wl.seq_len
    nb, k = S // (2 * B), len(groups)
    best, best_plan_, n = math.inf, None, 0
    for extra in splits(nb - k, k, chunk_step):
        blocks = [e + 1 for e in extra]
        opts = []
        for g, b in zip(groups, blocks):
            tokens = 2 * b * B
            cut = [tuple(tokens * x // shard_parts for x in sp[:-1]) for sp in splits(shard_parts, len(g))]
            opts.append([o + (tokens - sum(o),) for o in cut])
        for shards in itertools.product(*opts):
            if any(s == 0 and h == 0 for sh, hs in zip(shards, heads) for s, h in zip(sh, hs)):
                continue  # a rank with nothing to do: the layout without it has this plan
            plan = Plan(
                S,
                model.heads,
                model.kv_heads,
                tuple(Group(g, b * B, sh, hs) for g, b, sh, hs in zip(groups, blocks, shards, heads)),
                B,
            )
            est = estimate(plan, cluster, model, wl)
            n += 1
            if est.fits and est.iteration_time_s < best:
                best, best_plan_ = est.iteration_time_s, plan
    return best, best_plan_, n


# lp_plan's results for this pytest process, keyed by the inputs' full values (reprs: ClusterSpec
# compares by identity): test_planner_exhaustive and test_bound_joint enumerate the same layouts of
# the same clusters, and the answer is a pure function of its inputs.
_LP_PLANS: dict[tuple[str, ...], tuple[float, Plan | None]] = {}


def lp_plan(
    cluster: ClusterSpec, model: ModelSpec, wl: Workload, groups, heads, options: CostOptions = CostOptions()
) -> tuple[float, Plan | None]:
    """The fastest plan that fits found for one layout through its relaxation: the layout model's
    optimum (planner/layout_model.py) rounded to whole blocks and tokens (a few roundings, the shards chosen
    again under memory when a rounding does not fit), each judged by the step replay. (inf, None)
    when none fits. The planner's code finds the plans; only the replay judges them. `options`:
    e.g. the model states sharded over more devices than the layout's (`CostOptions.state_shards`)."""
    key = (repr(cluster), repr(model), repr(wl), repr(groups), repr(heads), repr(options))
    if key not in _LP_PLANS:
        _LP_PLANS[key] = _lp_plan(cluster, model, wl, groups, heads, options)
    return _LP_PLANS[key]


def _lp_plan(
    cluster: ClusterSpec, model: ModelSpec, wl: Workload, groups, heads, options: CostOptions
) -> tuple[float, Plan | None]:
    try:
        lm = LayoutModel(cluster, model, wl, Layout(tuple(groups), tuple(heads)), options)
    except HexiSeqError:
        return math.inf, None
    sol = lm.solve(max_rounds=200)
    if not sol.ok:
        return math.inf, None
    best, best_p = math.inf, None
    for blocks in roundings(sol.blocks, lm.nb, 5):
        plan = lm.to_plan(blocks, sol.shards)
        est = estimate(plan, cluster, model, wl, options)
        if not est.fits:
            plan, _ = lm.best_plan(blocks)
            if plan is None:
                continue
            est = estimate(plan, cluster, model, wl, options)
        if est.fits and est.iteration_time_s < best:
            best, best_p = est.iteration_time_s, plan
    return best, best_p
