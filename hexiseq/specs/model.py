"""A decoder-only transformer (`data/models.yaml`, or a Hugging Face config: `hf.py`): its shape,
parameter count and FLOPs per token."""

import dataclasses
from typing import Annotated, Any

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from .schema import (
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    STRICT,
    KnownKeys,
    StrictBool,
    StrictStr,
    count,
    number,
    one_of,
    spec_class,
)

# Normalization epsilon of a catalog model that names none: what Llama 2 and 3 publish. A Hugging
# Face config.json without rms_norm_eps reads as transformers' default instead (hf.py).
DEFAULT_NORM_EPS = 1e-5


@spec_class(lambda kw: f"model {kw.get('name', '?')!r}")
@dataclass(frozen=True, config=STRICT)
class ModelSpec(KnownKeys):
    """A decoder-only transformer (Llama: SwiGLU + RMSNorm + RoPE + GQA; GPT: GELU + LayerNorm, biases)."""

    name: StrictStr
    layers: count("transformer blocks", le=MAX_LAYERS)
    hidden: count("model width (hidden size)", le=MAX_WIDTH)
    heads: count("query heads", le=MAX_HEADS)
    kv_heads: count("key/value heads (GQA: heads must be a multiple)", le=MAX_HEADS)
    ffn: count("MLP inner width", le=MAX_WIDTH)
    vocab: count("vocabulary size", le=MAX_VOCAB)
    mlp: one_of(("swiglu", "gelu"), "swiglu (3 matrices, Llama) or gelu (2 matrices, GPT)") = "swiglu"
    norm: one_of(("rmsnorm", "layernorm"), "normalization layer") = "rmsnorm"
    tie_embeddings: StrictBool = False
    rope_theta: number("RoPE base", gt=0, le=1e12) = 10000.0
    head_dim: count("per-head dimension; 0: hidden / heads", ge=0, le=MAX_WIDTH) = 0
    norm_eps: number("normalization epsilon (RMSNorm / LayerNorm)", gt=0, le=1) = DEFAULT_NORM_EPS
    # Hugging Face's rope_scaling dict (None: plain RoPE); not part of the hash, a dict has none.
    rope_scaling: Annotated[
        dict[str, Any] | None, Field(description="RoPE scaling as Hugging Face writes it (the executor runs llama3)")
    ] = dataclasses.field(default=None, hash=False)
    published_params: (
        number("parameter count from the model card (tests compare against it)", gt=0, le=1000000000000000.0) | None
    ) = None

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.heads % self.kv_heads:
            raise PydanticCustomError(
                "hexiseq",
                "{reason}",
                {
                    "reason": (
                        f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads}); "
                        f"{self.heads} % {self.kv_heads} = {self.heads % self.kv_heads}"
                    )
                },
            )
        if not self.head_dim:
            if self.hidden % self.heads:
                raise PydanticCustomError(
                    "hexiseq",
                    "{reason}",
                    {"reason": (f"hidden ({self.hidden}) not divisible by heads ({self.heads}); give head_dim")},
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        return self

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    @property
    def has_bias(self) -> bool:
        return self.mlp == "gelu"  # GPT-style blocks carry biases

    # ---- parameters
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        bias = ((self.heads + 2 * self.kv_heads) * self.head_dim + self.hidden) if self.has_bias else 0
        return q + kv + o + bias

    @property
    def mlp_params_per_layer(self) -> int:
        mats = 3 if self.mlp == "swiglu" else 2
        bias = (self.ffn + self.hidden) if self.has_bias else 0
        return mats * self.hidden * self.ffn + bias

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def param_count(self) -> int:
        """All parameters (embeddings, layers, final norm, LM head unless tied)."""
        return self.embedding_params + self.layers * self.params_per_layer + self.norm_params + self.lm_head_params

    # ---- FLOPs (forward; a multiply-add is 2 FLOPs; backward = 2x forward)
    @property
    def linear_flops_per_token_per_layer(self) -> float:
        """Forward FLOPs per token of one layer's matmuls (QKV, O, MLP); norms/activations ignored."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mats = 3 if self.mlp == "swiglu" else 2
        return 2.0 * (q + kv + o + mats * self.hidden * self.ffn)

    @property
    def lm_head_flops_per_token(self) -> float:
        """Forward FLOPs per token of the LM head (the logits matmul)."""
        return 2.0 * self.vocab * self.hidden

    @property
    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token of every matmul of the model (all layers + LM head)."""
        return self.layers * self.linear_flops_per_token_per_layer + self.lm_head_flops_per_token

    @property
    def attention_flops_per_pair(self) -> float:
        """Forward FLOPs of one query-key pair for one head in one layer: QK^T and PV, 2*d each."""
        return 4.0 * self.head_dim

    def causal_pairs(self, seq_len: int) -> int:
        """Query-key pairs per head of causal attention over a sequence: S(S+1)/2."""
        return seq_len * (seq_len + 1) // 2

    def forward_flops(self, seq_len: int) -> float:
        """Forward FLOPs of one sequence: matmuls on every token + causal attention in every layer."""
        return (
            seq_len * self.linear_flops_per_token
            + self.layers * self.heads * self.attention_flops_per_pair * self.causal_pairs(seq_len)
        )

    def training_flops(self, seq_len: int) -> float:
        """Useful FLOPs of forward + backward of one sequence (3x forward; recompute not counted)."""
        return 3.0 * self.forward_flops(seq_len)

    def state_bytes(self) -> dict[str, float]:
        """Bytes of model states for mixed-precision AdamW: bf16 weights and grads, fp32 master + 2 moments."""
        p = self.param_count
        return {"weights_bf16": 2.0 * p, "grads_bf16": 2.0 * p, "master_fp32": 4.0 * p, "adam_fp32": 8.0 * p}
