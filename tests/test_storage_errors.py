"""Every failure named (issue 22, item 4): a full disk while a checkpoint, the record or an export is
written is one message naming the path, the space needed and free, and what to do; the partial
checkpoint is removed; nothing says "internal"."""

from __future__ import annotations

import errno
import os

import pytest
import torch
import torch.distributed as dist

from hexiseq.runs import checkpoint as ckpt
from hexiseq.runs import rundir
from hexiseq.runs.rundir import RunDir
from hexiseq.runtime.failures import ERROR, StorageError, classify


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_full_disk_during_a_checkpoint_is_named_and_the_partial_removed(tmp_path, world, monkeypatch):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 8)).sum().backward()
    opt.step()
    directory = tmp_path / "run" / "checkpoints"
    monkeypatch.setattr(ckpt.torch, "save", _enospc)  # the rank's rng-00000.pt write
    with pytest.raises(StorageError) as e:
        ckpt.save(directory, 3, model, opt, {"samples": 3})
    msg = str(e.value)
    assert f"writing checkpoint step-00000003 into {directory}: No space left on device" in msg, msg
    assert "it needs about" in msg and "free" in msg and f"--resume {tmp_path / 'run'}" in msg, msg
    assert "the partial .step-00000003.tmp was removed" in msg
    assert not (directory / ".step-00000003.tmp").exists() and ckpt.checkpoints(directory) == []
    # a fault of the machine (exit code 1: the run directory is kept for --resume), not "internal"
    assert classify(0, e.value).kind == ERROR and "internal" not in classify(0, e.value).message


def test_a_full_disk_writing_the_record_is_named(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    run.write_json(run.config, {})
    monkeypatch.setattr(rundir, "write_text", _enospc)
    with pytest.raises(StorageError, match=f"writing {run.status}: No space left on device: .* free"):
        run.set_status("training")
    run.metrics.write_text('{"step": 1}\n')
    with pytest.raises(StorageError, match=f"continue with --resume {tmp_path}"):
        run.keep_metrics_until(0)


def test_a_rank_os_error_with_a_path_is_not_internal():
    f = classify(1, OSError(errno.EROFS, "Read-only file system", "/ro/run/metrics.jsonl"))
    assert f.kind == ERROR and "/ro/run/metrics.jsonl" in f.message and "read-only" in f.message
    assert "internal" not in f.message
