"""CPU emulation of slower devices and links (hexiseq/runtime/emulation.py, hexiseq/calibrate/emulated_clusters.py):
real gloo processes; the assertions are on what the emulation recorded (its sleeps against the
operators' CPU time) and on lower bounds of link times, which a loaded machine can only lengthen."""

import math

import pytest
import torch

from hexiseq.calibrate.emulated_clusters import check_emulated, cpu_factor, emulation_for, local_cluster, local_factor
from hexiseq.errors import HexiSeqError, SpecError
from hexiseq.plan import ring_plan, symmetric_plan
from hexiseq.runtime import emulation as E
from hexiseq.runtime.world import spawn_world
from hexiseq.specs import load_cluster

# the pacing is checked against the wall clock and the process's CPU time, to within milliseconds
pytestmark = pytest.mark.serial


def _work(rank: int, world: int, factors: list[float], link: tuple[float, float]) -> dict:
    """Each rank: the same matmuls under its slowdown, then one P2P message and one all-to-all over an
    emulated link (bandwidth GB/s, latency us) between rank 0 and rank 1."""
    import time

    from hexiseq.runtime.comm import P2PBatch, ragged_all_to_all

    gbps, lat_us = link
    emu = E.Emulation(tuple(factors), ((0.0, gbps), (gbps, 0.0)), ((0.0, lat_us), (lat_us, 0.0)), source="test")
    a = torch.randn(192, 192, generator=torch.Generator().manual_seed(rank))
    out = {}
    with E.activate(emu, rank) as pacer:
        torch.mm(a, a)  # the first operator under a dispatch mode pays a one-time set-up
        # ... and its long wall time leaves a credit (debt < 0) that would shorten the sleeps below
        pacer.stats, pacer.debt = E.PacerStats(), 0.0
        for _ in range(60):
            a = torch.tanh(a @ a)
        pacer.settle(0.0)
        compute = pacer.stats.to_dict()
        n = 100_000
        payload = torch.arange(n, dtype=torch.float32) + rank
        t0 = time.monotonic()
        batch = P2PBatch()
        batch.send(payload, 1 - rank, 3)
        batch.recv(torch.empty(n), 1 - rank, 3)
        (got,) = batch.start().wait()
        out["p2p_s"] = time.monotonic() - t0
        out["p2p_ok"] = bool(torch.equal(got, torch.arange(n, dtype=torch.float32) + (1 - rank)))
        t0 = time.monotonic()
        y = ragged_all_to_all(torch.full((2 * n,), float(rank)), [n, n], [n, n])
        out["a2a_s"] = time.monotonic() - t0
        out["a2a_ok"] = bool(torch.equal(y[:n], torch.zeros(n)) and torch.equal(y[n:], torch.ones(n)))
        out["links"] = {
            k: v for k, v in pacer.stats.to_dict().items() if k in ("link_sleep_s", "link_wait_s", "messages")
        }
    out["compute"] = compute
    return out


@pytest.fixture(scope="module")
def world():
    return spawn_world(_work, 2, [1.0, 2.5], (0.01, 5000.0), timeout_s=120)


def test_a_slowed_rank_sleeps_its_factor_of_cpu_time(world):
    fast, slow = world[0]["compute"], world[1]["compute"]
    assert fast["compute_sleep_s"] == 0.0 and fast["ops"] == 0  # f = 1: nothing is paced
    f = 2.5
    assert slow["ops"] >= 120 and slow["cpu_s"] > 0
    paced = slow["wall_s"] + slow["host_s"] + slow["bookkeeping_s"] + slow["compute_sleep_s"]
    assert paced >= f * slow["cpu_s"] - 1e-3  # never faster than f x its CPU time
    if slow["wall_s"] <= f * slow["cpu_s"]:  # the machine left it its share: the sleep made up exactly the rest
        assert paced <= f * slow["cpu_s"] + 0.05  # (the last sleep may overshoot by a scheduler tick)


def test_an_operator_is_charged_its_reference_not_its_sample():
    """The device is charged, per operator, the least of the first REFERENCE_SAMPLES samples of the
    same signature (operator, shapes, strides, dtypes, scalars), then that figure for good; the
    samples stay in the record (`raw_cpu_s`). Synthetic samples through the rule, then a real block."""
    pacer = E.Pacer(E.Emulation((4.0,)), 0)
    a, b = torch.zeros(8, 8), torch.zeros(8, 16)
    mm = torch.ops.aten.mm.default
    samples = [5.0, 3.0, 4.0, 6.0, 2.5, 7.0, 3.5, 9.0]
    assert len(samples) == E.REFERENCE_SAMPLES
    got = [pacer.reference_cpu(mm, (a, a), s) for s in samples]
    assert got == [5.0, 3.0, 3.0, 3.0, 2.5, 2.5, 2.5, 2.5]  # the least so far, never above the sample's ...
    assert pacer.reference_cpu(mm, (a, a), 0.1) == 2.5  # ... then frozen, whatever the samples do
    assert pacer.reference_cpu(mm, (a, a), 99.0) == 2.5
    assert pacer.reference_cpu(mm, (a, b), 8.0) == 8.0  # another shape is another operator
    assert pacer.reference_cpu(mm, (a.t(), a), 1.0) == 1.0  # so is another stride
    assert pacer.reference_cpu(torch.ops.aten.slice.Tensor, (a, 0, 0, 4), 2.0) == 2.0
    assert pacer.reference_cpu(torch.ops.aten.slice.Tensor, (a, 0, 4, 8), 3.0) == 3.0  # and other scalars
    x = torch.randn(96, 96, generator=torch.Generator().manual_seed(0))
    with E.activate(E.Emulation((2.0,)), 0) as live:
        for _ in range(3 * E.REFERENCE_SAMPLES):
            torch.mm(x, x)
    st = live.stats
    assert st.ops == 3 * E.REFERENCE_SAMPLES and st.cpu_s > 0 and st.raw_cpu_s > 0
    (ref,) = [v for k, v in live.references.items() if k[0] is torch.ops.aten.mm.default]
    assert isinstance(ref, float)  # frozen after its samples
    # every charge is at least the final reference (the least so far only falls), the frozen ones
    # exactly it (a later sample may be less), and the first ones at most their samples
    n = E.REFERENCE_SAMPLES
    assert st.ops * ref <= st.cpu_s * (1 + 1e-9) and st.cpu_s <= (st.ops - n) * ref + st.raw_cpu_s * (1 + 1e-9)


def test_an_emulated_links_hold_runs_the_owed_device_work_meanwhile():
    """A message over an emulated link is held until its α-β time; the device's owed work runs during
    the hold (a GPU computes while its NIC transfers): the hold pays the debt off first and only its
    excess is link time. In-process, one rank, the hold called directly."""
    import time

    pacer = E.Pacer(E.Emulation((4.0,)), 0)
    pacer.debt, pacer.mark = 0.02, time.monotonic()  # 20 ms owed, a hold of 60 ms
    pacer.hold_until(time.monotonic() + 0.06)
    st = pacer.stats
    # (the microseconds before the call are host time: they pay the first of the debt)
    assert st.compute_sleep_s + st.host_s == pytest.approx(0.02) and st.link_sleep_s >= 0.04 - 1e-3
    assert pacer.debt <= 1e-12
    pacer = E.Pacer(E.Emulation((4.0,)), 0)
    pacer.debt, pacer.mark = 0.2, time.monotonic()  # 200 ms owed, a hold of 30 ms: all of it device work
    pacer.hold_until(time.monotonic() + 0.03)
    st = pacer.stats
    assert st.link_sleep_s == 0.0 and st.compute_sleep_s >= 0.03 - 1e-3 and 0.0 < pacer.debt <= 0.17 + 1e-3


def test_host_time_between_operators_runs_behind_the_device_work():
    """The host's own time between operators (here a Python sleep) pays off what the slowed device
    still owes instead of adding to it (a GPU's launch queue), and never runs ahead of the device:
    in-process, one rank, no communication."""
    import time

    gap, n = 2e-3, 30
    a = torch.randn(160, 160, generator=torch.Generator().manual_seed(0))
    with E.activate(E.Emulation((10.0,)), 0) as pacer:
        for _ in range(E.REFERENCE_SAMPLES):  # the dispatch mode's set-up; the operators' reference CPU times fixed
            torch.tanh(a @ a)
        pacer.settle(0.0)
        pacer.stats = E.PacerStats()
        torch.tanh(a @ a)
        # the slowdown that makes an iteration owe ~3 ms: more than the host gap after it, less than
        # the debt the rank sleeps off at once (QUANTUM_S). Its reference CPU time depends on the
        # machine and its threads (60 us to 0.5 ms seen), so it is read from the pacer.
        f = pacer.factor = 3e-3 / pacer.stats.cpu_s
        pacer.stats, pacer.debt = E.PacerStats(), 0.0
        t0 = time.monotonic()
        for _ in range(n):
            a = torch.tanh(a @ a)  # ~3 ms owed, more than the host gap after it
            time.sleep(gap)
        pacer.settle(0.0)
        elapsed = time.monotonic() - t0
    st = pacer.stats
    device = f * st.cpu_s
    assert st.host_s >= 0.5 * n * gap  # the gaps were hidden behind owed device time ...
    # ... never faster than the device; the emulation's bookkeeping after each operator stood in for device time
    assert st.wall_s + st.host_s + st.bookkeeping_s + st.compute_sleep_s >= device - 1e-3
    assert 0.0 < st.bookkeeping_s < 1e-3 * st.ops
    # hidden, not added: the block took its device time plus only the host time nothing could hide
    # (serial pacing took device + every gap), and the last sleep's overshoot
    assert elapsed < device + st.host_exposed_s + 0.02


def _dtensor_work(rank: int, world: int) -> dict:
    """On one rank: the same elementwise operators on a sharded DTensor and on a plain tensor of its
    shape, each under its own pacer; what each pacer counted and charged."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    d = distribute_tensor(torch.randn(6000, generator=torch.Generator().manual_seed(0)), mesh, [Shard(0)])
    n, out = 200, {}
    for name, t in (("dtensor", d), ("plain", d.to_local().clone())):
        with E.activate(E.Emulation((4.0,)), rank) as pacer:
            for _ in range(E.REFERENCE_SAMPLES):  # DTensor's sharding rules cached, the references fixed
                t.mul_(1.0)
                t.add_(t)
            pacer.settle(0.0)
            pacer.stats = E.PacerStats()
            for _ in range(n):
                t.mul_(1.0)
                t.add_(t)
            pacer.settle(0.0)
        out[name] = {"ops": pacer.stats.ops, "cpu_s": pacer.stats.cpu_s}
    return out


def test_a_dtensor_dispatch_is_host_time_and_its_local_operators_are_paced():
    """FSDP2's sharded parameters and gradients are DTensors: their Python dispatch (sharding rules,
    ~10x the elementwise operator itself on small shards) is the host's work, not the emulated
    device's. The pacer hands a DTensor call to DTensor and paces the operators it runs on the local
    tensor: the same operators, counted once each, charged about what the plain tensor's cost."""
    (got,) = spawn_world(_dtensor_work, 1, timeout_s=120)
    dt, plain = got["dtensor"], got["plain"]
    assert dt["ops"] == plain["ops"] == 400  # each call paced once, as its local operator
    # the charge is the local operators' (before: the whole DTensor dispatch, 8-10x the plain charge on the
    # project's VMs); a margin for the reference samples of two pacers
    assert dt["cpu_s"] < 3.0 * plain["cpu_s"]


def test_a_paced_block_records_its_process_cpu_and_wall_time():
    """The process's CPU time over the paced blocks is what the rank really used of the machine (busy work
    counts, sleep does not), accumulated over blocks of the same pacer: calibrate.cores_used reads it."""
    import time

    a = torch.randn(128, 128, generator=torch.Generator().manual_seed(0))
    pacer = None
    for _ in range(2):
        with E.activate(E.Emulation((1.0,)), 0, pacer) as pacer:
            end = time.process_time() + 0.05
            while time.process_time() < end:  # 50 ms of CPU
                torch.tanh(a @ a)
            time.sleep(0.1)  # 100 ms of wall time and no CPU
    st = pacer.stats
    assert 0.1 <= st.process_cpu_s < st.block_wall_s
    assert st.block_wall_s >= 0.3  # two blocks of >= 150 ms each
    assert st.process_cpu_s < 0.1 + 0.5 * (st.block_wall_s - 0.1)  # the sleeps took no CPU


def test_emulated_link_holds_messages_and_keeps_them_intact(world):
    n_bytes = 100_000 * E.MODEL_BYTES_PER_ELEMENT
    want = 5e-3 + n_bytes / 0.01e9  # alpha + bytes / beta: 25 ms
    for r in world:
        assert r["p2p_ok"] and r["a2a_ok"]
        assert r["p2p_s"] >= want * 0.99
        assert r["a2a_s"] >= want * 0.99
        assert r["links"]["link_sleep_s"] > 0 and r["links"]["messages"] >= 2
        # the exchanges' time is the wait for their real transfers and the hold after it, both recorded
        held = r["links"]["link_sleep_s"] + r["links"]["link_wait_s"]
        assert r["links"]["link_wait_s"] >= 0 and 0.5 * (r["p2p_s"] + r["a2a_s"]) <= held <= r["p2p_s"] + r["a2a_s"]


def test_an_all_to_all_over_an_emulated_link_completes_at_the_latest_post_plus_its_link_time():
    """A ragged all-to-all across an emulated link follows the P2P rule: each peer's part carries its
    sender's post time, and the exchange completes at the latest post + α + max(sent, received)/β, the
    real transfer running inside that time (held after the real exchange, it paid both). In-process:
    rank 0's side, with the part from rank 1 stamped 40 ms after rank 0's post."""
    import time

    emu = E.Emulation((2.0, 2.0), ((0.0, 0.01), (0.01, 0.0)), ((0.0, 20_000.0), (20_000.0, 0.0)))
    pacer = E.Pacer(emu, 0)
    links = E.AllToAllLinks(pacer, [0, 1], [3, 5], [4, 2])
    x = torch.arange(8, dtype=torch.float32)
    xs, ins, outs = links.pack(x)
    tail = E.P2PLinks.tail(torch.float32)
    assert ins == [3 + tail, 5 + tail] and outs == [4 + tail, 2 + tail] and xs.numel() == 8 + 2 * tail
    assert torch.equal(xs[:3], x[:3]) and torch.equal(xs[3 + tail : 8 + tail], x[3:])
    late = torch.tensor([links.posted + 0.04], dtype=torch.float64).view(torch.float32)
    own = torch.tensor([links.posted], dtype=torch.float64).view(torch.float32)
    y = torch.cat([torch.full((4,), 7.0), own, torch.full((2,), 9.0), late])
    y = links.unpack(y)
    done = time.monotonic()
    assert torch.equal(y, torch.tensor([7.0, 7.0, 7.0, 7.0, 9.0, 9.0]))
    # rank 1's part: 5 sent, 2 received elements of 2 bytes at 0.01 GB/s after 20 ms, from its post
    want = links.posted + 0.04 + 0.02 + 5 * E.MODEL_BYTES_PER_ELEMENT / 0.01e9
    assert want - 1e-4 <= done <= want + 0.02
    assert E.a2a_links([0, 1], [1, 1], [1, 1]) is None  # no pacer running: the plain exchange


def test_emulation_refuses_bad_factors_and_shapes():
    with pytest.raises(HexiSeqError, match=r"rank 1 has slowdown 0.5.*must be a number >= 1"):
        E.Emulation((1.0, 0.5))
    with pytest.raises(HexiSeqError, match="rank 0 has slowdown nan"):
        E.Emulation((math.nan,))
    with pytest.raises(HexiSeqError, match=r"link_gbps must be 2 x 2"):
        E.Emulation((1.0, 2.0), ((0.0,),), ((0.0,),))
    with pytest.raises(HexiSeqError, match="negative"):
        E.Emulation((1.0, 2.0), ((0.0, -1.0), (0.0, 0.0)), ((0.0, 0.0), (0.0, 0.0)))
    with pytest.raises(HexiSeqError, match="has no rank 3"):
        E.Pacer(E.Emulation((1.0, 2.0)), 3)
    with pytest.raises(SpecError, match="factor >= 1"):
        from hexiseq.calibrate.emulated_clusters import derived_type
        from hexiseq.specs import gpu_catalog

        derived_type(gpu_catalog()["CPU-x1"], 0.5)


def test_cpu_4_emulation_is_derived_from_the_cluster():
    c = load_cluster("cpu-4")
    assert [cpu_factor(d.gpu) for d in c.devices] == [4.0, 4.0, 10.0, 10.0]
    emu = emulation_for(ring_plan(range(4), 2048, 8, 4, block_size=64, cluster="cpu-4"), c)
    assert emu.slowdown == (4.0, 4.0, 10.0, 10.0)
    assert emu.link(0, 1) is None and emu.link(2, 3) is None  # inside a node: the real loopback
    bw, lat = emu.link(0, 2)
    assert bw == pytest.approx(0.05e9 * c.devices[0].gpu.nic_efficiency) and lat == pytest.approx(1e-3)
    # a plan on devices 2, 3 only: its ranks 0, 1 are the slow devices of one node
    sub = symmetric_plan([2, 3], 2048, 8, 4, cp=2, hp=1, block_size=64, cluster="cpu-4")
    e2 = emulation_for(sub, c)
    assert e2.slowdown == (10.0, 10.0) and not e2.emulates_links


def test_gpu_clusters_cannot_be_emulated():
    with pytest.raises(SpecError, match="mixed-4.*A100-80GB, H100-SXM.*CPU types of data/gpus-cpu.yaml"):
        check_emulated(load_cluster("mixed-4"))


def test_local_world_leaves_room_on_the_cores():
    assert local_factor(4, cores=2) == 4.0  # four ranks use one of the two cores
    assert local_factor(2, cores=2) == 2.0
    assert local_factor(1, cores=8) == 1.0
    assert local_cluster(4, cores=2).gpu_types == {"CPU-x4": 4}
    assert local_factor(6, cores=2) == 8.0
    with pytest.raises(HexiSeqError, match="use at most 20 ranks"):
        local_factor(21, cores=2)
    with pytest.raises(HexiSeqError, match="positive number of ranks"):
        local_cluster(0)


def test_off_by_default():
    assert E.active() is None
    with E.activate(None, 0) as p:
        assert p is None and E.active() is None


def _spin_loops(parent: int) -> list[tuple[int, int]]:
    """(pid, nice) of every live warm_cores loop started by process `parent`: the loop carries its
    parent's pid as its argument, so it is found after that parent is gone too (other tests leave
    helpers, e.g. multiprocessing's)."""
    import os

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        if argv[1:4] == ["-c", E._SPIN, str(parent)] and stat[0] != "Z":
            out.append((int(pid), int(stat[16])))
    return out


def test_warm_cores_runs_one_lowest_priority_loop_for_the_block_only():
    """emulation.warm_cores: one busy child at nice 19 while the block runs, gone after it, also when
    the block raises."""
    import os
    import time

    me = os.getpid()
    with E.warm_cores():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(n == 19 for _, n in _spin_loops(me)):
            time.sleep(0.05)
        assert [n for _, n in _spin_loops(me)] == [19]
    assert _spin_loops(me) == []
    with pytest.raises(RuntimeError), E.warm_cores():
        raise RuntimeError("the block fails")
    assert _spin_loops(me) == []


def test_warm_cores_loop_ends_when_its_parent_is_killed():
    """A process killed by a signal runs no `finally`: the busy loop it started under warm_cores must
    still end (it watches its parent), not take a core for every later measurement."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time\nfrom hexiseq.runtime import emulation\n"
        "with emulation.warm_cores():\n    print('up', flush=True)\n    time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "up"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _spin_loops(parent.pid):
        time.sleep(0.05)
    assert _spin_loops(parent.pid), "warm_cores started no loop"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _spin_loops(parent.pid):
        time.sleep(0.05)
    assert _spin_loops(parent.pid) == [], "the loop outlived its killed parent"
