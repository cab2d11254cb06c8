"""`hexiseq schema cluster|plan|gpus|models|profile [--out FILE]`: the JSON Schema of an input file.

Editors validate as you type with it (VS Code's YAML extension reads a first-line comment
`# yaml-language-server: $schema=../schemas/cluster.schema.json`; for JSON, map `*.plan.json` or
`plan.json` to data/schemas/plan.schema.json in `json.schemas`). The same pydantic declarations
check the files when HexiSeq reads them; copies are committed in data/schemas/ (a test keeps them
up to date: regenerate with `hexiseq schema --all --out-dir data/schemas`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _cluster() -> dict[str, Any]:
    from pydantic import TypeAdapter

    from ..specs import ClusterFile

    return TypeAdapter(ClusterFile).json_schema()


def _plan() -> dict[str, Any]:
    from ..planfile import plan_json_schema

    return plan_json_schema()


def _gpus() -> dict[str, Any]:
    from ..specs import GPUType
    from ..specs.catalog import catalog_json_schema

    return catalog_json_schema(GPUType, "GPU catalog")


def _models() -> dict[str, Any]:
    from ..specs import ModelSpec
    from ..specs.catalog import catalog_json_schema

    return catalog_json_schema(ModelSpec, "model catalog")


def _profile() -> dict[str, Any]:
    from pydantic import TypeAdapter

    from ..specs import ProfileFile

    return TypeAdapter(ProfileFile).json_schema()


SCHEMAS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "cluster": ("HexiSeq cluster file (data/clusters/*.yaml)", _cluster),
    "plan": ("HexiSeq plan file (hexiseq plan --out)", _plan),
    "gpus": ("HexiSeq GPU catalog (data/gpus.yaml)", _gpus),
    "models": ("HexiSeq model catalog (data/models.yaml)", _models),
    "profile": ("HexiSeq device profile (data/profiles/*.yaml)", _profile),
}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one kind of input file, with $schema and title."""
    title, build = SCHEMAS[name]
    return {"$schema": DRAFT, **build(), "title": title}


def schema_text(name: str) -> str:
    """The schema as the committed file holds it (sorted keys, 2-space indent, final newline)."""
    return json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of an input file (cluster, plan, ...)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", nargs="?", choices=sorted(SCHEMAS), help="which file")
    p.add_argument("--out", help="write it to this file instead of printing it")
    p.add_argument("--all", action="store_true", help="every schema, written as KIND.schema.json into --out-dir")
    p.add_argument("--out-dir", help="with --all: the directory (e.g. data/schemas)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError
    from ..specs import check_output_path, write_text_atomic

    if args.all:
        if args.kind or args.out or not args.out_dir:
            raise SpecError("--all writes every schema into --out-dir DIR (and takes no KIND or --out)")
        out_dir = Path(args.out_dir)
        if not out_dir.is_dir():
            raise SpecError(f"--out-dir {out_dir}: not a directory; create it first (mkdir -p {out_dir})")
        for name in SCHEMAS:
            write_text_atomic(out_dir / f"{name}.schema.json", schema_text(name))
            print(f"wrote {out_dir / f'{name}.schema.json'}")
        return 0
    if not args.kind:
        raise SpecError(f"name the file kind: hexiseq schema {{{','.join(sorted(SCHEMAS))}}} (or --all --out-dir DIR)")
    if args.out:
        check_output_path(args.out, "--out")
        write_text_atomic(args.out, schema_text(args.kind))
        print(f"wrote {args.out}")
    else:
        print(schema_text(args.kind), end="")
    return 0
