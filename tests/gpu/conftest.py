"""The GPU tests reuse the checks of benchmarks/gpu_check.py (a script, not a package: loaded by path)."""

import importlib.util
from pathlib import Path

import pytest

GPU_CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="session")
def gpu_check():
    """benchmarks/gpu_check.py as a module (its correctness cases run on "cuda")."""
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
