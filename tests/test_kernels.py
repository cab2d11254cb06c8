"""Local attention kernels against a float64 autograd reference, for every mask kind derived from
global positions, GQA, blockwise merging (LSE rule) and per-block exact backward."""

from __future__ import annotations

import math
import random

import pytest
import torch
from _numerics import BF16, FP32

from hexiseq.runtime.kernels import (
    CAUSAL,
    FULL,
    NONE,
    block_mask,
    local_attention,
    local_attention_backward,
    merge_,
    select_backend,
)

BACKENDS = ["cpu", "math"]
TOL = FP32  # fp32 against the float64 reference (relative; lse absolute)

pytestmark = pytest.mark.numerics


def reference(q, k, v, qpos, kpos):
    """Dense masked attention in float64 with autograd; rows without keys give out 0, lse -inf."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    ke, ve = k64.repeat_interleave(g, 1), v64.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q64, ke) / math.sqrt(q.shape[2])
    allowed = kpos[None, :] <= qpos[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(allowed, torch.exp(s - lse[..., None]), torch.zeros_like(s))
    out = torch.einsum("hqk,khd->qhd", p, ve)
    return out, lse, (q64, k64, v64)


def rel(a, b):
    return (a.double() - b.double()).abs().max().item() / max(b.double().abs().max().item(), 1e-30)


def test_block_mask_from_positions():
    assert block_mask(10, 5, 0, 10) == (FULL, 0)  # keys 0..9 all before query 10
    assert block_mask(0, 5, 10, 3) == (NONE, 0)  # keys after every query
    assert block_mask(10, 5, 10, 5) == (CAUSAL, 0)  # the diagonal
    assert block_mask(10, 5, 8, 10) == (CAUSAL, 2)
    assert block_mask(8, 5, 10, 10) == (CAUSAL, -2)  # first two queries see nothing
    assert block_mask(0, 0, 0, 4) == (NONE, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_match_reference(backend, within):
    rng = random.Random(5)
    worst = {"out": 0.0, "lse": 0.0, "grad": 0.0}
    torch.manual_seed(0)
    for trial in range(40):
        hk = rng.choice([1, 2, 3])
        hq = hk * rng.choice([1, 2, 3])
        d = rng.choice([4, 8, 16])
        lq, lk = rng.randint(1, 37), rng.randint(1, 41)
        q0, k0 = rng.randint(0, 60), rng.randint(0, 60)
        q, k, v = torch.randn(lq, hq, d), torch.randn(lk, hk, d), torch.randn(lk, hk, d)
        qpos, kpos = torch.arange(q0, q0 + lq), torch.arange(k0, k0 + lk)
        kind, off = block_mask(q0, lq, k0, lk)
        out, lse = local_attention(q, k, v, kind, off, backend=backend)
        ref_out, ref_lse, leaves = reference(q, k, v, qpos, kpos)
        assert out.shape == (lq, hq, d) and lse.shape == (hq, lq) and lse.dtype == torch.float32
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), seen), (trial, kind, off)
        if kind == NONE:
            assert out.abs().max() == 0
        else:
            worst["out"] = max(worst["out"], rel(out, ref_out))
        if seen.any():
            worst["lse"] = max(worst["lse"], (lse[seen].double() - ref_lse[seen]).abs().max().item())
            do = torch.randn_like(out)
            (ref_out * do.double()).sum().backward()
            dq, dk, dv = local_attention_backward(
                do, q, k, v, ref_out.float().detach(), ref_lse.float().detach(), kind, off, backend=backend
            )
            for got, leaf in zip((dq, dk, dv), leaves):
                worst["grad"] = max(worst["grad"], rel(got, leaf.grad))
    for what, err in worst.items():
        within(err, TOL, f"{backend}: {what} over 40 random blocks")


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_and_blockwise_backward(backend, within):
    """Split the keys into uneven blocks: merging the block results and summing the per-block
    gradients (each computed with the merged out/lse) reproduces dense causal attention."""
    torch.manual_seed(1)
    L, hq, hk, d = 53, 6, 2, 8
    q, k, v = torch.randn(L, hq, d), torch.randn(L, hk, d), torch.randn(L, hk, d)
    pos = torch.arange(L)
    ref_out, ref_lse, leaves = reference(q, k, v, pos, pos)
    do = torch.randn(L, hq, d)
    (ref_out * do.double()).sum().backward()
    cuts = [0, 7, 20, 21, 40, L]
    acc = torch.zeros(L, hq, d)
    acc_lse = torch.full((hq, L), float("-inf"))
    for a, b in zip(cuts, cuts[1:]):
        kind, off = block_mask(0, L, a, b - a)
        merge_(acc, acc_lse, *local_attention(q, k[a:b], v[a:b], kind, off, backend=backend))
    within(rel(acc, ref_out), TOL, f"{backend}: merged out")
    within((acc_lse.double() - ref_lse).abs().max().item(), TOL, f"{backend}: merged lse")
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for a, b in zip(cuts, cuts[1:]):
        kind, off = block_mask(0, L, a, b - a)
        g = local_attention_backward(do, q, k[a:b], v[a:b], acc, acc_lse, kind, off, backend=backend)
        dq += g[0]
        dk[a:b] += g[1]
        dv[a:b] += g[2]
    within(max(rel(got, leaf.grad) for got, leaf in zip((dq, dk, dv), leaves)), TOL, f"{backend}: blockwise dq, dk, dv")


def test_merge_handles_empty_rows():
    acc = torch.zeros(3, 1, 2)
    acc_lse = torch.full((1, 3), float("-inf"))
    out = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]])
    lse = torch.tensor([[0.5, float("-inf"), 0.0]])
    merge_(acc, acc_lse, out, lse)
    assert torch.equal(acc[0], out[0]) and torch.equal(acc[1], torch.zeros(1, 2)) and torch.isneginf(acc_lse[0, 1])
    assert not torch.isnan(acc).any() and not torch.isnan(acc_lse[0, [0, 2]]).any()


def test_bf16_close_to_fp32(within):
    torch.manual_seed(2)
    L, h, d = 96, 4, 16
    q, k, v = torch.randn(L, h, d), torch.randn(L, h, d), torch.randn(L, h, d)
    o32, l32 = local_attention(q, k, v, CAUSAL, 0, backend="cpu")
    o16, l16 = local_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), CAUSAL, 0)
    assert o16.dtype == torch.bfloat16 and l16.dtype == torch.float32
    within(rel(o16, o32), BF16, "bf16 out")
    within((l16 - l32).abs().max().item(), BF16, "bf16 lse")
    g = local_attention_backward(torch.ones_like(o16), q.bfloat16(), k.bfloat16(), v.bfloat16(), o16, l16, CAUSAL, 0)
    g32 = local_attention_backward(torch.ones_like(o32), q, k, v, o32, l32, CAUSAL, 0)
    within(max(rel(a, b) for a, b in zip(g, g32)), BF16, "bf16 gradients")


def test_backend_selection_on_cpu():
    assert select_backend(torch.zeros(1, 1, 8)) == "cpu"
    with pytest.raises(ValueError):
        local_attention(torch.zeros(2, 3, 4), torch.zeros(2, 2, 4), torch.zeros(2, 2, 4))
