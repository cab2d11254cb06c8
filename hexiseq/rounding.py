"""Integer splits: the one home for cutting a whole number into parts (chunk lengths, token shards,
head counts) evenly, in proportion to weights, or near a fractional point.

Every split here is exact (the parts sum to the total) and deterministic: largest remainder, ties to
the first part. Torch-free, numpy-free; it depends on nothing in hexiseq but its errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .errors import PlanError


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """Split `total` into `parts` integers differing by at most one (larger ones first)."""
    if parts <= 0:
        raise PlanError(f"cannot split {total} into {parts} parts")
    q, r = divmod(total, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def largest_remainder(
    weights: Sequence[float],
    total: int,
    *,
    unit: int = 1,
    minimum: int = 0,
    skip_zero: bool = False,
    strict_minimum: bool = True,
) -> list[int]:
    """`total` as multiples of `unit` in proportion to `weights` (largest remainder, ties to the
    first): its total // unit units are split, every part first gets `minimum` units and the rest
    goes by weight; the units sum exactly.

    skip_zero: parts of weight 0 get nothing, not even the minimum. When the units are too few for
    the minimum: PlanError with `strict_minimum`, else no minimum at all. All weights 0: the rest
    split evenly (`even_split`)."""
    units = total // unit
    idx = [i for i, w in enumerate(weights) if w > 0] if skip_zero else list(range(len(weights)))
    base = minimum
    if units < minimum * len(idx):
        if strict_minimum:
            raise PlanError(f"cannot give {len(idx)} parts at least {minimum} each out of {total}")
        base = 0
    rest = units - base * len(idx)
    out = [0] * len(weights)
    if not idx:
        return out
    wsum = sum(weights[i] for i in idx)
    if wsum <= 0:
        for i, p in zip(idx, even_split(rest, len(idx))):
            out[i] = (base + p) * unit
        return out
    exact = {i: rest * weights[i] / wsum for i in idx}
    parts = {i: int(math.floor(exact[i])) for i in idx}
    for i in sorted(idx, key=lambda i: (-(exact[i] - parts[i]), i))[: rest - sum(parts.values())]:
        parts[i] += 1
    for i in idx:
        out[i] = (base + parts[i]) * unit
    return out


def round_near(values: Sequence[float], total: int, minimum: int = 0) -> list[int]:
    """Integers of at least `minimum` summing to `total`, nearest to the fractional `values`: the
    minimum each, and the rest by largest remainder of how far each value lies above it."""
    extra = largest_remainder([max(0.0, v - minimum) for v in values], total - minimum * len(values))
    return [minimum + x for x in extra]
