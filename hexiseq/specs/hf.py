"""The one reader of Hugging Face `config.json` files (Llama family).

`HFConfig` declares, strictly, every key HexiSeq reads; `model_from_hf_config` turns it into the
ModelSpec that the planner uses and that the runtime's LlamaConfig is built from
(`LlamaConfig.from_spec`, the one bridge), so every path reads a config.json the same way. Other
keys of a config are kept as they are, since Hugging Face configs carry many that do not concern us.
`num_hidden_layers: 2.7`, `"hidden_size": "4096"` or `true` for a count are refused with the key named.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ..errors import SpecError
from .files import read_json
from .model import ModelSpec
from .schema import MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, StrictBool, StrictStr, count, number, validate

DEFAULT_ROPE_THETA = 10000.0
# A config.json without rms_norm_eps: transformers' LlamaConfig default (`rms_norm_eps=1e-6` in
# LlamaConfig.__init__), which is what Hugging Face itself would run.
DEFAULT_RMS_NORM_EPS = 1e-6


class HFConfig(BaseModel):
    """The keys of a Hugging Face Llama-family `config.json` that HexiSeq reads."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, protected_namespaces=())

    num_hidden_layers: count("transformer blocks", le=MAX_LAYERS)
    hidden_size: count("model width", le=MAX_WIDTH)
    num_attention_heads: count("query heads", le=MAX_HEADS)
    num_key_value_heads: count("key/value heads (absent or null: as many as query heads)", le=MAX_HEADS) | None = None
    intermediate_size: count("MLP inner width", le=MAX_WIDTH)
    vocab_size: count("vocabulary size", le=MAX_VOCAB)
    head_dim: count("per-head dimension (absent or null: hidden_size / num_attention_heads)", le=MAX_WIDTH) | None = (
        None
    )
    tie_word_embeddings: StrictBool = False
    rope_theta: number("RoPE base (transformers 4 layout)", gt=0, le=1000000000000.0) | None = None
    rope_parameters: dict[str, Any] | None = Field(
        None, description="RoPE settings (transformers 5 layout; holds rope_theta)"
    )
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: number("RMSNorm epsilon", gt=0, le=1) | None = None
    model_type: StrictStr | None = None
    hidden_act: StrictStr | None = None
    attention_bias: StrictBool | None = None
    mlp_bias: StrictBool | None = None
    sliding_window: StrictBool | count("sliding-window size", ge=0, le=1 << 31) | None = None
    use_sliding_window: StrictBool | None = None
    name_or_path: StrictStr | None = Field(None, alias="_name_or_path")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def theta(self) -> float:
        """rope_theta from either layout: transformers 5 nests it in rope_parameters."""
        nested = (self.rope_parameters or {}).get("rope_theta")
        if nested is not None:
            return float(validate(_THETA, nested, "config.json: rope_parameters.rope_theta"))
        return self.rope_theta if self.rope_theta is not None else DEFAULT_ROPE_THETA

    @property
    def scaling(self) -> dict[str, Any] | None:
        """RoPE scaling from either layout (transformers 4: `rope_scaling`; transformers 5: the rest of
        `rope_parameters`); None for plain RoPE (no dict, or rope_type "default")."""
        params = {k: v for k, v in (self.rope_parameters or {}).items() if k != "rope_theta"}
        scaling = self.rope_scaling or params or None
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            return None
        return scaling

    @property
    def norm_eps(self) -> float:
        return self.rms_norm_eps if self.rms_norm_eps is not None else DEFAULT_RMS_NORM_EPS


_ADAPTER = TypeAdapter(HFConfig)
_THETA = TypeAdapter(number("RoPE base", gt=0, le=1e12))


def parse_hf_config(cfg: Any, where: str = "Hugging Face config") -> HFConfig:
    """A parsed config dict checked against HFConfig; SpecError naming each bad key."""
    if not isinstance(cfg, Mapping):
        raise SpecError(f"{where}: a Hugging Face config is a JSON object, got {type(cfg).__name__}")
    return validate(_ADAPTER, dict(cfg), where)


def read_hf_config(path: Path | str) -> dict[str, Any]:
    """The parsed, checked `config.json` of a checkpoint directory (or the file itself)."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    cfg = read_json(p, "Hugging Face config")
    parse_hf_config(cfg, str(p))
    return cfg


def model_from_hf_config(path_or_dict: Path | str | Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face Llama `config.json` (path or already-parsed dict)."""
    if isinstance(path_or_dict, Mapping):
        raw, default_name, where = dict(path_or_dict), "hf-model", "Hugging Face config"
    else:
        p = Path(path_or_dict)
        raw, default_name = read_hf_config(p), (p if p.is_dir() else p.parent).name or "hf-model"
        where = str(p / "config.json" if p.is_dir() else p)
    cfg = parse_hf_config(raw, where)
    return ModelSpec(
        name=name or cfg.name_or_path or default_name,
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.kv_heads,
        ffn=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        mlp="swiglu",
        norm="rmsnorm",
        tie_embeddings=cfg.tie_word_embeddings,
        rope_theta=cfg.theta,
        head_dim=cfg.head_dim or 0,
        norm_eps=cfg.norm_eps,
        rope_scaling=cfg.scaling,
    )
