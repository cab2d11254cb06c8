"""The record matches the state (issue 22, item 3): a resume cuts metrics.jsonl back to the
checkpoint's step, also when there is no checkpoint yet (the run restarts at step 0 with an empty
record, not steps 1, 2, 1, 2); a status.json left "training" by a killed session is recognised."""

from __future__ import annotations

import json
import shutil

import pytest

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runs import load, lock
from hexiseq.runs.rundir import RunDir
from hexiseq.runs.session import TimeLimit, begin_record, grace_s, mark_failed, previous_end


def test_keep_metrics_until_drops_later_records_and_foreign_lines(tmp_path):
    run = RunDir(tmp_path)
    run.metrics.write_text('{"step": 1}\n{"step": 2}\nnot json\n[1]\n{"step": 3}\n{"step"')
    assert run.keep_metrics_until(2) == 1
    assert run.read_metrics() == [{"step": 1}, {"step": 2}]
    assert begin_record(run, 0) == 2 and run.read_metrics() == []
    assert RunDir(tmp_path / "new").keep_metrics_until(0) == 0 and not (tmp_path / "new").exists()


def test_a_stale_status_is_recognised_and_a_final_one_is_kept(tmp_path):
    run = RunDir(tmp_path)
    run.set_status("training", step=3, steps=9)
    (run.checkpoints / ".step-00000004.tmp").mkdir(parents=True)
    notes = previous_end(run)
    assert "removed .step-00000004.tmp" in notes[0] and not (run.checkpoints / ".step-00000004.tmp").exists()
    assert "ended without a final status (it was 'training' at step 3)" in notes[1]
    assert run.read_status()["stale"] is False  # no lock file: no run ever held it (cannot tell)
    lock.take(tmp_path)
    lock.release(tmp_path)
    assert run.read_status()["stale"] is True  # the writer's lock is gone, the status says "training"
    mark_failed(run, RuntimeError("boom\nmore"))
    assert run.read_json(run.status)["phase"] == "failed" and run.read_json(run.status)["error"] == "boom"
    run.set_status("completed")
    mark_failed(run, "late")
    assert run.read_json(run.status)["phase"] == "completed" and previous_end(run) == []


def test_the_time_limit_asks_first_and_kills_after_the_grace_period(tmp_path):
    limit = TimeLimit(RunDir(tmp_path), 100.0)
    assert limit.kill_after_s == 100.0 + grace_s(100.0) and grace_s(1000.0) == 100.0
    limit.ask_if_due(99.0)
    assert not (tmp_path / "STOP").exists() and limit.note() is None
    limit.ask_if_due(100.0)
    assert (tmp_path / "STOP").exists() and "--time-limit of 100 s" in limit.note()
    assert TimeLimit(RunDir(tmp_path), None).kill_after_s is None


@pytest.mark.slow
def test_a_resume_without_a_checkpoint_restarts_with_an_empty_record(tmp_path, capsys):
    random_plan(2, 64, 8, 4, seed=3, block_size=8).save(tmp_path / "plan.json")
    run = tmp_path / "run"
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny", "--steps", "2", "--out", str(run)]
    assert main([*argv, "--no-tensorboard"]) == 0
    first = list(load(run)["loss"])
    # the state of a session killed during its first save: records, no complete checkpoint, "checkpoint"
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    RunDir(run).set_status("checkpoint", step=2, steps=2)
    capsys.readouterr()
    assert main(["run", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "no checkpoint yet: the run starts from step 0" in out
    assert "ended without a final status (it was 'checkpoint' at step 2)" in out
    assert list(load(run)["step"]) == [1, 2] and list(load(run)["loss"]) == first
    assert json.loads((run / "status.json").read_text())["phase"] == "completed"
    # --steps below the run's step is named as such (it said "step 2 of 1")
    assert main(["run", "--resume", str(run), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--steps 1: the run is at step 2 already" in err and "of 1" not in err, err


def test_a_refused_start_removes_what_it_made_and_keeps_a_notebooks_inputs(tmp_path):
    from hexiseq.runs.session import discard_refused_start

    (tmp_path / "nb" / "inputs").mkdir(parents=True)
    (tmp_path / "nb" / "inputs" / "launcher.log").write_text("the run's own message")
    run = RunDir.create(tmp_path / "nb")
    run.write_json(run.config, {})
    run.set_status("building the model")
    assert not discard_refused_start(run, 1)  # a fault, not refused input: the record stays
    assert discard_refused_start(run, 2)
    assert sorted(p.name for p in run.path.iterdir()) == ["inputs"]
    fresh = RunDir.create(tmp_path / "fresh")
    assert discard_refused_start(fresh, 2) and not fresh.path.exists()
    old = RunDir(tmp_path / "nb")  # not made by this process (a resume): never removed
    assert not discard_refused_start(old, 2) and old.path.exists()
