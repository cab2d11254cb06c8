"""From a model's solution to plans: whole blocks and whole tokens, and the replay's verdict.

A layout's model (planner/layout_model.py) chooses chunk blocks and per-class shards, continuous in the
relaxation. A plan needs integer chunk blocks (the search rounds them: rounding.round_near) and
whole tokens per rank, rounded inside each group to sum to its 2·L_g tokens (largest remainder,
rounding.largest_remainder). `judge` replays such a plan from the layout's own coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..costmodel.durations import Coefficients, evaluate
from ..costmodel.kernels import CostOptions
from ..costmodel.memory import memory_bytes
from ..costmodel.simulate import simulate_durations
from ..plan import Group, Plan
from ..rounding import largest_remainder
from ..specs import ClusterSpec, ModelSpec, Workload
from .layout import Layout


def whole_tokens(
    layout: Layout, cls: np.ndarray, blocks: Sequence[int], shards: Sequence[float], block_size: int
) -> list[list[int]]:
    """Per group, its ranks' shards (per class, `cls` the class of every rank) rounded to whole
    tokens summing to 2·blocks·B (largest remainder)."""
    per_rank = np.maximum(np.asarray(shards, dtype=float)[cls], 0.0)
    out, r0 = [], 0
    for g, devs in enumerate(layout.groups):
        n = len(devs)
        out.append(largest_remainder(list(per_rank[r0 : r0 + n]), 2 * int(blocks[g]) * block_size))
        r0 += n
    return out


def plan_of(
    layout: Layout,
    cls: np.ndarray,
    blocks: Sequence[int],
    shards: Sequence[float],
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    name: str = "hexiseq",
) -> Plan:
    """The plan of integer chunk blocks and per-class shards, rounded to whole tokens inside each
    group (largest remainder); heads as the layout has them. A rank left with neither tokens nor
    heads is left out of the run (it would only wait)."""
    B = workload.block_size
    groups = []
    for g, (devs, heads, ints) in enumerate(
        zip(layout.groups, layout.heads, whole_tokens(layout, cls, blocks, shards, B))
    ):
        keep = [i for i in range(len(devs)) if ints[i] > 0 or heads[i] > 0]
        groups.append(
            Group(
                tuple(devs[i] for i in keep),
                int(blocks[g]) * B,
                tuple(ints[i] for i in keep),
                tuple(heads[i] for i in keep),
            )
        )
    return Plan(workload.seq_len, model.heads, model.kv_heads, tuple(groups), B, name, cluster.name, model.name)


def judge(
    coef: Coefficients,
    layout: Layout,
    cls: np.ndarray,
    blocks: Sequence[int],
    shards: Sequence[float],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
) -> tuple[float, bool] | None:
    """(replayed step time, fits in memory) of plan_of(blocks, shards), from the layout's
    coefficients (the plan's structure is the layout's: no schedule or coefficients to derive
    again); None when the plan would leave a rank out (its structure differs: estimate it)."""
    ints = whole_tokens(layout, cls, blocks, shards, workload.block_size)
    if any(t == 0 and h == 0 for tok, heads in zip(ints, layout.heads) for t, h in zip(tok, heads)):
        return None
    s = np.array([t for tok in ints for t in tok], dtype=float)
    L = workload.block_size * np.asarray(blocks, dtype=float)
    d = evaluate(coef, s, L)
    t = simulate_durations(d, phases=False).iteration_time_s
    a = replace(coef.a, s=s, L=L)
    mem = sum(memory_bytes(a, model, workload, d.recv_bytes, options).values())
    return t, bool(np.all(mem <= a.capacity))
