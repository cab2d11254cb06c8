"""`hexiseq run --save` into a directory that holds a sharded checkpoint replaces it whole (issue #9:
the old index used to stay and --init-from then loaded the old weights with exit code 0). The
refusals of bad run/verify/checkpoint input are rows of tests/test_bad_inputs.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hexiseq.cli import main
from hexiseq.plan import random_plan
from hexiseq.runtime.hf_checkpoint import save_hf_checkpoint
from hexiseq.runtime.llama import Llama, LlamaConfig
from hexiseq.specs import get_model

TINY = LlamaConfig.from_spec(get_model("tiny"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    random_plan(2, 128, 8, 4, seed=4, block_size=8).save(d / "plan.json")
    save_hf_checkpoint(Llama(TINY).init_weights(0), d / "sharded", max_shard_bytes=200_000)
    return d


def test_save_target_is_checked_before_training_and_a_checkpoint_is_replaced_whole(files, capfd, tmp_path):
    """--save into a directory holding a sharded checkpoint used to leave its old index behind, so
    the next --init-from loaded the old weights with exit code 0: the save replaces the directory."""
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(files / "sharded", target)
    assert (
        main(
            [
                "run",
                "--plan",
                str(files / "plan.json"),
                "--steps",
                "2",
                "--model",
                "tiny",
                "--save",
                str(target),
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    trained = load_file(str(target / "model.safetensors"))
    init = Llama(TINY).init_weights(0).state_dict()
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], init["layers.0.mlp.up_proj.weight"])
    assert not any(p.name.startswith(".ckpt") for p in tmp_path.iterdir())  # no temporaries left
    assert (tmp_path / "run" / "summary.json").is_file()
    json.loads((target / "config.json").read_text())
