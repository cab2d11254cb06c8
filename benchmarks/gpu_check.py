"""One-CUDA-device check of the attention kernels, and TFLOP/s figures to calibrate the cost model.

    python benchmarks/gpu_check.py [--json out.json] [--profile data/profiles/NAME.yaml] [--gpu H100-SXM]

1. Correctness, bf16 against an fp32 reference (the "math" backend in fp32): the flash-attn backend
   (when flash_attn imports) and the torch backend, for every mask kind the executor produces
   (full, causal on the diagonal, causal with positive and negative offsets, GQA) and for a
   blockwise LSE merge whose per-block backward (with the merged out/lse) must sum to the dense
   gradients. Checks out, lse, dq, dk, dv.
2. Speed: bf16 GEMM TFLOP/s and causal attention forward+backward TFLOP/s (flash-attn through our
   kernel interface; PyTorch SDPA when flash-attn is missing), as fractions of the GPU's peak:
   `eff_matmul` and `eff_attention` for `data/profiles/` (format in data/profiles/README.md).

Installs nothing; a few minutes at most. Without CUDA it prints SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hexiseq.runtime.kernels import block_mask, flash_available, local_attention, local_attention_backward, merge_  # noqa: E402

# Dense BF16 peaks (TFLOP/s) if data/gpus.yaml cannot be read; names as in the catalog.
PEAKS = {
    "H100-SXM": 989,
    "H200": 989,
    "A100-80GB": 312,
    "A100-40GB": 312,
    "A800": 312,
    "L40S": 362,
    "B200": 2250,
    "RTX-4090": 165,
    "RTX-A6000": 155,
}
# Substrings of torch.cuda.get_device_name() -> catalog name (first match wins).
NAMES = [
    ("H200", "H200"),
    ("H100", "H100-SXM"),
    ("A800", "A800"),
    ("A100-SXM4-40GB", "A100-40GB"),
    ("A100 40GB", "A100-40GB"),
    ("A100", "A100-80GB"),
    ("L40S", "L40S"),
    ("B200", "B200"),
    ("4090", "RTX-4090"),
    ("A6000", "RTX-A6000"),
]
TOL = 2e-2  # bf16 against fp32: relative (max abs diff / max abs reference)
DEVICE = "cuda"  # --dry-run-cpu switches the correctness part to CPU to check this script without a GPU


def catalog_name(device_name: str) -> str | None:
    return next((cat for sub, cat in NAMES if sub in device_name), None)


def peak_tflops(name: str | None) -> float | None:
    try:
        import yaml

        cat = yaml.safe_load((ROOT / "data" / "gpus.yaml").read_text())
        if name in cat:
            return float(cat[name]["peak_bf16_tflops"])
    except Exception:  # no yaml / no catalog: fall back to the table above
        pass
    return PEAKS.get(name) if name else None


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)


def _block_case(lq, lk, q0, k0, hq, hk, d, backends, gen):
    q = torch.randn(lq, hq, d, device=DEVICE, generator=gen)
    k, v = torch.randn(lk, hk, d, device=DEVICE, generator=gen), torch.randn(lk, hk, d, device=DEVICE, generator=gen)
    do = torch.randn(lq, hq, d, device=DEVICE, generator=gen)
    kind, off = block_mask(q0, lq, k0, lk)
    ro, rl = local_attention(q, k, v, kind, off, backend="math")
    rg = local_attention_backward(do, q, k, v, ro, rl, kind, off, backend="math")
    seen = torch.isfinite(rl)
    res = {}
    for b in backends:
        qb, kb, vb, dob = (t.bfloat16() for t in (q, k, v, do))
        o, lse = local_attention(qb, kb, vb, kind, off, backend=b)
        g = local_attention_backward(dob, qb, kb, vb, o, lse, kind, off, backend=b)
        res[b] = {
            "out": rel(o, ro),
            "lse_abs": (lse[seen] - rl[seen]).abs().max().item() if seen.any() else 0.0,
            "empty_rows_ok": bool(torch.equal(torch.isfinite(lse), seen)),
            **{n: rel(x, y) for n, x, y in zip(("dq", "dk", "dv"), g, rg)},
        }
    return f"{kind}{off:+d} q{lq}xk{lk} h{hq}/{hk} d{d}", res


def _merge_case(L, hq, hk, d, cuts, backends, gen):
    """Keys cut into blocks: merged block outputs and summed per-block grads vs one causal call."""
    q = torch.randn(L, hq, d, device=DEVICE, generator=gen)
    k, v = torch.randn(L, hk, d, device=DEVICE, generator=gen), torch.randn(L, hk, d, device=DEVICE, generator=gen)
    do = torch.randn(L, hq, d, device=DEVICE, generator=gen)
    ro, rl = local_attention(q, k, v, "causal", 0, backend="math")
    rg = local_attention_backward(do, q, k, v, ro, rl, "causal", 0, backend="math")
    res = {}
    for b in backends:
        qb, kb, vb, dob = (t.bfloat16() for t in (q, k, v, do))
        acc = torch.zeros(L, hq, d, device=DEVICE)
        lse = torch.full((hq, L), float("-inf"), device=DEVICE)
        for a, e in zip(cuts, cuts[1:]):
            kind, off = block_mask(0, L, a, e - a)
            merge_(acc, lse, *local_attention(qb, kb[a:e], vb[a:e], kind, off, backend=b))
        grads = [torch.zeros(t.shape, device=DEVICE) for t in (q, k, v)]
        for a, e in zip(cuts, cuts[1:]):
            kind, off = block_mask(0, L, a, e - a)
            gq, gk, gv = local_attention_backward(dob, qb, kb[a:e], vb[a:e], acc, lse, kind, off, backend=b)
            grads[0] += gq
            grads[1][a:e] += gk
            grads[2][a:e] += gv
        res[b] = {
            "out": rel(acc, ro),
            "lse_abs": (lse - rl).abs().max().item(),
            "empty_rows_ok": True,
            **{n: rel(x, y) for n, x, y in zip(("dq", "dk", "dv"), grads, rg)},
        }
    return f"merge causal L{L} cuts{cuts[1:-1]} h{hq}/{hk} d{d}", res


def correctness(backends: list[str]) -> tuple[list, bool]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rows = [
        _block_case(1024, 1024, 4096, 4096, 16, 4, 128, backends, gen),  # zigzag diagonal block
        _block_case(512, 1536, 2048, 1024, 16, 4, 128, backends, gen),  # causal, offset +1024
        _block_case(384, 640, 9000, 0, 8, 8, 64, backends, gen),  # full (earlier group's chunk)
        _block_case(300, 500, 900, 1000, 12, 3, 128, backends, gen),  # causal, offset -100: empty rows
        _block_case(200, 64, 0, 5000, 8, 2, 64, backends, gen),  # none
        _merge_case(2048, 16, 4, 128, [0, 700, 1300, 2048], backends, gen),
    ]
    ok = all(
        r["empty_rows_ok"] and r["lse_abs"] < TOL and max(r[n] for n in ("out", "dq", "dk", "dv")) < TOL
        for _, per in rows
        for r in per.values()
    )
    return rows, ok


def backend_agreement(first: str, second: str) -> tuple[list, bool]:
    """Two backends on the same bf16 inputs, no reference: relative differences of out, dq, dk, dv
    (lse absolute, on the rows that see a key), per mask kind; ok when all are below TOL."""
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    rows = []
    for q0, lq, k0, lk in ((4096, 1024, 4096, 1024), (2048, 512, 1024, 1536), (9000, 384, 0, 640)):
        q = torch.randn(lq, 16, 128, device=DEVICE, generator=gen).bfloat16()
        k, v = (torch.randn(lk, 4, 128, device=DEVICE, generator=gen).bfloat16() for _ in range(2))
        do = torch.randn(lq, 16, 128, device=DEVICE, generator=gen).bfloat16()
        kind, off = block_mask(q0, lq, k0, lk)
        res = []
        for b in (first, second):
            o, lse = local_attention(q, k, v, kind, off, backend=b)
            res.append((o, lse, *local_attention_backward(do, q, k, v, o, lse, kind, off, backend=b)))
        (o1, l1, *g1), (o2, l2, *g2) = res
        seen = torch.isfinite(l2)
        diff = {"out": rel(o1, o2), **{n: rel(x, y) for n, x, y in zip(("dq", "dk", "dv"), g1, g2)}}
        diff["lse_abs"] = (l1[seen] - l2[seen]).abs().max().item() if seen.any() else 0.0
        rows.append((f"{kind}{off:+d} q{lq}xk{lk} {first} vs {second}", diff))
    return rows, all(max(d.values()) < TOL for _, d in rows)


def _cuda_time(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    a, b = (
        torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16),
        torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16),
    )
    return 2 * n**3 / _cuda_time(lambda: a @ b, iters) / 1e12


def attention_tflops(seq: int, heads: int, d: int, use_flash: bool, iters: int = 5) -> dict:
    """Causal fwd / fwd+bwd TFLOP/s, counting useful (unmasked) FLOPs: fwd 2*S^2*H*d, bwd 2.5x fwd."""
    q = torch.randn(seq, heads, d, device=DEVICE, dtype=torch.bfloat16)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    fwd_flops = 2.0 * seq * seq * heads * d
    if use_flash:
        fwd = lambda: local_attention(q, k, v, "causal", 0, backend="flash")  # noqa: E731
        o, lse = fwd()
        both = lambda: (fwd(), local_attention_backward(do, q, k, v, o, lse, "causal", 0, backend="flash"))  # noqa: E731
    else:
        import torch.nn.functional as F

        qs, ks, vs = (t.transpose(0, 1)[None].requires_grad_() for t in (q, k, v))
        fwd = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)  # noqa: E731
        both = lambda: torch.autograd.grad(fwd(), (qs, ks, vs), do.transpose(0, 1)[None])  # noqa: E731
    t_f, t_fb = _cuda_time(fwd, iters), _cuda_time(both, iters)
    return {
        "seq": seq,
        "heads": heads,
        "dim": d,
        "fwd_tflops": fwd_flops / t_f / 1e12,
        "fwd_bwd_tflops": 3.5 * fwd_flops / t_fb / 1e12,
        "fwd_ms": t_f * 1e3,
        "fwd_bwd_ms": t_fb * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", help="catalog name (default: from the device name)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--profile", type=Path, help="write a data/profiles YAML with the measured efficiencies")
    ap.add_argument("--quick", action="store_true", help="smaller speed runs")
    ap.add_argument(
        "--dry-run-cpu", action="store_true", help="run the correctness part on CPU (torch backends) and stop"
    )
    a = ap.parse_args(argv)
    if a.dry_run_cpu:
        global DEVICE
        DEVICE = "cpu"
        rows, ok = correctness(["cpu", "math"])
        for label, per in rows:
            print(label, {b: {n: f"{x:.1e}" for n, x in r.items() if n != "empty_rows_ok"} for b, r in per.items()})
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False); nothing measured")
        return 0
    t_start = time.time()
    dev = torch.cuda.get_device_name()
    name = a.gpu or catalog_name(dev)
    peak = peak_tflops(name)
    flash = flash_available()
    try:
        import flash_attn

        flash_version = flash_attn.__version__
    except Exception as e:  # reported, not fatal: the torch backend is still checked
        flash_version = f"not available ({type(e).__name__}: {e})"
    print(
        f"device {dev!r} -> catalog {name!r}, peak bf16 {peak} TFLOP/s; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}; flash-attn {flash_version}"
    )
    backends = (["flash"] if flash else []) + ["math"]
    rows, ok = correctness(backends)
    print(f"\ncorrectness, bf16 vs fp32 reference (relative; lse absolute), tolerance {TOL}:")
    for label, per in rows:
        for b, r in per.items():
            print(
                f"  {label:<42} {b:<6} out {r['out']:.2e} lse {r['lse_abs']:.2e} dq {r['dq']:.2e} "
                f"dk {r['dk']:.2e} dv {r['dv']:.2e}{'' if r['empty_rows_ok'] else '  EMPTY-ROW MISMATCH'}"
            )
    if flash:
        agreement, agree = backend_agreement("flash", "math")
        print(f"\nflash-attn vs the torch backend, same bf16 inputs, tolerance {TOL}:")
        for label, d in agreement:
            print(f"  {label:<42} " + " ".join(f"{n} {x:.2e}" for n, x in d.items()))
        ok = ok and agree
    print(f"  -> {'PASS' if ok else 'FAIL'}")
    mm = matmul_tflops(4096 if a.quick else 8192)
    shapes = [(4096, 16, 128)] if a.quick else [(8192, 32, 128), (16384, 32, 128), (16384, 16, 64)]
    attn = [attention_tflops(s, h, d, flash) for s, h, d in shapes]
    best = max(x["fwd_bwd_tflops"] for x in attn)
    print(f"\nbf16 GEMM: {mm:.1f} TFLOP/s" + (f" = {mm / peak:.3f} of peak" if peak else ""))
    for x in attn:
        print(
            f"causal attention ({'flash-attn' if flash else 'torch SDPA'}) S={x['seq']} H={x['heads']} d={x['dim']}: "
            f"fwd {x['fwd_tflops']:.1f}, fwd+bwd {x['fwd_bwd_tflops']:.1f} TFLOP/s "
            f"({x['fwd_ms']:.2f} / {x['fwd_bwd_ms']:.2f} ms)"
        )
    result = {
        "device": dev,
        "gpu": name,
        "peak_bf16_tflops": peak,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flash_attn": flash_version,
        "attention_kernel": "flash-attn" if flash else "torch-sdpa",
        "correct": ok,
        "correctness": [{"case": lab, **{b: r for b, r in per.items()}} for lab, per in rows],
        "matmul_tflops": mm,
        "attention": attn,
        "seconds": time.time() - t_start,
    }
    if peak:
        result["eff_matmul"], result["eff_attention"] = round(mm / peak, 3), round(best / peak, 3)
        effs = f"    eff_matmul: {result['eff_matmul']}\n    eff_attention: {result['eff_attention']}\n"
        entry = f"gpus:\n  {name}:\n{effs}"
        print(f"\nprofile entry:\n{entry}", end="")
        if a.profile:
            a.profile.parent.mkdir(parents=True, exist_ok=True)
            a.profile.write_text(
                f"# Measured by benchmarks/gpu_check.py on {dev!r}, torch {torch.__version__}, "
                f"flash-attn {flash_version}.\n"
                f"# GEMM {mm:.1f} TFLOP/s; best causal attention fwd+bwd {best:.1f} TFLOP/s "
                f"({result['attention_kernel']}).\n{entry}"
            )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ndone in {result['seconds']:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
