"""The plan depends on its input only, never on what the same process solved before.

HiGHS keeps one task scheduler per process, made by the first solve with that solve's thread count;
a later solve asking for another count fails before it starts (planner/lp.py). A solve with HiGHS's
defaults first (planner/explain.py's memory LP, run when a replica shape cannot fit, or any user
code) made every LP of the planner fail, every node of the search was dropped and a baseline won:
the joint plan of sim-128, gpt-13b, 1M, global batch 8 took 591.154 s in a fresh process and
549.420 s after a 512K plan (issue 18). Here: plan B alone in a fresh process, and after A, in a
process of its own each. Without the fix both cases gave another plan of B (a refined baseline
instead of the models' plan, another bound). The "infeasible" case needs HiGHS's default thread
count to be above one (a machine of more than one core); "highs-2-threads" makes the state on any.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hexiseq.errors import HexiSeqError
from hexiseq.planner import plan_cluster
from hexiseq.planner.layout_model import LayoutModel
from hexiseq.specs import Workload, get_model, load_cluster

SCRIPT = """
import json, sys
from hexiseq.errors import InfeasibleError
from hexiseq.planner import plan_cluster
from hexiseq.specs import ClusterSpec, Workload, get_model, load_cluster

before = sys.argv[1]
if before == "infeasible":  # A: no policy fits, so the planner explains why with its memory LP
    try:
        plan_cluster(ClusterSpec.from_nodes("l1", [("L40S", 1, 25)]), get_model("gpt-70b"),
                     Workload(seq_len=64 * 1024, activation_checkpointing="auto"), progress=False)
        raise SystemExit("A was expected not to fit")
    except InfeasibleError:
        pass
elif before == "highs-2-threads":  # A: any other HiGHS user of the process, on two threads
    import highspy
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 2)
    inf = highspy.kHighsInf
    h.addVar(0.0, inf)
    h.changeColCost(0, 1.0)
    h.addRow(1.0, inf, 1, [0], [1.0])  # x >= 1
    assert h.run() == highspy.HighsStatus.kOk and h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    # the state this test is about: a bare one-thread solve is now refused
    h.setOptionValue("threads", 1)
    assert h.run() == highspy.HighsStatus.kError, "HiGHS no longer refuses another thread count"
# B: a case the models decide (the search's plan beats every baseline)
r = plan_cluster(load_cluster("mixed-4"), get_model("llama2-7b"),
                 Workload(seq_len=32 * 1024, activation_checkpointing="auto"), progress=False)
d = r.to_dict()
for key in ("plan_time_s", "stage_times_s"):  # wall-clock figures are reports, not decisions
    d.pop(key)
print(json.dumps(d, sort_keys=True))
"""


def _plan_b(before: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, before], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def alone() -> dict:
    return _plan_b("nothing")


@pytest.mark.parametrize("before", ["infeasible", "highs-2-threads"])
def test_the_same_plan_whatever_the_process_solved_before(alone, before):
    assert alone["source"].startswith("model: "), "B must be decided by the models, or a failed search would not show"
    after = _plan_b(before)
    assert after["iteration_time_s"] == alone["iteration_time_s"]
    assert after == alone


def test_a_solver_failure_is_an_error_not_a_dropped_layout(monkeypatch):
    """An LP the solver fails on (here: every one, as when HiGHS refused to start) stops the planner
    with an error naming the layout; the search does not drop the node and return a baseline."""
    monkeypatch.setattr(LayoutModel, "solve_lp", lambda self: ("unknown", None))
    with pytest.raises(HexiSeqError, match="the LP solver failed on layout .*: unknown"):
        plan_cluster(
            load_cluster("mixed-4"),
            get_model("llama2-7b"),
            Workload(seq_len=32 * 1024, activation_checkpointing="auto"),
            progress=False,
        )
