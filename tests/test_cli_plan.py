"""`hexiseq plan`: tables, JSON, plan file, clear errors."""

from __future__ import annotations

import json

import pytest

from hexiseq.cli import main
from hexiseq.plan import Plan
from hexiseq.planner import plan_cluster
from hexiseq.specs import Workload, get_model, load_cluster

ARGS = ["plan", "--cluster", "testbed-8", "--model", "llama2-7b", "--seq-len", "128K", "--recompute"]


def test_text_report(capsys):
    assert main(ARGS + ["--no-progress"]) == 0
    out = capsys.readouterr().out
    for needle in (
        "HexiSeq plan for llama2-7b on testbed-8",
        "group",
        "rank",
        "memory GiB",
        "hexiseq",
        "ring",
        "ulysses",
        "usp",
        "proportional",
        "speedup over the best baseline",
        "compute-bound",
        "lower bound",
        "within",
        "planning took",
        "cutting-plane rounds",
    ):
        assert needle in out, needle


def test_json_and_out(capsys, tmp_path):
    path = tmp_path / "plan.json"
    assert main(ARGS + ["--json", "--out", str(path)]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in (
        "throughput_tokens_per_s",
        "baselines",
        "speedup_vs_best_baseline",
        "gap",
        "lower_bound_s",
        "plan_time_s",
        "stage_times_s",
        "search_space",
        "left_out",
    ):
        assert key in d
    assert d["speedup_vs_best_baseline"] >= 1.0
    # gap: over every plan at DP = 1 (bound_covers says so); search_gap: over the candidate layouts
    assert d["lower_bound_s"] <= d["search_lower_bound_s"] <= d["iteration_time_s"] and 0 <= d["gap"]
    assert 0 <= d["search_gap"] < 0.01 and "every plan" in d["bound_covers"]
    assert set(d["baselines"]) >= {"ring", "ulysses", "usp", "proportional"}
    plan = Plan.load(path)
    assert plan.name == "hexiseq"
    assert plan.validate(load_cluster("testbed-8"), get_model("llama2-7b")) == []
    assert plan.to_dict() == d["plan"]


def test_infeasible_exits_2_with_explanation(capsys):
    assert (
        main(["plan", "--cluster", "testbed-8", "--model", "llama2-7b", "--seq-len", "128K", "--recompute", "none"])
        == 2
    )
    err = capsys.readouterr().err
    assert "does not fit" in err and "--recompute" in err and "Traceback" not in err
    # 8 GPUs cannot hold 70B's training states at any length: recompute does not rescue it either
    assert main(["plan", "--cluster", "testbed-8", "--model", "llama2-70b", "--seq-len", "128K"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "more devices" in err and "Traceback" not in err


def test_default_auto_picks_a_recompute_policy_and_records_it(capsys, tmp_path):
    """Without --recompute the planner searches the policies that can fit (at 128K on testbed-8 "none"
    cannot: see --recompute none above), says which it chose and writes it into the plan file."""
    path = tmp_path / "plan.json"
    assert (
        main(
            [
                "plan",
                "--cluster",
                "testbed-8",
                "--model",
                "llama2-7b",
                "--seq-len",
                "128K",
                "--json",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert d["recompute"] in ("selective", "full") and d["policies_searched"] == ["selective", "full"]
    assert (
        d["notes"][0].startswith(f"recompute policy {d['recompute']} chosen by auto")
        and "none cannot fit" in d["notes"][0]
    )
    assert Plan.load(path).meta["recompute"] == d["recompute"]
    assert d["speedup_vs_best_baseline"] >= 1.0
    # each policy alone: auto's plan is the faster one
    tps = {}
    for policy in ("selective", "full"):
        assert (
            main(
                [
                    "plan",
                    "--cluster",
                    "testbed-8",
                    "--model",
                    "llama2-7b",
                    "--seq-len",
                    "128K",
                    "--json",
                    "--recompute",
                    policy,
                ]
            )
            == 0
        )
        r = json.loads(capsys.readouterr().out)
        assert r["recompute"] == policy and r["policies_searched"] == [policy]
        tps[policy] = r["throughput_tokens_per_s"]
    assert d["throughput_tokens_per_s"] >= max(tps.values()) * (1 - 1e-9)


def test_bare_recompute_means_selective_and_the_text_says_so(capsys):
    assert main(ARGS + ["--no-progress"]) == 0
    assert "recompute: selective" in capsys.readouterr().out


def test_write_model_exports_the_chosen_layout(capsys, tmp_path):
    path = tmp_path / "model.lp"
    assert main(ARGS + ["--no-progress", "--write-model", str(path)]) == 0
    text = path.read_text()
    assert "min" in text and "cuts" in text and "cover" in text and "D(_forward" in text
    assert main(ARGS + ["--write-model", str(tmp_path / "model.txt")]) == 2
    assert "must end in .lp or .mps" in capsys.readouterr().err


def test_non_positive_work_is_a_clear_error(capsys):
    assert main(ARGS + ["--work", "0"]) == 2
    err = capsys.readouterr().err
    assert "work must be positive" in err and "Traceback" not in err
    assert main(ARGS + ["--ranks", "-1"]) == 2
    assert "--ranks must be >= 0" in capsys.readouterr().err


def test_the_gap_is_accounted_on_the_critical_rank():
    """When the reported bound is the every-grouping one (weaker than the search's), a note splits the
    plan's critical rank's step into its own work, what that bound does not count and its exposed
    parameter traffic: the three add up to the step, and the note carries them."""
    res = plan_cluster(
        load_cluster("testbed-8"),
        get_model("llama2-7b"),
        Workload(seq_len=128 * 1024, activation_checkpointing="auto"),
        progress=False,
    )
    assert res.lower_bound_s < res.search_lower_bound_s  # the every-grouping bound is the one reported
    note = next(n for n in res.notes if n.startswith("where the gap lies"))
    rank = res.estimate.ranks[res.estimate.critical_rank]
    own = sum(
        rank.time_s[k]
        for k in ("linear", "memory_bound", "attention", "lm_head", "recompute", "operators", "optimizer")
    )
    left = sum(rank.time_s[k] for k in ("kv_exchange", "alltoall", "wait"))
    assert own + left + rank.time_s["param_comm"] == pytest.approx(res.iteration_time_s, rel=1e-9)
    assert f"rank {rank.rank}, {rank.gpu}" in note and f"{own:.4g} s itself" in note
    assert f"{rank.time_s['kv_exchange']:.3g} s in exposed K/V exchange" in note
    assert f"against the bound's {res.lower_bound_s:.4g} s" in note
