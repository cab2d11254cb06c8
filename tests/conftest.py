"""Fixtures shared by several test files."""

import json
import os

import pytest

from hexiseq.specs import ClusterSpec, load_cluster

_GPU_SKIPPED = pytest.StashKey[tuple[int, str]]()


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped, with the reason, where torch sees no CUDA device (they show as
    skipped, and the summary says how many and why, instead of vanishing)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # only when a GPU test was collected: the core tests run without torch

    if torch.cuda.is_available():
        return
    reason = "needs a CUDA device: torch.cuda.is_available() is False"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
    config.stash[_GPU_SKIPPED] = (len(gpu_items), reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _GPU_SKIPPED in config.stash:
        count, reason = config.stash[_GPU_SKIPPED]
        terminalreporter.write_line(f"{count} gpu test{'s' * (count != 1)} skipped: {reason}")


@pytest.fixture(scope="module")
def testbed():
    """The paper's 8-GPU mixed testbed: 4 H100 + 4 A100 in two nodes."""
    return load_cluster("testbed-8")


@pytest.fixture(scope="module")
def mixed():
    """Two H100 and two A100, each pair in its own node (small planner cases)."""
    return ClusterSpec.from_nodes("mixed-4", [("H100-SXM", 2, 25), ("A100-80GB", 2, 25)])


@pytest.fixture(scope="module")
def node8():
    """One node of 8 H100s."""
    return ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])


@pytest.fixture(scope="module")
def h100x16():
    """Two nodes of 8 H100s."""
    return ClusterSpec.from_nodes("h100x16", [("H100-SXM", 8, 50), ("H100-SXM", 8, 50)])


@pytest.fixture
def within(request):
    """`within(err, tol, what)`: assert a measured numeric error is at most its tolerance, and record
    it (test, what, error, tolerance, thread settings) in the JSON-lines file named by
    HEXISEQ_NUMERICS_LOG, from which `.ci/numerics_audit.py` builds the margin table."""
    log = os.environ.get("HEXISEQ_NUMERICS_LOG")

    def check(err: float, tol: float, what: str = "") -> None:
        if log:
            with open(log, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "test": request.node.nodeid,
                            "what": what,
                            "err": float(err),
                            "tol": float(tol),
                            "omp": os.environ.get("OMP_NUM_THREADS"),
                            "rank_threads": os.environ.get("HEXISEQ_RANK_THREADS"),
                        }
                    )
                    + "\n"
                )
        assert err <= tol, f"{what}: error {err:.3g} above its tolerance {tol:.3g}"

    return check
