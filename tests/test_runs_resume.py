"""Checkpoints and resume (issue #12): a 4-rank CPU run SIGKILLed mid-way and resumed gives the
uninterrupted run's per-step losses bitwise (same plan: the same arithmetic in the same order); a
run resumed under a 3-rank plan of another shape continues the uninterrupted run's losses (float64:
another reduction order, so equal within FP64); corrupt or partial checkpoints are refused and
named; `hexiseq export` writes a model that transformers loads."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from _numerics import FP32, FP64, rel_err

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runs import launch, load

pytestmark = pytest.mark.slow
FOUR = random_plan(4, 256, 8, 4, seed=3, block_size=8)  # groups of 2 and 2? see test_plans_differ
THREE = random_plan(3, 256, 8, 4, seed=5, block_size=8)
ARGS = ["--model", "tiny", "--lr", "3e-3", "--warmup-steps", "1", "--steps", "6"]


def test_plans_differ():
    assert FOUR.world_size == 4 and THREE.world_size == 3
    assert FOUR.group_sizes != THREE.group_sizes or FOUR.shards != THREE.shards


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    FOUR.save(d / "four.json")
    THREE.save(d / "three.json")
    return d


@pytest.fixture(scope="module")
def reference(work):
    """The uninterrupted 4-rank run, fp32, checkpoints every 2 steps."""
    assert (
        main(["run", "--plan", str(work / "four.json"), *ARGS, "--checkpoint-every", "2", "--out", str(work / "ref")])
        == 0
    )
    return work / "ref"


def losses(run_dir) -> list[float]:
    m = load(run_dir)
    assert list(m["step"]) == list(range(1, len(m) + 1))
    return list(m["loss"])


def test_killed_run_resumes_bitwise(work, reference):
    run = work / "killed"
    h = launch(work / "four.json", steps=6, out=run, model="tiny", lr=3e-3, warmup_steps=1, checkpoint_every=2)
    deadline = time.monotonic() + 120
    while len(h.metrics) < 3 and h.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.running(), h.error
    h.kill()  # SIGKILL to the launcher and every rank, mid-way (between or inside steps 4..5)
    assert h.status == "failed" and 3 <= len(h.metrics) < 6
    assert main(["run", "--resume", str(run)]) == 0
    assert losses(run) == losses(reference)  # bitwise: same plan, same order of every reduction
    sessions = [r["session"] for _, r in load(run).iterrows()]
    assert sessions[:2] == [0, 0] and sessions[-1] == 1


@pytest.mark.numerics
def test_resume_under_another_plan_continues_the_losses(work, within):
    """4 steps on the 4-rank plan, then 2 more on a 3-rank plan of another shape: DCP reshards the
    (replicated) model and optimizer state; float64, compared with the uninterrupted 4-rank run."""
    full = work / "ref64"
    assert (
        main(
            [
                "run",
                "--plan",
                str(work / "four.json"),
                *ARGS,
                "--dtype",
                "float64",
                "--checkpoint-every",
                "4",
                "--out",
                str(full),
            ]
        )
        == 0
    )
    elastic = work / "elastic"
    shutil.copytree(full, elastic)
    assert (
        main(["run", "--resume", str(elastic), "--checkpoint", "step-00000004", "--plan", str(work / "three.json")])
        == 0
    )
    cfg = json.loads((elastic / "config.json").read_text())
    assert sum(len(g["devices"]) for g in cfg["plan"]["groups"]) == 3 and (elastic / "plans").is_dir()
    got, ref = losses(elastic), losses(full)
    assert got[:4] == ref[:4] and len(got) == 6
    within(
        max(abs(a - b) / abs(b) for a, b in zip(got[4:], ref[4:])),
        FP64,
        "elastic resume 4 -> 3 ranks: losses of steps 5-6",
    )
    assert got[5] < got[0]


def test_corrupt_or_partial_checkpoints_are_refused_and_named(work, reference, capsys):
    run = work / "corrupt"
    shutil.copytree(reference, run)
    newest = run / "checkpoints" / "step-00000006"
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    argv = ["run", "--resume", str(run), "--steps", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "step-00000006 is corrupt: __1_0.distcp does not match its checksum" in err, err
    assert "the older step-00000004 can be resumed with --checkpoint NAME" in err and "Traceback" not in err
    shard.write_bytes(bytes(data[:1000]))
    assert main(argv) == 2
    assert "__1_0.distcp has 1,000 bytes, the manifest says" in capsys.readouterr().err
    (newest / "manifest.json").unlink()
    assert main(argv) == 2
    assert "step-00000006 is incomplete: it has no manifest.json" in capsys.readouterr().err
    assert main(["run", "--resume", str(run), "--checkpoint", "step-00000003"]) == 2
    assert "not a checkpoint of this run (checkpoints: step-00000004, step-00000006)" in capsys.readouterr().err
    assert main(["run", "--resume", str(run), "--lr", "1"]) == 2
    assert "--lr cannot change" in capsys.readouterr().err


@pytest.mark.numerics
def test_export_is_a_model_transformers_loads(work, reference, within):
    transformers = pytest.importorskip("transformers")
    from hexiseq.runtime.hf_checkpoint import load_hf_checkpoint

    assert main(["export", str(reference), "--to", str(work / "hf")]) == 0
    hf = transformers.LlamaForCausalLM.from_pretrained(work / "hf").eval()
    ours = load_hf_checkpoint(work / "hf")
    tokens = torch.randint(0, 512, (96,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        within(
            rel_err(ours.logits(ours(tokens)), hf(tokens[None]).logits[0]),
            FP32,
            "exported run: transformers logits vs ours",
        )
    # the exported weights are the trained ones: not the initial weights
    from hexiseq.runtime.llama import Llama

    init = Llama(ours.cfg).init_weights(0)
    assert not torch.equal(ours.layers[0].mlp.up_proj.weight, init.layers[0].mlp.up_proj.weight)
