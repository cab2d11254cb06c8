"""Software stacks (`data/stacks.yaml`): the kernel-efficiency factors of one software stack per GPU.

The GPU catalog's efficiencies (`data/gpus.yaml`) are the rates of the fit's reference stack
(`reference-bf16`: Transformer Engine attention, bf16 GEMMs). Every stack multiplies those rates by
its factors, per GPU: the default, `fa2-bf16`, the one the executor runs on GPUs, by the
flash-attention 2 kernel measurements; a published source's framework by its FP8 GEMMs, another
attention kernel, a power-capped GPU variant. A GPU a stack does not name runs at its `every_gpu` factors (1 when
absent). The cost model applies the factors in one place (`costmodel/kernels.py`, `rates`); the
validation study predicts every published point with its source's stack, so no correction is private
to the fit.

Factors (each a ratio of this stack's rate to the default stack's, on the same GPU):
    matmul        every GEMM, the LM head included (a clock or power cap moves them all)
    layer_gemm    the GEMMs of the transformer layers only, on top of `matmul` (FP8 recipes keep the
                  LM head in bf16: Transformer Engine's and torchao's defaults)
    attention     the attention kernel's long-block rate
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass

from ..errors import SpecError
from .files import data_path, read_yaml
from .schema import STRICT, KnownKeys, StrictStr, did_you_mean, number, spec_class, validate

DEFAULT_STACK_NAME = "fa2-bf16"
"""The stack the catalog's efficiencies describe and the executor runs: flash-attention 2, bf16 GEMMs."""

_FACTOR = dict(gt=0, le=10)


@spec_class(lambda kw: "stack factors")
@dataclass(frozen=True, config=STRICT)
class StackFactors(KnownKeys):
    """One stack's rates on one GPU (or every GPU) over the default stack's, and their evidence."""

    source: Annotated[StrictStr, Field(description="citation key of data/validation/sources.yaml")]
    how: Annotated[StrictStr, Field(description="which measurement or fit gives the factors, and the rule")]
    matmul: number("every GEMM's rate over the default stack's (the LM head included)", **_FACTOR) = 1.0
    layer_gemm: number("the transformer layers' GEMMs' rate, on top of matmul (FP8 GEMMs)", **_FACTOR) = 1.0
    attention: number("the attention kernel's long-block rate over the default stack's", **_FACTOR) = 1.0


@spec_class(lambda kw: f"stack {kw.get('name', '?')!r}")
@dataclass(frozen=True, config=STRICT)
class Stack(KnownKeys):
    """A named software stack: its factors on every GPU and per GPU (they multiply)."""

    name: StrictStr
    description: Annotated[StrictStr, Field(description="frameworks, kernels and precision of the stack")]
    used_by: Annotated[
        tuple[StrictStr, ...], Field(description="sources of data/validation/published.yaml that ran on this stack")
    ] = ()
    every_gpu: Annotated[StackFactors | None, Field(description="factors on every GPU")] = None
    gpus: Annotated[
        dict[StrictStr, StackFactors], Field(description="factors per GPU type (a catalog or published.yaml name)")
    ] = dataclasses.field(default_factory=dict)

    def __hash__(self) -> int:  # the dict field is not hashable; a stack is named once in its file
        return hash(self.name)

    def factors(self, gpu: str) -> tuple[float, float, float]:
        """(matmul, layer_gemm, attention) of this stack on GPU type `gpu`."""
        out = [1.0, 1.0, 1.0]
        for f in (self.every_gpu, self.gpus.get(gpu)):
            if f is not None:
                out = [out[0] * f.matmul, out[1] * f.layer_gemm, out[2] * f.attention]
        return out[0], out[1], out[2]

    @property
    def is_identity(self) -> bool:
        """True when every factor is 1 (the catalog's rates as they are)."""
        every = [self.every_gpu] if self.every_gpu is not None else []
        return all((f.matmul, f.layer_gemm, f.attention) == (1.0, 1.0, 1.0) for f in every + list(self.gpus.values()))


@dataclass(frozen=True, config=STRICT)
class StacksFile(KnownKeys):
    """data/stacks.yaml: the default stack's name and every stack."""

    default: Annotated[StrictStr, Field(description="the stack a command assumes without --stack")]
    stacks: Annotated[dict[StrictStr, dict[StrictStr, Any]], Field(description="{stack name: its fields}")]


_FILE = TypeAdapter(StacksFile)
_STACK = TypeAdapter(Stack)


def load_stacks(path: Path | str | None = None) -> dict[str, Stack]:
    """Every stack of `data/stacks.yaml` (or another file), checked: the default is named, defined
    and is DEFAULT_STACK_NAME (the name the cost model's default options use)."""
    where = str(path or data_path("stacks.yaml"))
    raw = validate(_FILE, read_yaml(path or data_path("stacks.yaml")), where)
    out = {
        name: validate(_STACK, {**fields, "name": name}, f"{where}: stack {name!r}")
        for name, fields in raw.stacks.items()
    }
    if raw.default != DEFAULT_STACK_NAME:
        raise SpecError(
            f"{where}: default is {raw.default!r}, but the cost model's default stack is {DEFAULT_STACK_NAME!r}"
        )
    if raw.default not in out:
        raise SpecError(f"{where}: the default stack {raw.default!r} is not defined")
    return out


@functools.lru_cache(maxsize=1)
def stack_catalog() -> dict[str, Stack]:
    """The bundled stacks (cached)."""
    return load_stacks()


def default_stack() -> Stack:
    """The default stack (DEFAULT_STACK_NAME of the bundled file): what CostOptions() runs on."""
    return stack_catalog()[DEFAULT_STACK_NAME]


def get_stack(name: str | None, stacks: Mapping[str, Stack] | None = None) -> Stack:
    """A stack by name (None: the default stack)."""
    stacks = stacks if stacks is not None else stack_catalog()
    name = DEFAULT_STACK_NAME if name is None else name
    if name not in stacks:
        raise SpecError(f"unknown stack {name!r}{did_you_mean(name, stacks)}; known stacks: {', '.join(stacks)}")
    return stacks[name]


def stacks_json_schema() -> dict[str, Any]:
    """JSON Schema of data/stacks.yaml."""
    entry = _STACK.json_schema()
    entry["properties"].pop("name", None)
    entry["required"] = [k for k in entry.get("required", []) if k != "name"]
    defs = entry.pop("$defs", {})
    return {
        "type": "object",
        "properties": {"default": {"type": "string"}, "stacks": {"type": "object", "additionalProperties": entry}},
        "required": ["default", "stacks"],
        "additionalProperties": False,
        **({"$defs": defs} if defs else {}),
    }
