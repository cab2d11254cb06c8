"""What `hexiseq profile` runs on each rank of a world: timed kernels and transfers, nothing else.

Compute (every rank at once, each under its own emulation, the shapes a plan of `model` at
`seq_len` tokens over the world uses; the fastest of `repeats` timings after one untimed call):
- linear layers: `F.linear` forward + backward (dx, dW) of every projection of a layer, s = S / world
  rows, and a square GEMM; FLOPs = 3 x 2·rows·in·out;
- attention: the executor's own kernels (runtime.kernels.local_attention and its backward) on the
  blocks a zigzag layout runs — full blocks of Lq query rows against four key lengths, timed in turn
  (their slope gives the rate per pair, their intercept less the block's operators at the
  per-operator time the per-row cost: `fit_attention`, and per device type profile.type_attention)
  and a causal diagonal block — all query/KV heads of the model; useful FLOPs as the cost model
  counts them: 4·d per visible pair forward, (1 + attn_bwd_factor) x that forward + backward;
- memory-bound kernels: one layer's norms, RoPE, SwiGLU activation and residual adds forward +
  backward at s tokens, with the bytes the cost model counts for them (costmodel.kernels.memory_bytes),
  and again at s/16 tokens: the same operators on less data, so the pair gives the time of each
  operator beyond its bytes (the cost model's op_overhead_us) and the rate of the bytes alone; and a
  large copy (the streaming bandwidth);
- the LM head with its chunked loss, and one AdamW step of the model's parameters (for the record
  and the calibration's checks).

Links (one pair at a time, the others waiting at a barrier): a ping-pong of a small and a large
message with `comm.P2PBatch` (emulated links apply) gives each pair's latency (half the small round
trip) and bandwidth (the large message over the extra time); an all-to-all of the world gives its
bandwidth. Bytes are counted as the cost model counts them, 2 per element (bf16). On an emulated
world, each pair inside a node also exchanges a small message both ways at once (as an all-to-all
or an exchange round does) after paced work and a settle, as a run's ranks come to every message
(`paced_latency_us`, the mean of 40): what a message costs there, waking and waiting for the peer
included. Measured on this project's 2-core VM (benchmarks/bench_paced_collectives.py,
data/results/paced-collectives.txt), a two-rank all-to-all after paced work took 1.5-2.1 ms on
average at f = 4-20, against a ping-pong latency of 0.2-0.3 ms in the profiles of cpu-4; the
per-message latency the cost model charges is this paced figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..costmodel.kernels import memory_bytes
from ..runs.config import model_spec
from ..runtime import emulation as emu
from ..runtime.comm import P2PBatch, ragged_all_to_all
from ..runtime.emulation import (
    MODEL_BYTES_PER_ELEMENT,  # bytes counted as the cost model counts them (bf16)
    active,
)
from ..runtime.kernels import local_attention, local_attention_backward
from ..runtime.llama import Llama, LlamaConfig, RMSNorm, apply_rope, chunked_loss_sum, rope_inv_freq


@dataclass(frozen=True)
class MeasureJob:
    """What every rank measures (picklable)."""

    model: dict[str, Any]  # LlamaConfig fields
    model_name: str
    seq_len: int
    emulation: dict[str, Any] | None  # runtime.emulation.Emulation.to_dict(), None: plain ranks
    repeats: int = 5
    link_elems: int = 1 << 20  # the large ping-pong message (elements)
    attn_bwd_factor: float = 2.5  # costmodel.kernels.CostOptions.attn_bwd_factor (the FLOP convention)


def _timed(fn: Callable[[], Any], repeats: int, stat: Callable[[list[float]], float] = min) -> float:
    """Seconds of `fn` over `repeats` calls after one untimed call: the fastest for kernels (an emulated
    rank's kernel takes f x its CPU time unless a busy machine stretched it: the fastest is the least
    stretched), the median for transfers (`stat`). Under an emulation every call starts owing nothing
    (no credit from an earlier stretched call) and ends by sleeping off all it owes, so that each timing
    holds exactly its own pacing."""
    out = [_once(fn) for _ in range(repeats + 1)][1:]  # the first call is untimed
    return float(stat(out))


def _once(fn: Callable[[], Any]) -> float:
    """Seconds of one call of `fn`, its pacing owed from nothing and slept off in full (`_timed`)."""
    pacer = active()
    if pacer is not None:
        pacer.debt = 0.0
    t0 = time.perf_counter()
    fn()
    if pacer is not None:
        pacer.settle(0.0)
    return time.perf_counter() - t0


def _linear_fwd_bwd(rows: int, n_in: int, n_out: int, gen: torch.Generator) -> Callable[[], None]:
    x = torch.randn(rows, n_in, generator=gen).requires_grad_()
    w = torch.randn(n_out, n_in, generator=gen).mul_(0.02).requires_grad_()
    dy = torch.randn(rows, n_out, generator=gen)

    def run() -> None:
        x.grad = w.grad = None
        F.linear(x, w).backward(dy)

    return run


def measure_matmul(cfg: Any, rows: int, repeats: int, gen: torch.Generator) -> dict[str, Any]:
    """Forward + backward of every linear of one layer at `rows` tokens, the LM head, a square GEMM."""
    h, d, H, Hkv, f = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.ffn
    shapes = {
        "q_proj": (h, H * d),
        "k_proj": (h, Hkv * d),
        "v_proj": (h, Hkv * d),
        "o_proj": (H * d, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }
    out: dict[str, Any] = {"rows": rows, "layer": []}
    flops = secs = 0.0
    for name, (a, b) in shapes.items():
        t = _timed(_linear_fwd_bwd(rows, a, b, gen), repeats)
        fl = 3 * 2.0 * rows * a * b
        out["layer"].append({"op": name, "in": a, "out": b, "seconds": t, "tflops": fl / t / 1e12})
        flops, secs = flops + fl, secs + t
    out["layer_tflops"] = flops / secs / 1e12
    t = _timed(_linear_fwd_bwd(rows, h, cfg.vocab, gen), repeats)
    out["lm_head"] = {"in": h, "out": cfg.vocab, "seconds": t, "tflops": 3 * 2.0 * rows * h * cfg.vocab / t / 1e12}
    n = 512
    a_, b_ = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    t = _timed(lambda: torch.mm(a_, b_), repeats)
    out["square"] = {"n": n, "seconds": t, "tflops": 2.0 * n**3 / t / 1e12}
    return out


def _attention_fwd_bwd(lq: int, lk: int, kind: str, cfg: Any, gen: torch.Generator) -> Callable[[], None]:
    q = torch.randn(lq, cfg.heads, cfg.head_dim, generator=gen)
    k = torch.randn(lk, cfg.kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(lk, cfg.kv_heads, cfg.head_dim, generator=gen)
    do = torch.randn(lq, cfg.heads, cfg.head_dim, generator=gen)

    def run() -> None:
        out, lse = local_attention(q, k, v, kind, 0)
        local_attention_backward(do, q, k, v, out, lse, kind, 0)

    return run


def _attention_fwd(lq: int, lk: int, kind: str, cfg: Any, gen: torch.Generator) -> Callable[[], None]:
    q = torch.randn(lq, cfg.heads, cfg.head_dim, generator=gen)
    k = torch.randn(lk, cfg.kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(lk, cfg.kv_heads, cfg.head_dim, generator=gen)
    return lambda: local_attention(q, k, v, kind, 0)


def attention_blocks(seq_len: int, world: int) -> tuple[int, list[int]]:
    """(query rows, key lengths) of the timed full blocks: a zigzag chunk of a ring over the world
    (S / 2·world rows) against a quarter, a half, all of it and twice it (a rank's whole share)."""
    lq = max(64, seq_len // (2 * world))
    return lq, sorted({max(32, lq // 4), max(32, lq // 2), lq, 2 * lq})


def _timed_together(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """The fastest of `repeats` timings of each of `fns`, timed in rounds after one untimed round: each
    round runs every fn once, the order turning by one each round, so a stretch of a busy machine falls
    on every point of a fit alike rather than on one of them (one timing each, as `_timed`)."""
    best = [float("inf")] * len(fns)
    for i in range(repeats + 1):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            t = _once(fns[k])
            if i:
                best[k] = min(best[k], t)
    return best


def fit_attention(
    lq: int, series: list[list[tuple[int, float]]], per_pair: float, bwd_factor: float, ops: int, op_us: float
) -> dict[str, float]:
    """The rate per visible pair and the per-row cost (in keys) of full blocks of `lq` query rows, from
    `series`: each rank's (key length, forward + backward seconds). The slope is a repeated median
    (Siegel) over every point: for each, the median of its slopes to the other points of its own rank
    (so that what sets one rank apart from another cancels), then the median of those over all the
    points; the intercept is the median of what each timing leaves beyond it. One stretched timing of
    four moves neither, nor does a stretched rank among three or more, where a two-point slope takes
    it whole and a median of two ranks' fits half. The intercept less the block's operators at `op_us`
    each is the per-row cost. {"tflops", "half_keys", "slope_s_per_key", "intercept_s"}."""
    pts = [sorted(s) for s in series]
    own = [
        statistics.median((tb - ta) / (kb - ka) for kb, tb in s if kb != ka) for s in pts if len(s) > 1 for ka, ta in s
    ]
    slope = statistics.median(own) if own else 0.0
    if slope <= 0:  # the machine's noise hid the keys' work: the longest block's own rate, no per-row cost
        kb, tb = min((p[-1] for p in pts), key=lambda kt: (-kt[0], kt[1]))
        return {
            "tflops": (1 + bwd_factor) * per_pair * lq * kb / tb / 1e12,
            "half_keys": 0.0,
            "slope_s_per_key": slope,
            "intercept_s": tb,
        }
    intercept = statistics.median(t - slope * k for s in pts for k, t in s)
    return {
        "tflops": (1 + bwd_factor) * per_pair * lq / slope / 1e12,
        "half_keys": max(0.0, (intercept - ops * op_us * 1e-6) / slope),
        "slope_s_per_key": slope,
        "intercept_s": intercept,
    }


def measure_attention(
    cfg: Any, seq_len: int, world: int, repeats: int, bwd_factor: float, gen: torch.Generator, op_us: float = 0.0
) -> dict[str, Any]:
    """Full blocks at four key lengths, timed together (`_timed_together`) and fitted (`fit_attention`:
    rate per pair and per-row cost), and a causal diagonal block. The intercept of the full blocks'
    times, less the block's operators at `op_us` each (the per-operator time, which the cost model
    charges apart: costmodel/operators.py), is the per-row cost. Measured on one CPU thread
    (benchmarks/bench_attention_blocks.py, data/results/attention_blocks.txt): the intercept is 0.29 /
    0.26 / 0.07 ms at 128 / 256 / 512 query rows, 75 operators per block each time -- a cost per call,
    not per row; left in, the per-row charge it became priced a ring's many short blocks ~30% above a
    Ulysses group's few long ones per pair, where the executor's blocks of those layouts took 5.35-5.70
    ns per model pair alike. Two lengths timed one after the other were not enough: in a cpu-4 profile
    of 2026-12-07 (03:46 UTC) one CPU-x4 rank timed its 64-key block at 7.6 ms against its partner's
    5.7 ms, and the slope between its two blocks put the type's rate at 47.5 GFLOP/s against 17.5 in
    the profiles before and after."""
    lq, lks = attention_blocks(seq_len, world)
    per_pair = 4.0 * cfg.head_dim * cfg.heads  # forward FLOPs of one (query, key) pair, all heads
    times = _timed_together([_attention_fwd_bwd(lq, lk, "full", cfg, gen) for lk in lks], repeats)
    rows = [
        {"kind": "full", "lq": lq, "lk": lk, "seconds": t, "tflops": (1 + bwd_factor) * per_pair * lq * lk / t / 1e12}
        for lk, t in zip(lks, times)
    ]
    forward_s = _timed(_attention_fwd(lq, lq, "full", cfg, gen), repeats)
    t = _timed(_attention_fwd_bwd(lq, lq, "causal", cfg, gen), repeats)
    pairs = lq * (lq + 1) / 2
    rows.append(
        {"kind": "causal", "lq": lq, "lk": lq, "seconds": t, "tflops": (1 + bwd_factor) * per_pair * pairs / t / 1e12}
    )
    ops = operators_of(_attention_fwd_bwd(lq, lks[0], "full", cfg, gen))
    fit = fit_attention(lq, [list(zip(lks, times))], per_pair, bwd_factor, ops, op_us)
    square = times[lks.index(lq)]
    return {
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "blocks": rows,
        "tflops": fit["tflops"],
        "half_keys": fit["half_keys"],
        "operators": ops,
        "op_us": op_us,
        "per_pair_flops": per_pair,
        "bwd_factor": bwd_factor,
        "bwd_over_fwd": (square - forward_s) / forward_s,
    }


class _OperatorCount(TorchDispatchMode):
    """Counts the aten operators run under it (the pieces the emulation paces one by one)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        self.n += 1
        return func(*args, **(kwargs or {}))


def operators_of(fn: Callable[[], Any]) -> int:
    """The aten operators one call of `fn` runs."""
    with _OperatorCount() as count:
        fn()
    return count.n


def measure_memory(cfg: Any, spec: Any, rows: int, repeats: int, gen: torch.Generator) -> dict[str, Any]:
    """One layer's elementwise kernels forward + backward at `rows` tokens, bytes as the cost model
    counts them, and at a sixteenth of the rows: the same operators on less data, so the two times
    part the per-operator time (their intercept over the operators, `op_us`) from the streaming rate
    (`gbps`: the bytes over the time beyond it)."""
    big = _memory_kernels(cfg, spec, rows, repeats, gen)
    small = _memory_kernels(cfg, spec, max(1, rows // 16), repeats, gen)
    extra_s, extra_b = big["seconds"] - small["seconds"], big["bytes"] - small["bytes"]
    if extra_s > 0 and extra_b > 0:  # else the machine's noise hid the data: all the time is the data's
        gbps = extra_b / extra_s / 1e9
        op_us = max(0.0, small["seconds"] - small["bytes"] / (gbps * 1e9)) / big["operators"] * 1e6
    else:
        gbps, op_us = big["bytes"] / big["seconds"] / 1e9, 0.0
    stream = torch.randn(1 << 23, generator=gen)  # 32 MB of fp32: out of the caches
    dst = torch.empty_like(stream)
    tc = _timed(lambda: dst.copy_(stream), repeats)
    copy = {"elements": stream.numel(), "seconds": tc, "gbps": 2 * stream.numel() * MODEL_BYTES_PER_ELEMENT / tc / 1e9}
    return {**big, "gbps": gbps, "op_us": op_us, "small": small, "copy": copy}


def _memory_kernels(cfg: Any, spec: Any, rows: int, repeats: int, gen: torch.Generator) -> dict[str, Any]:
    """measure_memory at one size: seconds, bytes, operators, the whole time's rate."""
    h, d, H, Hkv, f = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.ffn
    norm1, norm2 = RMSNorm(h, cfg.norm_eps), RMSNorm(h, cfg.norm_eps)
    x = torch.randn(rows, h, generator=gen).requires_grad_()
    o = torch.randn(rows, h, generator=gen).requires_grad_()
    m = torch.randn(rows, h, generator=gen).requires_grad_()
    q = torch.randn(rows, H, d, generator=gen).requires_grad_()
    k = torch.randn(rows, Hkv, d, generator=gen).requires_grad_()
    g = torch.randn(rows, f, generator=gen).requires_grad_()
    u = torch.randn(rows, f, generator=gen).requires_grad_()
    ang = torch.arange(rows, dtype=torch.float32)[:, None] * rope_inv_freq(cfg)[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def run() -> None:
        for t in (x, o, m, q, k, g, u):
            t.grad = None
        y = x + o  # residual add 1
        total = norm1(x).sum() + apply_rope(q, cos, sin).sum() + apply_rope(k, cos, sin).sum()
        total = total + norm2(y).sum() + (F.silu(g) * u).sum() + (y + m).sum()  # norm 2, activation, residual add 2
        total.backward()

    t = _timed(run, repeats)
    ops = operators_of(run)
    mem = memory_bytes(spec)
    nbytes = rows * sum(mem.values())
    return {
        "rows": rows,
        "seconds": t,
        "bytes": nbytes,
        "operators": ops,
        "gbps": nbytes / t / 1e9,
    }


def measure_step_parts(cfg: Any, rows: int, repeats: int, gen: torch.Generator) -> dict[str, Any]:
    """The LM head with its loss (forward + backward) at `rows` tokens and one AdamW step of the model."""
    model = Llama(cfg).init_weights(0)
    hid = torch.randn(rows, cfg.hidden, generator=gen).requires_grad_()
    labels = torch.randint(0, cfg.vocab, (rows,), generator=gen)
    w = model.lm_head.weight

    def head() -> None:
        hid.grad = w.grad = None
        chunked_loss_sum(hid, w, labels).backward()

    th = _timed(head, repeats)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-4)
    to = _timed(opt.step, repeats)
    return {"head_rows": rows, "head_s": th, "optimizer_s": to, "params": sum(p.numel() for p in params)}


def measure_links(rank: int, world: int, elems: int, repeats: int) -> dict[str, Any]:
    """Ping-pong between every pair (one pair at a time) and one all-to-all of the world."""

    def exchange(peer: int, n: int, first: bool) -> None:
        buf = torch.zeros(n)
        for turn in (0, 1):
            batch = P2PBatch()
            if (turn == 0) == first:
                batch.send(buf, peer, 7)
            else:
                batch.recv(torch.empty(n), peer, 7)
            batch.start().wait()

    pairs = []
    for a in range(world):
        for b in range(a + 1, world):
            dist.barrier()
            if rank in (a, b):
                peer, first = (b, True) if rank == a else (a, False)
                small = _timed(lambda peer=peer, first=first: exchange(peer, 1, first), repeats, statistics.median)
                large = _timed(lambda peer=peer, first=first: exchange(peer, elems, first), repeats, statistics.median)
                if rank == a:  # a large message that did not take longer than a small one (load noise): no bandwidth
                    extra = large - small
                    pairs.append(
                        {
                            "a": a,
                            "b": b,
                            "latency_us": small / 2 * 1e6,
                            "elements": elems,
                            "gbps": elems * MODEL_BYTES_PER_ELEMENT / (extra / 2) / 1e9 if extra > 0 else None,
                        }
                    )
    dist.barrier()
    per_peer = max(1, elems // max(1, world - 1))
    x = torch.zeros(per_peer * world)
    splits = [per_peer] * world
    t = _timed(lambda: ragged_all_to_all(x, splits, splits), repeats, statistics.median)
    sent = per_peer * (world - 1) * MODEL_BYTES_PER_ELEMENT
    return {"pairs": pairs, "all_to_all": {"elements_per_peer": per_peer, "seconds": t, "gbps": sent / t / 1e9}}


PACED_WORK = 20  # small matmuls (64 x 64) of paced work before each timed message: f x ~0.6 ms
PACED_MESSAGES = (5, 40)  # messages of each pair left out, then timed: the mean is what a run's messages sum to


def measure_paced_latency(world: int, rank: int, local: Callable[[int], bool]) -> dict[tuple[int, int], float]:
    """{(a, b): microseconds} for each pair inside a node (`local(peer)`; one pair at a time): the
    mean of PACED_MESSAGES one-element exchanges both ways at once, each after paced work and a settle
    (module doc). Run under the rank's own pacing."""
    pacer = active()
    a_mat = torch.randn(64, 64, generator=torch.Generator().manual_seed(rank))
    out: dict[tuple[int, int], float] = {}
    for a in range(world):
        for b in range(a + 1, world):
            dist.barrier()
            if rank not in (a, b) or not local(b if rank == a else a):
                continue
            peer = b if rank == a else a
            times = []
            skip, timed = PACED_MESSAGES
            for i in range(skip + timed):
                for _ in range(PACED_WORK):
                    a_mat = torch.tanh(a_mat @ a_mat) * 0.5
                if pacer is not None:
                    pacer.settle(0.0)
                t0 = time.perf_counter()
                batch = P2PBatch()
                batch.send(torch.zeros(1), peer, 9)
                batch.recv(torch.empty(1), peer, 9)
                batch.start().wait()
                if i >= skip:
                    times.append(time.perf_counter() - t0)
            if rank == a:
                out[(a, b)] = statistics.mean(times) * 1e6
    dist.barrier()
    return out


def measure_worker(rank: int, world: int, job: MeasureJob) -> dict[str, Any]:
    """Body of one rank of `hexiseq profile`."""
    cfg = LlamaConfig(**job.model)
    spec = model_spec(cfg, job.model_name)
    gen = torch.Generator().manual_seed(1000 + rank)
    rows = max(16, job.seq_len // world)
    pacer = emu.Pacer(emu.Emulation.from_dict(job.emulation), rank) if job.emulation else None
    out: dict[str, Any] = {"rank": rank, "threads": 1 if pacer else torch.get_num_threads()}
    with emu.activate(None, rank, pacer):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # the first operator under a dispatch mode pays a one-time set-up
        if pacer is not None:
            pacer.stats = emu.PacerStats()
        dist.barrier()
        out["matmul"] = measure_matmul(cfg, rows, job.repeats, gen)
        out["memory"] = measure_memory(cfg, spec, rows, job.repeats, gen)  # its per-operator time first
        out["attention"] = measure_attention(
            cfg, job.seq_len, world, job.repeats, job.attn_bwd_factor, gen, out["memory"]["op_us"]
        )
        out["step_parts"] = measure_step_parts(cfg, rows, job.repeats, gen)
    if pacer is not None:
        out["pacing"] = {"slowdown": pacer.factor, **pacer.stats.to_dict()}
    # links with the emulated ones but unpaced compute: a link is not slowed by its rank's device
    links = emu.Emulation.from_dict({**job.emulation, "slowdown": [1.0] * world}) if job.emulation else None
    with emu.activate(links, rank):
        out["links"] = measure_links(rank, world, job.link_elems, job.repeats)
    if pacer is not None:
        with emu.activate(None, rank, pacer):
            paced = measure_paced_latency(world, rank, lambda peer: pacer.emulation.link(rank, peer) is None)
        for p in out["links"]["pairs"]:
            if (p["a"], p["b"]) in paced:
                p["paced_latency_us"] = paced[(p["a"], p["b"])]
    return out
