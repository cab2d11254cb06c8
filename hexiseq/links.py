"""Collective times over links: the ring formulas that the cost model (costmodel/comm.py) and the
executor's CPU link emulation (runtime/emulation.py) both charge, in one place below both.

Units: bytes, bytes/s, seconds. A ring of n ranks over its slowest link (bandwidth `bw`, latency
`lat`) moves (n-1)/n of the result per rank and pays one latency per step. Pure arithmetic: no
numpy, no torch; it depends on nothing in hexiseq.
"""

from __future__ import annotations


def ring_allreduce_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-reduce of `nbytes` over n ranks: 2(n-1)/n·bytes/bw + 2(n-1)·lat seconds."""
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * lat


def ring_allgather_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-gather (or reduce-scatter) of a `nbytes` result over n ranks: (n-1)/n·bytes/bw + (n-1)·lat."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw + (n - 1) * lat
