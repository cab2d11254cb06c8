"""Compute ceilings of a cell: what no plan can beat on compute alone (costmodel/bound.py's LP over
the catalog's kernel rates on the cell's software stack), for the paper comparison's reasons, the
pairs figure and the rate sensitivity."""

from __future__ import annotations

import numpy as np

from ..costmodel import CostOptions
from ..costmodel.bound import kernel_rates, min_compute_time
from ..specs import ClusterSpec, ModelSpec, get_model, load_cluster
from ..specs.stacks import get_stack


def _options(stack: str | None) -> CostOptions:
    return CostOptions(stack=get_stack(stack or None))


def compute_ceiling(cluster: str, model: str, seq_len: int, global_batch: int, stack: str | None = None) -> float:
    """The compute ceiling of a cell: the compute-only time of a symmetric layout (every device an
    equal share of tokens and attention, so the slowest sets the pace) over the compute-bound time
    (each device the work it is relatively best at, costmodel/bound.py), on the software stack
    `stack` (None: the default); 1 on a homogeneous cluster."""
    return cluster_ceiling(load_cluster(cluster), get_model(model), seq_len, global_batch, stack)


def cluster_ceiling(c: ClusterSpec, m: ModelSpec, seq_len: int, global_batch: int, stack: str | None = None) -> float:
    """`compute_ceiling` of a built cluster (one whose GPU types may differ from the catalog's)."""
    tok, att = kernel_rates(c, m, _options(stack))
    f_tok = float(global_batch * seq_len)
    f_att = float(global_batch * m.layers * m.heads * m.causal_pairs(seq_len))
    n = len(tok)
    symmetric = float(np.max(f_tok / n / tok + f_att / n / att))
    return symmetric / min_compute_time(tok, att, f_tok, f_att)


def compute_ceiling_time(
    cluster: str, model: str, seq_len: int, global_batch: int = 1, stack: str | None = None
) -> float:
    """The compute-bound time of one iteration on a cluster (costmodel/bound.py's LP, no optimizer),
    on the software stack `stack` (None: the default)."""
    c, m = load_cluster(cluster), get_model(model)
    tok, att = kernel_rates(c, m, _options(stack))
    return min_compute_time(
        tok, att, float(global_batch * seq_len), float(global_batch * m.layers * m.heads * m.causal_pairs(seq_len))
    )
