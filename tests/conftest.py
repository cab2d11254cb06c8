"""Fixtures shared by several test files."""

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
