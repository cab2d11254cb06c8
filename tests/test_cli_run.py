"""`hexiseq run`: a short real training run of a plan on spawned gloo ranks, checkpoints out and in."""

from __future__ import annotations

import dataclasses
import re

import torch

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runs import load
from hexiseq.runtime.hf_checkpoint import load_hf_checkpoint
from hexiseq.runtime.llama import Llama, LlamaConfig
from hexiseq.specs import get_model


def test_run_trains_saves_and_resumes(tmp_path, capfd):
    # capfd: rank 0 prints from its own (spawned) process
    plan = tmp_path / "plan.json"
    # the plan file records a recompute policy (as hexiseq plan writes it): the run uses it by default
    dataclasses.replace(random_plan(2, 128, 8, 4, seed=4, block_size=8), meta={"recompute": "full"}).save(plan)
    out_dir = tmp_path / "ckpt"
    assert (
        main(
            [
                "run",
                "--plan",
                str(plan),
                "--nproc",
                "2",
                "--steps",
                "3",
                "--lr",
                "3e-3",
                "--model",
                "tiny",
                "--save",
                str(out_dir),
                "--out",
                str(tmp_path / "run1"),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "recompute full" in out
    steps = re.findall(r"step (\d)/3\s+loss ([\d.]+)\s+grad_norm [\d.]+\s+([\d,]+) tokens/s", out)
    assert [s[0] for s in steps] == ["1", "2", "3"], out
    losses = [float(s[1]) for s in steps]
    assert losses[2] < losses[0]
    assert all(int(s[2].replace(",", "")) > 0 for s in steps)
    # the saved checkpoint is the trained model: other weights than the initial ones
    trained = load_hf_checkpoint(out_dir)
    init = Llama(LlamaConfig.from_spec(get_model("tiny"))).init_weights(0)
    assert trained.cfg == init.cfg
    assert not torch.equal(trained.layers[0].mlp.up_proj.weight, init.layers[0].mlp.up_proj.weight)
    # resume from it (on a one-rank plan: any plan can continue any checkpoint): the first loss is
    # below the first loss from scratch
    one = tmp_path / "one.json"
    random_plan(1, 128, 8, 4, seed=0, block_size=8).save(one)
    assert (
        main(
            [
                "run",
                "--plan",
                str(one),
                "--steps",
                "1",
                "--init-from",
                str(out_dir),
                "--recompute",
                "--out",
                str(tmp_path / "run2"),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "recompute selective" in out  # a bare --recompute: selective
    resumed = float(re.search(r"step 1/1\s+loss ([\d.]+)", out).group(1))
    assert resumed < losses[0]


def test_run_from_a_checkpoint_scales_a_long_plan_like_any_run(tmp_path, capfd):
    """--init-from takes the model from the checkpoint; the plan is still scaled by --seq-len / the
    default (a 16K plan would otherwise run at full length on CPU)."""
    from hexiseq.runtime.hf_checkpoint import save_hf_checkpoint

    ckpt = tmp_path / "ckpt"
    save_hf_checkpoint(Llama(LlamaConfig.from_spec(get_model("tiny"))).init_weights(0), ckpt)
    plan = tmp_path / "long.json"
    random_plan(1, 16384, 8, 4, seed=0, block_size=8).save(plan)
    assert (
        main(
            [
                "run",
                "--plan",
                str(plan),
                "--steps",
                "1",
                "--init-from",
                str(ckpt),
                "--seq-len",
                "256",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "1 ranks, 256 tokens" in out and "scaled from 16,384 to 256 tokens" in out


def test_run_config_json_round_trips_and_an_older_one_loads(tmp_path):
    """config.json is the run's typed RunConfig at the JSON edge: it round-trips, and one written
    before a record setting existed (here: without the record keys at all) still loads, defaults
    filled in."""
    import json

    from hexiseq.runs.config import RunConfig, resolve
    from hexiseq.runs.settings import RecordSettings, RunSettings, TrainSettings

    plan = random_plan(2, 128, 8, 4, seed=4, block_size=8)
    settings = RunSettings(train=TrainSettings(steps=3, lr=3e-3))
    cfg = resolve(plan, settings, tmp_path)
    d = json.loads(json.dumps(cfg.to_dict()))
    assert json.loads(json.dumps(RunConfig.from_dict(d).to_dict())) == d
    assert d["train"]["warmup_steps"] == 0 and d["steps"] == 3 and d["checkpoint_every"] == 0
    older = {k: v for k, v in d.items() if k not in {f for f in RecordSettings.__dataclass_fields__}}
    assert RunConfig.from_dict(older).record == RecordSettings()


def test_run_options_come_from_the_settings_table():
    """Each `hexiseq run` option of the settings is declared once (runs.settings): on the command
    line with no default of its own (not given: the table's default, or on --resume the run's)."""
    from hexiseq.cli import build_parser
    from hexiseq.runs.settings import RunSettings, options

    args = build_parser().parse_args(["run", "--plan", "p.json"])
    rows = list(options())
    assert len({row.flag for row in rows}) == len(rows)
    assert all(getattr(args, row.key) in (None, False) for row in rows)
    assert RunSettings.from_options(vars(args)) == RunSettings()
    args = build_parser().parse_args(["run", "--plan", "p.json", "--lr", "0.01", "--no-tensorboard", "--recompute"])
    s = RunSettings.from_options(vars(args))
    assert s.train.lr == 0.01 and s.record.tensorboard is False and s.parallel.recompute == "selective"


def test_log_every_thins_the_console_not_the_metrics(tmp_path, capfd):
    """--log-every N: a progress line every N steps (and the last); metrics.jsonl keeps every step.
    A resumed run may change it."""
    plan = tmp_path / "one.json"
    random_plan(1, 64, 8, 4, seed=0, block_size=8).save(plan)
    out = tmp_path / "run"
    argv = ["run", "--plan", str(plan), "--steps", "5", "--log-every", "2", "--no-tensorboard", "--out", str(out)]
    assert main(argv) == 0
    lines = re.findall(r"step (\d)/5\s+loss", capfd.readouterr().out)
    assert lines == ["2", "4", "5"]
    assert [r["step"] for r in load(out).to_dict("records")] == [1, 2, 3, 4, 5]
    assert main(["run", "--resume", str(out), "--steps", "7", "--log-every", "3"]) == 0
    assert re.findall(r"step (\d)/7\s+loss", capfd.readouterr().out) == ["6", "7"]
