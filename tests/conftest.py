"""Fixtures shared by several test files."""

import pytest

from hexiseq.specs import load_cluster


@pytest.fixture(scope="module")
def testbed():
    """The paper's 8-GPU mixed testbed: 4 H100 + 4 A100 in two nodes."""
    return load_cluster("testbed-8")
