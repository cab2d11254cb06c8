"""Plans of data-parallel replicas and a sharding strategy: views, validation rules, the plan file
(version 2, and version 1 loading as one replica), the JSON Schema agreeing with the loader."""

import json
from dataclasses import replace

import jsonschema
import pytest

from hexiseq import Plan, PlanError, Replica, Sharding, ShardingScope, ShardingStage, Workload, ring_plan, ulysses_plan
from hexiseq.commands.schema import schema_text
from hexiseq.specs import DATA_DIR

S, H = 1024, 8


def _joint(sharding: Sharding = Sharding(ShardingStage.ZERO2, ShardingScope.REPLICA)) -> Plan:
    return Plan.joint(
        [ring_plan(range(4), S, H, H), ulysses_plan(range(4, 6), S, H, H), ring_plan([7], S, H, H)],
        [3, 2, 1],
        sharding,
        name="j",
    )


def test_default_plan_is_one_replica_under_zero3_over_all_devices():
    p = ring_plan(range(4), S, H, H)
    assert p.replicas == () and p.num_replicas == 1 and p.sharding == Sharding("zero3", "all")
    assert p.sharding.is_default and p.replica(0) is p
    assert p.replica_ranks(0) == range(4) and p.sequences_of(5) == (5,)
    assert p.to_dict()["schema_version"] == 1  # today's files stay version 1


def test_replica_views_and_ranks():
    j = _joint()
    assert j.validate() == [] and j.num_replicas == 3 and j.world_size == 7
    assert [j.replica_ranks(i) for i in range(3)] == [range(0, 4), range(4, 6), range(6, 7)]
    assert [list(j.replica_groups(i)) for i in range(3)] == [[0, 1, 2, 3], [4], [5]]
    assert j.sequences_of(6) == (3, 2, 1)
    r1 = j.replica(1)
    assert r1.num_replicas == 1 and r1.rank_devices == (4, 5) and r1.world_size == 2
    assert r1.sharding == j.sharding and r1.replicas == (Replica(1, 2),) and r1.validate() == []
    assert r1.layout()[0].rank == 0 and r1.layout()[0].device == 4
    assert j.replica_of_group(4) == 1
    # every replica's ranks cover the whole sequence and every head
    lay = j.layout()
    for i in range(3):
        ranks = [lay[r] for r in j.replica_ranks(i)]
        assert sorted(t for r in ranks for t in r.token_indices()) == list(range(S))
    with pytest.raises(PlanError, match="has 3 replicas; no replica 3"):
        j.replica(3)
    with pytest.raises(PlanError, match=r"process 6 sequences per step \(\[3, 2, 1\]\) but the global batch is 4"):
        j.sequences_of(4)


def test_round_trips(tmp_path):
    j = _joint()
    again = Plan.from_json(j.to_json())
    assert again == j and again.to_dict()["schema_version"] == 2
    path = tmp_path / "j.json"
    j.save(path)
    assert Plan.load(path) == j
    # one replica under another strategy: version 2 without a sequence count, replicas stay ()
    z1 = replace(ring_plan(range(2), S, H, H), sharding=Sharding("zero1", "node"))
    d = z1.to_dict()
    assert d["schema_version"] == 2 and "sequences" not in d["replicas"][0]
    assert Plan.from_dict(d) == z1 and Plan.from_dict(d).replicas == ()
    # one explicit replica keeps its count
    one = Plan.joint([ring_plan(range(2), S, H, H)], [4])
    assert Plan.from_dict(one.to_dict()) == one and one.validate(workload=Workload(seq_len=S, global_batch=4)) == []
    assert j.scaled(256, 8).validate() == [] and j.scaled(256, 8).replicas == j.replicas


def test_version_1_file_loads_as_one_replica():
    v1 = {
        "schema_version": 1,
        "seq_len": 512,
        "num_heads": 4,
        "num_kv_heads": 4,
        "groups": [{"devices": [0, 1], "chunk_len": 256, "shards": [256, 256], "heads": [2, 2]}],
    }
    p = Plan.from_dict(v1)
    assert p.num_replicas == 1 and p.replicas == () and p.sharding.is_default and p.validate() == []


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda p: replace(p, replicas=(Replica(4, 3), Replica(1, 2))), "replicas hold 5 groups but the plan has 6"),
        (
            lambda p: replace(p, replicas=(Replica(4, 3), Replica(0, 2), Replica(2, 1))),
            "replica 1 must hold at least one group, got 0",
        ),
        (
            lambda p: replace(p, replicas=(Replica(4, 0), Replica(1, 2), Replica(1, 1))),
            "replica 0 must process at least one sequence per step, got 0",
        ),
        (
            lambda p: replace(p, replicas=(Replica(3, 3), Replica(2, 2), Replica(1, 1))),
            "replica 0: chunks cover 768 tokens (2 x sum of chunk_len) but seq_len is 1024; short by 256",
        ),
        (
            lambda p: replace(p, groups=p.groups[:5] + (replace(p.groups[5], devices=(5,)),)),
            "group 5: device 5 already appears in group 4",
        ),
        (
            lambda p: replace(p, groups=p.groups[:4] + (replace(p.groups[4], heads=(4, 3)),) + p.groups[5:]),
            "group 4: head counts sum to 7, expected 8; short by 1",
        ),
        (lambda p: replace(p, sharding=Sharding("replicated", "node")), "replicated states have no scope"),
    ],
)
def test_replica_validation_messages(change, msg):
    assert msg in "\n".join(change(_joint()).validate())


def test_global_batch_must_match_the_replicas():
    v = _joint().validate(workload=Workload(seq_len=S, global_batch=8))
    assert "replicas process 6 sequences per step (3 + 2 + 1) but the workload's global batch is 8" in v


def test_bad_sharding_and_plan_file_errors():
    with pytest.raises(PlanError, match="sharding stage must be one of 'replicated', 'zero1'"):
        Sharding("zero4")
    d = _joint().to_dict()
    d["sharding"] = {"stage": "zero9"}
    with pytest.raises(PlanError, match=r"sharding.stage must be one of"):
        Plan.from_dict(d)
    d = _joint().to_dict()
    del d["replicas"][1]["sequences"]
    with pytest.raises(PlanError, match=r"replicas\[1\].sequences is missing"):
        Plan.from_dict(d)
    d = _joint().to_dict()
    d["replicas"][0]["groups"][0]["chunk_len"] = "x"
    with pytest.raises(PlanError, match=r"replicas\[0\].groups\[0\].chunk_len must be an integer"):
        Plan.from_dict(d)
    with pytest.raises(PlanError, match="one sequence count per replica"):
        Plan.joint([ring_plan(range(2), S, H, H)], [1, 2])


def test_schema_accepts_both_versions_and_is_committed():
    schema = json.loads((DATA_DIR / "schemas" / "plan.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(_joint().to_dict())
    jsonschema.Draft202012Validator(schema).validate(ring_plan(range(2), S, H, H).to_dict())
    bad = _joint().to_dict()
    bad["replicas"][0]["sequences"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)
    assert json.loads(schema_text("plan"))["anyOf"]
