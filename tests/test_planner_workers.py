"""The joint planner with worker processes (planner/workers.py): the same plan, step, bounds and
search as in one process, whatever the number of workers; bad worker counts refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hexiseq import Workload, get_model
from hexiseq.errors import HexiSeqError
from hexiseq.planner import plan_joint
from hexiseq.planner.joint import to_dict
from hexiseq.planner.workers import Jobs, available_cores, resolve_workers
from hexiseq.specs import ClusterSpec, NodeSpec, get_gpu

# what may differ between runs: wall times and the worker count itself
_TIMING = ("plan_time_s", "workers")


def _comparable(res) -> dict:
    d = to_dict(res)
    for k in _TIMING:
        d.pop(k)
    d["shapes_planned"] = res.shapes_planned
    d["dp1_plan"] = None if res.dp1 is None else res.dp1.plan.to_dict()
    return d


@pytest.mark.parametrize(
    "case",
    [
        # replica shapes of whole nodes and rate-balanced unions, the DP = 1 plan beside them
        (
            [NodeSpec(get_gpu("H100-SXM"), 4, 50.0, None)] + [NodeSpec(get_gpu("A100-80GB"), 4, 25.0, None)] * 5,
            "gpt-7b",
            Workload(seq_len=32 * 1024, global_batch=3, activation_checkpointing="auto"),
        ),
        # shapes that fit only with the states sharded over the partition: planned again in this process
        (
            [NodeSpec(get_gpu("A100-40GB"), 2, 25.0, None)] * 4,
            "gpt-13b",
            Workload(seq_len=8 * 1024, global_batch=4, activation_checkpointing="auto"),
        ),
    ],
    ids=["h100-a100-unions", "states-sharded-shapes"],
)
def test_workers_give_the_same_plan_as_one_process(case):
    nodes, model, w = case
    c, m = ClusterSpec.from_nodes("w", nodes, 5.0), get_model(model)
    one = plan_joint(c, m, w, workers=1)
    two = plan_joint(c, m, w, workers=2)
    assert one.workers == 1 and two.workers == 2
    assert two.visited > 0 and two.shapes_planned > 0  # the pool planned shapes
    assert _comparable(two) == _comparable(one)
    again = plan_joint(c, m, w, workers=2)  # the pool is kept between plans
    assert _comparable(again) == _comparable(one)


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5, True, None])
def test_a_bad_worker_count_is_refused_before_any_work(bad):
    with pytest.raises(HexiSeqError, match="workers must be 'auto' or a positive number of processes"):
        resolve_workers(bad)


def test_auto_workers_is_the_cores_this_process_may_use_from_64_gpus():
    assert resolve_workers("auto") == resolve_workers("auto", 64) == min(available_cores(), 16) >= 1
    assert resolve_workers("auto", 63) == 1  # a small plan: less than starting workers costs
    assert resolve_workers(3) == resolve_workers(3, 8) == 3


def test_one_process_runs_only_the_jobs_asked_for():
    done: list[int] = []
    jobs = Jobs(1)
    first, second = jobs.submit(done.append, 1), jobs.submit(done.append, 2)
    assert done == []  # nothing runs until asked for
    assert jobs.result(second) is None and done == [2]
    assert jobs.result(second) is None and done == [2]  # once
    jobs.close()
    assert done == [2] and first.future is None


def test_a_queued_job_is_run_here_and_a_free_worker_takes_the_next():
    """Workers = 2: one pool process beside this one. The first job occupies it; a job asked for
    while still queued runs in this process instead of waiting; once the worker is free it takes
    new jobs; errors come back as they were raised; close drops what is still queued."""
    jobs = Jobs(2)
    busy = jobs.submit(time.sleep, 1.5)
    queued = jobs.submit(os.getpid)
    assert jobs.result(queued) == os.getpid()  # not waited for: run here
    assert jobs.result(busy) is None
    on_worker = jobs.submit(os.getpid)
    assert on_worker.future is not None and jobs.result(on_worker) != os.getpid()
    failing = jobs.submit(int, "not a number")
    with pytest.raises(ValueError, match="not a number"):
        jobs.result(failing)
    jobs.submit(time.sleep, 1.0)
    dropped = jobs.submit(os.getpid)
    jobs.close()
    assert dropped.future is None and not dropped.taken  # never run anywhere


def test_a_script_that_plans_at_its_top_level_still_plans_and_its_worker_says_why(tmp_path):
    """Spawned workers import the main module again: a script with no `if __name__ == "__main__":`
    runs its body once more in the worker. There the planner refuses to start workers with a clear
    error (not multiprocessing's bootstrapping RuntimeError) and the worker goes on serving; the
    script's own plan is made."""
    script = tmp_path / "plan_at_top_level.py"
    script.write_text(
        "from hexiseq import Workload, get_model\n"
        "from hexiseq.errors import HexiSeqError\n"
        "from hexiseq.planner import plan_joint\n"
        "from hexiseq.specs import ClusterSpec, NodeSpec, get_gpu\n"
        "c = ClusterSpec.from_nodes('w', [NodeSpec(get_gpu('A100-40GB'), 2, 25.0, None)] * 4, 5.0)\n"
        "w = Workload(seq_len=8 * 1024, global_batch=4, activation_checkpointing='auto')\n"
        "try:\n"
        "    print('planned', plan_joint(c, get_model('gpt-13b'), w, workers=2).workers, flush=True)\n"
        "except HexiSeqError as e:\n"
        "    print('refused:', e, flush=True)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "planned 2" in out.stdout
    assert "refused: the planner was asked for workers while a worker process was starting" in out.stdout
    assert 'if __name__ == "__main__":' in out.stdout and "RuntimeError" not in out.stderr
