"""Training checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, schedule position,
data position, RNG states and step, written atomically and verified before they are loaded.

`RUN_DIR/checkpoints/step-NNNNNNNN/` holds DCP's `.metadata` and `__R_I.distcp` files (each tensor
written once, with its global shape, so any world size and any plan can load it back: the plan
partitions activations, not the model state), `trainer.json` (step, samples used, the world that
wrote it), one `rng-RRRRR.pt` per rank, and `manifest.json` (size and CRC-32 of every file).

Atomic: every rank writes into `.step-NNNNNNNN.tmp/`; once all are done, rank 0 writes the manifest,
fsyncs the directory and renames it into place (hexiseq.atomic.publish). A checkpoint without its
manifest, or whose files disagree with it, is refused and named (`verify`); `--resume` never falls
back to an older one silently. The manifest is an integrity check, not authentication: the pickled
parts are read without running code (checkpoint_files), by `verify` in the parent and again in the ranks.
"""

from __future__ import annotations

import json
import random
import shutil
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..atomic import fsync_dir, fsync_files, fsync_tree, publish
from ..errors import SpecError
from ..runtime.failures import storage_error, unwrap
from ..runtime.zero1 import Zero1AdamW

PREFIX = "step-"
MANIFEST, TRAINER = "manifest.json", "trainer.json"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _describe(path: Path) -> dict[str, int]:
    return {"bytes": path.stat().st_size, "crc32": _crc(path)}


def checkpoints(directory: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest first (temporaries excluded)."""
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    )


def verify(path: Path) -> dict[str, Any]:
    """Check a checkpoint against its manifest (every file there, same size, same CRC-32); return its
    trainer state. SpecError naming the checkpoint and the file otherwise."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise SpecError(
            f"checkpoint {path} is incomplete: it has no {MANIFEST} (it was not written by a finished save); "
            "use another checkpoint (--checkpoint NAME)"
        )
    try:
        files = json.loads(manifest.read_text())["files"]
        if not all(
            isinstance(d, dict) and isinstance(d.get("bytes"), int) and isinstance(d.get("crc32"), int)
            for d in files.values()
        ):
            raise TypeError("an entry is not {bytes, crc32}")
        if any(Path(n).name != n or n in ("", ".", "..") for n in files):
            raise ValueError("a name is not a file of the checkpoint")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise SpecError(
            f"checkpoint {path}: {MANIFEST} is unreadable ({type(e).__name__}): the checkpoint is corrupt"
        ) from None
    for name, want in sorted(files.items()):
        f = path / name
        if not f.is_file():
            raise SpecError(f"checkpoint {path} is incomplete: {name} is missing")
        got = _describe(f)
        if got["bytes"] != want["bytes"]:
            raise SpecError(
                f"checkpoint {path} is corrupt: {name} has {got['bytes']:,} bytes, the manifest says {want['bytes']:,}"
            )
        if got["crc32"] != want["crc32"]:
            raise SpecError(f"checkpoint {path} is corrupt: {name} does not match its checksum (CRC-32)")
    from .checkpoint_files import verify_contents  # same layer; DCP is imported only when a checkpoint is read

    trainer = read_trainer(path)
    verify_contents(path)  # the pickled parts, read without running code: a tampered file is refused here
    return trainer


def read_trainer(path: Path) -> dict[str, Any]:
    """trainer.json of a checkpoint (step, samples, world size); SpecError naming it when unreadable."""
    try:
        trainer = json.loads((path / TRAINER).read_text())
        int(trainer["step"]), int(trainer["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(
            f"checkpoint {path}: {TRAINER} is unreadable ({type(e).__name__}): the checkpoint is corrupt"
        ) from None
    return trainer


def find(directory: Path, name: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from: `name` (e.g. step-00000008), else the newest. Verified; a
    corrupt or incomplete one is refused with the older complete ones listed. None: no checkpoint."""
    found = checkpoints(directory)
    if name is not None:
        path = directory / name
        if path not in found:
            have = ", ".join(p.name for p in found) or "none"
            raise SpecError(f"--checkpoint {name}: not a checkpoint of this run (checkpoints: {have})")
    elif not found:
        return None
    else:
        path = found[-1]
    try:
        return path, verify(path)
    except SpecError as e:
        older = [p.name for p in found if p < path]
        hint = f"; the older {', '.join(older)} can be resumed with --checkpoint NAME" if older else ""
        raise SpecError(f"{e}{hint}") from None


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and lists (loadable with weights_only=True)."""
    import numpy as np

    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": [version, list(mt), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    directory: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer: dict[str, Any],
    keep: int = 2,
    writes_states: bool = True,
) -> Path:
    """Save a checkpoint of `step` (every rank calls this; collectives inside). Keeps the newest
    `keep` checkpoints. Returns its path. `writes_states` False: this rank's model and optimizer
    states are copies another rank writes, cut differently (shard sets of unequal sizes, which DCP
    refuses as overlapping chunks); it writes none of them. A write that fails (disk full) removes the partial
    checkpoint and raises a StorageError naming the directory, the space needed and what to do."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    final = directory / step_name(step)
    tmp = directory / f".{step_name(step)}.tmp"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if not writes_states:
        model_sd, optim_sd = {}, {}
    try:
        return _save(directory, step, final, tmp, rank, world, model_sd, optim_sd, trainer, keep)
    except (OSError, CheckpointException) as e:
        failure = unwrap(e)
        if not isinstance(failure, OSError):
            raise
        if rank == 0:  # the partial checkpoint would fill the disk further
            shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(
            failure,
            directory,
            f"writing checkpoint {step_name(step)} into",
            need_bytes=state_bytes(model_sd, optim_sd),  # DCP writes each tensor once
            then=f"the partial {tmp.name} was removed; continue with --resume {directory.parent} "
            "(or lower --keep-checkpoints)",
        ) from None


def state_bytes(*states: Any) -> int:
    """Bytes of the tensors in nested state dicts (what a checkpoint of them writes, about)."""
    total, todo = 0, list(states)
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return total


def _save(
    directory: Path,
    step: int,
    final: Path,
    tmp: Path,
    rank: int,
    world: int,
    model_sd: dict[str, Any],
    optim_sd: dict[str, Any],
    trainer: dict[str, Any],
    keep: int,
) -> Path:
    """The writes of `save`: every rank's files into `tmp`, then rank 0's manifest and the rename."""
    import torch.distributed.checkpoint as dcp

    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a killed save
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    mine = tmp / f"rng-{rank:05d}.pt"
    torch.save(rng_state(), mine)
    own = [p for p in tmp.iterdir() if p.name.startswith(f"__{rank}_")] + [mine]
    fsync_files(own)
    described: list[Any] = [None] * world
    dist.all_gather_object(described, {p.name: _describe(p) for p in own})
    if rank == 0:
        (tmp / TRAINER).write_text(json.dumps({**trainer, "step": step, "world_size": world}, indent=2) + "\n")
        files = {name: d for part in described for name, d in part.items()}
        files.update({n: _describe(tmp / n) for n in (".metadata", TRAINER)})
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=2) + "\n")
        fsync_tree(tmp)
        publish(tmp, final)
        for old in checkpoints(directory)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(directory)
    dist.barrier()
    return final


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a (verified) checkpoint into this rank's model and optimizer, resharding to this world;
    restore this rank's RNG when the world size is the one that saved. Returns the trainer state."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from .checkpoint_files import dcp_load, load_rng

    trainer = read_trainer(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp_load(state, path)  # no code from the checkpoint's pickles (checkpoint_files); every asked key must be there
    set_model_state_dict(model, state["model"])
    # ZeRO-1 asks for (and holds) the states of its own parameters only: the others' are not missing
    partial = StateDictOptions(strict=not isinstance(optimizer, Zero1AdamW))
    set_optimizer_state_dict(model, optimizer, state["optim"], options=partial)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    rng = path / f"rng-{rank:05d}.pt"
    if trainer.get("world_size") == world and rng.is_file():
        set_rng_state(load_rng(rng))
    return trainer


def model_state(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full model weights of a checkpoint, in one process (for export): `model`'s state dict filled."""
    import warnings

    from .checkpoint_files import dcp_load

    sd = model.state_dict()
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp_load({"model": sd}, path)
    return sd
