"""CPU emulation of slower devices and links: a CPU world whose ranks behave like a heterogeneous cluster.

The method (every figure it produces is labelled "emulated", with its factors):

- **Compute.** Rank r emulates a device `slowdown[r]` = f ≥ 1 times slower than one unpaced CPU core.
  Every aten operator the rank runs (forward, backward, recompute, optimizer: a TorchDispatchMode
  sees them all) is timed with the thread's CPU time and its wall time w, and charged its reference
  CPU time c (below); the rank then owes f·c − w seconds, and sleeps them off once they exceed
  `QUANTUM_S` and before every communication (so a message leaves at the emulated time). Sleeping,
  not busy-waiting, keeps the cores free for the other ranks; charging CPU time, not wall time, keeps
  the emulated rate when ranks briefly share a core (an operator slowed by a neighbour owes less
  sleep). An emulated rank runs one torch thread. The rank is a device of 1/f of a core as long as
  Σ 1/f over the ranks stays within the cores.
- **The reference CPU time of an operator.** A device runs a kernel of given shapes in a near-fixed
  time; a paced CPU rank does not: it sleeps between operators, and an operator run on waking takes
  more CPU than the same operator unpaced, the more the longer it sleeps, by an amount that varies
  from run to run. On this project's 2-core VM (benchmarks/bench_pacing.py, data/results/pacing.txt:
  the tiny model's forward + backward alone) the sampled CPU per operator was 9-24% above unpaced at
  f = 4-20 on 112 tokens, 3-12% on 448; in runs of cpu-8, a plan's step time varied by up to 22%
  between three runs, and the CPU-x20 ranks ran 10-35% slower per unit of work than the CPU-x8 ranks
  (the profile's per-rank figures). So each operator is charged the least of the first
  `REFERENCE_SAMPLES` samples of its signature (the operator, its tensors' shapes, strides and
  dtypes, its other arguments), and that figure for good once they are taken: what one core takes
  for it when nothing gets in the way. The samples stay in the record (`PacerStats.raw_cpu_s`).
- **Host time.** The emulated device runs the operators asynchronously from its host, as a GPU's
  launch queue does: the host's own wall time between operators (Python, the autograd engine, the
  dispatch, waiting on an asynchronous collective) pays off what the device still owes instead of
  adding to it, so a step takes max(host, device) between two communications, not their sum. Host
  time never creates credit (a device cannot run work it has not been given), and the wait inside a
  communication is not host time (the device's queue is drained before it). Without this, every
  rank ran f·(operator CPU) + (host time at 1x): a per-operator cost the cost model (a GPU's) does not
  have, largest on the fast ranks (least sleep to hide it) and on plans with many small operators.
  DTensor's own dispatch (FSDP2's sharded parameters and gradients, which the clipping and AdamW run
  on) is host time too: DTensor handles the call, and only the operators it runs on the local tensors
  are paced (its shape propagation on fake tensors is not). Timed as one operator, its Python (25-30 us
  a call against 2.5-3.6 us for the same elementwise operator on a plain tensor of 6,000 elements, on
  this project's Intel VM) was charged f times as device time: on cpu-8's CPU-x20 ranks under hybrid
  ZeRO-2, 0.30 s of a 3.0 s step went to ~600 clipping, AdamW and FSDP operators, against the 0.02 s
  the cost model charges them (2026-12-07).
  The emulation's own bookkeeping after each operator (its timing and reference lookup, recorded as
  `PacerStats.bookkeeping_s`) is neither the host's time nor the device's: like time lost to
  contention, it is made up later by sleeping less, so a rank whose host keeps up with its device
  does not pay it.
- **Links.** A pair (a, b) may have an emulated link of β bytes/s and α seconds (two "nodes" joined by
  a slower network). Bytes are counted as the cost model counts them: 2 bytes per element (bf16),
  whatever dtype the CPU run uses, so β is in the cost model's units. A batched P2P exchange
  (`comm.P2PBatch`) that uses such a link completes no earlier than
  max(its post time, the senders' post times) + α + max(Σ sent, Σ received)/β over those links (each
  message carries its sender's post time, `time.monotonic`, shared by the processes of one machine).
  A ragged all-to-all whose group crosses one follows the same rule (`AllToAllLinks`: each peer's part
  carries its post time; α–β by costmodel.comm's formula): the real exchange runs inside the link's
  time. Held after the real exchange instead, as before 2026-12-07, a cross-node all-to-all cost the
  real one (2-4 ms a message between paced ranks in this VM's profiles of 2026-12-07, where it is
  the latency inside a node) plus the emulated link's: on cpu-4's DP = 1 plan, whose head-parallel
  groups span the two nodes, 0.25 s a step of real waits beside the 0.18 s the link held, where the
  cost model charges the link's 0.18 s. The gradient all-reduce (once a step: the flat reductions of
  runtime/sharding.py, HSDP's across copies included where it runs after the backward) returns its
  α–β time after the real one; unequal shard sets' swap of shard rows is a ragged all-to-all, held
  by the rule above. FSDP2's own collectives (its gathers and reduce-scatters, HSDP's
  per-layer all-reduce of copies in lockstep) are not held: over an emulated link they take the real
  link's time, so a plan whose FSDP groups span emulated nodes is measured without that link time
  (bench_dp's plans keep FSDP groups inside a node; cpu-4's one-replica plan under ZeRO-2 inside each
  node all-reduces its copies that way, 0.016 s a step in the step model). Links inside a node are
  the real ones.

- **The machine's idle state.** A rank's emulated time is f times its operators' CPU time, and an
  idle virtual CPU runs them slower: measured on this project's 2-core VM (cpu-4, four one-rank
  replicas, 2026-12-05), the same run took 3.626 s per step, then 3.249 s with one busy loop at the
  lowest priority beside it; in the other order 3.123 s with it, 3.478 s without (11-12%, and
  steps 3.06-3.35 s with it against 3.23-3.91 s without). `warm_cores()` keeps one such loop for a
  block: the measuring commands (profile, calibrate, their runs) take it, so every figure they fit
  and every run they compare sees the machine in one state. At nice 19 it takes about 1.5% of a
  core from a rank that wants one.

`activate(emulation, rank)` turns it on for a block of code; `active()` is the running `Pacer` (None
when off, the default: then nothing here costs anything). The emulation of a plan on an emulated
cluster is derived by `hexiseq.calibrate.emulated_clusters`.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import HexiSeqError
from ..links import ring_allreduce_s

REFERENCE_SAMPLES = 8  # samples of an operator's signature whose least is its reference CPU time (module doc)
QUANTUM_S = 5e-3  # the rank sleeps off what it owes once it exceeds this: each sleep costs a wake-up, so not too often
MIN_SLEEP_S = (
    2e-4  # before a message, less than this stays owed: a sleep costs Linux's timer slack (50 us) and a wake-up
)
CREDIT_S = 0.05  # at most this much time lost to contention is made up later by sleeping less
MODEL_BYTES_PER_ELEMENT = 2.0  # the cost model's activations are bf16
_COMM_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


@dataclass(frozen=True)
class Emulation:
    """What a CPU world emulates: a slowdown per rank and the emulated links between ranks.

    `link_gbps[a][b]` (GB/s, 1e9 bytes per second of bf16-counted bytes, per direction) and
    `link_latency_us[a][b]` describe an emulated link; 0 means the pair uses the real link."""

    slowdown: tuple[float, ...]
    link_gbps: tuple[tuple[float, ...], ...] = ()
    link_latency_us: tuple[tuple[float, ...], ...] = ()
    source: str = ""  # what it emulates (e.g. "cluster cpu-4"), for the record

    def __post_init__(self) -> None:
        n = len(self.slowdown)
        if n == 0:
            raise HexiSeqError("an emulation needs at least one rank")
        for r, f in enumerate(self.slowdown):
            if not (isinstance(f, (int, float)) and math.isfinite(f) and f >= 1.0):
                raise HexiSeqError(
                    f"emulation: rank {r} has slowdown {f!r}; a CPU rank can only be slowed down, "
                    f"so the factor must be a number >= 1 (1 = one unpaced core)"
                )
        for name in ("link_gbps", "link_latency_us"):
            m = getattr(self, name)
            if m and (len(m) != n or any(len(row) != n for row in m)):
                raise HexiSeqError(f"emulation: {name} must be {n} x {n} (one row per rank), got {len(m)} rows")
            if m and any(not math.isfinite(x) or x < 0 for row in m for x in row):
                raise HexiSeqError(f"emulation: {name} holds a negative or non-finite value")
        object.__setattr__(self, "slowdown", tuple(float(f) for f in self.slowdown))
        object.__setattr__(self, "link_gbps", tuple(tuple(float(x) for x in row) for row in self.link_gbps))
        object.__setattr__(self, "link_latency_us", tuple(tuple(float(x) for x in row) for row in self.link_latency_us))

    @property
    def world_size(self) -> int:
        return len(self.slowdown)

    def link(self, a: int, b: int) -> tuple[float, float] | None:
        """(bytes/s, seconds) of the emulated link a-b, None when the pair uses the real one."""
        if not self.link_gbps or a == b or self.link_gbps[a][b] <= 0:
            return None
        return self.link_gbps[a][b] * 1e9, self.link_latency_us[a][b] * 1e-6

    @property
    def emulates_links(self) -> bool:
        return any(x > 0 for row in self.link_gbps for x in row)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {
            k: [list(r) for r in v] if k.startswith("link") else (list(v) if isinstance(v, tuple) else v)
            for k, v in d.items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Emulation:
        return cls(
            tuple(d["slowdown"]),
            tuple(tuple(r) for r in d.get("link_gbps", ())),
            tuple(tuple(r) for r in d.get("link_latency_us", ())),
            d.get("source", ""),
        )


@dataclass
class PacerStats:
    """What the emulation did on one rank (seconds): the operators' CPU time charged (their reference,
    module doc) and sampled, their wall time, the host time between them (hidden behind the device's
    work, or exposed), the sleep that made them f times slower, and for messages over emulated links
    the wait for their real transfers and the sleep that held them. Held pacing: wall_s + host_s +
    bookkeeping_s + compute_sleep_s = f x cpu_s; a step is about that, host_exposed_s, link_wait_s and link_sleep_s
    (and the time inside the communication calls themselves)."""

    ops: int = 0
    cpu_s: float = 0.0  # the operators' reference CPU time: what the device is charged (f x it)
    wall_s: float = 0.0
    host_s: float = 0.0  # host time between operators that ran while the device still owed (module doc)
    host_exposed_s: float = 0.0  # host time between operators with nothing owed: the rank was host-bound
    compute_sleep_s: float = 0.0
    link_sleep_s: float = 0.0
    messages: int = 0
    raw_cpu_s: float = 0.0  # the operators' CPU time as sampled (0 in records from before the reference)
    link_wait_s: float = 0.0  # waiting for an emulated link's real transfers with nothing owed, before its hold
    bookkeeping_s: float = 0.0  # the emulation's own time after each operator: made up by sleeping less (module doc)
    # the process's CPU time (every thread: operators, Python, autograd, gloo, the emulation's own) and the wall
    # time of the paced blocks: their ratio is how much of the machine the rank really used (`cores_used`)
    process_cpu_s: float = 0.0
    block_wall_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def since(self, earlier: PacerStats) -> PacerStats:
        """What the pacing did after `earlier` (a copy of these statistics taken then): the steps
        after the warm-up, say, whose first steps allocate and fill caches."""
        return PacerStats(**{k: v - getattr(earlier, k) for k, v in asdict(self).items()})


class Pacer(TorchDispatchMode):
    """The running emulation on one rank (module doc): paces compute, holds the links."""

    def __init__(self, emulation: Emulation, rank: int) -> None:
        super().__init__()
        if not 0 <= rank < emulation.world_size:
            raise HexiSeqError(f"emulation of {emulation.world_size} ranks has no rank {rank}")
        self.emulation, self.rank = emulation, rank
        self.factor = emulation.slowdown[rank]
        self.debt = 0.0
        self.mark: float | None = None  # time.monotonic() up to which the rank's wall time is accounted
        self.bookkeeping = False  # True while the emulation's own operators run (message stamps): not paced
        self.stats = PacerStats()
        self.references: dict[tuple, list[float] | float] = {}

    # ------------------------------------------------------------------ compute
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # every aten operator of a paced rank passes here, so the path is kept lean: its Python is host
        # CPU beside the ranks' own, on a machine whose cores the ranks share (module doc)
        kwargs = kwargs or {}
        if func.namespace in _COMM_NAMESPACES:
            self.settle()  # a message leaves at the emulated time
            out = func(*args, **kwargs)
            self.mark = time.monotonic()  # the wait inside a communication is not host time
            return out
        for t in types:
            if issubclass(t, DTensor):
                # DTensor's own dispatch (its sharding rules) is host time: DTensor handles the call, and
                # the operators it runs on the local tensors come back here (module doc)
                return NotImplemented
        if self.factor == 1.0 or self.bookkeeping or _propagating_shapes():
            return func(*args, **kwargs)  # the emulation's own work and shape propagation: host time
        w0 = self.host()
        c0 = time.thread_time()
        out = func(*args, **kwargs)
        w1 = time.monotonic()
        dc, dw = time.thread_time() - c0, w1 - w0
        st = self.stats
        st.raw_cpu_s += dc
        dc = self.reference_cpu(func, args, dc)
        st.ops += 1
        st.cpu_s += dc
        st.wall_s += dw
        self.mark = mark = time.monotonic()
        # the time of the bookkeeping above is the emulation's, neither the host's nor the device's (module doc)
        st.bookkeeping_s += mark - w1
        debt = self.debt + self.factor * dc - dw - (mark - w1)
        self.debt = debt if debt > -CREDIT_S else -CREDIT_S
        if debt > QUANTUM_S:
            self.settle()
        return out

    def reference_cpu(self, func: Any, args: tuple, sample: float) -> float:
        """The CPU time the device is charged for `func` on `args`, given this call's `sample` (module
        doc): the least sample of its signature so far, fixed after REFERENCE_SAMPLES of them."""
        key = (func, *map(_signature, args))
        ref = self.references.get(key)
        if ref.__class__ is float:
            return ref  # type: ignore[return-value]
        if ref is None:
            ref = self.references[key] = []
        ref.append(sample)  # type: ignore[union-attr]
        mid = min(ref)  # type: ignore[type-var]
        if len(ref) >= REFERENCE_SAMPLES:  # type: ignore[arg-type]
            self.references[key] = mid
        return mid

    def host(self) -> float:
        """Account the host's wall time since `mark` (module doc, host time): what the device still
        owes runs meanwhile; the rest of it was host-bound. Returns now (time.monotonic), the new mark."""
        return self._account_gap("host_exposed_s")

    def _account_gap(self, exposed: str) -> float:
        """The wall time since `mark`: what the device still owes runs meanwhile (`host_s`), the rest
        goes to the `exposed` statistic. Returns now, the new mark."""
        now = time.monotonic()
        mark = self.mark
        if mark is not None and now > mark:
            gap = now - mark
            debt = self.debt
            hidden = gap if gap < debt else debt if debt > 0.0 else 0.0
            self.debt = debt - hidden
            st = self.stats
            st.host_s += hidden
            if gap > hidden:
                setattr(st, exposed, getattr(st, exposed) + gap - hidden)
        self.mark = now
        return now

    def settle(self, at_least: float = MIN_SLEEP_S) -> None:
        """Sleep off what the rank owes, when it is at least `at_least` seconds (before it communicates,
        and whenever it exceeds QUANTUM_S); a smaller debt stays owed."""
        if self.factor != 1.0:
            self.host()
        if self.debt > 0 and self.debt >= at_least:
            t0 = time.monotonic()
            time.sleep(self.debt)
            slept = time.monotonic() - t0
            self.stats.compute_sleep_s += slept
            self.debt -= slept  # an oversleep is owed back
            self.mark = t0 + slept

    @contextlib.contextmanager
    def unpaced(self) -> Iterator[None]:
        """A block of the emulation's own operators (stamping and unpacking messages over an emulated
        link): no device would run them, so they are not paced (their time is host time)."""
        was, self.bookkeeping = self.bookkeeping, True
        try:
            yield
        finally:
            self.bookkeeping = was

    # ------------------------------------------------------------------ links
    def hold_until(self, deadline: float) -> None:
        """Block until `deadline` (time.monotonic) for an emulated link. The device's owed work runs
        meanwhile (a GPU computes while its NIC transfers): the wait for the real transfers and the
        hold pay it off first, and only what the link adds beyond it is link time."""
        now = self._account_gap("link_wait_s")  # the wait for the real transfers, behind owed work
        wait = deadline - now
        if wait > 0:
            time.sleep(wait)
            slept = time.monotonic() - now
            paid = min(slept, max(self.debt, 0.0))
            self.debt -= paid
            self.stats.compute_sleep_s += paid
            self.stats.link_sleep_s += slept - paid
        self.mark = time.monotonic()  # a link's time is not host time

    def hold(self, seconds: float) -> None:
        self.hold_until(time.monotonic() + seconds)

    def a2a_seconds(self, ranks: Sequence[int], send_elems: Sequence[int], recv_elems: Sequence[int]) -> float:
        """Emulated time of this rank's part of an all-to-all among `ranks` (global, group order):
        α + max(Σ sent, Σ received)/β over the peers behind an emulated link (costmodel/comm.py's rule)."""
        lat, send, recv = 0.0, 0.0, 0.0
        for peer, s, r in zip(ranks, send_elems, recv_elems):
            link = self.emulation.link(self.rank, peer)
            if link is None:
                continue
            bw, a = link
            lat = max(lat, a)
            send += s * MODEL_BYTES_PER_ELEMENT / bw
            recv += r * MODEL_BYTES_PER_ELEMENT / bw
        return lat + max(send, recv) if (send or recv or lat) else 0.0

    def all_reduce_seconds(self, ranks: Sequence[int], elems: int) -> float:
        """Emulated time of a ring all-reduce of `elems` elements among `ranks` when any pair of them is
        an emulated link: the slowest link and largest latency of the pairs (costmodel.comm's ring)."""
        links = [self.emulation.link(a, b) for a in ranks for b in ranks if a != b]
        links = [x for x in links if x is not None]
        if not links:
            return 0.0
        bw, lat = min(x[0] for x in links), max(x[1] for x in links)
        return ring_allreduce_s(elems * MODEL_BYTES_PER_ELEMENT, len(ranks), bw, lat)


_ACTIVE: list[Pacer] = []

# lowers its own priority first; ends when its parent is gone (a parent killed by a signal runs no `finally`:
# an orphaned loop went on taking a core for good, and every later measurement ran beside two of them)
# (the parent's pid comes as the argument: one read by the loop itself may already be its new parent's)
_SPIN = (
    "import os, sys\nos.nice(19)\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n"
    "    for _ in range(200_000):\n        pass\n"
)


@contextlib.contextmanager
def warm_cores() -> Iterator[None]:
    """One busy loop at the lowest priority (nice 19) for the block (module doc: the machine's idle
    state); it is killed on the way out, however the block ends, and it ends by itself once its parent
    process is gone (a parent killed by a signal runs no `finally`)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def active() -> Pacer | None:
    """The emulation running on this rank, None when off."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def activate(emulation: Emulation | dict | None, rank: int, pacer: Pacer | None = None) -> Iterator[Pacer | None]:
    """Run the block under `emulation` as rank `rank` (None: nothing changes). One torch thread while
    it runs. Pass the same `pacer` again to accumulate its statistics over several blocks."""
    if emulation is None and pacer is None:
        yield None
        return
    if pacer is None:
        emulation = Emulation.from_dict(emulation) if isinstance(emulation, dict) else emulation
        pacer = Pacer(emulation, rank)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    _ACTIVE.append(pacer)
    pacer.mark = None  # the host's time before the block is not the device's
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        with pacer:
            yield pacer
        pacer.settle(0.0)
    finally:
        _ACTIVE.pop()
        torch.set_num_threads(threads)
        pacer.stats.process_cpu_s += time.process_time() - cpu0
        pacer.stats.block_wall_s += time.monotonic() - wall0


# ---------------------------------------------------------------------- hooks the runtime calls


def after_all_reduce(ranks: Sequence[int], elems: int) -> None:
    """Called after a synchronous all-reduce of `elems` elements among `ranks` returns: hold for its
    emulated link time, if any, after the real one (once a step; the all-to-all carries post times
    instead: AllToAllLinks)."""
    pacer = active()
    if pacer is not None and pacer.emulation.emulates_links:
        pacer.hold(pacer.all_reduce_seconds(ranks, elems))


@dataclass
class P2PLinks:
    """The emulated part of one batched P2P exchange (comm.P2PBatch): built while ops are added."""

    pacer: Pacer
    stamps: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # send buffers whose tail holds the post time
    recvs: list[tuple[torch.Tensor, int]] = field(
        default_factory=list
    )  # receive buffers (with a tail) and payload length
    send_s: float = 0.0
    recv_s: float = 0.0
    latency_s: float = 0.0
    posted: float = 0.0

    @staticmethod
    def tail(dtype: torch.dtype) -> int:
        """Elements of `dtype` that hold one float64 time stamp."""
        size = torch.empty((), dtype=dtype).element_size()
        if 8 % size:
            raise HexiSeqError(f"link emulation cannot stamp messages of dtype {dtype}")
        return 8 // size

    def send(self, t: torch.Tensor, peer: int) -> torch.Tensor:
        """The message to post to `peer`: t itself, or t with a time-stamp tail over an emulated link."""
        link = self.pacer.emulation.link(self.pacer.rank, peer)
        if link is None:
            return t
        bw, lat = link
        self.send_s += t.numel() * MODEL_BYTES_PER_ELEMENT / bw
        self.latency_s = max(self.latency_s, lat)
        with self.pacer.unpaced():
            flat = t.reshape(-1)
            out = torch.cat([flat, flat.new_zeros(self.tail(t.dtype))])
        self.stamps.append((out, flat.numel()))
        return out

    def recv(self, t: torch.Tensor, peer: int) -> torch.Tensor:
        """The buffer to receive into from `peer`: t itself, or a longer one (payload + stamp)."""
        link = self.pacer.emulation.link(self.pacer.rank, peer)
        if link is None:
            return t
        bw, lat = link
        self.recv_s += t.numel() * MODEL_BYTES_PER_ELEMENT / bw
        self.latency_s = max(self.latency_s, lat)
        with self.pacer.unpaced():
            buf = t.new_empty(t.numel() + self.tail(t.dtype))
        self.recvs.append((buf, t.numel()))
        return buf

    def post(self) -> None:
        """Stamp the messages with the post time (after the rank's owed compute sleep)."""
        self.pacer.settle()
        self.posted = time.monotonic()
        with self.pacer.unpaced():
            for buf, n in self.stamps:
                buf[n:] = _stamp(self.posted, buf.dtype)

    def complete(self) -> None:
        """After the real transfers: hold until the emulated links would have delivered."""
        if not (self.stamps or self.recvs):
            return
        start = self.posted
        with self.pacer.unpaced():
            for buf, n in self.recvs:
                start = max(start, _stamp_of(buf[n:]))
        self.pacer.stats.messages += len(self.stamps) + len(self.recvs)
        self.pacer.hold_until(start + self.latency_s + max(self.send_s, self.recv_s))


@dataclass
class AllToAllLinks:
    """The emulated part of one ragged all-to-all (comm.ragged_all_to_all) whose group crosses an
    emulated link: every peer's part carries the sender's post time in a tail, and the exchange
    completes no earlier than the latest post + α + max(Σ sent, Σ received)/β over the emulated links
    (`Pacer.a2a_seconds`), the rule of a batched P2P exchange: the real transfer runs inside that
    time, not before it."""

    pacer: Pacer
    ranks: list[int]
    send: list[int]
    recv: list[int]
    posted: float = 0.0

    def pack(self, x: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        """(x with a stamp after each peer's part, its send splits, the receive splits): post time now,
        after the rank's owed compute sleep."""
        self.pacer.settle()
        self.posted = time.monotonic()
        tail = P2PLinks.tail(x.dtype)
        with self.pacer.unpaced():
            stamp = _stamp(self.posted, x.dtype)
            parts = []
            for piece in x.split(self.send):
                parts += [piece, stamp]
            out = torch.cat(parts)
        return out, [n + tail for n in self.send], [n + tail for n in self.recv]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """The received parts without their stamps; holds until the emulated links would have
        delivered them."""
        tail = P2PLinks.tail(y.dtype)
        start = self.posted
        with self.pacer.unpaced():
            parts = []
            for peer, piece in zip(self.ranks, y.split([n + tail for n in self.recv])):
                parts.append(piece[: piece.numel() - tail])
                if self.pacer.emulation.link(self.pacer.rank, peer) is not None:
                    start = max(start, _stamp_of(piece[piece.numel() - tail :]))
            out = torch.cat(parts)
        self.pacer.stats.messages += 1
        self.pacer.hold_until(start + self.pacer.a2a_seconds(self.ranks, self.send, self.recv))
        return out


def a2a_links(ranks: Sequence[int], send: Sequence[int], recv: Sequence[int]) -> AllToAllLinks | None:
    """An AllToAllLinks for an all-to-all among `ranks` (global, group order; per-peer element
    counts) when one of its pairs is an emulated link, else None."""
    pacer = active()
    if pacer is None or not pacer.emulation.emulates_links:
        return None
    if all(pacer.emulation.link(pacer.rank, p) is None for p in ranks):
        return None
    return AllToAllLinks(pacer, list(ranks), list(map(int, send)), list(map(int, recv)))


def _stamp(t: float, dtype: torch.dtype) -> torch.Tensor:
    """A post time as the `P2PLinks.tail(dtype)` elements of a message of `dtype`."""
    return torch.tensor([t], dtype=torch.float64).view(dtype)


def _stamp_of(tail: torch.Tensor) -> float:
    """The post time a message's tail holds (clone: an odd offset cannot be viewed as float64)."""
    return float(tail.clone().view(torch.float64)[0])


def p2p_links() -> P2PLinks | None:
    """A P2PLinks for a new batch when links are emulated, else None."""
    pacer = active()
    return P2PLinks(pacer) if pacer is not None and pacer.emulation.emulates_links else None


def _propagating_shapes() -> bool:
    """Whether a fake-tensor mode is running (DTensor propagating shapes on fake tensors, the first
    call of each signature): no device runs those operators."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _signature(a: Any) -> Any:
    """What tells one call of an operator from another of different cost: a tensor's shape, strides
    and dtype; a sequence's items; a plain value itself; any other object its type."""
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype)  # torch.Size is a tuple: hashable and compared as one
    if isinstance(a, (list, tuple)):
        return tuple(map(_signature, a))
    return a if isinstance(a, (int, float, bool, str, type(None))) else type(a)
