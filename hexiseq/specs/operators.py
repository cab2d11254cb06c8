"""The executor's operator counts (`data/operators.yaml`): how many operators each piece of a step runs.

A device's `op_overhead_us` (data/gpus*.yaml) is the time each executed operator costs beyond its
FLOPs and bytes; the cost model charges it per piece of the step (costmodel/durations.py) with these
counts. They are properties of the executor (hexiseq/runtime, this torch), not of a device, and are
measured: fitted by least squares to the operators the CPU emulation counted on every rank of
recorded runs (`python -m hexiseq.calibrate.operator_counts RUN_DIR ...`, which rewrites the file).

    linear_forward    one forward linear part of one layer (norm + QKV, or O + MLP)
    linear_backward   one backward linear part (a selective rerun costs linear_forward again)
    round_forward     one attention round's forward on a rank (kernel, merge, the KV exchange's copies)
    round_backward    one attention round's backward
    all_to_all        one ragged all-to-all of a head-parallel group (packing, unpacking)
    step              once per optimizer step (optimizer, gradient reduction, clipping)
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass

from .files import data_path, read_yaml
from .schema import STRICT, KnownKeys, number, spec_class, validate

COUNT_FIELDS = ("linear_forward", "linear_backward", "round_forward", "round_backward", "all_to_all", "step")


@spec_class(lambda kw: "operator counts")
@dataclass(frozen=True, config=STRICT)
class OperatorCounts(KnownKeys):
    """Operators per executed piece of a step (module doc); `measured` records how they were fitted."""

    linear_forward: number("operators of one forward linear part of one layer", ge=0, le=1e5) = 0.0
    linear_backward: number("operators of one backward linear part", ge=0, le=1e5) = 0.0
    round_forward: number("operators of one attention round's forward", ge=0, le=1e5) = 0.0
    round_backward: number("operators of one attention round's backward", ge=0, le=1e5) = 0.0
    all_to_all: number("operators of one ragged all-to-all", ge=0, le=1e5) = 0.0
    step: number("operators once per optimizer step", ge=0, le=1e7) = 0.0
    measured: Annotated[dict[str, Any], Field(description="the fit's record: command, torch, runs, residuals")] = (
        dataclasses.field(default_factory=dict, compare=False)
    )


_ADAPTER = TypeAdapter(OperatorCounts)


def load_operator_counts(path: Path | str | None = None) -> OperatorCounts:
    """The operator counts of `data/operators.yaml` (or another file), checked."""
    where = str(path or data_path("operators.yaml"))
    return validate(_ADAPTER, read_yaml(path or data_path("operators.yaml")), where)


@functools.lru_cache(maxsize=1)
def operator_counts() -> OperatorCounts:
    """The bundled operator counts (cached)."""
    return load_operator_counts()
