"""Bad input, one table: every case is refused before any work with exit code 2, no traceback,
and a message that names the field, the value and the rule (the words each case lists).

Cases run `hexiseq.cli.main` in-process (a spawned process costs ~1 s here). Each input is a
small mutation of a valid base (`test_the_bases_are_valid` runs the bases: they succeed), so a
case fails for the reason it states. Cases marked `issue9-...` are regressions of the defects
quoted in issue #9 (parts 3 and 4).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hexiseq.cli import main
from hexiseq.plan import ring_plan


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # "{f}": the case's file; "{tmp}": a fresh directory
    words: tuple[str, ...]  # each must appear in stderr
    file: str | None = None  # contents of {f}
    suffix: str = ".yaml"
    absent: tuple[str, ...] = ()  # must not appear in stderr
    rc: int = 2
    setup: Callable[[Any], None] | None = None  # builds more inputs in the fresh directory (checkpoints)


def run_cli(argv: list[str]) -> int:
    """main(argv)'s exit status; argparse refuses bad arguments with SystemExit(2) after printing
    usage and the error. Any other exception escapes: it would be a traceback for the user."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


# ---------------------------------------------------------------------------------- cluster files

CLUSTER = """\
name: bad
nodes:
  - gpu: H100-SXM
    count: 2
    nic_gbps: 25
  - gpu: A100-80GB
    count: 2
    nic_gbps: 25
"""


def cluster(id: str, text: str, *words: str, absent: tuple[str, ...] = ()) -> Case:
    return Case(id, ("info", "{f}"), words, file=text, absent=absent)


def node(**fields: Any) -> str:
    """A cluster of one node: gpu H100-SXM, count 2, nic_gbps 25, with `fields` changed (None: left out)."""
    entry = {"gpu": "H100-SXM", "count": 2, "nic_gbps": 25, **fields}
    lines = "".join(f"    {k}: {v}\n" for k, v in entry.items() if v is not None)
    return "nodes:\n  - " + lines[4:]


def overrides(*entries: str) -> str:
    return CLUSTER.replace("name: bad\n", "") + "overrides:\n" + "".join(f"  - {{{e}}}\n" for e in entries)


CLUSTER_CASES = [
    cluster(
        "issue9-duplicate-nodes-key",
        "nodes:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\nnodes:\n  - {gpu: A100-80GB, count: 2, nic_gbps: 25}\n",
        "line 3",
        "duplicate key 'nodes'",
        "first at line 1",
        "merge",
    ),
    cluster("duplicate-key-in-node", node() + "    count: 4\n", "duplicate key 'count'"),
    cluster("issue9-unknown-top-level-key", CLUSTER + "links: []\n", "unknown key 'links'", "known keys: nodes, name"),
    cluster(
        "top-level-typo",
        "node:\n  - {gpu: H100-SXM, count: 2, nic_gbps: 25}\n",
        "unknown key 'node'",
        "did you mean 'nodes'?",
    ),
    cluster(
        "issue9-typo-nic_gbsp",
        node(nic_gbps=None, nic_gbsp=25),
        "nodes[0] has unknown key 'nic_gbsp'",
        "did you mean 'nic_gbps'?",
        absent=("missing",),
    ),
    cluster("typo-cuont", node(count=None, cuont=2), "unknown key 'cuont'", "did you mean 'count'?"),
    cluster("missing-nic", node(nic_gbps=None), "nodes[0].nic_gbps is missing (required)"),
    cluster("missing-gpu", node(gpu=None), "nodes[0].gpu is missing (required)"),
    cluster(
        "issue9-count-true",
        node(count="true"),
        "nodes[0].count must be an integer from 1 to 4096",
        "got true (a boolean)",
    ),
    cluster("count-false", node(count="false"), "nodes[0].count", "got false (a boolean)"),
    cluster("count-fraction", node(count=2.5), "nodes[0].count must be an integer", "got 2.5 (a fraction)"),
    cluster("count-float", node(count="8.0"), "nodes[0].count must be an integer", "write it without the '.0'"),
    cluster(
        "count-string",
        node(count='"8"'),
        "nodes[0].count must be an integer",
        "a string: write the number without quotes",
    ),
    cluster("count-zero", node(count=0), "nodes[0].count must be an integer from 1 to 4096, got 0"),
    cluster("count-negative", node(count=-4), "nodes[0].count", "got -4"),
    cluster(
        "issue9-count-200000",
        node(count=200000),
        "nodes[0].count must be at most 4096, got 200,000",
        "HexiSeq plans clusters of at most 4096 GPUs",
    ),
    cluster(
        "total-above-limit",
        node(count=8, repeat=600),
        "its nodes hold 4800 GPUs, above the limit of 4096",
        "plan a part of it",
    ),
    cluster("repeat-zero", node(repeat=0), "nodes[0].repeat must be an integer from 1 to 4096, got 0"),
    cluster("repeat-fraction", node(repeat=1.5), "nodes[0].repeat", "got 1.5 (a fraction)"),
    cluster("repeat-true", node(repeat="true"), "nodes[0].repeat", "got true (a boolean)"),
    cluster("nic-zero", node(nic_gbps=0), "nodes[0].nic_gbps must be a number > 0 and <= 10,000 GB/s, got 0"),
    cluster("nic-negative", node(nic_gbps=-25), "nodes[0].nic_gbps", "got -25"),
    cluster("nic-nan", node(nic_gbps=".nan"), "nodes[0].nic_gbps", "got nan"),
    cluster("nic-inf", node(nic_gbps=".inf"), "nodes[0].nic_gbps", "got inf"),
    cluster("nic-string", node(nic_gbps="fast"), "nodes[0].nic_gbps must be a number", "got 'fast' (a string)"),
    cluster(
        "nic-bytes-per-second",
        node(nic_gbps="25e9"),
        "nodes[0].nic_gbps must be at most 10,000 GB/s",
        "bytes/s or Gbit/s",
    ),
    cluster("nic-true", node(nic_gbps="true"), "nodes[0].nic_gbps", "got true (a boolean)"),
    cluster("link-zero", node(link_bandwidth_gbps=0), "nodes[0].link_bandwidth_gbps must be a number > 0"),
    cluster("link-huge", node(link_bandwidth_gbps="1e12"), "nodes[0].link_bandwidth_gbps must be at most 10,000 GB/s"),
    cluster("unknown-gpu", node(gpu="V100"), "nodes[0]", "unknown GPU type 'V100'", "known types:", "H100-SXM"),
    cluster("gpu-near-miss", node(gpu="H100-SMX"), "unknown GPU type 'H100-SMX' (did you mean 'H100-SXM'?)"),
    cluster("gpu-number", node(gpu=100), "nodes[0]", "unknown GPU type 100"),
    cluster("latency-zero", CLUSTER + "inter_node_latency_us: 0\n", "inter_node_latency_us must be a number > 0"),
    cluster(
        "latency-with-unit",
        CLUSTER + "inter_node_latency_us: 10us\n",
        "inter_node_latency_us must be a number",
        "got '10us'",
    ),
    cluster(
        "latency-huge",
        CLUSTER + "inter_node_latency_us: 1e9\n",
        "inter_node_latency_us must be at most 1,000,000 us, got 1,000,000,000",
    ),
    cluster("name-number", CLUSTER.replace("name: bad", "name: 123"), "name must be a string, got 123"),
    cluster("nodes-empty", "nodes: []\n", "nodes must have at least 1 entry"),
    cluster("nodes-not-a-list", "nodes: 5\n", "nodes must be a list, got 5"),
    cluster("nodes-absent", "name: x\n", "nodes is missing (required)"),
    cluster(
        "file-is-a-list",
        "- {gpu: H100-SXM, count: 2, nic_gbps: 25}\n",
        "a cluster file is a mapping with a 'nodes' list",
        "got a list",
    ),
    cluster("file-empty", "", "a cluster file is a mapping", "got an empty file"),
    cluster("not-yaml", "nodes: [\n", "not valid YAML", "line 2"),
    cluster("node-not-a-mapping", "nodes:\n  - H100-SXM\n", "nodes[0] must be a mapping", "got 'H100-SXM'"),
    cluster(
        "issue9-override-a-1.9",
        overrides("a: 1.9, b: 0, bandwidth_gbps: 5"),
        "overrides[0].a must be an integer from 0 to 4095",
        "got 1.9 (a fraction)",
    ),
    cluster(
        "override-a-string",
        overrides('a: "1", b: 0, bandwidth_gbps: 5'),
        "overrides[0].a must be an integer",
        "a string",
    ),
    cluster("override-a-true", overrides("a: true, b: 0, bandwidth_gbps: 5"), "overrides[0].a", "got true (a boolean)"),
    cluster(
        "override-b-negative",
        overrides("a: 0, b: -1, bandwidth_gbps: 5"),
        "overrides[0].b must be an integer from 0 to 4095, got -1",
    ),
    cluster("override-self-link", overrides("a: 1, b: 1, bandwidth_gbps: 5"), "overrides[0] links device 1 to itself"),
    cluster(
        "override-out-of-range",
        overrides("a: 0, b: 99, bandwidth_gbps: 5"),
        "overrides[0] names device 99, but devices are 0..3",
    ),
    cluster("override-missing-bandwidth", overrides("a: 0, b: 1"), "overrides[0].bandwidth_gbps is missing (required)"),
    cluster(
        "override-zero-bandwidth",
        overrides("a: 0, b: 1, bandwidth_gbps: 0"),
        "overrides[0].bandwidth_gbps must be a number > 0",
    ),
    cluster(
        "override-unknown-key",
        overrides("a: 0, b: 1, bw: 5"),
        "overrides[0] has unknown key 'bw'",
        "known keys: a, b, bandwidth_gbps",
    ),
    cluster("overrides-not-a-list", CLUSTER + "overrides: 3\n", "overrides must be a list, got 3"),
    cluster(
        "override-negative-latency",
        overrides("a: 0, b: 1, bandwidth_gbps: 5, latency_us: -1"),
        "overrides[0].latency_us",
        "got -1",
    ),
    Case(
        "cluster-file-not-found",
        ("info", "{tmp}/nope.yaml"),
        ("cluster file not found", "bundled clusters:", "testbed-8"),
    ),
    Case("cluster-name-not-bundled", ("info", "testbed-9"), ("cluster file not found: testbed-9", "testbed-8")),
    Case("cluster-path-is-a-directory", ("info", "{tmp}"), ("is a directory, not a YAML file",)),
]

# ---------------------------------------------------------------------------- models and HF configs

HF = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def hf(
    id: str, change: dict[str, Any] | Callable[[dict], Any] | str, *words: str, absent: tuple[str, ...] = ()
) -> Case:
    """`info testbed-8 --model CONFIG.json` with the base config changed (a dict: keys set, None
    removes; a callable: its result; a string: the file's text)."""
    if isinstance(change, str):
        text = change
    elif callable(change):
        text = json.dumps(change(copy.deepcopy(HF)))
    else:
        text = json.dumps({k: v for k, v in {**HF, **change}.items() if v is not None})
    return Case(id, ("info", "testbed-8", "--model", "{f}"), words, file=text, suffix=".json", absent=absent)


MODEL_CASES = [
    Case(
        "unknown-model",
        ("info", "testbed-8", "--model", "llama9"),
        ("unknown model 'llama9'", "known models:", "llama2-7b"),
    ),
    Case(
        "model-near-miss",
        ("info", "testbed-8", "--model", "llama2-7B"),
        ("unknown model 'llama2-7B' (did you mean 'llama2-7b'?)",),
    ),
    Case(
        "hf-config-not-found",
        ("info", "testbed-8", "--model", "{tmp}/none/config.json"),
        ("Hugging Face config not found",),
    ),
    hf(
        "issue9-num_hidden_layers-2.7",
        {"num_hidden_layers": 2.7},
        "num_hidden_layers must be an integer from 1 to 4096",
        "got 2.7 (a fraction)",
    ),
    hf(
        "hf-hidden-size-string",
        {"hidden_size": "4096"},
        "hidden_size must be an integer",
        "a string: write the number without quotes",
    ),
    hf(
        "hf-heads-true", {"num_attention_heads": True}, "num_attention_heads must be an integer", "got true (a boolean)"
    ),
    hf("hf-missing-vocab", {"vocab_size": None}, "vocab_size is missing (required)"),
    hf(
        "hf-typo-layers",
        lambda c: {**{k: v for k, v in c.items() if k != "num_hidden_layers"}, "num_hidden_layer": 2},
        "num_hidden_layers is missing (required)",
        "found 'num_hidden_layer'",
    ),
    hf("hf-not-json", "{not json", "not valid JSON"),
    hf("hf-a-list", "[1, 2]", "a Hugging Face config is a JSON object, got list"),
    hf("hf-duplicate-key", json.dumps(HF)[:-1] + ', "vocab_size": 512}', "duplicate key 'vocab_size'"),
    hf("hf-nan", json.dumps(HF).replace("10000.0", "NaN"), "NaN is not a JSON number"),
    hf(
        "hf-heads-not-divisible",
        {"num_attention_heads": 6, "num_key_value_heads": 4},
        "heads (6) must be divisible by kv_heads (4)",
    ),
    hf("hf-hidden-not-divisible", {"hidden_size": 66}, "hidden (66) not divisible by heads (4); give head_dim"),
    hf("hf-vocab-huge", {"vocab_size": 10**9}, "vocab_size must be at most 16,777,216, got 1,000,000,000"),
    hf("hf-kv-heads-zero", {"num_key_value_heads": 0}, "num_key_value_heads must be an integer from 1 to 4096, got 0"),
    hf("hf-tie-yes", {"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false", "got 'yes'"),
    hf(
        "hf-rope-theta-string",
        {"rope_theta": None, "rope_parameters": {"rope_theta": "big"}},
        "rope_parameters.rope_theta",
        "must be a number",
        "got 'big'",
    ),
    hf("hf-rope-theta-negative", {"rope_theta": -1.0}, "rope_theta must be a number > 0", "got -1"),
]

# ---------------------------------------------------------------------------------------- plan files

PLAN = {**ring_plan(range(8), 8192, 32, 32, block_size=128).to_dict(), "cluster": "testbed-8", "model": "llama2-7b"}


def plan(id: str, change: Callable[[dict], Any] | str, *words: str) -> Case:
    """`estimate --plan FILE` with the base plan changed by `change` (in place or
    returning the new object) or replaced by a text."""
    if isinstance(change, str):
        text = change
    else:
        d = copy.deepcopy(PLAN)
        out = change(d)
        text = json.dumps(d if out is None else out)
    return Case(id, ("estimate", "--plan", "{f}"), words, file=text, suffix=".json")


def group(key: str, value: Any) -> Callable[[dict], None]:
    """Set `key` of group 1."""
    return lambda d: d["groups"][1].__setitem__(key, value)


def drop(key: str, group: int | None = None) -> Callable[[dict], None]:
    """Remove `key` from the plan (or from one of its groups)."""
    return lambda d: (d if group is None else d["groups"][group]).pop(key) and None


PLAN_CASES = [
    plan(
        "issue9-chunk_len-2048.7",
        group("chunk_len", 2048.7),
        "groups[1].chunk_len must be an integer",
        "got 2048.7 (a fraction)",
    ),
    plan(
        "issue9-devices-string",
        group("devices", ["01"]),
        "groups[1].devices[0] must be an integer from 0 to 4095",
        "got '01'",
    ),
    plan(
        "issue9-devices-true",
        lambda d: d["groups"][0].__setitem__("devices", [True, 0]),
        "groups[0].devices[0]",
        "got true (a boolean)",
    ),
    plan(
        "shard-float", group("shards", [1024.0]), "groups[1].shards[0] must be an integer", "write it without the '.0'"
    ),
    plan("heads-string", group("heads", ["32"]), "groups[1].heads[0] must be an integer", "a string"),
    plan("seq_len-string", lambda d: d.__setitem__("seq_len", "big"), "seq_len must be an integer", "got 'big'"),
    plan("seq_len-1e30", lambda d: d.__setitem__("seq_len", 1e30), "seq_len must be an integer", "got 1e+30"),
    plan("seq_len-huge", lambda d: d.__setitem__("seq_len", 2**40), "seq_len must be at most 134,217,728"),
    plan(
        "chunk_len-zero",
        group("chunk_len", 0),
        "groups[1].chunk_len must be an integer from 1 to 134,217,728 tokens, got 0",
    ),
    plan(
        "schema-version-3",
        lambda d: d.__setitem__("schema_version", 3),
        "schema_version 3; this HexiSeq reads schema_version 1 and 2",
    ),
    plan(
        "schema-version-2-with-groups",
        lambda d: d.__setitem__("schema_version", 2),
        "a schema_version 2 file holds its groups inside replicas",
    ),
    plan("schema-version-absent", drop("schema_version"), "schema_version None; this HexiSeq reads schema_version 1"),
    plan("schema-version-true", lambda d: d.__setitem__("schema_version", True), "schema_version True"),
    plan(
        "unknown-key",
        lambda d: d.__setitem__("seqlen", 8192),
        "unknown key 'seqlen' (did you mean 'seq_len'?)",
        "known keys: schema_version, seq_len",
    ),
    plan("unknown-group-key", group("chunk", 1024), "groups[1] has unknown key 'chunk' (did you mean 'chunk_len'?)"),
    plan("groups-empty", lambda d: d.__setitem__("groups", []), "groups must have at least 1 entry"),
    plan("groups-not-a-list", lambda d: d.__setitem__("groups", 5), "groups must be a list, got 5"),
    plan("group-missing-heads", drop("heads", group=2), "groups[2].heads is missing (required)"),
    plan("group-no-devices", group("devices", []), "groups[1].devices must have at least 1 entry"),
    plan("device-negative", group("devices", [-1]), "groups[1].devices[0] must be an integer from 0 to 4095, got -1"),
    plan("device-huge", group("devices", [5000]), "groups[1].devices[0] must be at most 4095, got 5000"),
    plan("device-not-in-cluster", group("devices", [9]), "device 9 is not in cluster 'testbed-8' (devices 0..7)"),
    plan("meta-a-list", lambda d: d.__setitem__("meta", [1]), "meta must be a mapping"),
    plan(
        "meta-recompute-typo",
        lambda d: d.__setitem__("meta", {"recompute": "fulll"}),
        "meta.recompute must be one of",
        "did you mean 'full'?",
    ),
    plan("plan-name-number", lambda d: d.__setitem__("name", 5), "name must be a string, got 5"),
    plan(
        "plan-block-size-zero",
        lambda d: d.__setitem__("block_size", 0),
        "block_size must be an integer from 1 to 1,048,576 tokens, got 0",
    ),
    plan(
        "shards-do-not-sum",
        group("shards", [1000]),
        "is invalid",
        "shards sum to 1000 but the group holds 1024 tokens",
        "short by 24",
    ),
    plan("duplicate-key", json.dumps(PLAN)[:-1] + ', "seq_len": 4096}', "duplicate key 'seq_len'"),
    plan("nan", json.dumps(PLAN).replace('"chunk_len": 512', '"chunk_len": NaN', 1), "NaN is not a JSON number"),
    plan("not-json", "{", "not valid JSON"),
    plan("a-list", "[1]", "must be a JSON object, got list"),
    Case(
        "plan-for-another-cluster",
        ("estimate", "--plan", "{f}", "--cluster", "sim-64"),
        ("made for cluster 'testbed-8', not 'sim-64'",),
        file=json.dumps(PLAN),
        suffix=".json",
    ),
    Case("plan-file-not-found", ("estimate", "--plan", "{tmp}/none.json"), ("plan file not found",)),
    Case("plan-file-is-a-directory", ("estimate", "--plan", "{tmp}"), ("is a directory, not a plan file",)),
]

# ------------------------------------------------------------------------------------- CLI numbers

PLAN_ARGS = ("plan", "--cluster", "testbed-8", "--seq-len", "64K")
EST_ARGS = ("estimate", "--cluster", "testbed-8", "--layout", "ring")


def cli(id: str, argv: tuple[str, ...], *words: str) -> Case:
    return Case(id, argv, words)


CLI_CASES = [
    cli(
        "issue9-plan-seq-len-1e30",
        ("plan", "--cluster", "testbed-8", "--seq-len", "1e30"),
        "argument --seq-len",
        "above the limit of 134,217,728 (128M) tokens",
    ),
    cli(
        "issue9-estimate-seq-len-1e30",
        EST_ARGS + ("--seq-len", "1e30"),
        "argument --seq-len",
        "above the limit of 134,217,728",
    ),
    cli("seq-len-fraction", EST_ARGS + ("--seq-len", "4096.5"), "token count '4096.5' is not a whole number of tokens"),
    cli("seq-len-negative", PLAN_ARGS[:3] + ("--seq-len=-4K",), "token count must be positive, got '-4K'"),
    cli("seq-len-zero", PLAN_ARGS[:4] + ("0",), "token count must be positive, got '0'"),
    cli("seq-len-word", PLAN_ARGS[:4] + ("lots",), "not a token count: 'lots'", "128K"),
    cli("seq-len-inf", PLAN_ARGS[:4] + ("inf",), "not a token count: 'inf'"),
    cli("seq-len-nan", PLAN_ARGS[:4] + ("nan",), "not a token count: 'nan'"),
    cli("seq-len-200M", PLAN_ARGS[:4] + ("200M",), "'200M' (209,715,200 tokens) is above the limit"),
    cli(
        "global-batch-zero",
        PLAN_ARGS + ("--global-batch", "0"),
        "argument --global-batch: must be an integer from 1 to 65,536, got 0",
    ),
    cli(
        "global-batch-fraction",
        PLAN_ARGS + ("--global-batch", "2.5"),
        "argument --global-batch",
        "got 2.5 (a fraction)",
    ),
    cli("global-batch-huge", PLAN_ARGS + ("--global-batch", "100000"), "argument --global-batch", "at most 65,536"),
    cli("global-batch-word", PLAN_ARGS + ("--global-batch", "abc"), "argument --global-batch", "got 'abc' (a string)"),
    cli(
        "block-size-zero",
        PLAN_ARGS + ("--block-size", "0"),
        "argument --block-size: must be an integer from 1 to 1,048,576 tokens, got 0",
    ),
    cli("block-size-fraction", PLAN_ARGS + ("--block-size", "2.5"), "argument --block-size", "got 2.5 (a fraction)"),
    cli(
        "estimate-block-size-negative",
        EST_ARGS + ("--seq-len", "64K", "--block-size", "-1"),
        "argument --block-size",
        "got -1",
    ),
    cli("work-negative", PLAN_ARGS + ("--work", "-1"), "work must be positive"),
    cli("gap-nan", PLAN_ARGS + ("--gap", "nan"), "gap >= 0"),
    cli("ranks-negative", PLAN_ARGS + ("--ranks", "-1"), "--ranks must be >= 0"),
    cli("recompute-typo", PLAN_ARGS + ("--recompute", "fulll"), "argument --recompute: invalid choice: 'fulll'"),
    cli(
        "estimate-recompute-auto",
        EST_ARGS + ("--seq-len", "64K", "--recompute", "auto"),
        "needs a concrete --recompute",
    ),
    cli(
        "layout-size",
        ("estimate", "--cluster", "testbed-8", "--seq-len", "64K", "--layout", "usp:3x4"),
        "3 x 4 = 12 devices",
        "has 8",
    ),
    cli(
        "layout-unknown",
        ("estimate", "--cluster", "testbed-8", "--seq-len", "64K", "--layout", "grid"),
        "ring, ulysses or usp:CPxHP",
    ),
    cli(
        "estimate-plan-and-layout-missing",
        ("estimate", "--cluster", "testbed-8", "--seq-len", "64K"),
        "exactly one of --plan",
    ),
    cli("issue9-plan-out-directory", PLAN_ARGS + ("--out", "{tmp}"), "--out", "is a directory; give a file name"),
    cli(
        "issue9-plan-out-missing-parent",
        PLAN_ARGS + ("--out", "{tmp}/no/such/dir/plan.json"),
        "does not exist; create it first",
    ),
    cli("plan-out-trailing-slash", PLAN_ARGS + ("--out", "{tmp}/new/"), "is a directory; give a file name"),
    cli("sharding-unknown", PLAN_ARGS + ("--sharding", "zero9"), "argument --sharding: invalid choice: 'zero9'"),
    cli("plan-cluster-missing", ("plan", "--cluster", "{tmp}/c.yaml", "--seq-len", "64K"), "cluster file not found"),
    cli("estimate-model-unknown", EST_ARGS + ("--seq-len", "64K", "--model", "gpt-9b"), "unknown model 'gpt-9b'"),
]

# ------------------------------------------------------------------------------------------ profiles

PROFILE = "notes: test bench\ngpus:\n  H100-SXM:\n    eff_matmul: 0.7\n    eff_attention: 0.5\n"


def profile(id: str, text: str, *words: str) -> Case:
    return Case(id, EST_ARGS + ("--seq-len", "64K", "--profile", "{f}"), words, file=text)


PROFILE_CASES = [
    profile(
        "profile-eff-above-1", PROFILE.replace("0.7", "1.5"), "gpus.H100-SXM.eff_matmul must be at most 1, got 1.5"
    ),
    profile(
        "profile-eff-zero", PROFILE.replace("0.7", "0"), "gpus.H100-SXM.eff_matmul must be a number > 0 and <= 1, got 0"
    ),
    profile("profile-eff-string", PROFILE.replace("0.7", "abc"), "gpus.H100-SXM.eff_matmul", "got 'abc' (a string)"),
    profile("profile-eff-true", PROFILE.replace("0.5", "true"), "gpus.H100-SXM.eff_attention", "got true (a boolean)"),
    profile(
        "profile-gpu-typo",
        PROFILE.replace("H100-SXM", "H100-SMX"),
        "gpus.H100-SMX is not a GPU type of the catalog",
        "did you mean 'H100-SXM'?",
    ),
    profile(
        "profile-unknown-field",
        PROFILE + "    speed: 3\n",
        "gpus.H100-SXM has unknown key 'speed'",
        "known keys: peak_bf16_tflops",
    ),
    profile("profile-top-level-typo", PROFILE.replace("notes:", "note:"), "unknown key 'note' (did you mean 'notes'?)"),
    profile("profile-no-gpus", "notes: nothing\n", "a profile needs a top-level 'gpus' mapping"),
    profile("profile-duplicate-gpu", PROFILE + "  H100-SXM:\n    eff_matmul: 0.6\n", "duplicate key 'H100-SXM'"),
    Case("profile-not-found", EST_ARGS + ("--seq-len", "64K", "--profile", "{tmp}/p.yaml"), ("file not found",)),
]

# ------------------------------------------------------------------------------ checkpoints and runs
# `hexiseq run` / `verify` / `export`: numbers, checkpoints (readable, complete, shapes, floating
# dtypes, finite), output paths and data, all refused before a rank starts (NaN weights: by the
# ranks, at load, before the first step, as one message).

RUN_PLAN = ring_plan([0, 1], 128, 8, 4, block_size=8, name="two").to_json()


def run_case(
    id: str, args: tuple[str, ...], *words: str, setup: Callable[[Any], None] | None = None, cmd: str = "run"
) -> Case:
    head = (
        ("run", "--plan", "{f}", "--steps", "1", "--out", "{tmp}/run") if cmd == "run" else ("verify", "--plan", "{f}")
    )
    return Case(id, head + args, words, file=RUN_PLAN, suffix=".json", setup=setup)


def checkpoint(
    edit: Callable[[Any], None] | None = None, sharded: bool = False, kv_heads: int = 4
) -> Callable[[Any], None]:
    """A setup: a tiny-model checkpoint in {tmp}/ckpt (with `kv_heads`), then `edit(directory)`."""

    def make(tmp) -> None:
        from dataclasses import replace

        from hexiseq.runtime.hf_checkpoint import save_hf_checkpoint
        from hexiseq.runtime.llama import Llama, LlamaConfig
        from hexiseq.specs import get_model

        cfg = replace(LlamaConfig.from_spec(get_model("tiny")), kv_heads=kv_heads)
        save_hf_checkpoint(Llama(cfg).init_weights(0), tmp / "ckpt", max_shard_bytes=200_000 if sharded else 5 * 2**30)
        if edit is not None:
            edit(tmp / "ckpt")

    return make


def tensors(fn: Callable[[dict], None]) -> Callable[[Any], None]:
    """An edit of model.safetensors' tensors."""

    def edit(d) -> None:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(d / "model.safetensors"))
        fn(sd)
        save_file(sd, str(d / "model.safetensors"))

    return edit


def _truncate(d) -> None:
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])


def _mix(d) -> None:  # an index next to a single file: two checkpoints in one directory
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model.safetensors"}})
    )


def _drop_shard(d) -> None:
    sorted(d.glob("model-*.safetensors"))[1].unlink()


def _set(key: str, value: Callable[[Any], Any]) -> Callable[[dict], None]:
    return lambda sd: sd.__setitem__(key, value(sd[key]))


def _nan(t):
    t[0, 0] = float("nan")
    return t


def _files(**files: Any) -> Callable[[Any], None]:
    """A setup writing {tmp}/NAME files (text, bytes, or a numpy array for .npy)."""

    def make(tmp) -> None:
        import numpy as np

        for name, content in files.items():
            path = tmp / name.replace("_", ".", 1)
            if isinstance(content, str):
                path.write_text(content)
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                np.save(path, np.asarray(content))

    return make


UP = "model.layers.0.mlp.up_proj.weight"
RUN_CASES: list[Case] = [
    run_case("issue9-run-lr-nan", ("--lr", "nan"), "argument --lr: must be a number > 0 and <= 1, got nan"),
    run_case("issue9-run-lr-negative", ("--lr=-1e-3",), "argument --lr", "got -0.001"),
    run_case("issue9-run-lr-zero", ("--lr", "0"), "argument --lr", "got 0"),
    run_case("run-lr-huge", ("--lr", "5"), "argument --lr: must be at most 1, got 5", "not training"),
    run_case(
        "issue9-run-grad-clip-negative", ("--grad-clip=-1",), "argument --grad-clip: must be a number >= 0", "got -1"
    ),
    run_case("run-grad-clip-inf", ("--grad-clip", "inf"), "argument --grad-clip", "got inf"),
    run_case("run-steps-zero", ("--steps", "0"), "argument --steps: must be an integer from 1 to 10,000,000, got 0"),
    run_case("run-steps-huge", ("--steps", "100000000"), "argument --steps: must be at most 10,000,000"),
    run_case("run-steps-fraction", ("--steps", "2.5"), "argument --steps", "got 2.5 (a fraction)"),
    run_case("run-timeout-huge", ("--timeout", "1e9"), "argument --timeout: must be at most 604,800 s", "(a week)"),
    run_case("run-timeout-zero", ("--timeout", "0"), "argument --timeout", "got 0"),
    run_case("run-time-limit-nan", ("--time-limit", "nan"), "argument --time-limit", "got nan"),
    run_case("run-seq-len-1e30", ("--seq-len", "1e30"), "argument --seq-len", "above the limit of 134,217,728"),
    run_case(
        "run-global-batch-zero",
        ("--global-batch", "0"),
        "argument --global-batch: must be an integer from 1 to 65,536, got 0",
    ),
    run_case("run-loss-chunk-zero", ("--loss-chunk", "0"), "argument --loss-chunk", "got 0"),
    run_case("run-seed-negative", ("--seed=-1",), "argument --seed", "got -1"),
    run_case(
        "run-warmup-not-below-steps",
        ("--steps", "3", "--warmup-steps", "3"),
        "--warmup-steps (3) must be fewer than --steps (3)",
    ),
    run_case("run-nproc-wrong", ("--nproc", "3"), "has 2 ranks but --nproc is 3"),
    run_case("run-dtype-unknown", ("--dtype", "float16"), "argument --dtype: invalid choice: 'float16'"),
    run_case(
        "issue9-run-save-onto-a-file",
        ("--save", "{f}"),
        "cannot save to",
        "it is an existing file; give a directory path",
    ),
    run_case(
        "run-save-over-other-files",
        ("--save", "{tmp}"),
        "holds files that are not a checkpoint",
        "replaces the whole directory",
    ),
    run_case("run-out-is-a-file", ("--out", "{f}"), "--out", "is a file"),
    run_case("run-init-from-missing", ("--init-from", "{tmp}/nowhere"), "checkpoint directory not found"),
    run_case(
        "issue9-run-init-from-corrupt-safetensors",
        ("--init-from", "{tmp}/ckpt"),
        "ckpt/model.safetensors: cannot be read",
        "corrupt or was cut short",
        setup=checkpoint(_truncate),
    ),
    run_case(
        "issue9-run-init-from-int64-weights",
        ("--init-from", "{tmp}/ckpt"),
        "layers.0.mlp.up_proj.weight has dtype int64",
        "floating point",
        setup=checkpoint(tensors(_set(UP, lambda t: t.long()))),
    ),
    run_case(
        "issue9-run-init-from-nan-weights",
        ("--init-from", "{tmp}/ckpt", "--timeout", "60"),
        "ranks 0, 1 of 2: checkpoint tensor",
        "layers.1.self_attn.q_proj.weight has 1 NaN/Inf entry",
        setup=checkpoint(tensors(_set("model.layers.1.self_attn.q_proj.weight", _nan))),
    ),
    run_case(
        "run-init-from-missing-tensor",
        ("--init-from", "{tmp}/ckpt"),
        "missing ['norm.weight']",
        setup=checkpoint(tensors(lambda sd: sd.pop("model.norm.weight"))),
    ),
    run_case(
        "run-init-from-wrong-shape",
        ("--init-from", "{tmp}/ckpt"),
        "embed_tokens.weight has shape (512, 64)",
        "(512, 128)",
        setup=checkpoint(tensors(_set("model.embed_tokens.weight", lambda t: t[:, :64].clone()))),
    ),
    run_case(
        "issue9-run-init-from-index-and-single-file",
        ("--init-from", "{tmp}/ckpt"),
        "holds both model.safetensors.index.json and model.safetensors",
        "two checkpoints are mixed",
        setup=checkpoint(_mix),
    ),
    run_case(
        "issue9-run-init-from-index-names-a-missing-shard",
        ("--init-from", "{tmp}/ckpt"),
        "names 1 shard that is not in",
        "model-00002-of-",
        setup=checkpoint(_drop_shard, sharded=True),
    ),
    run_case(
        "run-init-from-config-not-json",
        ("--init-from", "{tmp}/ckpt"),
        "config.json",
        setup=checkpoint(lambda d: (d / "config.json").write_text("{not json")),
    ),
    run_case(
        "run-init-from-other-heads",
        ("--init-from", "{tmp}/ckpt"),
        "plan has 8 heads / 4 KV heads but model 'ckpt' has 8 / 2",
        setup=checkpoint(kv_heads=2),
    ),
    run_case("run-data-missing", ("--data", "{tmp}/none.txt"), "--data", "no such file or folder"),
    run_case("run-data-not-utf8", ("--data", "{tmp}/t.txt"), "not UTF-8 text", setup=_files(t_txt=b"\xff\xfe\x00bad")),
    run_case(
        "run-data-wrong-kind", ("--data", "{tmp}/t.csv"), "expected a text file or folder", setup=_files(t_csv="1,2")
    ),
    run_case(
        "run-data-id-beyond-vocab",
        ("--data", "{tmp}/t.npy", "--model", "tiny"),
        "holds token ids up to 600",
        "vocabulary of 512",
        setup=_files(t_npy=list(range(590, 601)) * 30),
    ),
    run_case(
        "run-data-negative-id", ("--data", "{tmp}/t.npy"), "negative token id (-1)", setup=_files(t_npy=[1, 2, -1])
    ),
    run_case(
        "run-data-float-ids", ("--data", "{tmp}/t.npy"), "token ids must be integers", setup=_files(t_npy=[0.5, 1.5])
    ),
    run_case(
        "run-labels-other-shape",
        ("--data", "{tmp}/t.npy", "--labels", "{tmp}/l.npy"),
        "shape (1, 3) differs from the tokens' (1, 4)",
        setup=_files(t_npy=[[1, 2, 3, 4]], l_npy=[[1, 2, 3]]),
    ),
    run_case(
        "run-labels-bad-value",
        ("--data", "{tmp}/t.npy", "--labels", "{tmp}/l.npy"),
        "holds -7; labels are token ids or -100",
        setup=_files(t_npy=[[1, 2, 3, 4]], l_npy=[[1, -7, 3, -100]]),
    ),
    run_case(
        "run-labels-with-text",
        ("--data", "{tmp}/t.txt", "--labels", "{tmp}/l.npy"),
        "--labels goes with 2-D token arrays",
        setup=_files(t_txt="hello", l_npy=[1]),
    ),
    run_case(
        "run-sequences-longer-than-plan",
        ("--data", "{tmp}/t.npy", "--seq-len", "128"),
        "sequences have 200 tokens but the plan holds 128",
        setup=_files(t_npy=[list(range(200))]),
    ),
    run_case(
        "run-tokenizer-missing",
        ("--data", "{tmp}/t.txt", "--tokenizer", "{tmp}"),
        "no tokenizer.json there",
        setup=_files(t_txt="hello"),
    ),
    run_case(
        "run-tokenizer-with-tokens",
        ("--data", "{tmp}/t.npy", "--tokenizer", "{tmp}"),
        "--tokenizer goes with text data",
        setup=_files(t_npy=[1, 2, 3]),
    ),
    run_case(
        "run-token-dtype-unknown",
        ("--data", "{tmp}/t.bin", "--token-dtype", "float8"),
        "--token-dtype must be one of",
        setup=_files(t_bin=b"\x00\x01"),
    ),
    Case("run-no-plan", ("run", "--steps", "1"), ("give --plan FILE (or --resume RUN_DIR)",)),
    Case("run-resume-not-a-run", ("run", "--resume", "{tmp}"), ("not a run directory (no config.json)",)),
    Case("run-resume-changes-lr", ("run", "--resume", "{tmp}", "--lr", "0.1"), ("--lr cannot change",)),
    Case("export-not-a-run", ("export", "{tmp}", "--to", "{tmp}/hf"), ("not a run directory (no config.json)",)),
    Case("export-onto-a-file", ("export", "{tmp}", "--to", "{f}"), ("it is an existing file",), file="x"),
    run_case("verify-tolerance-nan", ("--tolerance", "nan"), "argument --tolerance", "got nan", cmd="verify"),
    run_case("verify-tolerance-negative", ("--tolerance=-1",), "argument --tolerance", "got -1", cmd="verify"),
    run_case("verify-timeout-negative", ("--timeout=-5",), "argument --timeout", "got -5", cmd="verify"),
    run_case("verify-time-limit-inf", ("--time-limit", "inf"), "argument --time-limit", "got inf", cmd="verify"),
    run_case("verify-seq-len-huge", ("--seq-len", "1G"), "argument --seq-len", "not a token count", cmd="verify"),
    run_case("verify-nproc-wrong", ("--nproc", "3"), "has 2 ranks but --nproc is 3", cmd="verify"),
]

# ------------------------------------------------------------------------------ run directories
# issue 22: a run directory's files damaged or tampered with (a pickle that would create {tmp}/MARKER,
# the manifest updated to match it), refused with the file named and no code run; special targets
# and data refused before any work; a refusal the ranks find leaves no run directory behind.

_TEMPLATE: dict[str, Any] = {}


def _template_run() -> Any:
    """A finished 2-step run of RUN_PLAN (tiny model), made once per session and copied by setups."""
    if "path" not in _TEMPLATE:
        import atexit
        import contextlib
        import io
        import shutil
        import tempfile
        from pathlib import Path

        base = Path(tempfile.mkdtemp(prefix="hexiseq-table-run-"))
        atexit.register(shutil.rmtree, base, True)
        (base / "plan.json").write_text(RUN_PLAN)
        argv = ["run", "--plan", str(base / "plan.json"), "--model", "tiny", "--steps", "2", "--out", str(base / "r")]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main([*argv, "--no-tensorboard"]) == 0
        _TEMPLATE["path"] = base / "r"
    return _TEMPLATE["path"]


def _step(run) -> Any:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


def _evil(tmp) -> bytes:
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp / 'MARKER'}",))

    return pickle.dumps(Evil(), protocol=2)


def _rewrite(run, name: str, data: bytes) -> None:
    """Replace a checkpoint file and give the manifest its size and CRC-32 (as an attacker would)."""
    import zlib

    step = _step(run)
    (step / name).write_bytes(data)
    m = json.loads((step / "manifest.json").read_text())
    m["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    (step / "manifest.json").write_text(json.dumps(m))


def run_dir(edit: Callable[[Any, Any], None] | None = None) -> Callable[[Any], None]:
    """A setup: the template run copied to {tmp}/r, then `edit(run, tmp)`."""

    def make(tmp) -> None:
        import shutil

        shutil.copytree(_template_run(), tmp / "r")
        if edit is not None:
            edit(tmp / "r", tmp)

    return make


def _drop_config_fields(run, tmp) -> None:
    cfg = json.loads((run / "config.json").read_text())
    for key in ("model", "steps"):
        cfg.pop(key)
    (run / "config.json").write_text(json.dumps(cfg))


def _checkpoints_a_file(run, tmp) -> None:
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("not a directory")


def _dev_zero(tmp) -> None:
    (tmp / "zero").symlink_to("/dev/zero")


RESUME = ("run", "--resume", "{tmp}/r", "--steps", "3")
EXPORT = ("export", "{tmp}/r", "--to", "{tmp}/hf")
RUN_DIR_CASES: list[Case] = [
    Case(
        "issue22-config-missing-fields",
        RESUME,
        ("config.json is incomplete or damaged (it lacks model, steps)",),
        setup=run_dir(_drop_config_fields),
    ),
    Case(
        "issue22-export-config-missing-fields",
        EXPORT,
        ("RUN_DIR", "config.json is incomplete or damaged"),
        absent=("--resume",),
        setup=run_dir(_drop_config_fields),
    ),
    Case(
        "issue22-config-nested",
        RESUME,
        ("config.json is unreadable",),
        setup=run_dir(lambda r, t: (r / "config.json").write_text("[" * 100_000 + "]" * 100_000)),
    ),
    Case(
        "issue22-checkpoints-is-a-file",
        RESUME,
        ("checkpoints is not a directory", "the run directory is damaged"),
        setup=run_dir(_checkpoints_a_file),
    ),
    Case(
        "issue22-rng-tampered",
        RESUME,
        ("rng-00000.pt: refused", "could run code"),
        absent=("weights_only=False",),
        setup=run_dir(lambda r, t: _rewrite(r, "rng-00000.pt", _evil(t))),
    ),
    Case(
        "issue22-metadata-runs-code",
        RESUME,
        (".metadata: refused: it asks to load posix.system",),
        setup=run_dir(lambda r, t: _rewrite(r, ".metadata", _evil(t))),
    ),
    Case(
        "issue22-export-metadata-runs-code",
        EXPORT,
        (".metadata: refused",),
        setup=run_dir(lambda r, t: _rewrite(r, ".metadata", _evil(t))),
    ),
    Case(
        "issue22-metadata-corrupt",
        RESUME,
        (".metadata: not a readable checkpoint index",),
        setup=run_dir(lambda r, t: _rewrite(r, ".metadata", (_step(r) / ".metadata").read_bytes()[:200])),
    ),
    Case(
        "issue22-manifest-not-a-manifest",
        RESUME,
        ("manifest.json is unreadable",),
        setup=run_dir(lambda r, t: (_step(r) / "manifest.json").write_text('{"files": [1, 2]}')),
    ),
    Case(
        "issue22-trainer-without-step",
        EXPORT,
        ("trainer.json is unreadable",),
        setup=run_dir(lambda r, t: _rewrite(r, "trainer.json", b"{}")),
    ),
    Case(
        "issue22-resume-steps-below-the-run",
        ("run", "--resume", "{tmp}/r", "--steps", "1"),
        ("--steps 1: the run is at step 2 already",),
        absent=("of 1",),
        setup=run_dir(),
    ),
    Case("issue22-export-names-run-dir", EXPORT, ("RUN_DIR", "not a run directory"), absent=("--resume",)),
    run_case("issue22-run-out-empty", ("--out", ""), "--out '': give a directory path"),
    run_case(
        "issue22-run-data-dev-zero", ("--data", "{tmp}/zero"), "is a character device (/dev/zero)", setup=_dev_zero
    ),
    run_case("issue22-run-save-under-proc", ("--save", "/proc/hexiseq-save"), "a directory cannot be made in /proc"),
    run_case(
        "issue22-run-data-id-4e9",
        ("--data", "{tmp}/t.npy"),
        "holds token id 4,000,000,000, beyond any model's vocabulary",
        setup=_files(t_npy=[1, 2, 4_000_000_000] * 50),
    ),
    run_case(
        "issue22-run-data-too-short-for-the-ranks",
        ("--data", "{tmp}/t.txt", "--timeout", "60"),
        "ranks 0, 1 of 2:",
        "make no sequence of 129",
        setup=_files(t_txt="hello"),
    ),
    Case(
        "issue22-plan-nested-100000",
        ("estimate", "--plan", "{f}"),
        ("nested too deeply to be read",),
        file="[" * 100_000 + "]" * 100_000,
        suffix=".json",
    ),
    Case(
        "issue22-verify-nproc-4096",
        ("verify", "--random-plan", "--nproc", "4096"),
        ("--nproc 4096: this machine has", "local ranks"),
    ),
    Case("issue22-profile-world-4096", ("profile", "--world", "4096", "--out", "{tmp}/p.yaml"), ("use at most",)),
    Case("issue22-plan-dev-zero", ("estimate", "--plan", "{tmp}/zero"), ("is not a regular file",), setup=_dev_zero),
    Case(
        "issue22-plan-huge",
        ("estimate", "--plan", "{tmp}/huge.json"),
        ("more than any plan file holds",),
        setup=lambda tmp: open(tmp / "huge.json", "wb").truncate(300 * 2**20),
    ),
    Case(
        "issue22-cluster-nested-100000",
        ("info", "{f}"),
        ("nested too deeply to be read",),
        file="[" * 100_000 + "]" * 100_000,
    ),
]

CASES = CLUSTER_CASES + MODEL_CASES + PLAN_CASES + CLI_CASES + PROFILE_CASES + RUN_CASES + RUN_DIR_CASES


def _argv(case: Case, tmp_path) -> list[str]:
    f = tmp_path / f"input{case.suffix}"
    if case.file is not None:
        f.write_text(case.file)
    if case.setup is not None:
        case.setup(tmp_path)
    return [a.format(f=f, tmp=tmp_path) for a in case.argv]


def test_the_table_is_large_and_its_ids_unique():
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly(case, tmp_path, capsys):
    rc = run_cli(_argv(case, tmp_path))
    out, err = capsys.readouterr()
    assert rc == case.rc, f"exit {rc}, expected {case.rc}; stderr:\n{err}"
    assert "Traceback" not in out + err
    for word in case.words:
        assert word in err, f"{word!r} not in the message:\n{err}"
    for word in case.absent:
        assert word not in err, f"{word!r} should not be in the message:\n{err}"
    message = [line for line in err.splitlines() if "error:" in line]
    assert len(message) == 1 and len(err.splitlines()) <= 16, f"not one short message:\n{err}"
    assert "internal" not in err.lower(), f"bad input called an internal fault:\n{err}"
    assert not (tmp_path / "MARKER").exists(), "code from the input ran"
    # Nothing left behind: refused before the run directory is made, or (what the ranks find as they
    # load, e.g. non-finite weights or too little data) the directory the start made is removed.
    if case.argv[:1] == ("run",) and "--resume" not in case.argv:
        assert not (tmp_path / "run").exists(), "a refused run left a run directory behind"


@pytest.mark.parametrize(
    "base",
    [
        Case("cluster", ("info", "{f}"), (), file=CLUSTER, rc=0),
        Case(
            "cluster-with-overrides",
            ("info", "{f}"),
            (),
            file=overrides("a: 0, b: 3, bandwidth_gbps: 5, latency_us: 2"),
            rc=0,
        ),
        Case("one-node", ("info", "{f}"), (), file=node(repeat=2, link_bandwidth_gbps=400), rc=0),
        Case("hf-config", ("info", "testbed-8", "--model", "{f}"), (), file=json.dumps(HF), suffix=".json", rc=0),
        Case("plan", ("estimate", "--plan", "{f}"), (), file=json.dumps(PLAN), suffix=".json", rc=0),
        Case("profile", EST_ARGS + ("--seq-len", "64K", "--profile", "{f}"), (), file=PROFILE, rc=0),
        Case("seq-len-at-the-limit", EST_ARGS + ("--seq-len", "128M"), (), rc=0),
        Case(
            "run",
            ("run", "--plan", "{f}", "--steps", "1", "--out", "{tmp}/run", "--init-from", "{tmp}/ckpt"),
            (),
            file=RUN_PLAN,
            suffix=".json",
            setup=checkpoint(),
            rc=0,
        ),
        Case(
            "run-tokens",
            ("run", "--plan", "{f}", "--steps", "1", "--out", "{tmp}/run", "--data", "{tmp}/t.npy", "--model", "tiny"),
            (),
            file=RUN_PLAN,
            suffix=".json",
            setup=_files(t_npy=list(range(500)) * 2),
            rc=0,
        ),
    ],
    ids=lambda c: c.id,
)
def test_the_bases_are_valid(base, tmp_path, capsys):
    """The inputs the table mutates are accepted: each case fails for its own reason."""
    rc = run_cli(_argv(base, tmp_path))
    out, err = capsys.readouterr()
    assert rc == 0, err


def test_plan_out_is_written_whole(tmp_path, capsys):
    """`plan --out` writes the file by rename: the target appears complete, no temp file stays."""
    target = tmp_path / "plan.json"
    assert run_cli(list(PLAN_ARGS[:4]) + ["16K", "--model", "gpt-3b", "--out", str(target), "--no-progress"]) == 0
    assert json.loads(target.read_text())["schema_version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    capsys.readouterr()
