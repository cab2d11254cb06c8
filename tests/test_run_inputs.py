"""Bad input to `hexiseq run` / `hexiseq verify` is refused before any work, with one message that
names the file, tensor or value (exit code 2, no traceback) — the run/verify/checkpoint rows of
issue #9. Every case but one is refused in the parent, before a rank is spawned; NaN weights are
found when the ranks load them, and come back as one message too."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runtime.checkpoint import save_hf_checkpoint
from hexiseq.runtime.model import Llama, LlamaConfig
from hexiseq.specs import get_model

TINY = LlamaConfig.from_spec(get_model("tiny"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(d / "plan.json")
    save_hf_checkpoint(Llama(TINY).init_weights(0), d / "good")
    save_hf_checkpoint(Llama(TINY).init_weights(0), d / "sharded", max_shard_bytes=200_000)
    return d


def _checkpoint(files, name: str, edit) -> str:
    """A copy of the good checkpoint with `edit(directory)` applied."""
    import shutil

    d = files / name
    if not d.exists():
        shutil.copytree(files / "good", d)
        edit(d)
    return str(d)


def _tensors(d, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


CASES = {
    # name: (argv after `run --plan PLAN --steps 1`, words of the message)
    "lr-nan": (["--lr", "nan"], ["--lr must be a finite number, got nan"]),
    "lr-negative": (["--lr=-1e-3"], ["--lr must be positive, got -0.001"]),
    "lr-zero": (["--lr", "0"], ["--lr must be positive, got 0"]),
    "lr-huge": (["--lr", "5"], ["--lr must be at most 1, got 5"]),
    "grad-clip-negative": (["--grad-clip=-1"], ["--grad-clip must be at least 0, got -1"]),
    "grad-clip-inf": (["--grad-clip", "inf"], ["--grad-clip must be a finite number"]),
    "steps-huge": (["--steps", "100000000"], ["--steps must be at most 1e+07"]),
    "timeout-huge": (["--timeout", "1e9"], ["--timeout must be at most 604800"]),
    "time-limit-zero": (["--time-limit", "0"], ["--time-limit must be positive, got 0"]),
    "seq-len-huge": (["--seq-len", "1000000000"], ["--seq-len must be at most 1.67772e+07"]),
    "loss-chunk-zero": (["--loss-chunk", "0"], ["--loss-chunk must be positive, got 0"]),
    "nproc-wrong": (["--nproc", "3"], ["has 2 ranks but --nproc is 3"]),
    "save-to-a-file": (["--save", "{d}/plan.json"], ["cannot save to", "plan.json: it is an existing file"]),
    "save-over-other-files": (["--save", "{d}"], ["holds files that are not a checkpoint", "a save replaces the whole directory"]),
    "init-from-missing": (["--init-from", "{d}/nowhere"], ["checkpoint directory not found", "nowhere"]),
    "init-from-truncated": (["--init-from", "truncated"], ["truncated/model.safetensors: cannot be read", "corrupt or was cut short"]),
    "init-from-int64": (["--init-from", "int64"], ["layers.0.mlp.up_proj.weight has dtype int64", "floating point"]),
    "init-from-missing-tensor": (["--init-from", "missing-tensor"], ["missing ['norm.weight']"]),
    "init-from-wrong-shape": (["--init-from", "wrong-shape"], ["embed_tokens.weight has shape (512, 64)", "(512, 128)"]),
    "init-from-index-and-single": (["--init-from", "mixed"], ["holds both model.safetensors.index.json and model.safetensors",
                                                             "two checkpoints are mixed"]),
    "init-from-index-missing-shard": (["--init-from", "missing-shard"], ["names 1 shard that is not in", "model-00002-of-"]),
    "init-from-bad-config": (["--init-from", "bad-config"], ["config.json"]),
}


def _make(files, case: str) -> None:
    import shutil

    def trunc(d):
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])

    edits = {
        "truncated": trunc,
        "int64": lambda d: _tensors(d, lambda sd: sd.__setitem__("model.layers.0.mlp.up_proj.weight",
                                                                  sd["model.layers.0.mlp.up_proj.weight"].long())),
        "missing-tensor": lambda d: _tensors(d, lambda sd: sd.pop("model.norm.weight")),
        "wrong-shape": lambda d: _tensors(d, lambda sd: sd.__setitem__("model.embed_tokens.weight", torch.zeros(512, 64))),
        "mixed": lambda d: shutil.copy(files / "sharded" / "model.safetensors.index.json", d),
        "bad-config": lambda d: (d / "config.json").write_text("{not json"),
        "nan": lambda d: _tensors(d, lambda sd: sd["model.layers.1.self_attn.q_proj.weight"].__setitem__((0, 0), float("nan"))),
    }
    if case == "missing-shard":
        d = files / case
        if not d.exists():
            shutil.copytree(files / "sharded", d)
            sorted(d.glob("model-*.safetensors"))[1].unlink()
        return
    if case in edits:
        _checkpoint(files, case, edits[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_refuses_before_any_work(case, files, capsys, tmp_path):
    argv, words = CASES[case]
    argv = [a.format(d=files) for a in argv]
    if "--init-from" in argv:
        i = argv.index("--init-from") + 1
        if "/" not in argv[i]:
            _make(files, argv[i])
            argv[i] = str(files / argv[i])
    t0 = time.monotonic()
    rc = main(["run", "--plan", str(files / "plan.json"), "--steps", "1", *argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert all(w in err for w in words), err
    assert time.monotonic() - t0 < 5  # refused in the parent: no rank was spawned


def test_nan_weights_are_refused_by_the_ranks_in_one_message(files, capfd, tmp_path):
    """NaN weights used to train to 'loss nan' with exit code 0: the ranks find them at load, before
    the first step, and the parent prints one message naming the tensor (exit code 2)."""
    _make(files, "nan")
    rc = main(["run", "--plan", str(files / "plan.json"), "--steps", "1", "--init-from", str(files / "nan"), "--timeout", "60",
               "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err
    assert rc == 2, err
    assert "ranks 0, 1 of 2: checkpoint tensor layers.1.self_attn.q_proj.weight has 1 NaN/Inf entry" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err


@pytest.mark.parametrize("argv,words", [
    (["--tolerance", "nan"], "--tolerance must be a finite number"),
    (["--tolerance=-1"], "--tolerance must be positive, got -1"),
    (["--timeout=-5"], "--timeout must be positive, got -5"),
    (["--time-limit", "inf"], "--time-limit must be a finite number"),
    (["--seq-len", "99999999999"], "--seq-len must be at most"),
])
def test_verify_refuses_bad_numbers(argv, words, files, capsys):
    assert main(["verify", "--plan", str(files / "plan.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


def test_save_target_is_checked_before_training_and_a_checkpoint_is_replaced_whole(files, capfd, tmp_path):
    """--save into a directory holding a sharded checkpoint used to leave its old index behind, so
    the next --init-from loaded the old weights with exit code 0: the save replaces the directory."""
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(files / "sharded", target)
    assert main(["run", "--plan", str(files / "plan.json"), "--steps", "2", "--model", "tiny", "--save", str(target),
                 "--out", str(tmp_path / "run")]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    trained = load_file(str(target / "model.safetensors"))
    init = Llama(TINY).init_weights(0).state_dict()
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], init["layers.0.mlp.up_proj.weight"])
    assert not any(p.name.startswith(".ckpt") for p in tmp_path.iterdir())  # no temporaries left
    assert (tmp_path / "run" / "summary.json").is_file()
    json.loads((target / "config.json").read_text())
