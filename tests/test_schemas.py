"""JSON Schemas of the input files: the committed copies are current, the bundled files validate
against them, and schema and loader agree on what they refuse."""

import json
from pathlib import Path

import jsonschema
import pytest

from hexiseq import random_plan
from hexiseq.commands.schema import SCHEMAS, schema_text
from hexiseq.specs import DATA_DIR, bundled_clusters, read_yaml

SCHEMA_DIR = DATA_DIR / "schemas"


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# The keywords that decide what a schema accepts (annotations such as title and description are
# left out when the running pydantic is not the one that wrote the committed file: pydantic
# versions word and place annotations differently, the rules must not differ).
_RULES = {
    "type",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "minProperties",
    "anyOf",
    "$ref",
    "$defs",
    "propertyNames",
}


def _rules(node):
    """The rule keywords of a schema node, recursively (older pydantic writes enum next to const)."""
    if isinstance(node, list):
        return [_rules(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ("properties", "$defs"):  # mappings of names to schemas
            out[k] = {name: _rules(sub) for name, sub in v.items()}
        elif k == "required":
            out[k] = sorted(v)
        elif k in _RULES and not (k == "enum" and "const" in node):
            out[k] = _rules(v)
    return out


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_committed_schema_is_up_to_date(kind):
    committed = SCHEMA_DIR / f"{kind}.schema.json"
    fix = f"{committed} is out of date: regenerate with `hexiseq schema --all --out-dir data/schemas`"
    assert committed.exists(), fix
    old, new = json.loads(committed.read_text()), json.loads(schema_text(kind))
    if old.get("$comment") == new["$comment"]:  # same pydantic: the very same text
        assert committed.read_text() == schema_text(kind), fix
    else:
        assert _rules(old) == _rules(new), fix


def test_bundled_files_validate_against_their_schemas():
    cluster = _validator("cluster")
    for name in bundled_clusters():
        cluster.validate(read_yaml(DATA_DIR / "clusters" / f"{name}.yaml"))
        assert (
            (DATA_DIR / "clusters" / f"{name}.yaml")
            .read_text()
            .startswith("# yaml-language-server: $schema=../schemas/cluster.schema.json\n")
        ), name
    _validator("gpus").validate(read_yaml(DATA_DIR / "gpus.yaml"))
    _validator("models").validate(read_yaml(DATA_DIR / "models.yaml"))
    plan = random_plan(4, 1024, 8, 4, seed=1, block_size=16).to_dict()
    _validator("plan").validate({**plan, "meta": {"recompute": "full", "source": "test"}})


@pytest.mark.parametrize(
    "kind, doc",
    [
        ("cluster", {"nodes": [{"gpu": "H100-SXM", "count": True, "nic_gbps": 25}]}),
        ("cluster", {"nodes": [{"gpu": "H100-SXM", "count": 2, "nic_gbsp": 25}]}),
        ("cluster", {"nodes": [{"gpu": "H100-SXM", "count": 200000, "nic_gbps": 25}]}),
        ("cluster", {"nodes": [{"gpu": "V100", "count": 2, "nic_gbps": 25}]}),
        (
            "cluster",
            {
                "nodes": [{"gpu": "H100-SXM", "count": 2, "nic_gbps": 25}],
                "overrides": [{"a": 1.9, "b": 0, "bandwidth_gbps": 5}],
            },
        ),
        (
            "plan",
            {
                "schema_version": 1,
                "seq_len": 4096,
                "num_heads": 8,
                "num_kv_heads": 8,
                "groups": [{"devices": ["01"], "chunk_len": 2048, "shards": [4096], "heads": [8]}],
            },
        ),
        (
            "plan",
            {
                "schema_version": 1,
                "seq_len": 4096,
                "num_heads": 8,
                "num_kv_heads": 8,
                "groups": [{"devices": [0], "chunk_len": 2048.7, "shards": [4096], "heads": [8]}],
            },
        ),
        (
            "gpus",
            {
                "X": {
                    "peak_bf16_tflops": 1,
                    "memory_gib": 1,
                    "hbm_bandwidth_gbps": 1,
                    "link_kind": "pcie4",
                    "link_bandwidth_gbps": 1,
                    "sources": {"peak_tflops": "vendor"},
                }
            },
        ),
    ],
)
def test_schema_refuses_what_the_loader_refuses(kind, doc, tmp_path):
    assert list(_validator(kind).iter_errors(doc)), f"the {kind} schema accepts {doc}"
    from hexiseq.errors import HexiSeqError
    from hexiseq.plan import Plan
    from hexiseq.specs import load_cluster, load_gpu_catalog

    path = tmp_path / "f.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    load = {"cluster": load_cluster, "plan": lambda p: Plan.from_json(Path(p).read_text()), "gpus": load_gpu_catalog}[
        kind
    ]
    with pytest.raises(HexiSeqError):
        load(path)
