"""Hugging Face Llama checkpoints in and out.

A checkpoint directory holds `config.json` and the weights, either as `*.safetensors` (one file or
shards with `model.safetensors.index.json`) or as a PyTorch state dict (`pytorch_model*.bin`, read
with `weights_only=True`, never unpickling code). Our parameter names are Hugging Face's without
the `model.` prefix and RoPE uses the same half-rotation convention, so weights map one to one.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from ..errors import SpecError
from ..specs import ModelSpec, model_from_hf_config, read_hf_config
from .model import Llama, LlamaConfig, rope_inv_freq

HF_PREFIX = "model."
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry


def _rope_of(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and scaling from either layout: transformers 4 (top-level `rope_theta`,
    `rope_scaling`) or transformers 5 (`rope_parameters` holding both)."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or (params if params else None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return theta, scaling


def config_from_hf(cfg: Mapping[str, Any]) -> LlamaConfig:
    """Our LlamaConfig from a Hugging Face Llama config dict; refuses what the model does not implement."""
    mtype = cfg.get("model_type", "llama")
    if mtype not in ("llama", "mistral", "qwen2", "qwen3"):
        raise SpecError(f"config.json has model_type {mtype!r}; only Llama-family checkpoints are supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise SpecError(f"config.json has hidden_act {cfg['hidden_act']!r}; the model implements SwiGLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise SpecError(f"config.json sets {key}; the model has no biases")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", mtype == "mistral"):
        raise SpecError("config.json uses sliding-window attention; the executor runs full causal attention")
    try:
        heads = int(cfg["num_attention_heads"])
        theta, scaling = _rope_of(cfg)
        return LlamaConfig(
            vocab=int(cfg["vocab_size"]),
            hidden=int(cfg["hidden_size"]),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            ffn=int(cfg["intermediate_size"]),
            head_dim=int(cfg.get("head_dim") or 0),
            rope_theta=theta,
            rope_scaling=scaling,
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise SpecError(f"config.json lacks {e.args[0]!r}") from None


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
    cfg = read_hf_config(path)
    spec = model_from_hf_config(cfg, name=name or Path(path).name)
    theta, _ = _rope_of(cfg)  # transformers 5 nests rope_theta in rope_parameters
    return replace(spec, rope_theta=theta) if spec.rope_theta != theta else spec


def _weight_files(directory: Path, index_name: str, single: str, pattern: str) -> list[Path]:
    """The files an index names (other files, e.g. a `consolidated.safetensors`, are not ours), else
    the single file, else every file matching `pattern`."""
    index = directory / index_name
    if index.exists():
        return [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (directory / single).exists():
        return [directory / single]
    return sorted(directory.glob(pattern))


def _read_weights(directory: Path) -> dict[str, Tensor]:
    st_files = _weight_files(directory, "model.safetensors.index.json", "model.safetensors", "*.safetensors")
    if st_files:
        from safetensors.torch import load_file

        out: dict[str, Tensor] = {}
        for f in st_files:
            out.update(load_file(str(f)))
        return out
    bin_files = _weight_files(directory, "pytorch_model.bin.index.json", "pytorch_model.bin", "pytorch_model*.bin")
    bin_files = bin_files or sorted(directory.glob("*.pt")) or sorted(directory.glob("*.pth"))
    if not bin_files:
        raise SpecError(f"{directory}: no *.safetensors, pytorch_model*.bin, *.pt or *.pth weights")
    out = {}
    for f in bin_files:
        sd = torch.load(f, map_location="cpu", weights_only=True)  # tensors only: no code is unpickled
        if not isinstance(sd, Mapping):
            raise SpecError(f"{f}: expected a state dict (name -> tensor), got {type(sd).__name__}")
        out.update(sd)
    return out


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
        raise SpecError(f"checkpoint does not match the config: missing {missing[:6]}{'...' * (len(missing) > 6)}, "
                        f"unexpected {unexpected[:6]}{'...' * (len(unexpected) > 6)}")
    return ours


def load_hf_checkpoint(path: Path | str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Llama:
    """Our model with the weights of a Hugging Face Llama checkpoint directory."""
    directory = Path(path)
    if not directory.is_dir():
        raise SpecError(f"checkpoint directory not found: {directory}")
    cfg = config_from_hf(read_hf_config(directory))
    with torch.device("meta"):
        model = Llama(cfg)
    sd = hf_to_ours(_read_weights(directory), cfg)
    for name, t in sd.items():
        want = model.state_dict()[name].shape
        if tuple(t.shape) != tuple(want):
            raise SpecError(f"checkpoint tensor {name} has shape {tuple(t.shape)}, the config implies {tuple(want)}")
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
) -> Path:
    """Write `config.json` + `model*.safetensors` (sharded with an index above `max_shard_bytes`).

    `state_dict` overrides the model's own (e.g. a full state dict gathered from FSDP shards with
    `torch.distributed.checkpoint.state_dict.get_model_state_dict(..., full_state_dict=True)`).
    """
    from safetensors.torch import save_file

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    sd = dict(state_dict if state_dict is not None else model.state_dict())
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    dtype = dtype or next(iter(sd.values())).dtype
    tensors = {HF_PREFIX + k if not k.startswith("lm_head.") else k: v.detach().to("cpu", dtype).contiguous() for k, v in sd.items()}
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for k, v in tensors.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(directory / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        total = sum(v.numel() * v.element_size() for v in tensors.values())
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (directory / "config.json").write_text(json.dumps(config_to_hf(cfg, dtype), indent=2) + "\n")
    return directory
