"""Slurm jobs of a plan without a Slurm: the generated sbatch scripts (golden files; a real
controller validates them in test_slurm_cluster.py), the partition mapping, the checks before
submitting, `hexiseq launch --dry-run` and the `slurm:` section of cluster files.

Regenerate the golden files after an intended change: HEXISEQ_UPDATE_GOLDEN=1 pytest tests/test_slurm.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from hexiseq.cli import main
from hexiseq.errors import HexiSeqError, SpecError
from hexiseq.plan import Group, Plan
from hexiseq.runs import slurm
from hexiseq.runs.slurm_node import report
from hexiseq.specs import load_cluster

GOLDEN = Path(__file__).parent / "golden" / "slurm"
CLUSTER = """name: two-nodes
inter_node_latency_us: 10
nodes:
  - {gpu: H100-SXM, count: 2, nic_gbps: 25}
  - {gpu: A100-80GB, count: 2, nic_gbps: 25}
slurm:
  partitions: {H100-SXM: h100, A100-80GB: a100}
"""
ONE_NODE = """name: one-node
nodes:
  - {gpu: A100-80GB, count: 2, nic_gbps: 25}
"""
RUN_ARGS = ("run", "--plan", "/shared/runs/x/inputs/plan.json", "--out", "/shared/runs/x", "--steps", "100")


def cross_plan(where: Path, cluster: str = CLUSTER) -> Plan:
    """4 ranks whose groups span both nodes (plan rank 1 is node 1's first device)."""
    (where / "two-nodes.yaml").write_text(cluster)
    return Plan(
        256,
        8,
        4,
        (Group((0, 2), 48, (40, 56), (3, 5)), Group((1, 3), 80, (100, 60), (4, 4))),
        block_size=8,
        name="cross",
        cluster=str(where / "two-nodes.yaml"),
    ).check()


def one_node_plan(where: Path) -> Plan:
    (where / "one-node.yaml").write_text(ONE_NODE)
    return Plan(256, 8, 4, (Group((0, 1), 128, (128, 128), (4, 4)),), block_size=8, name="pair",
                cluster=str(where / "one-node.yaml")).check()  # fmt: skip


def golden_jobs(where: Path) -> dict[str, slurm.SlurmJob]:
    """The jobs of the golden files: fixed paths, so that the scripts do not depend on this machine."""
    fixed = {"python": "/opt/venv/bin/python", "workdir": "/shared/work"}
    return {
        "one-partition": slurm.make_job(
            one_node_plan(where),
            "/shared/runs/x",
            RUN_ARGS,
            slurm.SlurmOptions(
                partitions={"*": "a100"},
                time="4:00:00",
                account="proj",
                qos="normal",
                constraint="ib",
                env={"NCCL_DEBUG": "WARN"},
            ),
            **fixed,
        ),
        "heterogeneous": slurm.make_job(
            cross_plan(where), "/shared/runs/x", RUN_ARGS, slurm.SlurmOptions(time="30", cpus_per_task=2), **fixed
        ),
    }


@pytest.mark.parametrize("name", ["one-partition", "heterogeneous"])
def test_the_job_script_matches_its_golden_file(tmp_path, name):
    text = slurm.render(golden_jobs(tmp_path)[name])
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("HEXISEQ_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (HEXISEQ_UPDATE_GOLDEN=1 to rewrite it after a change)"


def test_a_plan_over_two_partitions_is_a_heterogeneous_job_in_the_plans_node_order(tmp_path):
    job = golden_jobs(tmp_path)["heterogeneous"]
    assert job.heterogeneous and job.nnodes == 2 and job.world_size == 4
    assert [(c.partition, c.gpu, c.nodes, c.procs, c.first_node) for c in job.components] == [
        ("h100", "H100-SXM", 1, 2, 0),
        ("a100", "A100-80GB", 1, 2, 1),
    ]  # the partitions come from the cluster file's slurm: section
    text = slurm.render(job)
    assert text.count("#SBATCH hetjob") == 1 and "--gres=gpu:2" in text and "--signal=TERM@120" in text
    assert "srun --het-group=0" in text and "srun --het-group=1" in text
    assert "--first-node 0" in text and "--first-node 1" in text
    assert "SLURM_JOB_NODELIST_HET_GROUP_0" in text and "--rdzv-backend=c10d" in text


def test_nodes_of_one_partition_with_the_same_ranks_are_one_component(tmp_path):
    cluster = CLUSTER.replace("A100-80GB, count: 2", "H100-SXM, count: 2").replace(", A100-80GB: a100", "")
    job = slurm.make_job(cross_plan(tmp_path, cluster), tmp_path / "run", RUN_ARGS, slurm.SlurmOptions())
    assert not job.heterogeneous and [(c.partition, c.nodes, c.procs) for c in job.components] == [("h100", 2, 2)]
    text = slurm.render(job)
    assert "hetjob" not in text and "--nodes=2" in text and 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text


def test_command_line_partitions_win_and_a_type_without_one_is_refused(tmp_path):
    plan = cross_plan(tmp_path, CLUSTER.split("slurm:")[0])
    opts = slurm.SlurmOptions(partitions=slurm.parse_partitions(["H100-SXM=gpu-h", "A100-80GB=gpu-a"]))
    assert [c.partition for c in slurm.make_job(plan, "r", RUN_ARGS, opts).components] == ["gpu-h", "gpu-a"]
    assert [c.partition for c in slurm.make_job(plan, "r", RUN_ARGS, slurm.SlurmOptions({"*": "all"})).components] == [
        "all",
        "all",
    ]
    with pytest.raises(HexiSeqError, match="no Slurm partition is given for A100-80GB"):
        slurm.make_job(plan, "r", RUN_ARGS, slurm.SlurmOptions(partitions={"H100-SXM": "h100"}))
    with pytest.raises(HexiSeqError, match="GPU_TYPE=NAME"):
        slurm.parse_partitions(["H100-SXM="])
    bare = Plan(256, 8, 4, (Group((0, 1), 128, (128, 128), (4, 4)),), block_size=8, name="bare")
    with pytest.raises(HexiSeqError, match="plan 'bare' names no cluster .*: give --partition NAME"):
        slurm.make_job(bare, "r", RUN_ARGS, slurm.SlurmOptions())
    assert slurm.make_job(bare, "r", RUN_ARGS, slurm.SlurmOptions({"*": "cpu"})).components == (
        slurm.Component("cpu", "*", 1, 2, 0),
    )


def _parts(**gres: str) -> dict[str, slurm.PartitionInfo]:
    return {
        "h100": slurm.PartitionInfo("h100", {"n1": gres.get("h100", "gpu:h100:8")}),
        "a100": slurm.PartitionInfo("a100", {"n2": gres.get("a100", "gpu:a100:8(S:0-1)")}),
    }


def test_checks_before_submitting(tmp_path):
    job = slurm.make_job(cross_plan(tmp_path), tmp_path / "run", RUN_ARGS, slurm.SlurmOptions())
    assert slurm.check_job(job, _parts()) == [
        f"the run directory {(tmp_path / 'run').resolve()} looks node-local: every node writes and reads it (plan, "
        "checkpoints, metrics); put it on a filesystem all nodes share"
    ]  # pytest's tmp_path is under /tmp
    with pytest.raises(HexiSeqError, match="Slurm has no partition 'a100'.*partitions: h100"):
        slurm.check_job(job, {"h100": _parts()["h100"]})
    with pytest.raises(
        HexiSeqError, match="partition 'a100' has h100 GPUs .* but the plan's nodes there are A100-80GB"
    ):
        slurm.check_job(job, _parts(a100="gpu:h100:8"))
    with pytest.raises(HexiSeqError, match="2 ranks per H100-SXM node but partition 'h100' has 0 nodes with 2"):
        slurm.check_job(job, _parts(h100="gpu:1"))
    with pytest.raises(HexiSeqError, match="has 0 nodes with 2 or more GPUs .*use --no-gpus"):
        slurm.check_job(job, _parts(h100="(null)"))
    no_gpus = slurm.make_job(cross_plan(tmp_path), "/shared/run", RUN_ARGS, slurm.SlurmOptions(gpus=False))
    assert slurm.check_job(no_gpus, _parts(h100="(null)")) == []
    two = slurm.make_job(
        cross_plan(tmp_path), "/shared/run", RUN_ARGS, slurm.SlurmOptions(partitions={"*": "h100"}, gpus=False)
    )
    with pytest.raises(HexiSeqError, match="needs 2 nodes of partition 'h100' but it has 1"):
        slurm.check_job(two, _parts())


def test_missing_slurm_commands_are_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HexiSeqError, match="Slurm commands not found: sbatch, sinfo, scontrol, scancel, squeue"):
        slurm.require_slurm()
    cross_plan(tmp_path).save(tmp_path / "plan.json")
    assert main(["launch", "--slurm", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "r")]) == 2
    assert "give --dry-run to only print the job script" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_dry_run_prints_the_script_with_the_run_options_as_given_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cross_plan(tmp_path).save(tmp_path / "plan.json")
    argv = ["launch", "--slurm", "--plan", "plan.json", "--out", "run", "--dry-run", "--time", "1:00:00"]
    argv += ["--steps", "40", "--seq-len", "1K", "--recompute", "--lr", "3e-3", "--fsdp", "--env", "A=b c"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n") and "#SBATCH hetjob" in out and "#SBATCH --time=1:00:00" in out
    run = tmp_path / "run"
    assert f"run --plan {run}/inputs/plan.json --out {run} --seq-len 1K --recompute --fsdp --steps 40 --lr 3e-3" in out
    assert "export A='b c'" in out
    assert not run.exists()
    assert main(["launch", "--plan", "plan.json", "--dry-run"]) == 2  # --slurm is the backend
    assert "give --slurm" in capsys.readouterr().err


def test_a_bad_run_option_is_refused_before_anything_is_submitted(tmp_path, capsys):
    cross_plan(tmp_path).save(tmp_path / "plan.json")
    with pytest.raises(SystemExit):
        main(["launch", "--slurm", "--plan", str(tmp_path / "plan.json"), "--dry-run", "--steps", "0"])
    assert "--steps" in capsys.readouterr().err
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text("{}")
    (tmp_path / "old" / "plan.json").write_text(json.dumps(cross_plan(tmp_path).to_dict()))
    assert main(["launch", "--slurm", "--resume", str(tmp_path / "old"), "--lr", "1e-2", "--dry-run"]) == 2
    assert "--lr cannot change" in capsys.readouterr().err
    assert main(["launch", "--slurm", "--resume", str(tmp_path / "old"), "--steps", "50", "--dry-run"]) == 0
    assert f"run --resume {tmp_path / 'old'} --steps 50" in capsys.readouterr().out
    # a resume keeps the Slurm options of the run's last job; those given win
    (tmp_path / "old" / "slurm").mkdir()
    last = slurm.SlurmOptions({"*": "big"}, time="1:00:00", gpus=False, env={"A": "1"})
    (tmp_path / "old" / "slurm" / "options.json").write_text(json.dumps(dataclasses.asdict(last)))
    assert main(["launch", "--slurm", "--resume", str(tmp_path / "old"), "--time", "2:00:00", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --time=2:00:00" in out and "--partition=big" in out and "--gres" not in out
    assert "export A=1" in out


def test_the_cluster_files_slurm_section_is_checked_strictly(tmp_path):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    assert load_cluster(tmp_path / "c.yaml").size == 4
    assert slurm.cluster_slurm(str(tmp_path / "c.yaml")).partitions == {"H100-SXM": "h100", "A100-80GB": "a100"}
    (tmp_path / "bad.yaml").write_text(CLUSTER + "  acount: x\n")
    with pytest.raises(SpecError, match="slurm has unknown key 'acount' \\(did you mean 'account'\\?\\)"):
        load_cluster(tmp_path / "bad.yaml")
    assert slurm.cluster_slurm("mixed-4") is None  # a bundled cluster without one


def test_the_job_ends_with_one_line_on_how_the_run_ended(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "stopped", "steps_done": 4, "steps": 12}))
    assert report(str(tmp_path), 143) == 0
    out = capsys.readouterr().out
    assert "stopped at step 4 of 12 (a signal) and checkpointed; continue it with: " in out
    assert f"hexiseq launch --slurm --resume {tmp_path}" in out
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "rank 1: boom"}))
    assert report(str(tmp_path), 1) == 1
    assert "the run failed: rank 1: boom" in capsys.readouterr().err


def test_launch_from_python_without_slurm_is_one_clear_error_and_leaves_no_run_directory(tmp_path, monkeypatch):
    import hexiseq

    plan = cross_plan(tmp_path)
    with pytest.raises(HexiSeqError, match="backend must be 'local' or 'slurm'"):
        hexiseq.launch(plan, backend="k8s", out=tmp_path / "r")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HexiSeqError, match="Slurm commands not found"):
        hexiseq.launch(plan, backend="slurm", partition="h100", steps=3, model="tiny", out=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    with pytest.raises(HexiSeqError, match="unknown options \\['partiton'\\]"):
        hexiseq.launch(plan, backend="slurm", partiton="h100", out=tmp_path / "r")
