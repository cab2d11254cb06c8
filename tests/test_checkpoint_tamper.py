"""No code runs from a run directory (issue 22, item 1): a pickle that would create a marker file is
planted in every file a run directory holds, with the manifest updated to match (the manifest is an
integrity check, not authentication); `--resume` and `export` refuse the checkpoint's files with one
message naming the file, and the marker never appears. The ranks' reader (no parent check before it)
refuses the same files."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from hexiseq.cli import main
from hexiseq.errors import SpecError
from hexiseq.plan import random_plan
from hexiseq.runs import checkpoint as ckpt
from hexiseq.runs import checkpoint_files

STEPS = 2


class _Evil:
    """Unpickling this runs `touch MARKER` (what an attacker's .metadata did)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Evil(marker), protocol=2)


def _update_manifest(step_dir: Path, name: str) -> None:
    """Give the manifest the tampered file's size and CRC-32, as an attacker would."""
    manifest = step_dir / ckpt.MANIFEST
    if name == ckpt.MANIFEST or not manifest.is_file():
        return
    m = json.loads(manifest.read_text())
    data = (step_dir / name).read_bytes()
    m["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    manifest.write_text(json.dumps(m))


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    d = tmp_path_factory.mktemp("tamper")
    random_plan(2, 64, 8, 4, seed=3, block_size=8).save(d / "plan.json")
    out = d / "run"
    argv = ["run", "--plan", str(d / "plan.json"), "--model", "tiny", "--steps", str(STEPS), "--out", str(out)]
    assert _run([*argv, "--no-tensorboard"]) == 0
    return out


def _files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _checkpoint_files(original: Path) -> list[str]:
    step = ckpt.checkpoints(original / "checkpoints")[-1]
    return sorted(p.name for p in step.iterdir())


def test_the_run_directory_holds_the_files_planted(original):
    names = _files(original)
    step = f"checkpoints/{ckpt.step_name(STEPS)}/"
    for want in (".metadata", "__0_0.distcp", "__1_0.distcp", "rng-00000.pt", "rng-00001.pt", "manifest.json"):
        assert step + want in names
    assert {"config.json", "plan.json", "metrics.jsonl", "status.json", "summary.json"} <= set(names)


CHECKPOINT_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-00000.pt", "rng-00001.pt", "trainer.json"]
CHECKPOINT_FILES += ["manifest.json"]
RUN_FILES = ["config.json", "plan.json", "metrics.jsonl", "status.json", "summary.json", "console.log", ".lock"]


def test_every_file_of_the_run_directory_is_planted_by_a_test(original):
    """A new kind of file in run directories fails here until the tests below plant it too."""
    step = f"checkpoints/{ckpt.step_name(STEPS)}/"
    assert set(_files(original)) == {step + n for n in CHECKPOINT_FILES} | set(RUN_FILES)


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_planted_checkpoint_file_is_refused_by_resume_and_export(original, tmp_path, name, capsys):
    run = tmp_path / "run"
    shutil.copytree(original, run)
    step = ckpt.checkpoints(run / "checkpoints")[-1]
    (step / name).write_bytes(evil_pickle(tmp_path / "MARKER"))
    _update_manifest(step, name)
    for argv in (["export", str(run), "--to", str(tmp_path / "hf")], ["run", "--resume", str(run), "--steps", "3"]):
        rc = _run(argv)
        err = capsys.readouterr().err
        assert not (tmp_path / "MARKER").exists(), f"{name}: code ran ({argv[0]})"
        assert rc == 2, err
        assert name in err and "internal" not in err and "Traceback" not in err, err
        assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err
    assert not (tmp_path / "hf").exists()


def test_a_pickle_in_place_of_an_entry_of_a_distcp_file_is_refused(original, tmp_path, capsys):
    """The subtler attack: the optimizer's non-tensor entry overwritten in place, same length (DCP
    itself unpickles these with weights_only=False)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    run = tmp_path / "run"
    shutil.copytree(original, run)
    step = ckpt.checkpoints(run / "checkpoints")[-1]
    md = checkpoint_files.read_metadata(step)
    index, info = next(
        (i, s) for i, s in md.storage_data.items() if isinstance(md.state_dict_metadata[i.fqn], BytesStorageMetadata)
    )
    payload = evil_pickle(tmp_path / "MARKER")
    assert len(payload) <= info.length
    f = step / info.relative_path
    data = bytearray(f.read_bytes())
    data[info.offset : info.offset + info.length] = payload.ljust(info.length, b".")
    f.write_bytes(bytes(data))
    _update_manifest(step, info.relative_path)
    rc = _run(["run", "--resume", str(run), "--steps", "3"])
    err = capsys.readouterr().err
    assert not (tmp_path / "MARKER").exists()
    assert rc == 2 and info.relative_path in err and index.fqn in err, err
    # the ranks' planner refuses it too (no parent check before it)
    with pytest.raises(SpecError, match="refused"):
        checkpoint_files.SafePlanner(step).load_bytes(type("R", (), {"dest_index": index})(), io.BytesIO(payload))
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("name", [".metadata", "rng-00000.pt"])
def test_the_ranks_reader_refuses_a_planted_file_by_itself(original, tmp_path, name):
    """What the ranks call, without the parent's verify: dcp_load and load_rng."""
    step = tmp_path / "step"
    shutil.copytree(ckpt.checkpoints(original / "checkpoints")[-1], step)
    (step / name).write_bytes(evil_pickle(tmp_path / "MARKER"))
    with pytest.raises(SpecError, match=name.replace(".", r"\.")):
        if name == ".metadata":
            checkpoint_files.dcp_load({"model": {"x": torch.zeros(1)}}, step)
        else:
            checkpoint_files.load_rng(step / name)
    assert not (tmp_path / "MARKER").exists()


def test_a_corrupt_metadata_is_one_message(original, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(original, run)
    step = ckpt.checkpoints(run / "checkpoints")[-1]
    md = step / ".metadata"
    md.write_bytes(md.read_bytes()[:100] + b"garbage" * 10)
    _update_manifest(step, ".metadata")
    rc = _run(["export", str(run), "--to", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert rc == 2 and ".metadata" in err and "not a readable checkpoint index" in err, err
    assert len(err.splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_planted_run_file_runs_no_code(original, tmp_path, name, capsys):
    """The run's own files are JSON: a pickle there is unreadable, never executed. config.json is
    refused, named; the others are the record, rewritten by the resumed run."""
    run = tmp_path / "run"
    shutil.copytree(original, run)
    (run / name).write_bytes(evil_pickle(tmp_path / "MARKER"))
    rc = _run(["run", "--resume", str(run), "--steps", str(STEPS + 1)])
    err = capsys.readouterr().err
    assert not (tmp_path / "MARKER").exists()
    assert "internal" not in err and "Traceback" not in err, err
    if name == "config.json":
        assert rc == 2 and "config.json" in err, err
    else:
        assert rc == 0, err
