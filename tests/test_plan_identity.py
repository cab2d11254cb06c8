"""A plan knows its cluster and its model (issue 22): a plan used with another cluster is refused
with what differs; a model from a Hugging Face config.json is recorded in the plan, so estimate,
verify and run find it by name."""

from __future__ import annotations

import json

import pytest

from hexiseq import get_model, load_cluster
from hexiseq.cli import main
from hexiseq.specs.identity import cluster_fingerprint, fingerprint_mismatch, model_named, model_record

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
}


@pytest.fixture(scope="module")
def hf_plan(tmp_path_factory):
    """A plan made with --model path/config.json (the model is not in the catalog)."""
    d = tmp_path_factory.mktemp("m02")
    (d / "config.json").write_text(json.dumps(CONFIG))
    plan = d / "plan.json"
    assert main(["plan", "--cluster", "testbed-8", "--model", str(d / "config.json"), "--seq-len", "16K",
                 "--out", str(plan)]) == 0  # fmt: skip
    return d, plan


def test_the_fingerprint_names_what_differs():
    a, b = load_cluster("testbed-8"), load_cluster("testbed-16")
    assert fingerprint_mismatch(cluster_fingerprint(a), a) is None
    differs = fingerprint_mismatch(cluster_fingerprint(a), b)
    assert "devices 8 there, 16 here" in differs and "GPUs" in differs


def test_a_plan_on_another_cluster_is_refused(hf_plan, capsys):
    d, plan = hf_plan
    data = json.loads(plan.read_text())
    assert data["meta"]["cluster_fingerprint"]["devices"] == 8
    data["cluster"] = "testbed-16"  # an edited cluster name: the devices are not the plan's
    edited = d / "edited.json"
    edited.write_text(json.dumps(data))
    assert main(["estimate", "--plan", str(edited)]) == 2
    err = capsys.readouterr().err
    assert "was made for another cluster than 'testbed-16'" in err and "devices 8 there, 16 here" in err


def test_a_model_from_a_config_file_is_recorded_and_found(hf_plan, capsys):
    d, plan = hf_plan
    recorded = json.loads(plan.read_text())["meta"]["model_spec"]
    assert recorded["name"] == d.name and recorded["heads"] == 8  # a config's model is named by its folder
    assert main(["estimate", "--plan", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0
    assert model_named(d.name, recorded) == get_model(str(d / "config.json"))


def test_catalog_models_are_not_recorded():
    assert model_record(get_model("llama2-7b")) is None


@pytest.mark.slow
def test_verify_finds_the_recorded_model_and_a_config_path(hf_plan, capsys):
    d, plan = hf_plan
    assert main(["verify", "--plan", str(plan), "--model", d.name]) == 0
    assert main(["verify", "--random-plan", "--nproc", "2", "--model", str(d / "config.json")]) == 0
    assert capsys.readouterr().out.count("PASS") >= 2
