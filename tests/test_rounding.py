"""hexiseq.rounding: every split sums exactly, follows its weights, breaks ties to the first part, and
gives the same parts as the four splitters it replaced (kept here as references)."""

from __future__ import annotations

import math
import random

import pytest

from hexiseq.errors import PlanError
from hexiseq.rounding import even_split, largest_remainder, round_near


def _ref_plan_proportional(weights, total, minimum=0, only_positive=False):
    idx = [i for i, w in enumerate(weights) if w > 0 or not only_positive]
    out = [0] * len(weights)
    rest = total - minimum * len(idx)
    if rest < 0:
        raise PlanError("too few")
    wsum = sum(weights[i] for i in idx) or 1
    exact = {i: rest * weights[i] / wsum for i in idx}
    for i in idx:
        out[i] = minimum + int(exact[i])
    left = total - sum(out)
    for i in sorted(idx, key=lambda i: exact[i] - int(exact[i]), reverse=True)[:left]:
        out[i] += 1
    return out


def _ref_round_to_sum(xs, total):
    s = float(sum(xs))
    scaled = [x * total / s for x in xs] if s > 0 else [total / len(xs)] * len(xs)
    out = [int(math.floor(x)) for x in scaled]
    for i in sorted(range(len(xs)), key=lambda i: (-(scaled[i] - out[i]), i))[: total - sum(out)]:
        out[i] += 1
    return out


def _ref_baselines(total, weights, unit=1, minimum=0):
    units = total // unit
    k = len(weights)
    base = [minimum] * k if units >= minimum * k else [0] * k
    rest = units - sum(base)
    wsum = sum(weights) or 1.0
    raw = [rest * w / wsum for w in weights]
    parts = [int(math.floor(x)) for x in raw]
    for i in sorted(range(k), key=lambda i: (-(raw[i] - parts[i]), i))[: rest - sum(parts)]:
        parts[i] += 1
    return [(b + p) * unit for b, p in zip(base, parts)]


def _ref_calibrate(total, weights, unit):
    units = total // unit
    wsum = sum(weights)
    exact = [units * w / wsum for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - out[i], reverse=True)[: units - sum(out)]:
        out[i] += 1
    return [x * unit for x in out]


def test_even_split():
    assert even_split(10, 3) == (4, 3, 3)
    assert even_split(6, 3) == (2, 2, 2)
    assert even_split(2, 4) == (1, 1, 0, 0)
    with pytest.raises(PlanError):
        even_split(5, 0)


def test_largest_remainder_rules():
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]  # ties to the first
    assert largest_remainder([3, 1], 8, unit=2) == [6, 2]
    assert largest_remainder([0, 0, 0], 7) == [3, 2, 2]  # all zero: even
    assert largest_remainder([5, 0, 1], 6, minimum=1, skip_zero=True) == [4, 0, 2]
    assert largest_remainder([1, 1000], 4, minimum=1) == [1, 3]
    with pytest.raises(PlanError):
        largest_remainder([1, 1, 1], 2, minimum=1)
    assert largest_remainder([1, 3], 3, minimum=2, strict_minimum=False) == [1, 2]  # no room: no minimum
    assert round_near([1.2, 2.9, 1.9], 6, minimum=1) == [1, 3, 2]


@pytest.mark.parametrize("seed", range(40))
def test_same_parts_as_the_splitters_it_replaced(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 9)
    ints = [rng.choice([0, 1, 2, 5, 128, 4096, rng.randint(0, 10**6)]) for _ in range(k)]
    floats = [rng.random() * rng.choice([1.0, 1e3, 1e12]) for _ in range(k)]
    total = rng.randint(k, 10**6)
    if sum(ints):
        assert largest_remainder(ints, total) == _ref_round_to_sum(ints, total)
        assert largest_remainder(ints, total, minimum=1, skip_zero=True) == _ref_plan_proportional(ints, total, 1, True)
        unit = rng.choice([1, 2, 128])
        assert largest_remainder(ints, total, unit=unit) == _ref_calibrate(total, ints, unit)
    assert largest_remainder(floats, total) == _ref_round_to_sum(floats, total)
    assert largest_remainder(ints if sum(ints) else floats, total, minimum=1) == _ref_plan_proportional(
        ints if sum(ints) else floats, total, 1
    )
    for unit, minimum in ((1, 0), (1, 1), (8, 0), (1, 10**6)):
        assert largest_remainder(floats, total, unit=unit, minimum=minimum, strict_minimum=False) == _ref_baselines(
            total, floats, unit, minimum
        )
    blocks = [rng.random() * 10 + 0.5 for _ in range(k)]
    n = max(k, round(sum(blocks)))
    assert round_near(blocks, n, minimum=1) == [
        1 + b for b in _ref_round_to_sum([max(0.0, x - 1.0) for x in blocks], n - k)
    ]
