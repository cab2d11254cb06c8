"""The attention kernels on one CUDA device (benchmarks/gpu_check.py's checks): every mask kind the
executor produces and a blockwise LSE merge, bf16 against an fp32 reference, for the torch backend
and the flash-attn backend; and flash-attn against the torch backend on the same inputs."""

import pytest

from hexiseq.runtime.kernels import flash_available

pytestmark = pytest.mark.gpu

needs_flash = pytest.mark.skipif(not flash_available(), reason="flash-attn does not import on this machine")


def _failures(rows, tol):
    """The (case, backend, errors) of every case outside gpu_check's tolerance."""
    return [
        (label, backend, r)
        for label, per in rows
        for backend, r in per.items()
        if not (r["empty_rows_ok"] and r["lse_abs"] < tol and max(r[n] for n in ("out", "dq", "dk", "dv")) < tol)
    ]


@pytest.mark.parametrize("backend", ["math", pytest.param("flash", marks=needs_flash)])
def test_backend_matches_the_fp32_reference(gpu_check, backend):
    rows, ok = gpu_check.correctness([backend])
    assert ok, _failures(rows, gpu_check.TOL)


@needs_flash
def test_flash_matches_the_torch_backend(gpu_check):
    rows, ok = gpu_check.backend_agreement("flash", "math")
    assert ok, rows
