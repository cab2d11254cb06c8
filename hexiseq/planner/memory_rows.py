"""Memory as rows of a layout's optimization model: every class of ranks within its capacity.

memory.py's per-rank terms are linear in the shard s, w = η·L and u = κ·L (`memory_terms`), so
one row per shard variable bounds every category but the K/V receive buffers. Those depend on the
round: while round j runs a rank holds round j's and the prefetched round j+1's K/V
(memory.kv_double_buffer), a different linear form of the source groups' chunks per round. Their
rows are added lazily (`violated`): at an LP solution, per class the most violated round not yet
in the model; the rows of other rounds follow if a later solution violates them.

Units: GiB in the rows (HiGHS drops matrix entries below 1e-9), bytes in `forms`.
"""

from __future__ import annotations

import numpy as np

from ..costmodel.durations import Coefficients
from ..costmodel.kernels import CostOptions
from ..costmodel.memory import kv_double_buffer, memory_terms
from ..specs import GIB, ModelSpec, Workload


class MemoryRows:
    """The memory rows of one layout's model over its variables `n` (chunk blocks per chunk
    variable) and `s` (tokens per shard variable); `rep` is a representative rank of every class,
    `svar` / `nvar` the shard variable of every class and the chunk variable of every group."""

    def __init__(
        self,
        model: ModelSpec,
        workload: Workload,
        options: CostOptions,
        coef: Coefficients,
        rep: np.ndarray,
        svar: np.ndarray,
        nvar: np.ndarray,
        n,
        s,
    ):
        self.coef, self.options, self.block_size = coef, options, workload.block_size
        self.rep, self.svar, self.nvar, self.n, self.s = rep, svar, nvar, n, s
        self.k = coef.a.k
        terms = memory_terms(model, workload, coef.a.R, options=options)
        self.const = sum(t.const for t in terms.values())
        self.c_s, self.c_w, self.c_u = (sum(getattr(t, f) for t in terms.values()) for f in ("c_s", "c_w", "c_u"))

    def capacity(self, c: int) -> float:
        """GiB class c may use: its capacity less the framework's reserve."""
        r = self.rep[c]
        return float(self.coef.a.capacity[r]) * (1.0 - self.options.reserved_fraction) / GIB

    def usage(self, c: int, pieces: tuple[tuple[float, int], ...] = ()) -> tuple[float, list]:
        """GiB of class c, all but the K/V receive buffers, plus `pieces` ((bytes per block, chunk
        variable), ...), as a linear form of the model's variables: (constant, [(variable,
        coefficient), ...]; a variable may repeat)."""
        r = self.rep[c]
        a = self.coef.a
        g = int(a.grp[r])
        per_n = float(self.c_w * a.eta[r] + self.c_u * a.kvc[r])
        terms = [
            (self.s[int(self.svar[c])], float(self.c_s) / GIB),
            (self.n[int(self.nvar[g])], per_n * self.block_size / GIB),
        ]
        terms += [(self.n[o], bytes_per_block / GIB) for bytes_per_block, o in pieces]
        return float(self.const) / GIB, terms

    def row(self, c: int) -> tuple[float, list, float]:
        """Class c within its capacity, K/V buffers aside: (constant, terms, capacity), GiB."""
        const, terms = self.usage(c)
        return const, terms, self.capacity(c)

    def kv_terms(self, c: int, j: int) -> tuple[tuple[float, int], tuple[float, int]]:
        """Class c's K/V receive buffers while round j runs as a linear form of the chunk blocks:
        (a, source group of round j), (b, source group of round j+1; b = 0 in the last round), the
        buffers a·n_h1 + b·n_h2 bytes (memory.kv_double_buffer of the rounds' bytes per block)."""
        cf, r, k, B = self.coef, self.rep[c], self.k, float(self.block_size)
        this = float(cf.x_recv_bytes[r, j]) * B
        nxt = float(cf.x_recv_bytes[r, j + 1]) * B if j + 1 < k else 0.0
        a, b = kv_double_buffer(np.array([this, 0.0]), np.array([0.0, nxt]))
        return (float(a), int(cf.pair_src[r, j])), (float(b), int(cf.pair_src[r, j + 1]) if j + 1 < k else 0)

    def kv_row(self, c: int, j: int) -> tuple[float, list, float]:
        """Class c's memory with round j's double-buffered K/V receive pieces within its capacity:
        (constant, terms, capacity), GiB."""
        (a, h1), (b, h2) = self.kv_terms(c, j)
        pieces = ((a, int(self.nvar[h1])),) + (((b, int(self.nvar[h2])),) if j + 1 < self.k else ())
        const, terms = self.usage(c, pieces)
        return const, terms, self.capacity(c)

    def violated(self, x_n: np.ndarray, x_s: np.ndarray, present: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """The (class, round) K/V rows to add at the point (x_n blocks per group, x_s tokens per
        class): per class over its capacity there, its most violated round whose row is not
        `present` (module doc)."""
        if self.k <= 1:
            return []
        cf, B = self.coef, self.block_size
        L = B * x_n
        reps = self.rep
        rb = cf.x_recv_bytes[reps] * L[cf.pair_src[reps]]  # [C, k] bytes received per round
        piece = kv_double_buffer(rb, np.concatenate([rb[:, 1:], np.zeros((len(reps), 1))], axis=1))
        piece[:, 0] = -np.inf  # round 0 receives nothing
        a = cf.a
        base = (
            self.const + self.c_s * np.asarray(x_s) + (self.c_w * a.eta[reps] + self.c_u * a.kvc[reps]) * L[a.grp[reps]]
        )
        cap = np.array([self.capacity(c) for c in range(len(reps))])
        over = (base[:, None] + piece) / GIB > cap[:, None] * (1 + 1e-9)
        out = []
        for c in np.nonzero(over.any(axis=1))[0]:
            for j in np.argsort(-piece[c], kind="stable"):
                if not over[c, j]:
                    break
                if (int(c), int(j)) not in present:
                    out.append((int(c), int(j)))
                    break
        return out

    def forms(self) -> list[dict]:
        """Per class, its memory as numbers (bytes): const (states, the reserve), per token of its
        shard ("s"), per block of its group's chunk ("n"), and the K/V-buffer pieces
        (a, source group, b, next source group): 2·(B_j + B_{j+1}) = a·n_h1 + b·n_h2. Used by
        planner.explain.memory_report."""
        cf, B = self.coef, float(self.block_size)
        out = []
        for c in range(len(self.rep)):
            r = self.rep[c]
            kv = []
            for j in range(1, self.k):
                (a, h1), (b, h2) = self.kv_terms(c, j)
                kv.append((a, h1, b, h2))
            out.append(
                {
                    "group": int(cf.a.grp[r]),
                    "const": self.const + self.options.reserved_fraction * float(cf.a.capacity[r]),
                    "s": self.c_s,
                    "n": B * (self.c_w * cf.a.eta[r] + self.c_u * cf.a.kvc[r]),
                    "kv": kv,
                    "capacity": float(cf.a.capacity[r]),
                }
            )
        return out
