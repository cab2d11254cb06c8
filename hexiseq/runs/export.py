"""A run's checkpoint as a Hugging Face model directory (config.json + safetensors) that
`transformers` loads: `hexiseq export RUN_DIR --to DIR`."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import HexiSeqError
from ..runtime.failures import storage_error
from ..runtime.hf_checkpoint import check_save_target, save_hf_checkpoint
from ..runtime.llama import Llama
from . import checkpoint as ckpt
from .rundir import RunDir


def export(run_dir: Path | str, to: Path | str, checkpoint: str | None = None, dtype: str | None = None) -> Path:
    """Write the weights of the run's newest (or the named) checkpoint to `to` in Hugging Face
    layout, atomically. The checkpoint is verified first; `dtype` (e.g. "bfloat16") casts."""
    check_save_target(to)
    run = RunDir.existing(run_dir, flag="RUN_DIR")
    cfg = run.read_config(flag="RUN_DIR")
    found = ckpt.find(run.checkpoints, checkpoint)
    if found is None:
        raise HexiSeqError(
            f"{run.path} has no checkpoint yet (they are written every --checkpoint-every steps and at the end)"
        )
    path, _ = found
    with torch.device("meta"):
        model = Llama(cfg.model)
    model = model.to_empty(device="cpu").to(getattr(torch, cfg.dtype))
    if cfg.model.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    ckpt.model_state(path, model)
    out_dtype = getattr(torch, dtype) if dtype else None
    if dtype and not isinstance(out_dtype, torch.dtype):
        raise HexiSeqError(f"--dtype {dtype!r} is not a torch dtype (float32, bfloat16, float16)")
    try:
        return save_hf_checkpoint(model, to, dtype=out_dtype)
    except OSError as e:  # disk full, read-only: named (the atomic save left nothing half-written)
        raise storage_error(e, Path(to), "exporting to", need_bytes=ckpt.state_bytes(model.state_dict())) from None
