"""Typed, schema-validated descriptions of the hardware, the model and the workload.

Units are in the field names: `_gbps` is GB/s (1e9 bytes per second, per direction),
`_gib` is GiB (2**30 bytes), `_tflops` is 1e12 FLOP/s, `_us` microseconds, `_s` seconds.

- `gpus`: `GPUType`, one GPU model of `data/gpus.yaml` (peak, memory, links, efficiencies, sources).
- `catalog`: the bundled GPU and model catalogs, lookup by name, measured profiles.
- `cluster`: `Device`, `NodeSpec`, `LinkOverride`, `ClusterSpec` and the cluster file (`ClusterFile`).
- `model`: `ModelSpec`, a decoder-only transformer; `hf`: the one Hugging Face config reader.
- `workload`: `Workload`, `RecomputePolicy`, `parse_tokens`.
- `schema`: strict field types, size limits and error messages; `files`: strict YAML/JSON
  reading and atomic writing.
"""

from .catalog import (
    ProfileFile,
    apply_profile,
    check_profile,
    get_gpu,
    get_model,
    gpu_catalog,
    load_gpu_catalog,
    load_model_catalog,
    load_profile,
    model_catalog,
)
from .cluster import ClusterFile, ClusterSpec, Device, LinkOverride, NodeEntry, NodeSpec, bundled_clusters, load_cluster
from .files import DATA_DIR, check_output_path, read_json, read_yaml, write_text_atomic
from .gpus import GB, GIB, LINK_KINDS, GPUType, profile_fields
from .hf import HFConfig, model_from_hf_config, parse_hf_config, read_hf_config
from .model import DEFAULT_NORM_EPS, ModelSpec
from .schema import MAX_DEVICES, MAX_SEQ_LEN
from .workload import RECOMPUTE_POLICIES, RecomputePolicy, Workload, parse_tokens, recompute_policy

PROFILE_KEYS = profile_fields()

__all__ = [
    "DATA_DIR",
    "DEFAULT_NORM_EPS",
    "GB",
    "GIB",
    "LINK_KINDS",
    "MAX_DEVICES",
    "MAX_SEQ_LEN",
    "PROFILE_KEYS",
    "RECOMPUTE_POLICIES",
    "ClusterFile",
    "ClusterSpec",
    "Device",
    "GPUType",
    "HFConfig",
    "LinkOverride",
    "ModelSpec",
    "NodeEntry",
    "NodeSpec",
    "ProfileFile",
    "RecomputePolicy",
    "Workload",
    "apply_profile",
    "bundled_clusters",
    "check_output_path",
    "check_profile",
    "get_gpu",
    "get_model",
    "gpu_catalog",
    "load_cluster",
    "load_gpu_catalog",
    "load_model_catalog",
    "load_profile",
    "model_catalog",
    "model_from_hf_config",
    "parse_hf_config",
    "parse_tokens",
    "read_hf_config",
    "read_json",
    "read_yaml",
    "recompute_policy",
    "write_text_atomic",
]
