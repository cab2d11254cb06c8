"""`hexiseq verify`: random and file plans pass on 2-4 ranks; bad plans are refused with their reason."""

from __future__ import annotations

import json

import pytest
from _numerics import FP32

from hexiseq.cli import main
from hexiseq.plan import Group, Plan, random_plan

pytestmark = pytest.mark.numerics

KEYS = {"loss_ref", "loss_dist", "max_rel_err_out", "max_rel_err_grad", "nproc"}


def test_random_plan_two_ranks_json(capsys, within):
    assert main(["verify", "--random-plan", "--nproc", "2", "--seed", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert KEYS <= set(res) and res["nproc"] == 2 and res["passed"] and res["dtype"] == "fp32"
    within(
        max(res["max_rel_err_out"], res["max_rel_err_grad"], abs(res["loss_dist"] - res["loss_ref"]) / res["loss_ref"]),
        FP32,
        "verify random-3 on 2 ranks: out, gradients, loss",
    )
    assert 5.5 < res["loss_ref"] < 7.0  # ~ln(512): a random tiny model on random tokens


def test_random_plan_four_ranks_text(capsys):
    assert main(["verify", "--random-plan", "--nproc", "4", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 ranks" in out and "PASS" in out and "gradients max rel err" in out


def test_plan_file_error_above_tolerance_exits_nonzero(tmp_path, capsys, within):
    """A plan file; a tolerance below fp32 rounding makes the same comparison fail (exit 1)."""
    path = tmp_path / "plan.json"
    random_plan(2, 128, 8, 4, seed=9, block_size=8).save(path)
    assert main(["verify", "--plan", str(path), "--tolerance", "1e-12", "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["nproc"] == 2 and res["plan"] == "random-9" and not res["passed"] and res["tolerance"] == 1e-12
    assert res["max_rel_err_grad"] > 0
    within(
        res["max_rel_err_grad"], FP32, "verify random-9 on 2 ranks: gradients"
    )  # the run itself is right: only the bar moved


def _refused(argv: list[str], capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse refuses a bad number before any work
        rc = e.code
    assert rc == 2
    return capsys.readouterr().err


def test_corrupted_plan_is_refused_with_its_reason(tmp_path, capsys):
    good = random_plan(2, 128, 8, 4, seed=1, block_size=8)
    d = good.to_dict()
    d["groups"][0]["shards"][0] += 5  # shards no longer sum to the group's tokens
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    err = _refused(["verify", "--plan", str(path)], capsys)
    assert "invalid" in err and "over by 5" in err
    path.write_text("{not json")
    assert "not valid JSON" in _refused(["verify", "--plan", str(path)], capsys)


def test_plan_for_another_model_is_refused(tmp_path, capsys):
    path = tmp_path / "7b.json"
    Plan(256, 32, 32, (Group((0, 1), 128, (128, 128), (16, 16)),), block_size=64, name="for-7b").save(path)
    err = _refused(["verify", "--plan", str(path), "--model", "tiny"], capsys)
    assert "plan has 32 heads but model 'tiny' has 8" in err and "32 KV heads" in err


def test_world_size_and_arguments_are_checked(tmp_path, capsys):
    path = tmp_path / "p.json"
    random_plan(3, 128, 8, 4, seed=2, block_size=8).save(path)
    assert "has 3 ranks but --nproc is 2" in _refused(["verify", "--plan", str(path), "--nproc", "2"], capsys)
    assert "--nproc" in _refused(["verify", "--random-plan"], capsys)
    assert "swiglu/rmsnorm" in _refused(["verify", "--random-plan", "--nproc", "2", "--model", "gpt-3b"], capsys)
    assert "argument --block-size: must be an integer from 1" in _refused(
        ["verify", "--random-plan", "--nproc", "2", "--block-size", "0"], capsys
    )
    assert "argument --timeout: must be a number > 0" in _refused(
        ["verify", "--plan", str(path), "--timeout", "0"], capsys
    )
    with pytest.raises(SystemExit):  # --plan and --random-plan together
        main(["verify", "--plan", str(path), "--random-plan"])


def test_verify_a_long_plan_for_a_big_model_runs_scaled_on_a_proxy(tmp_path, capsys, within):
    """A planner-sized plan (llama2-7b heads, 64K tokens, uneven groups) is checked on a proxy
    Llama with the same 32 heads, scaled to 1024 tokens with the same groups and head split."""

    plan = Plan(
        65536,
        32,
        32,
        (Group((0, 1), 20480, (22000, 18960), (20, 12)), Group((2,), 12288, (24576,), (32,))),
        block_size=128,
        name="uneven-7b",
        model="llama2-7b",
    )
    path = tmp_path / "p.json"
    plan.save(path)
    assert main(["verify", "--plan", str(path), "--seq-len", "1024", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["seq_len"] == 1024 and res["nproc"] == 3 and res["model"] == "proxy-32h32kv"
    within(
        max(res["max_rel_err_out"], res["max_rel_err_grad"]), FP32, "verify uneven-7b scaled to 1024 tokens on 3 ranks"
    )
    assert any("scaled from 65,536 to 1,024" in n for n in res["notes"])
