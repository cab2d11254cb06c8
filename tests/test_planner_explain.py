"""planner.explain.may_fit, the solver-free memory check the planner uses to skip a policy: it says
True for whatever fits (it is a necessary condition), False where nothing can, and its boundary is
the documented sum (memory.py's terms over all ranks against the devices' room)."""

from __future__ import annotations

import pytest

from hexiseq.costmodel import CostOptions, estimate
from hexiseq.costmodel.memory import memory_terms, state_bytes
from hexiseq.errors import InfeasibleError
from hexiseq.plan import random_plan
from hexiseq.planner import plan_cluster
from hexiseq.planner.baselines import baselines, proportional_plan
from hexiseq.planner.explain import may_fit, memory_report
from hexiseq.specs import Workload, get_model, load_cluster

BLOCK = 128


@pytest.fixture(scope="module")
def mixed4():
    return load_cluster("mixed-4")


def _bound(cluster, model, wl, options=CostOptions(), devices=None):
    """(need, room) of may_fit's docstring, computed here from memory.py's terms."""
    terms = memory_terms(model, wl, 1, options=options)
    per_tok = (
        sum(t.c_s for t in terms.values())
        + (model.heads * sum(t.c_w for t in terms.values()) + model.kv_heads * sum(t.c_u for t in terms.values())) / 2.0
    )
    st = state_bytes(model, wl, 1)
    states = st["weights"] + st["grads"] + st["optimizer"]
    per_rank = st["param_buffers"] + terms["logits"].const + (states if wl.param_sharding == "replicated" else 0.0)
    devs = cluster.devices if devices is None else [cluster.devices[i] for i in devices]
    room = sum(max(0.0, (1 - options.reserved_fraction) * d.gpu.memory_bytes - per_rank) for d in devs)
    need = wl.seq_len * per_tok + (states if wl.param_sharding == "zero3" else 0.0)
    return need, room


def test_what_fits_may_fit(mixed4):
    m = get_model("tiny")
    for policy in ("none", "selective", "full"):
        wl = Workload(seq_len=16 * 1024, activation_checkpointing=policy)
        assert estimate(proportional_plan(mixed4, m, wl), mixed4, m, wl).fits
        assert may_fit(mixed4, m, wl)
        assert may_fit(mixed4, m, wl, devices=[0])  # one H100 holds the tiny model's 16K tokens too


def test_what_cannot_fit_is_refused(mixed4):
    """Replicated 70B states (16 bytes per parameter) exceed every device; ZeRO-3 at 8M tokens
    exceeds the cluster: may_fit says so, and indeed no baseline fits."""
    m = get_model("llama2-70b")
    wl = Workload(seq_len=32 * 1024, activation_checkpointing="full", param_sharding="replicated")
    assert not may_fit(mixed4, m, wl)
    assert not any(r.feasible for r in baselines(mixed4, m, wl).values())
    m8 = get_model("llama3-8b")
    long = Workload(seq_len=8 * 1024 * 1024, activation_checkpointing="full", param_sharding="zero3")
    assert not may_fit(mixed4, m8, long)
    assert may_fit(mixed4, m8, Workload(seq_len=32 * 1024, activation_checkpointing="full", param_sharding="zero3"))


def _longest(cluster, model, policy, sharding, devices=None):
    """The longest sequence (whole chunk pairs of BLOCK tokens) may_fit accepts, by bisection."""
    lo, hi = 1, 1 << 18  # in units of 2·BLOCK tokens (64M tokens: too many for any cluster here)
    wl = lambda n: Workload(seq_len=n * 2 * BLOCK, activation_checkpointing=policy, param_sharding=sharding)  # noqa: E731
    assert may_fit(cluster, model, wl(lo), devices=devices) and not may_fit(cluster, model, wl(hi), devices=devices)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if may_fit(cluster, model, wl(mid), devices=devices) else (lo, mid)
    return wl(lo), wl(hi)


@pytest.mark.parametrize(
    "policy, sharding, devices", [("none", "zero3", None), ("full", "zero3", None), ("selective", "zero3", [0, 1])]
)
def test_the_boundary(mixed4, policy, sharding, devices):
    """At the longest accepted sequence the documented need is within the room, one step longer it
    is not; and past the boundary the memory LP (memory_report: the least load any token/chunk
    spread reaches) confirms that nothing fits."""
    m = get_model("llama3-8b")
    fits, over = _longest(mixed4, m, policy, sharding, devices)
    need, room = _bound(mixed4, m, fits, devices=devices)
    assert need <= room
    need, room = _bound(mixed4, m, over, devices=devices)
    assert need > room
    if devices is None:
        assert memory_report(mixed4, m, over).load > 1.0


@pytest.mark.parametrize("seed", range(12))
def test_never_refuses_a_plan_that_fits(mixed4, seed):
    """Necessary: every random plan that fits (the estimate's memory) passes may_fit on its devices,
    also at lengths around the boundary."""
    m = get_model("llama3.2-3b")
    policy = ("none", "selective", "full")[seed % 3]
    fits, _ = _longest(mixed4, m, policy, "zero3")
    for seq_len in (fits.seq_len // 4, fits.seq_len // 2, fits.seq_len):
        seq_len -= seq_len % (2 * BLOCK * 4)
        wl = Workload(seq_len=seq_len, activation_checkpointing=policy, param_sharding="zero3")
        plan = random_plan(4, seq_len, m.heads, m.kv_heads, seed=seed, block_size=BLOCK, whole_kv_heads=True)
        if estimate(plan, mixed4, m, wl).fits:
            assert may_fit(mixed4, m, wl, devices=plan.rank_devices)


@pytest.mark.parametrize("seed", range(12))
def test_never_refuses_a_plan_that_fits_with_states_sharded_wider(mixed4, seed):
    """The same with the model states sharded over more devices than the plan's (CostOptions.
    state_shards, a replica of a joint plan): every random plan that fits under those options passes
    may_fit under them, around the longest sequence they allow; and the wider sharding lets an 8B
    model's long sequence fit where its own states leave no room."""
    m = get_model("llama3-8b")
    opts = CostOptions(state_shards=(8, 16, 64)[seed % 3])
    policy = ("none", "selective", "full")[seed % 3]
    lo, hi = 1, 1 << 16  # the longest sequence may_fit accepts under the options (whole chunk pairs)
    wl = lambda n: Workload(seq_len=n * 2 * BLOCK * 4, activation_checkpointing=policy)  # noqa: E731
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if may_fit(mixed4, m, wl(mid), opts) else (lo, mid)
    checked = 0
    for n in (lo // 4, lo // 2, lo, hi):
        if n < 1:
            continue
        w = wl(n)
        plan = random_plan(4, w.seq_len, m.heads, m.kv_heads, seed=seed, block_size=BLOCK, whole_kv_heads=True)
        if estimate(plan, mixed4, m, w, opts).fits:
            checked += 1
            assert may_fit(mixed4, m, w, opts, devices=plan.rank_devices)
    assert not may_fit(mixed4, m, wl(hi), opts) and checked >= 1
    assert may_fit(mixed4, m, wl(lo), opts) and not may_fit(mixed4, m, wl(lo), CostOptions())


def test_plan_cluster_without_the_explanation(mixed4):
    """plan_cluster(explain=False), the joint planner's replica shapes: the same InfeasibleError,
    one line instead of the explanation (which solves a dozen memory models)."""
    m, wl = get_model("llama2-70b"), Workload(seq_len=32 * 1024, activation_checkpointing="auto")
    with pytest.raises(InfeasibleError) as short:
        plan_cluster(mixed4, m, wl, progress=False, explain=False)
    assert str(short.value) == "llama2-70b at 32,768 tokens does not fit on mixed-4"
    with pytest.raises(InfeasibleError) as full:
        plan_cluster(mixed4, m, wl, progress=False)
    assert "what would make it fit" in str(full.value)
