"""A run launched from Python (notebooks): a background handle with live metrics, a graceful stop
(the ranks finish their step, checkpoint and write the summary), the run directory's record
(metrics table, summary with predicted vs measured step time and the environment, TensorBoard
events), and `hexiseq run --resume ... --json` continuing it."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from hexiseq.cli import main
from hexiseq.errors import HexiSeqError
from hexiseq.plan import random_plan
from hexiseq.runs import RunFailed, launch, load, load_summary
from hexiseq.runs.rundir import METRIC_KEYS

pytestmark = pytest.mark.slow
TEXT = __import__("pathlib").Path(__file__).resolve().parent.parent / "data" / "text" / "tinyshakespeare.txt"


def test_launch_watch_stop_and_resume(tmp_path, capsys):
    plan = dataclasses.replace(random_plan(2, 256, 8, 4, seed=1, block_size=8), cluster="mixed-4")
    h = launch(plan, data=TEXT, steps=100_000, out=tmp_path / "run", model="tiny", lr=2e-3, warmup_steps=2)
    deadline = time.monotonic() + 120
    while len(h.metrics) < 3 and h.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert h.running() and h.status == "training", h.error
    summary = h.stop()
    assert h.status == "stopped" and summary["status"] == "stopped", h.error
    done = summary["steps_done"]
    assert done >= 3 and (tmp_path / "run" / "checkpoints" / f"step-{done:08d}").is_dir()
    m = load(tmp_path / "run")
    assert set(METRIC_KEYS) - {"peak_mem_mb"} <= set(m.columns) and {"peak_mem_mb_r0", "peak_mem_mb_r1"} <= set(
        m.columns
    )
    assert list(m["step"]) == list(range(1, done + 1)) and (m["peak_mem_mb_r0"] > 0).all()
    assert summary["predicted_step_time_s"] > 0 and summary["prediction"]["cluster"] == "mixed-4"
    assert summary["measured_step_time_s"] > 0 and summary["emulated"] is False
    env = summary["environment"]
    assert env["torch"] and env["hostnames"] and env["gpus"] == ["cpu", "cpu"] and "flash_attn" in env
    assert "tinyshakespeare.txt" in summary["data"]
    # TensorBoard events, one scalar per step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert len(events.Scalars("train/loss")) == done
    # continue it for two more steps from the command line, summary as JSON
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "run"), "--steps", str(done + 2), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "completed" and out["steps_done"] == done + 2
    assert list(load(tmp_path / "run")["step"]) == list(range(1, done + 3))
    assert load_summary(tmp_path / "run")["loss_last"] == out["loss_last"]


def test_a_failed_background_run_says_why(tmp_path):
    plan = random_plan(2, 256, 8, 4, seed=1, block_size=8)
    h = launch(plan, steps=2, out=tmp_path / "run", init_from=tmp_path / "nowhere")
    with pytest.raises(RunFailed, match="checkpoint directory not found"):
        h.wait(60)
    assert h.status == "failed"
    with pytest.raises(HexiSeqError, match="already holds files"):
        launch(plan, steps=2, out=tmp_path / "run")
    with pytest.raises(HexiSeqError, match="unknown options"):
        launch(plan, steps=2, out=tmp_path / "other", learning_rate=1)
