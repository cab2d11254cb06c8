"""`hexiseq estimate` end to end (in process)."""

import dataclasses
import json

import pytest

from hexiseq.cli import main
from hexiseq.commands.estimate import PHASE_ABBREVIATIONS, parse_layout, phase_header
from hexiseq.costmodel import PHASES
from hexiseq.errors import SpecError
from hexiseq.plan import random_plan


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_phase_has_a_short_unique_header():
    """The per-phase table's headers follow the cost model's PHASES: a new phase gets a column."""
    headers = [phase_header(p) for p in PHASES]
    assert len(set(headers)) == len(PHASES) and all(len(h) <= 6 for h in headers), headers
    assert set(PHASE_ABBREVIATIONS) <= set(PHASES)  # no abbreviation of a phase that is gone


def test_layout_json(capsys):
    rc, out, _ = run_cli(
        capsys, "estimate", "--cluster", "testbed-8", "--seq-len", "64K", "--layout", "usp:2x4", "--recompute", "--json"
    )
    assert rc == 0
    d = json.loads(out)
    for key in (
        "iteration_time_s",
        "tokens_per_s",
        "model_flops",
        "bound_tokens_per_s",
        "efficiency_vs_bound",
        "fits",
        "ranks",
        "passes",
    ):
        assert key in d
    assert len(d["ranks"]) == 8
    assert {"device", "time_s", "memory_gib", "capacity_gib"} <= set(d["ranks"][0])
    assert d["fits"] is True
    assert 0 < d["efficiency_vs_bound"] < 1
    assert d["ranks"][d["critical_rank"]]["gpu"] == "A100-80GB"


def test_plan_file_table(capsys, tmp_path):
    plan = random_plan(8, 65536, 32, 32, seed=2, block_size=128)
    plan = dataclasses.replace(plan, cluster="testbed-8", model="llama2-7b")
    path = tmp_path / "plan.json"
    plan.save(path)
    rc, out, _ = run_cli(capsys, "estimate", "--plan", str(path), "--recompute")
    assert rc == 0
    assert "critical path: rank" in out and "s/iteration" in out and "tokens/s" in out
    assert out.count("H100-SXM") >= 4 and "mem/cap GiB" in out


def test_oom_is_reported(capsys):
    rc, out, _ = run_cli(capsys, "estimate", "--cluster", "testbed-8", "--seq-len", "512K", "--layout", "ring")
    assert rc == 0
    assert "short by" in out and "OOM" in out


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--cluster", "testbed-8", "--seq-len", "64K", "--layout", "usp:3x4"], "12 devices"),
        (["--cluster", "testbed-8", "--seq-len", "64K", "--layout", "grid"], "ring, ulysses or usp"),
        (["--cluster", "testbed-8", "--seq-len", "64K"], "exactly one of"),
        (["--plan", "/nonexistent/plan.json"], "not found"),
    ],
)
def test_errors_exit_2(capsys, argv, msg):
    rc, _, err = run_cli(capsys, "estimate", *argv)
    assert rc == 2
    assert msg in err


def test_plan_for_another_cluster_is_refused(capsys, tmp_path):
    plan = dataclasses.replace(
        random_plan(8, 65536, 32, 32, seed=2, block_size=128), cluster="testbed-8", model="llama2-7b"
    )
    path = tmp_path / "plan.json"
    plan.save(path)
    rc, _, err = run_cli(capsys, "estimate", "--plan", str(path), "--cluster", "sim-64")
    assert rc == 2 and "made for cluster 'testbed-8', not 'sim-64'" in err and "Traceback" not in err
    rc, _, _ = run_cli(capsys, "estimate", "--plan", str(path), "--cluster", "testbed-8")
    assert rc == 0


def test_parse_layout():
    assert parse_layout("ring", 8) == (8, 1)
    assert parse_layout("Ulysses", 8) == (1, 8)
    assert parse_layout("usp:4x2", 8) == (4, 2)
    with pytest.raises(SpecError):
        parse_layout("usp:4x4", 8)


def test_recompute_policy_from_the_plan_file_by_default(capsys, tmp_path):
    """A plan file that records its policy (hexiseq plan does) is estimated under it unless
    --recompute says otherwise; "auto" is refused with a clear error (the cost model needs one policy)."""
    plan = random_plan(8, 65536, 32, 32, seed=2, block_size=128)
    path = tmp_path / "plan.json"
    recompute = {}
    for policy in ("none", "selective", "full"):
        dataclasses.replace(plan, cluster="testbed-8", model="llama2-7b", meta={"recompute": policy}).save(path)
        rc, out, _ = run_cli(capsys, "estimate", "--plan", str(path), "--json")
        assert rc == 0
        recompute[policy] = max(r["time_s"]["recompute"] for r in json.loads(out)["ranks"])
        rc, out, _ = run_cli(capsys, "estimate", "--plan", str(path))
        assert f"recompute {policy}" in out
    assert recompute["none"] == 0 < recompute["selective"] < recompute["full"]
    rc, out, _ = run_cli(capsys, "estimate", "--plan", str(path), "--json", "--recompute", "none")
    assert max(r["time_s"]["recompute"] for r in json.loads(out)["ranks"]) == 0  # the flag wins over the file
    rc, _, err = run_cli(capsys, "estimate", "--plan", str(path), "--recompute", "auto")
    assert rc == 2 and "concrete --recompute" in err and "Traceback" not in err
