"""One distributed training step on one CUDA device (NCCL, bf16 autocast, the CUDA attention
backend) against the same step on one device with dense attention: the check `hexiseq verify` runs."""

import pytest

from hexiseq.plan import ring_plan
from hexiseq.runtime.verify import prepare_check, verify_plan

pytestmark = pytest.mark.gpu


def test_one_rank_nccl_step_matches_the_single_device_reference():
    setup = prepare_check(ring_plan([0], 4096, 8, 4, block_size=128), model="tiny")
    result = verify_plan(setup, seed=0, timeout_s=120.0, time_limit_s=300.0)
    assert (result["backend"], result["dtype"]) == ("nccl", "bf16")
    assert result["passed"], result
