"""Hugging Face Llama checkpoints in and out.

A checkpoint directory holds `config.json` and the weights, either as `*.safetensors` (one file or
shards with `model.safetensors.index.json`) or as a PyTorch state dict (`pytorch_model*.bin`, read
with `weights_only=True`, never unpickling code). Our parameter names are Hugging Face's without
the `model.` prefix and RoPE uses the same half-rotation convention, so weights map one to one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..atomic import atomic_dir, remove_stale, stale_temporaries
from ..errors import SpecError
from ..specs import HFConfig, ModelSpec, model_from_hf_config, parse_hf_config, read_hf_config
from .llama import Llama, LlamaConfig, rope_inv_freq

HF_PREFIX = "model."
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry


_RUNNABLE_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def config_from_hf(cfg: Mapping[str, Any], where: str = "config.json") -> LlamaConfig:
    """Our LlamaConfig from a Hugging Face Llama config dict (read as the planner reads it, through
    `hexiseq.specs.hf`); refuses what the model does not implement."""
    missing = [k for k, f in HFConfig.model_fields.items() if f.is_required() and k not in cfg]
    if missing:
        raise SpecError(f"{where} lacks {missing[0]!r}")
    hf = parse_hf_config(cfg, where)
    mtype = hf.model_type or "llama"
    if mtype not in _RUNNABLE_TYPES:
        raise SpecError(f"{where} has model_type {mtype!r}; only Llama-family checkpoints are supported")
    if (hf.hidden_act or "silu") != "silu":
        raise SpecError(f"{where} has hidden_act {hf.hidden_act!r}; the model implements SwiGLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if getattr(hf, key):
            raise SpecError(f"{where} sets {key}; the model has no biases")
    # Mistral slides unless its config says otherwise; the others only when asked to.
    sliding = hf.use_sliding_window if "use_sliding_window" in hf.model_fields_set else mtype == "mistral"
    if hf.sliding_window and sliding:
        raise SpecError(f"{where} uses sliding-window attention; the executor runs full causal attention")
    return LlamaConfig.from_spec(model_from_hf_config(cfg))


def config_to_hf(cfg: LlamaConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A Hugging Face `LlamaConfig`-compatible dict (both rope layouts, so transformers 4 and 5 read it)."""
    rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope_parameters = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "intermediate_size": cfg.ffn,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def model_spec_from_checkpoint(path: Path | str, name: str | None = None) -> ModelSpec:
    """A ModelSpec (for the planner and the cost model) from a checkpoint's `config.json`."""
    return model_from_hf_config(path, name=name or Path(path).name)


def _weight_files(directory: Path, index_name: str, single: str, pattern: str) -> list[Path]:
    """The files an index names (other files, e.g. a `consolidated.safetensors`, are not ours), else
    the single file, else every file matching `pattern`. A directory with both an index and the
    single file is refused (two checkpoints mixed in one directory), as is an index naming a file
    that is not there."""
    index = directory / index_name
    if index.exists():
        if (directory / single).exists():
            raise SpecError(
                f"{directory} holds both {index_name} and {single}: two checkpoints are mixed in one directory; "
                "keep one of them (delete the other, or save into an empty directory)"
            )
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SpecError(
                f"{index}: not a readable checkpoint index ({type(e).__name__}: {e}); re-save the checkpoint"
            ) from None
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise SpecError(
                f"{index} names {len(missing)} shard{'s' * (len(missing) > 1)} that "
                f"{'are' if len(missing) > 1 else 'is'} not in {directory}: {', '.join(missing[:4])}"
                f"{'...' * (len(missing) > 4)}; the checkpoint is incomplete"
            )
        return [directory / n for n in names]
    if (directory / single).exists():
        return [directory / single]
    return sorted(directory.glob(pattern))


def weight_files(directory: Path) -> tuple[str, list[Path]]:
    """("safetensors" | "torch", the weight files) of a checkpoint directory; SpecError when none."""
    st_files = _weight_files(directory, "model.safetensors.index.json", "model.safetensors", "*.safetensors")
    if st_files:
        return "safetensors", st_files
    bin_files = _weight_files(directory, "pytorch_model.bin.index.json", "pytorch_model.bin", "pytorch_model*.bin")
    bin_files = bin_files or sorted(directory.glob("*.pt")) or sorted(directory.glob("*.pth"))
    if not bin_files:
        raise SpecError(f"{directory}: no *.safetensors, pytorch_model*.bin, *.pt or *.pth weights")
    return "torch", bin_files


def _corrupt(f: Path, e: Exception) -> SpecError:
    return SpecError(
        f"{f}: cannot be read as a checkpoint file ({type(e).__name__}: {str(e).strip()[:200]}); it is corrupt or "
        "was cut short: re-save or re-download it"
    )


def _read_weights(directory: Path, header_only: bool = False) -> dict[str, Any]:
    """name -> tensor of every weight file (with `header_only`, name -> (shape, dtype, file) read from
    safetensors headers without loading the data). Unreadable files are named in a SpecError."""
    kind, files = weight_files(directory)
    out: dict[str, Any] = {}
    for f in files:
        try:
            if kind == "safetensors":
                from safetensors import safe_open

                with safe_open(str(f), framework="pt") as st:
                    for k in st.keys():
                        if header_only:
                            sl = st.get_slice(k)
                            out[k] = (tuple(sl.get_shape()), _st_dtype(sl.get_dtype()), f)
                        else:
                            out[k] = st.get_tensor(k)
                continue
            sd = torch.load(f, map_location="cpu", weights_only=True)  # tensors only: no code is unpickled
        except SpecError:
            raise
        except Exception as e:
            if kind == "torch" and "weights_only" in str(e):
                raise SpecError(
                    f"{f}: refused: it holds pickled objects other than tensors, and unpickling them could run "
                    f"code (torch.load weights_only: {str(e).strip().splitlines()[0][:160]})"
                ) from None
            raise _corrupt(f, e) from None
        if not isinstance(sd, Mapping):
            raise SpecError(f"{f}: expected a state dict (name -> tensor), got {type(sd).__name__}")
        for k, v in sd.items():
            if not isinstance(v, Tensor):
                raise SpecError(f"{f}: entry {k!r} is a {type(v).__name__}, not a tensor")
            out[k] = (tuple(v.shape), v.dtype, f) if header_only else v
    return out


def _st_dtype(name: str) -> torch.dtype:
    """torch dtype of a safetensors dtype name (F32, BF16, I64, ...)."""
    table = {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
    }
    return table.get(name, torch.uint8)


def _check_entry(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, want: tuple[int, ...], where: Path | str
) -> None:
    if tuple(shape) != tuple(want):
        raise SpecError(
            f"checkpoint tensor {name} has shape {tuple(shape)}, the config implies {tuple(want)} ({where})"
        )
    if not dtype.is_floating_point:
        raise SpecError(
            f"checkpoint tensor {name} has dtype {str(dtype).removeprefix('torch.')}; weights must be floating "
            f"point ({where})"
        )


def check_finite(sd: Mapping[str, Tensor], where: Path | str) -> None:
    """Refuse weights with NaN or Inf entries (they would train to 'loss nan')."""
    for name, t in sd.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise SpecError(
                f"checkpoint tensor {name} has {bad} NaN/Inf entr{'ies' if bad > 1 else 'y'} of {t.numel()} ({where}); "
                "the checkpoint is broken: use an earlier one"
            )


def inspect_checkpoint(path: Path | str) -> LlamaConfig:
    """Check a checkpoint directory before any work, reading only headers: config.json readable, the
    weight files readable, every tensor of the model present with its shape and a floating dtype.
    Returns the model config. (NaN/Inf are found when the weights are loaded, before training.)"""
    directory = Path(path)
    if not directory.is_dir():
        raise SpecError(f"checkpoint directory not found: {directory}")
    cfg = config_from_hf(read_hf_config(directory))
    headers = hf_to_ours(_read_weights(directory, header_only=True), cfg)
    with torch.device("meta"):
        want = Llama(cfg).state_dict()
    for name, (shape, dtype, f) in headers.items():
        _check_entry(name, shape, dtype, tuple(want[name].shape), f)
    return cfg


def hf_to_ours(sd: Mapping[str, Tensor], cfg: LlamaConfig) -> dict[str, Tensor]:
    """Rename Hugging Face keys to ours and check that exactly the expected tensors are there."""
    ours = {}
    for k, v in sd.items():
        if k.endswith(_IGNORED):
            continue
        ours[k.removeprefix(HF_PREFIX)] = v
    if cfg.tie_embeddings:
        ours.pop("lm_head.weight", None)  # tied: the embedding is the head
    with torch.device("meta"):  # names only: no memory for the weights
        names = Llama(cfg).state_dict().keys()
    expected = {k for k in names if not (cfg.tie_embeddings and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - set(ours)), sorted(set(ours) - expected)
    if missing or unexpected:
        raise SpecError(
            f"checkpoint does not match the config: missing {missing[:6]}{'...' * (len(missing) > 6)}, "
            f"unexpected {unexpected[:6]}{'...' * (len(unexpected) > 6)}"
        )
    return ours


def load_hf_checkpoint(
    path: Path | str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    notes: list[str] | None = None,
) -> Llama:
    """Our model with the weights of a Hugging Face Llama checkpoint directory. Refuses (SpecError,
    naming the file or tensor) unreadable files, mixed or incomplete directories, missing or
    misshapen tensors, integer dtypes and NaN/Inf weights. Temporaries of an interrupted save next to
    the directory are ignored, with a note appended to `notes`."""
    directory = Path(path)
    if not directory.is_dir():
        raise SpecError(f"checkpoint directory not found: {directory}")
    if notes is not None:
        notes.extend(
            f"ignored {p.name} next to {directory.name}: left by an interrupted save"
            for p in stale_temporaries(directory)
        )
    cfg = config_from_hf(read_hf_config(directory))
    with torch.device("meta"):
        model = Llama(cfg)
    sd = hf_to_ours(_read_weights(directory), cfg)
    for name, t in sd.items():
        _check_entry(name, tuple(t.shape), t.dtype, tuple(model.state_dict()[name].shape), directory)
    check_finite(sd, directory)
    model = model.to_empty(device=device).to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight  # to_empty breaks the tie; restore it
    model.inv_freq = rope_inv_freq(cfg).to(device)  # buffers are not in the checkpoint
    return model


def save_hf_checkpoint(
    model: Llama,
    path: Path | str,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 2**30,
    state_dict: Mapping[str, Tensor] | None = None,
    notes: list[str] | None = None,
) -> Path:
    """Write `config.json` + `model*.safetensors` (sharded with an index above `max_shard_bytes`),
    atomically: the files are written and fsync'd in a temporary sibling directory that then replaces
    `path` whole (hexiseq.atomic), so a reader — or a save killed midway — sees the old checkpoint or
    the new one, never a mix. `path` must be absent, empty, or a checkpoint (`check_save_target`).

    `state_dict` overrides the model's own (e.g. a full state dict gathered from FSDP shards with
    `torch.distributed.checkpoint.state_dict.get_model_state_dict(..., full_state_dict=True)`).
    Notes (stale temporaries removed) are appended to `notes`.
    """
    from safetensors.torch import save_file

    directory = check_save_target(path)
    cleaned = remove_stale(directory)
    if notes is not None:
        notes.extend(cleaned)
    cfg = model.cfg
    sd = dict(state_dict if state_dict is not None else model.state_dict())
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    dtype = dtype or next(iter(sd.values())).dtype
    tensors = {
        HF_PREFIX + k if not k.startswith("lm_head.") else k: v.detach().to("cpu", dtype).contiguous()
        for k, v in sd.items()
    }
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for k, v in tensors.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    with atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text(json.dumps(config_to_hf(cfg, dtype), indent=2) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({k: fname for k in shard})
            total = sum(v.numel() * v.element_size() for v in tensors.values())
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
    return directory


_CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "generation_config.json",
)


def check_save_target(path: Path | str) -> Path:
    """Refuse, before any work, a place a checkpoint cannot be saved to: an existing file, a
    directory holding anything but a checkpoint (it would be replaced whole), or an unwritable
    parent. An existing checkpoint directory is fine: a save replaces it atomically."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise SpecError(
            f"cannot save to {directory}: it is an existing file; give a directory path (a checkpoint is a directory)"
        )
    if directory.is_dir():
        others = sorted(
            p.name
            for p in directory.iterdir()
            if p.name not in _CHECKPOINT_FILES
            and not (p.name.startswith("model-") and p.name.endswith(".safetensors"))
            and not (p.name.startswith("pytorch_model-") and p.name.endswith(".bin"))
        )
        if others:
            raise SpecError(
                f"cannot save to {directory}: it holds files that are not a checkpoint ({', '.join(others[:4])}"
                f"{'...' * (len(others) > 4)}) and a save replaces the whole directory; give a new or empty directory"
            )
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(f"cannot save to {directory}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecError(f"cannot save to {directory}: {parent} is not writable")
    try:  # what access() cannot tell (root, /proc, a read-only mount): make and remove a directory there
        os.rmdir(tempfile.mkdtemp(prefix=".hexiseq-probe-", dir=parent))
    except OSError as e:
        raise SpecError(
            f"cannot save to {directory}: a directory cannot be made in {parent} ({e.strerror or type(e).__name__}); "
            "give a location on a writable filesystem"
        ) from None
    return directory
