"""Local attention kernels: one query block against one key block, returning `(out, lse)`, and
the exact backward of such a block given the *merged* (global) out and lse of its queries.

Layout: q [Lq, Hq, d], k and v [Lk, Hk, d] (sequence first, like flash-attn without the batch
dimension), Hq a multiple of Hk (GQA: query head h uses key head h // (Hq // Hk)).
out [Lq, Hq, d] in q's dtype, lse [Hq, Lq] in the accumulation dtype `acc_dtype(q.dtype)` (fp32, or
fp64 for fp64 inputs, so float64 checks stay exact; natural log; -inf for a query that sees no key).

Masks are described by `(kind, offset)`: "full" (every key), "none" (no key) or "causal", where
query i may see key j iff j <= i + offset. `block_mask` derives them from global positions, so
the caller never special-cases zigzag chunks.

Backends (chosen by `select_backend`, or by name):
- "cpu":   aten `_scaled_dot_product_flash_attention_for_cpu` forward/backward (flash-style, bounded memory);
- "math":  plain torch matmuls in fp32, chunked over query rows (any device, the numeric reference);
- "flash": flash-attn 2.x on CUDA, imported lazily and only when a CUDA tensor asks for it.
The backward of a block with the global out/lse gives that block's exact share of dq, dk, dv
(softmax weights exp(s - lse_global) are the true probabilities), which is what ring attention needs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..schedule import CAUSAL, FULL, MASK_KINDS, NONE, block_mask  # noqa: F401 - the mask rules live with the schedule

# Elements of one fp32 score tile in the masked / math paths (64 MiB): bounds memory per chunk.
TILE_ELEMENTS = 1 << 24


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype partial results are accumulated in: fp32 for bf16/fp16/fp32 (the softmax statistics
    of a bf16 run stay accurate), fp64 for fp64 (equivalence checks at ~1e-12)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pieces(lq: int, lk: int, kind: str, offset: int) -> list[tuple[int, int, int, str, int]]:
    """Normalize a mask into row pieces (row_start, row_end, key_end, kind, offset).

    Rows outside every piece see no key. A causal piece always satisfies key_end == rows + offset
    with offset >= 0 (bottom-right aligned, as flash-attn wants), so every row sees >= 1 key.
    """
    if kind not in MASK_KINDS:
        raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")
    if kind == NONE or lq == 0 or lk == 0:
        return []
    if kind == FULL:
        return [(0, lq, lk, FULL, 0)]
    first = max(0, -offset)  # rows before `first` see no key
    if first >= lq:
        return []
    full_from = max(first, min(lq, lk - 1 - offset))  # rows from here on see every key
    out = []
    if full_from > first:
        out.append((first, full_from, full_from + offset, CAUSAL, first + offset))
    if full_from < lq:
        out.append((full_from, lq, lk, FULL, 0))
    return out


def _row_chunks(rows: int, keys: int, heads: int) -> int:
    return max(1, min(rows, TILE_ELEMENTS // max(1, keys * heads)))


def _causal_bias(rows: int, keys: int, offset: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    i = torch.arange(rows, device=device)[:, None]
    j = torch.arange(keys, device=device)[None, :]
    return torch.zeros(rows, keys, dtype=dtype, device=device).masked_fill_(j > i + offset, float("-inf"))


def _expand_kv(t: Tensor, hq: int) -> Tensor:
    return t if t.shape[1] == hq else t.repeat_interleave(hq // t.shape[1], dim=1)


def _reduce_kv(g: Tensor, hk: int) -> Tensor:
    return g if g.shape[1] == hk else g.unflatten(1, (hk, g.shape[1] // hk)).sum(2)


# --------------------------------------------------------------------------- math backend


def _math_fwd(q: Tensor, k: Tensor, v: Tensor, kind: str, offset: int, scale: float) -> tuple[Tensor, Tensor]:
    hq = q.shape[1]
    acc = acc_dtype(q.dtype)
    k, v = _expand_kv(k, hq).to(acc), _expand_kv(v, hq).to(acc)
    s = torch.einsum("qhd,khd->hqk", q.to(acc), k) * scale
    if kind == CAUSAL:
        s = s + _causal_bias(q.shape[0], k.shape[0], offset, s.dtype, s.device)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]), v)
    return out.to(q.dtype), lse


def _math_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, kind: str, offset: int, scale: float
):
    hq, hk = q.shape[1], k.shape[1]
    acc = acc_dtype(q.dtype)
    kf, vf, qf, dof = _expand_kv(k, hq).to(acc), _expand_kv(v, hq).to(acc), q.to(acc), do.to(acc)
    s = torch.einsum("qhd,khd->hqk", qf, kf) * scale
    if kind == CAUSAL:
        s = s + _causal_bias(q.shape[0], k.shape[0], offset, s.dtype, s.device)
    p = torch.exp(s - lse[..., None])
    dv = torch.einsum("hqk,qhd->khd", p, dof)
    dp = torch.einsum("qhd,khd->hqk", dof, vf)
    delta = (dof * o.to(acc)).sum(-1).transpose(0, 1)  # [H, Lq]
    ds = p * (dp - delta[..., None])
    dq = torch.einsum("hqk,khd->qhd", ds, kf) * scale
    dk = torch.einsum("hqk,qhd->khd", ds, qf) * scale
    return dq.to(q.dtype), _reduce_kv(dk, hk).to(k.dtype), _reduce_kv(dv, hk).to(v.dtype)


# --------------------------------------------------------------------------- aten CPU backend

_CPU_FWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _bhld(t: Tensor) -> Tensor:
    return t.transpose(0, 1).unsqueeze(0)


def _cpu_fwd(q: Tensor, k: Tensor, v: Tensor, kind: str, offset: int, scale: float) -> tuple[Tensor, Tensor]:
    hq = q.shape[1]
    k, v = _expand_kv(k, hq), _expand_kv(v, hq)
    is_causal = kind == CAUSAL and offset == 0 and q.shape[0] == k.shape[0]
    bias = _causal_bias(q.shape[0], k.shape[0], offset, q.dtype, q.device) if kind == CAUSAL and not is_causal else None
    out, lse = _CPU_FWD(_bhld(q), _bhld(k), _bhld(v), 0.0, is_causal, attn_mask=bias, scale=scale)
    return out[0].transpose(0, 1), lse[0].to(acc_dtype(q.dtype))


def _cpu_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, kind: str, offset: int, scale: float):
    hq, hk = q.shape[1], k.shape[1]
    ke, ve = _expand_kv(k, hq), _expand_kv(v, hq)
    is_causal = kind == CAUSAL and offset == 0 and q.shape[0] == k.shape[0]
    bias = _causal_bias(q.shape[0], k.shape[0], offset, q.dtype, q.device) if kind == CAUSAL and not is_causal else None
    dq, dk, dv = _CPU_BWD(
        _bhld(do).contiguous(),
        _bhld(q),
        _bhld(ke),
        _bhld(ve),
        _bhld(o.to(q.dtype)).contiguous(),
        lse.unsqueeze(0).contiguous(),
        0.0,
        is_causal,
        attn_mask=bias,
        scale=scale,
    )
    f = lambda t: t[0].transpose(0, 1)  # noqa: E731
    acc = acc_dtype(q.dtype)
    return f(dq), _reduce_kv(f(dk).to(acc), hk).to(k.dtype), _reduce_kv(f(dv).to(acc), hk).to(v.dtype)


# --------------------------------------------------------------------------- flash-attn backend


@functools.lru_cache(maxsize=1)
def flash_available() -> bool:
    """True when CUDA is up and flash-attn 2.x imports (never tried without CUDA)."""
    if not torch.cuda.is_available():
        return False
    try:
        import flash_attn.flash_attn_interface  # noqa: F401
    except Exception:  # any import failure means: no flash backend
        return False
    return True


def _call_by_name(fn: Callable, kwargs: dict) -> object:
    """Call a flash-attn internal with the keyword arguments its version accepts (2.x moved them)."""
    target = getattr(fn, "_init_fn", fn)  # torch.library custom ops keep the Python function here
    names = inspect.signature(target).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in names})


def _flash_fwd(q: Tensor, k: Tensor, v: Tensor, kind: str, offset: int, scale: float) -> tuple[Tensor, Tensor]:
    from flash_attn import flash_attn_interface as fi

    kw = dict(
        q=q[None].contiguous(),
        k=k[None].contiguous(),
        v=v[None].contiguous(),
        dropout_p=0.0,
        softmax_scale=scale,
        causal=kind == CAUSAL,
        window_size=(-1, -1),
        window_size_left=-1,
        window_size_right=-1,
        softcap=0.0,
        alibi_slopes=None,
        return_softmax=False,
    )
    res = _call_by_name(fi._flash_attn_forward, kw)
    out, lse = (res[0], res[5]) if len(res) == 8 else (res[0], res[1])  # 2.5/2.6 vs 2.7+ return tuples
    return out[0], lse[0].float()


def _flash_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, kind: str, offset: int, scale: float
):
    from flash_attn import flash_attn_interface as fi

    q4, k4, v4 = q[None].contiguous(), k[None].contiguous(), v[None].contiguous()
    dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)
    kw = dict(
        dout=do[None].contiguous(),
        q=q4,
        k=k4,
        v=v4,
        out=o.to(q.dtype)[None].contiguous(),
        softmax_lse=lse[None].contiguous(),
        dq=dq,
        dk=dk,
        dv=dv,
        dropout_p=0.0,
        softmax_scale=scale,
        causal=kind == CAUSAL,
        window_size=(-1, -1),
        window_size_left=-1,
        window_size_right=-1,
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        rng_state=None,
    )
    _call_by_name(fi._flash_attn_backward, kw)  # writes dq, dk, dv in place (GQA summed by the kernel)
    return dq[0], dk[0], dv[0]


# --------------------------------------------------------------------------- dispatch

_BACKENDS = {"math": (_math_fwd, _math_bwd), "cpu": (_cpu_fwd, _cpu_bwd), "flash": (_flash_fwd, _flash_bwd)}


def select_backend(t: Tensor) -> str:
    """flash on CUDA in fp16/bf16 when flash-attn imports; the aten CPU kernel on CPU; math otherwise."""
    if t.is_cuda:
        ok = t.dtype in (torch.float16, torch.bfloat16) and t.shape[-1] % 8 == 0 and t.shape[-1] <= 256
        return "flash" if ok and flash_available() else "math"
    return "cpu" if _CPU_FWD is not None and _CPU_BWD is not None else "math"


def _tiles(piece: tuple[int, int, int, str, int], heads: int, backend: str) -> list[tuple[int, int, int, str, int]]:
    """Cut a piece into row tiles where the backend would otherwise materialize rows x keys scores."""
    r0, r1, kend, kind, off = piece
    dense = backend == "math" or (backend == "cpu" and kind == CAUSAL and not (off == 0 and kend == r1 - r0))
    if not dense:
        return [piece]
    step = _row_chunks(r1 - r0, kend, heads)
    out = []
    for a in range(r0, r1, step):
        b = min(r1, a + step)
        out.append((a, b, kend, FULL, 0) if kind == FULL else (a, b, (b - r0) + off, CAUSAL, off + (a - r0)))
    return out


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"expected q [Lq,Hq,d], k and v [Lk,Hk,d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of key heads {k.shape[1]}")


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask_kind: str = FULL,
    offset: int = 0,
    scale: float | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention of one query block against one key block: (out [Lq,Hq,d], lse [Hq,Lq] fp32)."""
    _check(q, k, v)
    lq, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    name = backend or select_backend(q)
    fwd = _BACKENDS[name][0]
    out = q.new_zeros(lq, hq, v.shape[2])
    lse = torch.full((hq, lq), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)
    for piece in _pieces(lq, k.shape[0], mask_kind, offset):
        for r0, r1, kend, kind, off in _tiles(piece, hq, name):
            o, tile_lse = fwd(q[r0:r1], k[:kend], v[:kend], kind, off, scale)
            out[r0:r1] = o
            lse[:, r0:r1] = tile_lse
    return out, lse


def local_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask_kind: str = FULL,
    offset: int = 0,
    scale: float | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of one block. `out`/`lse` are the merged ones of these queries over *all* key blocks,
    so the block's dq/dk/dv are its exact share of the full gradients. Returned in `acc_dtype(q.dtype)`."""
    _check(q, k, v)
    lq, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    name = backend or select_backend(q)
    bwd = _BACKENDS[name][1]
    acc = acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for piece in _pieces(lq, k.shape[0], mask_kind, offset):
        for r0, r1, kend, kind, off in _tiles(piece, hq, name):
            a, b, c = bwd(dout[r0:r1], q[r0:r1], k[:kend], v[:kend], out[r0:r1], lse[:, r0:r1], kind, off, scale)
            dq[r0:r1] += a
            dk[:kend] += b
            dv[:kend] += c
    return dq, dk, dv


def merge_(acc_out: Tensor, acc_lse: Tensor, out: Tensor, lse: Tensor) -> None:
    """Fold a partial result (out, lse) into the accumulators (acc_dtype) in place, with the stable rule
    o <- o + sigmoid(lse_b - lse_a) * (o_b - o_a), lse <- logaddexp(lse_a, lse_b).
    A side with lse = -inf (no key seen) has weight 0; both -inf leaves the row empty."""
    w = torch.sigmoid(lse - acc_lse)
    w = torch.where(torch.isneginf(lse), torch.zeros_like(w), w)  # also clears -inf - -inf = nan
    acc_out.add_(w.transpose(0, 1).unsqueeze(-1) * (out.to(acc_out.dtype) - acc_out))
    acc_lse.copy_(torch.logaddexp(acc_lse, lse))
