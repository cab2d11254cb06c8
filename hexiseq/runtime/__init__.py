"""Runtime: the Plan executed on torch.distributed (exact asymmetric CP x HP attention).

Importing this package never imports flash-attn; the CUDA backend is loaded on first CUDA use.
"""

from .attention import PlanAttention, plan_attention
from .comm import P2PBatch, gather_heads, ragged_all_to_all, scatter_qkv
from .groups import RankContext, build_context, derive_context, world_violations
from .kernels import block_mask, local_attention, local_attention_backward, merge_, select_backend
from .world import WorldError, WorldResult, init_from_env, run_world, spawn_world

__all__ = [
    "PlanAttention",
    "plan_attention",
    "P2PBatch",
    "gather_heads",
    "ragged_all_to_all",
    "scatter_qkv",
    "RankContext",
    "build_context",
    "derive_context",
    "world_violations",
    "block_mask",
    "local_attention",
    "local_attention_backward",
    "merge_",
    "select_backend",
    "WorldError",
    "WorldResult",
    "init_from_env",
    "run_world",
    "spawn_world",
]
