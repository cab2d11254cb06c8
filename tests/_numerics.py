"""Error measures shared by the numerics tests (imported by the test modules; see conftest's `within`)."""

from __future__ import annotations

import torch

# Tolerances of the numerics tests (relative errors unless a test says otherwise). fp32 rounding of
# these checks is ~1e-6 relative (max |a - b| / max |b|); 1e-4 keeps >= 10x margin on any CPU and
# thread count while a real layout bug shows up at 1e-2 or more. bf16 rounds at ~8e-3.
FP32 = 1e-4
BF16 = 1e-1
FP64 = 1e-10


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|, in float64 (0 for two empty tensors)."""
    if ref.numel() == 0:
        return 0.0
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-300)).item()


def abs_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| in float64 (0 for two empty tensors)."""
    return 0.0 if ref.numel() == 0 else (got.double() - ref.double()).abs().max().item()
