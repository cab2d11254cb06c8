"""Specs and catalogs: every bundled file loads, derived bandwidths, parameter counts, bad input."""

import json
import re

import numpy as np
import pytest
import yaml

from hexiseq import ClusterSpec, ModelSpec, SpecError, Workload, get_gpu, get_model, load_cluster, model_catalog
from hexiseq.specs import (
    LinkOverride,
    RecomputePolicy,
    bundled_clusters,
    gpu_catalog,
    load_gpu_catalog,
    load_profile,
    model_from_hf_config,
    parse_tokens,
)

EXPECTED_CLUSTERS = {
    "testbed-8": {"H100-SXM": 4, "A100-80GB": 4},
    "testbed-16": {"H100-SXM": 8, "A100-80GB": 8},
    "sim-32": {"H100-SXM": 8, "A100-80GB": 16, "L40S": 8},
    "sim-64": {"H100-SXM": 16, "A100-80GB": 16, "A800": 16, "L40S": 16},
    "sim-128": {"H100-SXM": 16, "A100-80GB": 48, "A800": 32, "L40S": 32},
    "pair-a-mixed": {"H100-SXM": 48, "A100-80GB": 8},
    "pair-a-a100": {"A100-80GB": 152},
    "pair-b-mixed": {"H100-SXM": 52, "A100-80GB": 4, "A800": 8},
    "pair-b-a100": {"A100-80GB": 168},
    "scale-1024": {"H100-SXM": 256, "A100-80GB": 256, "A800": 256, "L40S": 256},
    "mixed-4": {"H100-SXM": 2, "A100-80GB": 2},
    "cpu-4": {"CPU-x4": 2, "CPU-x10": 2},
    "cpu-8": {"CPU-x8": 4, "CPU-x20": 4},
}


def test_gpu_catalog_has_required_types():
    cat = gpu_catalog()
    for name in ["H100-SXM", "H200", "A100-80GB", "A100-40GB", "A800", "L40S", "B200", "RTX-4090", "RTX-A6000"]:
        assert name in cat
    assert cat["H100-SXM"].peak_bf16_tflops == 989
    assert cat["A100-80GB"].link_bandwidth_gbps == 300
    assert cat["H100-SXM"].matmul_flops == pytest.approx(989e12 * cat["H100-SXM"].eff_matmul)


@pytest.mark.parametrize("name", sorted(EXPECTED_CLUSTERS))
def test_bundled_clusters_load_with_documented_composition(name):
    c = load_cluster(name)
    assert c.gpu_types == EXPECTED_CLUSTERS[name]
    assert c.size == sum(EXPECTED_CLUSTERS[name].values())


def test_devices_are_numbered_in_file_order():
    c = load_cluster("sim-32")
    assert [d.index for d in c.devices] == list(range(c.size))
    assert [d.local_rank for d in c.devices[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]


def test_every_bundled_cluster_file_is_covered():
    assert set(bundled_clusters()) == set(EXPECTED_CLUSTERS)


def test_derived_bandwidths_testbed():
    c = load_cluster("testbed-8")
    assert c.bandwidth_gbps(0, 1) == 450  # H100 NVLink inside node 0
    assert c.bandwidth_gbps(4, 7) == 300  # A100 NVLink inside node 1
    assert c.bandwidth_gbps(0, 4) == 25  # across nodes: the NIC
    assert c.latency_s(0, 4) == pytest.approx(10e-6)
    assert np.isinf(c.bandwidth_matrix_gbps[3, 3])
    assert c.bandwidth_matrix_gbps.shape == (8, 8)
    assert (c.bandwidth_matrix_gbps == c.bandwidth_matrix_gbps.T).all()


def test_inter_node_is_the_slower_nic_and_overrides_win():
    c = ClusterSpec.from_nodes(
        "x", [("H100-SXM", 2, 50), ("L40S", 2, 12.5)], overrides=[LinkOverride(0, 1, 100.0, 5.0)]
    )
    assert c.bandwidth_gbps(0, 2) == 12.5
    assert c.bandwidth_gbps(2, 3) == 32  # L40S over PCIe
    assert c.bandwidth_gbps(0, 1) == 100.0 and c.bandwidth_gbps(1, 0) == 100.0
    assert c.latency_s(0, 1) == pytest.approx(5e-6)


def test_profile_overrides_efficiencies(tmp_path):
    p = tmp_path / "prof.yaml"
    p.write_text("gpus:\n  H100-SXM: {eff_matmul: 0.7, eff_attention: 0.55}\n")
    c = load_cluster("testbed-8").with_profile(load_profile(p))
    assert c.devices[0].gpu.eff_matmul == 0.7 and c.devices[4].gpu.eff_matmul == get_gpu("A100-80GB").eff_matmul


@pytest.mark.parametrize(
    "body, msg",
    [
        (
            "gpus:\n  H100-SXM: {bogus: 1}\n",
            "gpus.H100-SXM has unknown key 'bogus'; known keys: peak_bf16_tflops, hbm_bandwidth_gbps",
        ),
        ("gpus:\n  H100-SXM: 5\n", "gpus.H100-SXM must be a mapping (key: value), got 5"),
        ("gpus: [1]\n", "gpus must be a mapping"),
        ("gpus:\n  H100-SXM: {eff_matmul: abc}\n", "gpus.H100-SXM.eff_matmul must be a number > 0 and <= 1, got 'abc'"),
        (
            "gpus:\n  H100-SMX: {eff_matmul: 0.5}\n",
            "gpus.H100-SMX is not a GPU type of the catalog (did you mean 'H100-SXM'?)",
        ),
        ("gpus:\n  H100-SXM: {eff_matmul: 1.5}\n", "gpus.H100-SXM.eff_matmul must be at most 1, got 1.5"),
    ],
)
def test_bad_profiles_are_spec_errors(tmp_path, body, msg):
    """What data/profiles/README.md promises: only the profile fields of the catalog, each a number in
    its declared range."""
    p = tmp_path / "prof.yaml"
    p.write_text(body)
    with pytest.raises(SpecError, match=re.escape(msg)):
        load_profile(p)
    with pytest.raises(SpecError):  # also when the mapping is handed over directly
        load_cluster("testbed-8").with_profile(yaml.safe_load(body)["gpus"])


def test_profile_top_level_keys_are_gpus_and_notes(tmp_path):
    p = tmp_path / "prof.yaml"
    p.write_text("notes: measured on a test bench\ngpus:\n  H100-SXM: {eff_matmul: 0.7}\n")
    assert load_profile(p) == {"H100-SXM": {"eff_matmul": 0.7}}
    p.write_text("gpus: {}\nnote: x\n")
    with pytest.raises(SpecError, match=re.escape("unknown key 'note' (did you mean 'notes'?)")):
        load_profile(p)


@pytest.mark.parametrize("name", [n for n, m in model_catalog().items() if m.published_params])
def test_param_counts_within_1pct_of_published(name):
    m = get_model(name)
    assert abs(m.param_count - m.published_params) / m.published_params < 0.01


def test_required_model_names():
    for name in [
        "llama3.2-3b",
        "llama2-7b",
        "llama3-8b",
        "llama2-13b",
        "codellama-34b",
        "llama2-70b",
        "llama3-70b",
        "gpt-3b",
        "gpt-7b",
        "gpt-13b",
        "gpt-70b",
        "tiny",
    ]:
        assert name in model_catalog()


def test_llama2_7b_exact_param_count_and_flops():
    m = get_model("llama2-7b")
    assert m.param_count == 6_738_415_616
    # Forward matmul FLOPs per token = 2 x (all matmul weights) = 2 x (params - embedding - norms).
    norms = (2 * m.layers + 1) * m.hidden
    assert m.linear_flops_per_token == 2 * (m.param_count - m.embedding_params - norms)
    S = 4096
    expected = (
        6 * (m.param_count - m.embedding_params - norms) * S + 3 * m.layers * m.heads * 4 * m.head_dim * S * (S + 1) / 2
    )
    assert m.training_flops(S) == pytest.approx(expected)


def test_gqa_reduces_kv_params():
    m = get_model("llama3-8b")
    assert m.group_size == 4 and m.head_dim == 128
    assert m.attn_params_per_layer == 4096 * 4096 * 2 + 2 * 4096 * 1024


def test_hf_config_to_modelspec(tmp_path):
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path / "config.json", name="x")
    assert m.param_count == get_model("llama3-8b").param_count
    assert get_model(str(tmp_path / "config.json")).kv_heads == 8

    assert model_from_hf_config(tmp_path).name == tmp_path.name  # a directory: its config.json, named after it


@pytest.mark.parametrize(
    "text, msg",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "a Hugging Face config is a JSON object, got list"),
        (
            '{"num_hidden_layers": "x", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, '
            '"vocab_size": 9}',
            "num_hidden_layers must be an integer from 1 to 4096, got 'x' (a string)",
        ),
        ('{"num_hidden_layers": 2}', "num_attention_heads is missing (required)"),
    ],
)
def test_bad_hf_configs_are_spec_errors(tmp_path, text, msg):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(SpecError, match=re.escape(msg)):
        model_from_hf_config(tmp_path / "config.json")


# ---------------------------------------------------------------- bad input


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(SpecError, match=r"unknown GPU type 'H9000'.*known types: .*A100-80GB"):
        get_gpu("H9000")


def test_unknown_gpu_in_cluster_file_names_the_node(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\n  - {gpu: V100, count: 2, nic_gbps: 25}\n")
    with pytest.raises(SpecError, match=r"nodes\[1\].*unknown GPU type 'V100'"):
        load_cluster(f)


@pytest.mark.parametrize(
    "body, msg",
    [
        ("nodes: 5\n", "nodes must be a list, got 5"),
        (
            "nodes:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\nlinks: []\n",
            "unknown key 'links'; known keys: nodes, name,",
        ),
        ("nodes:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\noverrides: 3\n", "overrides must be a list, got 3"),
        (
            "nodes:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\noverrides:\n  - {a: x, b: 1, bandwidth_gbps: 9}\n",
            "overrides[0].a must be an integer from 0 to 4095, got 'x' (a string)",
        ),
    ],
)
def test_malformed_cluster_files_are_spec_errors(tmp_path, body, msg):
    f = tmp_path / "c.yaml"
    f.write_text(body)
    with pytest.raises(SpecError, match=re.escape(msg)):
        load_cluster(f)


def test_unknown_model():
    with pytest.raises(SpecError, match=r"unknown model 'llama9'.*known models: .*llama2-7b"):
        get_model("llama9")


@pytest.mark.parametrize("bw", [0, -25])
def test_non_positive_bandwidth_refused(tmp_path, bw):
    f = tmp_path / "c.yaml"
    f.write_text(f"nodes:\n  - {{gpu: H100-SXM, count: 2, nic_gbps: {bw}}}\n")
    with pytest.raises(
        SpecError, match=r"nodes\[0\]\.nic_gbps must be a number > 0 and <= 10,000 GB/s, got " + str(bw)
    ):
        load_cluster(f)


def test_non_positive_override_refused():
    with pytest.raises(SpecError, match="link override: bandwidth_gbps must be a number > 0"):
        ClusterSpec.from_nodes("x", [("H100-SXM", 2, 25)], overrides=[LinkOverride(0, 1, -1.0)])


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(SpecError, match=r"heads \(30\) must be divisible by kv_heads \(8\)"):
        ModelSpec("bad", layers=2, hidden=960, heads=30, kv_heads=8, ffn=100, vocab=10)


def test_missing_cluster_file_lists_bundled():
    with pytest.raises(SpecError, match="bundled clusters: .*testbed-8"):
        load_cluster("no-such-cluster")


def test_bad_gpu_catalog_field(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(
        "X:\n  peak_bf16_tflops: 1\n  memory_gib: 1\n  hbm_bandwidth_gbps: 1\n  link_kind: pcie4\n"
        "  link_bandwidth_gbps: 1\n  speed: 3\n"
    )
    with pytest.raises(SpecError, match=r"GPU type 'X': unknown key 'speed'"):
        load_gpu_catalog(f)


def test_workload_and_tokens():
    assert parse_tokens("128K") == 131072 and parse_tokens("1M") == 1 << 20 and parse_tokens("4096") == 4096
    for bad in ("lots", "inf", "nan", "-infK"):
        with pytest.raises(SpecError, match="not a token count"):
            parse_tokens(bad)
    with pytest.raises(SpecError, match="workload: seq_len must be an integer from 1 to 134,217,728"):
        Workload(seq_len=0)
    with pytest.raises(SpecError, match="param_sharding"):
        Workload(seq_len=8, param_sharding="zero9")


def test_workload_recompute_policies():
    """activation_checkpointing takes the policy names and stores a RecomputePolicy (equal to its
    name); equal policies compare equal; anything else (booleans included) is refused."""
    for policy in ("none", "selective", "full", "auto"):
        w = Workload(seq_len=4096, activation_checkpointing=policy)
        assert w.recompute == policy and type(w.activation_checkpointing) is RecomputePolicy
        assert w == Workload(seq_len=4096, activation_checkpointing=RecomputePolicy(policy))
        assert w.with_recompute("full").recompute == "full" and w.with_recompute("none").recompute == "none"
    assert Workload(seq_len=4096).recompute is RecomputePolicy.NONE
    for bad in ("yes", "Full", 1, 0, None, True, False):
        with pytest.raises(SpecError, match="recompute policy"):
            Workload(seq_len=4096, activation_checkpointing=bad)
