"""Fixtures shared by several test files."""

import json
import os

import pytest

from hexiseq.specs import ClusterSpec, load_cluster


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
