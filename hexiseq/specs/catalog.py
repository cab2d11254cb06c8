"""The bundled catalogs (`data/gpus.yaml`, `data/models.yaml`), lookups by name, and measured
profiles that override catalog efficiencies (`data/profiles/`)."""

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model
from pydantic.dataclasses import dataclass

from ..errors import SpecError
from .files import data_path, read_yaml
from .gpus import GPUType, profile_fields
from .hf import model_from_hf_config
from .model import ModelSpec
from .schema import STRICT, KnownKeys, StrictStr, did_you_mean, join_problems, problems, validate

C = TypeVar("C")


def _load_catalog(path: Path | str, cls: type[C], kind: str) -> dict[str, C]:
    """{name: cls(name=name, **fields)} from a YAML mapping; every bad entry is named."""
    raw = read_yaml(path)
    if not isinstance(raw, dict) or not raw:
        raise SpecError(f"{path}: expected a mapping of {kind} name -> fields")
    adapter = TypeAdapter(cls)
    out: dict[str, C] = {}
    errors: list[str] = []
    for name, fields in raw.items():
        if not isinstance(name, str):
            errors.append(f"{kind} name {name!r} must be a string")
            continue
        if not isinstance(fields, dict):
            errors.append(f"{kind} {name!r} must be a mapping of fields, got {fields!r}")
            continue
        try:
            out[name] = adapter.validate_python({**fields, "name": name})
        except ValidationError as e:
            errors.extend(f"{kind} {name!r}: {line}" for line in problems(e, data=fields))
    if errors:
        raise SpecError(join_problems(str(path), errors))
    return out


def load_gpu_catalog(path: Path | str | None = None) -> dict[str, GPUType]:
    """Read `data/gpus.yaml` (or another catalog) into {name: GPUType}."""
    return _load_catalog(path or data_path("gpus.yaml"), GPUType, "GPU type")


# Emulated CPU device types (CPU ranks slowed by a factor, hexiseq/runtime/emulation.py): measured on
# this project's machine, not fitted to published GPU runs, so they live apart from data/gpus.yaml.
CPU_CATALOG = "gpus-cpu.yaml"


@functools.lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPUType]:
    """The bundled GPU catalog (cached): data/gpus.yaml and the emulated CPU types of data/gpus-cpu.yaml."""
    catalog = load_gpu_catalog()
    cpu = load_gpu_catalog(data_path(CPU_CATALOG))
    both = sorted(set(catalog) & set(cpu))
    if both:
        raise SpecError(f"{CPU_CATALOG} redefines GPU types of gpus.yaml: {', '.join(both)}")
    return {**catalog, **cpu}


def get_gpu(name: str, catalog: Mapping[str, GPUType] | None = None) -> GPUType:
    """A GPU type by catalog name (the bundled catalog unless one is given)."""
    catalog = catalog if catalog is not None else gpu_catalog()
    if not isinstance(name, str) or name not in catalog:
        hint = did_you_mean(name, catalog) if isinstance(name, str) else ""
        raise SpecError(f"unknown GPU type {name!r}{hint}; known types: {', '.join(sorted(catalog))}")
    return catalog[name]


def load_model_catalog(path: Path | str | None = None) -> dict[str, ModelSpec]:
    """Read `data/models.yaml` (or another catalog) into {name: ModelSpec}."""
    return _load_catalog(path or data_path("models.yaml"), ModelSpec, "model")


@functools.lru_cache(maxsize=1)
def model_catalog() -> dict[str, ModelSpec]:
    """The bundled model catalog (cached)."""
    return load_model_catalog()


def get_model(name: str) -> ModelSpec:
    """A bundled model by name, or a ModelSpec from a Hugging Face config.json path."""
    catalog = model_catalog()
    if name in catalog:
        return catalog[name]
    p = Path(name)
    if p.suffix == ".json" and p.exists():
        return model_from_hf_config(p)
    if p.suffix == ".json" or (p.is_dir() and (p / "config.json").exists()):
        return model_from_hf_config(p)  # a missing file or a checkpoint directory: its own error
    raise SpecError(
        f"unknown model {name!r}{did_you_mean(name, catalog)}; known models: {', '.join(catalog)} "
        f"(or a path to a Hugging Face config.json)"
    )


# --------------------------------------------------------------------------- profiles


def _profile_entry() -> type:
    """The per-GPU entry of a profile: every GPUType field declared with profile=True, optional,
    with that field's own type, range and description (so adding one is one declaration)."""
    fields: dict[str, Any] = {}
    for name in profile_fields():
        info = GPUType.__pydantic_fields__[name]
        fields[name] = (
            Annotated[(info.annotation, *info.metadata)] | None,
            Field(None, description=info.description),
        )
    return create_model("ProfileEntry", __base__=_StrictModel, **fields)


class _StrictModel(KnownKeys, BaseModel):
    model_config = STRICT


ProfileEntry = _profile_entry()


@dataclass(frozen=True, config=STRICT)
class ProfileFile(KnownKeys):
    """A profile: measured efficiencies per GPU type, overriding the catalog's defaults."""

    gpus: Annotated[
        dict[StrictStr, ProfileEntry], Field(description="{GPU type name of data/gpus.yaml: {field: measured value}}")
    ]  # type: ignore[valid-type]
    notes: Annotated[StrictStr | None, Field(description="free text: where, when and how it was measured")] = None
    measured: Annotated[
        dict[StrictStr, Any] | None,
        Field(
            description="the record of `hexiseq profile`: what was run, when, on what machine, and every raw figure "
            "(not read by the cost model)"
        ),
    ] = None


_PROFILE_FILE = TypeAdapter(ProfileFile)


def check_profile(
    profile: Any, where: str = "profile", catalog: Mapping[str, GPUType] | None = None
) -> dict[str, dict[str, float]]:
    """{gpu name: {field: value}} of a profile's `gpus` mapping, every name and value checked (names
    against the catalog, values against the GPU field declarations); else a SpecError naming each."""
    return _check_profile_file({"gpus": profile}, where, catalog)


def _check_profile_file(
    raw: Any, where: str, catalog: Mapping[str, GPUType] | None = None
) -> dict[str, dict[str, float]]:
    catalog = catalog if catalog is not None else gpu_catalog()
    if not isinstance(raw, Mapping) or "gpus" not in raw:
        raise SpecError(f"{where}: a profile needs a top-level 'gpus' mapping (data/profiles/README.md)")
    entries = validate(_PROFILE_FILE, dict(raw), where).gpus
    unknown = [
        f"gpus.{name} is not a GPU type of the catalog{did_you_mean(name, catalog)}; "
        f"known types: {', '.join(sorted(catalog))}"
        for name in entries
        if name not in catalog
    ]
    if unknown:
        raise SpecError(join_problems(where, unknown))
    return {name: e.model_dump(exclude_none=True) for name, e in entries.items()}


def load_profile(path: Path | str) -> dict[str, dict[str, float]]:
    """A profile file: `gpus: {NAME: {eff_matmul: x, eff_attention: y}}` and optional `notes`."""
    return _check_profile_file(read_yaml(path), str(path))


def apply_profile(catalog: Mapping[str, GPUType], profile: Mapping[str, Mapping[str, float]]) -> dict[str, GPUType]:
    """Override catalog efficiencies with measured ones: {gpu: {eff_matmul: .., eff_attention: ..}}."""
    out = dict(catalog)
    for name, fields in check_profile(profile, catalog=catalog).items():
        out[name] = catalog[name].measured(fields)
    return out


def catalog_json_schema(cls: type, title: str) -> dict[str, Any]:
    """JSON Schema of a catalog file: a mapping of entry name -> the class's fields (but `name`)."""
    entry = TypeAdapter(cls).json_schema()
    entry["properties"].pop("name", None)
    entry["required"] = [k for k in entry.get("required", []) if k != "name"]
    defs = entry.pop("$defs", {})
    return {
        "title": title,
        "type": "object",
        "additionalProperties": entry,
        "minProperties": 1,
        **({"$defs": defs} if defs else {}),
    }
