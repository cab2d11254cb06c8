"""`hexiseq run`: a short real training run of a plan on spawned gloo ranks, checkpoints out and in."""

from __future__ import annotations

import dataclasses
import re

import torch

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runtime.checkpoint import load_hf_checkpoint
from hexiseq.runtime.model import Llama, LlamaConfig
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
    from hexiseq.runtime.checkpoint import save_hf_checkpoint

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
