"""HexiSeq: plan and run long-context training on heterogeneous GPU clusters with
asymmetric context parallelism (ring attention) x head parallelism (Ulysses)."""

from .errors import HexiSeqError, InfeasibleError, PlanError, SpecError
from .plan import (
    Group,
    Plan,
    RankLayout,
    Replica,
    Sharding,
    ShardingScope,
    ShardingStage,
    random_plan,
    ring_plan,
    symmetric_plan,
    ulysses_plan,
)
from .rounding import even_split
from .specs import (
    ClusterSpec,
    Device,
    GPUType,
    ModelSpec,
    Workload,
    get_gpu,
    get_model,
    gpu_catalog,
    load_cluster,
    model_catalog,
)

__version__ = "0.1.0"


def launch(*args, **kwargs):
    """Start a training run of a plan in the background: see hexiseq.runs.launch."""
    from .runs import launch as _launch

    return _launch(*args, **kwargs)


__all__ = [
    "ClusterSpec",
    "Device",
    "GPUType",
    "Group",
    "HexiSeqError",
    "InfeasibleError",
    "ModelSpec",
    "Plan",
    "Replica",
    "Sharding",
    "ShardingScope",
    "ShardingStage",
    "PlanError",
    "RankLayout",
    "SpecError",
    "Workload",
    "even_split",
    "get_gpu",
    "get_model",
    "gpu_catalog",
    "launch",
    "load_cluster",
    "model_catalog",
    "random_plan",
    "ring_plan",
    "symmetric_plan",
    "ulysses_plan",
]
