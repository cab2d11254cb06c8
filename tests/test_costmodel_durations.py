"""Every duration of an iteration as a linear form (hexiseq/costmodel/durations.py): `evaluate(
coefficients(...), s, L)` against a direct per-rank computation from first principles (the GPUs'
catalog numbers, the model's shape, exact pair counts, the block pairs and transfers of the exchange
schedule), and the forms' linearity in (s, L, products)."""

import numpy as np
import pytest
from _costmodel_ref import brute_exchange, edge_plan, on_devices, random_plans, rank_gpus, stack_attention, with_knobs

from hexiseq.costmodel.arrays import link_matrices, plan_arrays
from hexiseq.costmodel.durations import Durations, coefficients, durations, evaluate, exact_products
from hexiseq.costmodel.flops import group_pair_matrix
from hexiseq.costmodel.kernels import CostOptions
from hexiseq.errors import SpecError
from hexiseq.plan import symmetric_plan
from hexiseq.schedule import CAUSAL, block_pairs, group_segments, needed_segments, packed
from hexiseq.specs import ClusterSpec, ModelSpec, Workload, get_model, load_cluster

ARRAY_FIELDS = (
    "lin_pre_f",
    "lin_post_f",
    "lin_pre_b",
    "lin_post_b",
    "matmul_f",
    "matmul_b",
    "a2a_in",
    "a2a_out",
    "att_f",
    "att_b",
    "xc_f",
    "xc_b",
    "link",
    "head",
    "optimizer",
    "window_f",
    "window_b",
    "window_h",
    "recv_bytes",
)


def reference(plan, cluster, model: ModelSpec, workload: Workload, options: CostOptions) -> dict[str, np.ndarray]:
    """The durations of durations.py's module doc, rank by rank, from first principles."""
    lay, R, k = plan.layout(), plan.world_size, plan.num_groups
    h, H, Hkv, d, f, V = model.hidden, model.heads, model.kv_heads, model.head_dim, model.ffn, model.vocab
    m = 3 if model.mlp == "swiglu" else 2
    policy = str(workload.recompute)
    comm = not options.ignore_comm
    bw, lat = link_matrices(cluster)
    # per token of one layer: FLOPs and elementwise bytes (kernels.py's doc)
    pre_fl, post_fl = 2 * h * (H + 2 * Hkv) * d, 2 * (H * d * h + m * h * f)
    qk = (H + Hkv) * d
    act_f, act_b = (3 * f, 5 * f) if m == 3 else (2 * f, 3 * f)
    pre_by, post_by = 2 * (2 * h + 2 * qk), 2 * (8 * h + act_f)
    pre_by_b, post_by_b = 2 * (3 * h + 2 * qk), 2 * (9 * h + act_b)
    pairs = group_pair_matrix(plan)
    out = {
        key: np.zeros(R)
        for key in (
            "lin_pre_f",
            "lin_post_f",
            "lin_pre_b",
            "lin_post_b",
            "matmul_f",
            "matmul_b",
            "head",
            "optimizer",
            "window_f",
            "window_b",
            "window_h",
        )
    }
    out.update(
        a2a_in=np.zeros((R, 2)),
        a2a_out=np.zeros((R, 2)),
        att_f=np.zeros((R, k)),
        att_b=np.zeros((R, k)),
        xc_f=np.zeros((R, k, 2)),
        xc_b=np.zeros((R, k)),
        link=np.zeros((R, k)),
        recv_bytes=np.zeros((R, k)),
    )
    recv_s, send_s, alpha = np.zeros((R, k)), np.zeros((R, k)), np.zeros((R, k))
    for x in brute_exchange(plan):
        nbytes = (x.kv1 - x.kv0) * x.tokens * 2 * d * 2
        a_, b_ = lay[x.src].device, lay[x.dst].device
        out["recv_bytes"][x.dst, x.round] += nbytes
        if comm:
            recv_s[x.dst, x.round] += nbytes / bw[a_, b_]
            send_s[x.src, x.round] += nbytes / bw[a_, b_]
            alpha[x.dst, x.round] = max(alpha[x.dst, x.round], lat[a_, b_])
            alpha[x.src, x.round] = max(alpha[x.src, x.round], lat[a_, b_])
    for r, me in enumerate(lay):
        g = cluster.devices[me.device].gpu
        mm = g.peak_bf16_tflops * 1e12 * g.eff_matmul
        at = g.peak_bf16_tflops * 1e12 * g.eff_attention * stack_attention(g)
        hbm = g.hbm_bandwidth_gbps * 1e9 * g.eff_hbm
        pair_s = 4 * d / at
        row_s = g.attn_block_half_keys * pair_s
        s, eta = me.num_tokens, me.heads
        rerun = 1.0 if policy == "selective" else 0.0
        out["lin_pre_f"][r] = s * (pre_fl / mm + pre_by / hbm)
        out["lin_post_f"][r] = s * (post_fl / mm + post_by / hbm)
        out["lin_pre_b"][r] = s * (2 * pre_fl / mm + pre_by_b / hbm) + rerun * out["lin_pre_f"][r]
        out["lin_post_b"][r] = s * (2 * post_fl / mm + post_by_b / hbm) + rerun * out["lin_post_f"][r]
        out["matmul_f"][r] = s * (pre_fl + post_fl) / mm
        out["matmul_b"][r] = (2 + rerun) * out["matmul_f"][r]
        out["head"][r] = s * (3 * 2 * h * V / mm + V * options.loss_bytes_per_logit / hbm)
        local = model.param_count / (R if workload.param_sharding == "zero3" else 1)
        out["optimizer"][r] = local * options.optimizer_bytes_per_param / hbm
        # ragged all-to-alls with every other member of the group
        a2a = dict.fromkeys(("in_send", "in_recv", "out_send", "out_recv", "lat"), 0.0)
        for q in lay:
            if comm and q.group == me.group and q.rank != r:
                link = bw[me.device, q.device]
                a2a["in_send"] += s * (q.heads + 2 * q.kv_heads) * d * 2 / link
                a2a["in_recv"] += q.num_tokens * (eta + 2 * me.kv_heads) * d * 2 / link
                a2a["out_send"] += q.num_tokens * eta * d * 2 / link
                a2a["out_recv"] += s * q.heads * d * 2 / link
                a2a["lat"] = max(a2a["lat"], lat[me.device, q.device])
        out["a2a_in"][r] = (a2a["lat"] + a2a["in_send"], a2a["lat"] + a2a["in_recv"])
        out["a2a_out"][r] = (a2a["lat"] + a2a["out_send"], a2a["lat"] + a2a["out_recv"])
        # attention per round: exact pairs + causal-tile waste, and the per-row cost, of the blocks run
        for j in range(k):
            src = (me.group - j) % k
            keys = group_segments(plan, src) if j == 0 else packed(needed_segments(plan, src, me.group))
            blocks = block_pairs(group_segments(plan, me.group), keys)
            rows = sum(p.q_rows[1] - p.q_rows[0] for p in blocks)
            waste = sum((p.q_rows[1] - p.q_rows[0]) * options.attn_tile / 2 for p in blocks if p.kind == CAUSAL)
            out["att_f"][r, j] = eta * ((pairs[me.group, src] + waste) * pair_s + rows * row_s)
        out["att_b"][r] = options.attn_bwd_factor * out["att_f"][r]
        for j in range(1, k):
            out["xc_f"][r, j] = (alpha[r, j] + recv_s[r, j], alpha[r, j] + send_s[r, j])
            out["xc_b"][r, j] = 2 * alpha[r, j] + recv_s[r, j] + send_s[r, j]
            out["link"][r, j] = recv_s[r, j] + send_s[r, j]
        wf = out["lin_pre_f"][r] + out["lin_post_f"][r] + out["att_f"][r].sum()
        out["window_f"][r] = wf
        out["window_b"][r] = (
            out["lin_pre_b"][r] + out["lin_post_b"][r] + out["att_b"][r].sum() + (wf if policy == "full" else 0)
        )
        out["window_h"][r] = out["head"][r] * 2 / 3
    return out


def _cases():
    out = []
    policies, shardings = ("none", "selective", "full"), ("zero3", "replicated")
    for i, p in enumerate(random_plans(6, 8, 32, 8, blocks=24, block_size=128)):
        out.append((p, "testbed-8", "llama3-8b", policies[i % 3], shardings[i % 2], i % 4 == 3, i % 2 == 1))
    for i, p in enumerate(random_plans(4, 10, 24, 8, blocks=20, block_size=64, seed0=30)):
        devs = list(range(3, 32, 3))[: p.world_size]
        out.append(
            (on_devices(p, devs), "sim-32", "llama3.2-3b", policies[(i + 1) % 3], shardings[i % 2], False, i % 2 == 0)
        )
    for i, p in enumerate(random_plans(3, 5, 32, 32, blocks=10, block_size=128, seed0=60)):
        out.append((on_devices(p, [6, 1, 4, 3, 0]), "testbed-8", "gpt-7b", policies[i], "zero3", False, True))
    return out


CASES = _cases()


@pytest.mark.parametrize(
    "plan,cluster_name,model_name,policy,sharding,ignore_comm,knobs",
    CASES,
    ids=[f"{c[1]}-{c[2]}-{c[0].name}-{c[3]}-{c[4]}{'-nocomm' * c[5]}{'-knobs' * c[6]}" for c in CASES],
)
def test_durations_equal_a_direct_per_rank_computation(
    plan, cluster_name, model_name, policy, sharding, ignore_comm, knobs, within
):
    cluster, model = load_cluster(cluster_name), get_model(model_name)
    w = Workload(seq_len=plan.seq_len, activation_checkpointing=policy, param_sharding=sharding, global_batch=2)
    opts = CostOptions(ignore_comm=ignore_comm)
    if knobs:
        cluster = with_knobs(cluster, block_half_keys=384, overlap_slowdown=0.05)
    d = durations(plan, cluster, model, w, opts)
    want = reference(plan, cluster, model, w, opts)
    for key in ARRAY_FIELDS:
        got, ref = np.asarray(getattr(d, key)), want[key]
        assert got.shape == ref.shape, key
        scale = max(np.abs(ref).max(), 1e-300)
        within(np.abs(got - ref).max() / scale, 1e-12, key)
    assert d.layers == model.layers and d.batch == 2 and d.comm is (not ignore_comm)
    assert d.rule.name == policy
    want_slowdown = [0.05 if knobs else g.overlap_slowdown for g in rank_gpus(plan, cluster)]  # else the catalog's
    np.testing.assert_array_equal(d.slowdown, want_slowdown)
    if ignore_comm:
        p = d.params
        assert p.ag_layer == p.rs_layer == p.ag_root == p.rs_root == p.ar_layer == p.ar_root == 0


def test_the_edge_plan_durations(within):
    """Ranks without tokens still attend (heads) and ranks without heads still run their linear
    parts (tokens); the exchange pieces follow the schedule."""
    plan = edge_plan()
    model = ModelSpec("edge", layers=2, hidden=48, heads=6, kv_heads=2, ffn=64, vocab=100)
    cluster = ClusterSpec.from_nodes("c6", [("A100-80GB", 3, 25), ("H100-SXM", 3, 50)])
    w = Workload(seq_len=plan.seq_len, block_size=2, activation_checkpointing="full")
    cluster = with_knobs(cluster, block_half_keys=3, overlap_slowdown=0.2)
    d = durations(plan, cluster, model, w)
    want = reference(plan, cluster, model, w, CostOptions())
    for key in ARRAY_FIELDS:
        scale = max(np.abs(want[key]).max(), 1e-300)
        within(np.abs(np.asarray(getattr(d, key)) - want[key]).max() / scale, 1e-12, key)
    assert d.lin_pre_f[0] == 0 and d.att_f[0].min() > 0  # rank 0: heads, no tokens
    assert d.lin_pre_f[2] > 0 and not d.att_f[2].any() and not d.xc_b[2].any()  # rank 2: tokens, no heads


# ------------------------------------------------------------------------------ the linear forms


@pytest.mark.parametrize("seed", range(4))
def test_durations_are_affine_in_tokens_lengths_and_products(testbed, seed):
    """At two points (s, L, P) and their midpoint the durations are the midpoint of the durations:
    every duration (every piece of the all-to-all and exchange maxima) is affine. At the origin only
    the latencies and the optimizer step remain."""
    m = get_model("llama3-8b")
    plan = random_plans(1, 8, 32, 8, blocks=24, block_size=128, seed0=seed)[0]
    w = Workload(seq_len=plan.seq_len, activation_checkpointing=("none", "selective", "full", "full")[seed])
    cluster = with_knobs(testbed, block_half_keys=256, overlap_slowdown=0.1)
    c = coefficients(plan_arrays(plan, cluster, m, w), m, w)
    rng = np.random.default_rng(seed)
    R, k = plan.world_size, plan.num_groups
    pts = [
        (
            rng.uniform(0, 4096, R),
            rng.uniform(0, 4096, k),
            rng.uniform(0, 4096**2, (k, k)),
            rng.uniform(0, 4096**2, (k, k)),
        )
        for _ in range(2)
    ]
    mid = tuple((x + y) / 2 for x, y in zip(*pts))
    d1, d2, dm = (evaluate(c, s, L, P, Pw) for s, L, P, Pw in (*pts, mid))
    for key in ARRAY_FIELDS:
        a, b, got = (np.asarray(getattr(x, key)) for x in (d1, d2, dm))
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-12, atol=1e-18, err_msg=key)
    z = evaluate(c, np.zeros(R), np.zeros(k), np.zeros((k, k)))
    for key in ("lin_pre_f", "lin_post_b", "att_f", "att_b", "head", "window_f", "window_b", "link", "recv_bytes"):
        assert not np.asarray(getattr(z, key)).any(), key
    np.testing.assert_array_equal(z.a2a_in, np.stack([c.a2a_lat, c.a2a_lat], axis=1))
    np.testing.assert_array_equal(z.xc_f[:, 1:, 0], c.x_lat[:, 1:])
    np.testing.assert_array_equal(z.xc_b[:, 1:], 2 * c.x_lat[:, 1:])
    np.testing.assert_array_equal(z.optimizer, c.optimizer)


def test_default_products_are_exact_and_window_products_only_change_windows(testbed):
    m = get_model("llama3-8b")
    plan = random_plans(1, 8, 32, 8, blocks=24, block_size=128, seed0=5)[0]
    w = Workload(seq_len=plan.seq_len)
    a = plan_arrays(plan, testbed, m, w)
    c = coefficients(a, m, w)
    np.testing.assert_array_equal(exact_products(a.L), np.outer(a.L, a.L))
    d0, d1 = evaluate(c, a.s, a.L), evaluate(c, a.s, a.L, exact_products(a.L), exact_products(a.L))
    for key in ARRAY_FIELDS:
        np.testing.assert_array_equal(getattr(d0, key), getattr(d1, key))
    d2 = evaluate(c, a.s, a.L, prod_window=2 * exact_products(a.L))
    np.testing.assert_array_equal(d2.att_f, d0.att_f)
    assert np.all(d2.window_f >= d0.window_f) and np.any(d2.window_f > d0.window_f)
    np.testing.assert_array_equal(c.pair_src, a.src[a.grp])


def test_durations_refuse_auto(testbed):
    m = get_model("llama2-7b")
    w = Workload(seq_len=32768, activation_checkpointing="auto")
    with pytest.raises(SpecError, match="concrete recompute policy"):
        durations(symmetric_plan(range(8), w.seq_len, m.heads, m.kv_heads, 2, 4), testbed, m, w)


def test_durations_is_the_public_record(testbed):
    m = get_model("llama2-7b")
    w = Workload(seq_len=32768)
    d = durations(symmetric_plan(range(8), w.seq_len, m.heads, m.kv_heads, 2, 4), testbed, m, w)
    assert isinstance(d, Durations) and d.a.R == 8 and d.params.sharding == "zero3"
