"""One GPU model of the catalog (`data/gpus.yaml`): peak, memory, links, default efficiencies.

Units are in the field names: `_gbps` GB/s (1e9 bytes per second, per direction), `_gib` GiB,
`_tflops` 1e12 FLOP/s, `_us` microseconds.

Adding a field is one declaration in `GPUType`: its type, unit, range and description are read by
the catalog loader, the JSON Schema, the error messages and the `sources` check. Fields declared
with `profile=True` are the ones a measured profile may override (`data/profiles/`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from .schema import (
    MAX_BANDWIDTH_GBPS,
    MAX_LATENCY_US,
    MAX_MEMORY_GIB,
    MAX_TFLOPS,
    STRICT,
    KnownKeys,
    StrictStr,
    did_you_mean,
    number,
    one_of,
    spec_class,
)

GIB = 2**30
MEASURED = "profile"  # the source of a field measured on the user's machine (`GPUType.measured`)
GB = 1e9

LINK_KINDS = (
    "nvlink3",
    "nvlink4",
    "nvlink5",
    "pcie4",
    "pcie5",
    "loopback",
)  # loopback: gloo between CPU processes of one machine

_BW_WHY = "10 TB/s per direction is more than any GPU link; is the value in bytes/s or Gbit/s instead of GB/s?"


@spec_class(lambda kw: f"GPU type {kw.get('name', '?')!r}")
@dataclass(frozen=True, config=STRICT)
class GPUType(KnownKeys):
    """One GPU model. Efficiencies are fractions of peak reached by training kernels."""

    name: StrictStr
    peak_bf16_tflops: number(
        "dense BF16 tensor-core peak (no sparsity)", unit="TFLOP/s", gt=0, le=MAX_TFLOPS, profile=True
    )
    memory_gib: number(
        "device memory (vendors quote GB = 1e9 bytes: 80 GB -> 74.5 GiB)", unit="GiB", gt=0, le=MAX_MEMORY_GIB
    )
    hbm_bandwidth_gbps: number("device-memory bandwidth", unit="GB/s", gt=0, le=1e6, profile=True)
    link_kind: one_of(LINK_KINDS, "GPU-GPU link inside a node")
    link_bandwidth_gbps: number(
        "that link, per direction, per GPU", unit="GB/s", gt=0, le=MAX_BANDWIDTH_GBPS, limit_why=_BW_WHY, profile=True
    )
    link_latency_us: number("one-message latency over that link", unit="us", gt=0, le=MAX_LATENCY_US, profile=True) = (
        3.0
    )
    eff_matmul: number("fraction of peak reached by large bf16 GEMMs", gt=0, le=1, profile=True) = 0.6
    eff_attention: number(
        "fraction of peak reached by causal flash attention forward+backward", gt=0, le=1, profile=True
    ) = 0.5
    eff_hbm: number(
        "fraction of the device-memory bandwidth reached by memory-bound kernels (norms, activations, optimizer)",
        gt=0,
        le=1,
        profile=True,
    ) = 1.0
    attn_block_half_keys: number(
        "keys at which an attention block runs at half its long-block rate (the per-row cost "
        "of a kernel call: short ring-round blocks are slower)",
        unit="tokens",
        ge=0,
        le=1e6,
        profile=True,
    ) = 0.0
    overlap_slowdown: number(
        "seconds of compute lost per second of link time a transfer overlaps (DMA / NCCL "
        "contention for memory bandwidth and SMs)",
        ge=0,
        le=1,
        profile=True,
    ) = 0.0
    op_overhead_us: number(
        "device time of each operator beyond its FLOPs and bytes (launch, dispatch, allocation, "
        "a kernel's fixed start), per executed operator (costmodel/operators.py); 0 on the catalog's "
        "GPUs, whose efficiencies are fitted on whole published steps that already hold it",
        unit="us",
        ge=0,
        le=1e4,
        profile=True,
    ) = 0.0
    link_efficiency: number(
        "fraction of link_bandwidth_gbps a transfer reaches inside the node", gt=0, le=1, profile=True
    ) = 1.0
    nic_efficiency: number(
        "fraction of the NIC bandwidth (the cluster's nic_gbps) a transfer between nodes reaches",
        gt=0,
        le=1,
        profile=True,
    ) = 1.0
    sources: Annotated[
        dict[StrictStr, StrictStr],
        Field(
            description="citation key (an entry of data/sources) per numeric field: {field name: key}; optional",
            json_schema_extra=lambda s: s.update(propertyNames={"enum": numeric_fields()}),
        ),
    ] = dataclasses.field(default_factory=dict, compare=False)
    ranges: Annotated[
        dict[StrictStr, tuple[float, float]],
        Field(
            description="where a field's evidence is a range, not one measurement: {field name: [low, high]}; "
            "the field's value is then the midpoint (`at_range_end` gives the GPU at either end); optional",
            json_schema_extra=lambda s: s.update(propertyNames={"enum": numeric_fields()}),
        ),
    ] = dataclasses.field(default_factory=dict, compare=False)

    @field_validator("ranges")
    @classmethod
    def _ranges_are_intervals(cls, ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        numeric = numeric_fields()
        for key, (low, high) in ranges.items():
            if key not in numeric:
                raise ValueError(
                    f"{key!r} is not a numeric field{did_you_mean(key, numeric)}; numeric fields: {', '.join(numeric)}"
                )
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"{key} is [{low}, {high}]; give [low, high] with low <= high")
        return ranges

    @field_validator("sources")
    @classmethod
    def _sources_name_fields(cls, sources: dict[str, str]) -> dict[str, str]:
        numeric = numeric_fields()
        for key, cite in sources.items():
            if key not in numeric:
                raise ValueError(
                    f"sources names {key!r}, which is not a numeric field{did_you_mean(key, numeric)}; "
                    f"numeric fields: {', '.join(numeric)}"
                )
            if not cite.strip():
                raise ValueError(f"sources.{key} is empty; give a citation key")
        return sources

    def measured(self, fields: Mapping[str, float]) -> GPUType:
        """This type with `fields` replaced by values measured on the user's own machine (a profile),
        their source marked MEASURED: a software stack's factors do not apply to a measured rate
        (the measurement already ran the user's stack)."""
        return dataclasses.replace(
            self,
            **fields,
            sources={**self.sources, **dict.fromkeys(fields, MEASURED)},
            ranges={k: v for k, v in self.ranges.items() if k not in fields},  # a measurement replaces the range
        )

    def is_measured(self, field: str) -> bool:
        return self.sources.get(field) == MEASURED

    @property
    def matmul_flops(self) -> float:
        """Effective FLOP/s of the linear layers."""
        return self.peak_bf16_tflops * 1e12 * self.eff_matmul

    @property
    def attention_flops(self) -> float:
        """Effective FLOP/s of the attention kernel."""
        return self.peak_bf16_tflops * 1e12 * self.eff_attention

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


RANGE_ENDS = ("low", "mid", "high")


def at_range_end(gpu: GPUType, end: str) -> GPUType:
    """`gpu` with every field that has a range (`GPUType.ranges`) at that end: "low", "high", or
    "mid" (the midpoint, which is the catalog's value). A GPU without ranges comes back unchanged."""
    if end not in RANGE_ENDS:
        raise ValueError(f"range end {end!r}; one of {', '.join(RANGE_ENDS)}")
    i = RANGE_ENDS.index(end)
    return dataclasses.replace(gpu, **{f: (lo, (lo + hi) / 2, hi)[i] for f, (lo, hi) in gpu.ranges.items()})


def numeric_fields() -> list[str]:
    """GPUType fields that hold a number (the ones `sources` may cite)."""
    return [name for name, info in GPUType.__pydantic_fields__.items() if info.annotation in (int, float)]


def profile_fields() -> tuple[str, ...]:
    """GPUType fields a measured profile may override (declared with `profile=True`)."""
    return tuple(
        name
        for name, info in GPUType.__pydantic_fields__.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("profile")
    )


def catalog_field_order() -> tuple[str, ...]:
    """The fields of a catalog entry in the order the catalog files write them (GPUType's own)."""
    return tuple(f.name for f in dataclasses.fields(GPUType) if f.name not in ("name", "sources", "ranges"))
