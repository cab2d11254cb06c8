"""The per-cell cache of `hexiseq reproduce`, and the version its keys carry.

`model_version()` hashes the content of everything that decides a cell's numbers: the source of
the cost model, the planner, the Plan and the specs, the code that turns a plan result into rows,
the catalogs (`data/*.yaml`), measured profiles, and the versions of the solver stack. A cell's
key adds the cell's own inputs (`Cell.compute_params`: the cluster's file and built content, the
model, the length, the workload). Any change to any of these gives a new key, so a cached cell is
never reused for code or data it was not computed with; stale entries are simply not read.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from ..specs import DATA_DIR, write_text_atomic

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = PACKAGE_DIR.parent
# Source that decides the numbers (directories: every .py below them).
VERSION_SOURCES = ("costmodel", "planner", "plan.py", "specs.py", "specs", "reproduce/cells.py")
# Data that decides the numbers: the catalogs and measured profiles. Cluster files enter each
# cell's own key (only the clusters a cell uses).
VERSION_DATA = ("*.yaml", "profiles/**/*")
VERSION_PACKAGES = ("pyomo", "highspy", "numpy")


def _files() -> list[Path]:
    out: list[Path] = []
    for rel in VERSION_SOURCES:
        p = PACKAGE_DIR / rel
        if p.is_dir():
            out += sorted(x for x in p.rglob("*.py") if "__pycache__" not in x.parts)
        elif p.exists():
            out.append(p)
    for pattern in VERSION_DATA:
        out += sorted(x for x in DATA_DIR.glob(pattern) if x.is_file())
    return out


def version_inputs() -> dict[str, str]:
    """{file relative to the repository, or package==version: sha256 of its content}."""
    out = {str(p.relative_to(REPO_DIR)): hashlib.sha256(p.read_bytes()).hexdigest() for p in _files()}
    for pkg in VERSION_PACKAGES:
        try:
            out[f"{pkg}=={metadata.version(pkg)}"] = ""
        except metadata.PackageNotFoundError:  # pragma: no cover - a dependency
            out[f"{pkg} (not installed)"] = ""
    return out


def model_version() -> str:
    """A short hash of `version_inputs()`: "cm-" + 12 hex digits. The files are read on every
    call (a few milliseconds), so an edit in a running notebook kernel counts at once."""
    blob = json.dumps(version_inputs(), sort_keys=True).encode()
    return "cm-" + hashlib.sha256(blob).hexdigest()[:12]


def cell_key(cell: Any, version: str) -> str:
    blob = json.dumps({"version": version, **cell.compute_params()}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def write_atomic(path: Path, text: str) -> None:
    """Write a file whole or not at all (`specs.write_text_atomic`), its directory made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


class CellCache:
    """One JSON file per finished cell, `DIR/<key>.json`."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The record stored under `key`, or None (absent, unreadable, or not this key's)."""
        p = self.path(key)
        if not p.exists():
            return None
        try:
            record = json.loads(p.read_text())
        except (OSError, ValueError):
            return None  # a damaged entry is recomputed (and overwritten)
        return record if isinstance(record, dict) and record.get("key") == key else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        write_atomic(self.path(key), json.dumps({**record, "key": key}, indent=1, default=float) + "\n")
