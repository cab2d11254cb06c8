"""Reading input files strictly and writing output files whole.

- YAML: a repeated key is an error (PyYAML keeps the last one silently: a second `nodes:` key
  dropped a whole node), and `1e9` / `3.21e9` are numbers as in YAML 1.2 and JSON (PyYAML's YAML
  1.1 rules read them as strings).
- JSON: a repeated key is an error too.
- Output: `check_output_path` refuses a target that cannot be written before any work starts;
  `write_text_atomic` writes a temporary file beside the target and renames it into place, so a
  reader never sees a partial file.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError

_UMASK = os.umask(0o022)
os.umask(_UMASK)

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "data"


def data_path(name: str) -> Path:
    """Bundled data lives in `data/` next to the package (source checkout)."""
    return DATA_DIR / name


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping repeats a key."""


class StrictYAMLLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated keys and reads exponent floats (1e9) as numbers."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", key_node.start_mark
                ) from None
            if first is not None:
                raise DuplicateKeyError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1}): a repeated key would silently replace "
                    f"the earlier one; merge the two entries into one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


StrictYAMLLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictYAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


MAX_INPUT_BYTES = 256 * 2**20  # a spec, plan or profile file: the largest plans are a few MB


def _input_file(path: Path | str, what: str, error: type[Exception]) -> Path:
    """`path` when it is an existing file; else `error` saying what is wrong with it."""
    p = Path(path)
    if not p.exists():
        raise error(f"{what} not found: {p}")
    if p.is_dir():
        raise error(f"{p} is a directory, not a {what}")
    if not p.is_file():  # a device or a pipe (a link to /dev/zero) would be read forever
        raise error(f"{p} is not a regular file (a device, pipe or socket), not a {what}")
    if p.stat().st_size > MAX_INPUT_BYTES:
        raise error(f"{p}: {p.stat().st_size:,} bytes, more than any {what} holds (at most {MAX_INPUT_BYTES:,})")
    return p


def read_yaml(path: Path | str) -> Any:
    """Parse a YAML file strictly; a SpecError names the file (and line) for anything wrong."""
    p = _input_file(path, "YAML file", SpecError)
    try:
        with open(p, encoding="utf-8") as f:
            return yaml.load(f, Loader=StrictYAMLLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as e:
        raise SpecError(f"{p}: {_one_line(e)}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{p}: not valid YAML: {_one_line(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot be read: {e}") from None
    except RecursionError:  # [[[[...]]]] thousands deep: no file of ours nests more than a few levels
        raise SpecError(f"{p}: nested too deeply to be read (more than {sys.getrecursionlimit():,} levels)") from None


def _one_line(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else " ".join(str(e).split())


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}: a repeated key would silently replace the earlier one")
        out[k] = v
    return out


def parse_json(text: str, where: str, error: type[Exception] = SpecError) -> Any:
    """Parse JSON text strictly (no repeated keys, no NaN/Infinity); `error` names `where`."""

    def bad_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=_pairs_no_duplicates, parse_constant=bad_constant)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON: {e}") from None
    except ValueError as e:
        raise error(f"{where}: {e}") from None
    except RecursionError:  # e.g. [[[[...]]]] 100,000 deep: no file of ours nests more than a few levels
        raise error(f"{where}: nested too deeply to be read (more than {sys.getrecursionlimit():,} levels)") from None


def read_json(path: Path | str, what: str = "file", error: type[Exception] = SpecError) -> Any:
    """Parse a JSON file strictly; a missing or unreadable file is an `error` naming it."""
    p = _input_file(path, what, error)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot be read: {e}") from None
    return parse_json(text, str(p), error)


def check_output_path(path: Path | str, flag: str = "output") -> Path:
    """Refuse, before any work, an output target that cannot be written: a directory, a missing
    parent directory, a parent that is not a directory or not writable."""
    p = Path(path)
    if str(path).endswith(os.sep) or p.is_dir():
        raise SpecError(f"{flag} {path}: is a directory; give a file name (e.g. {p / 'plan.json'})")
    parent = p.parent
    if not parent.exists():
        raise SpecError(f"{flag} {path}: the directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not parent.is_dir():
        raise SpecError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecError(f"{flag} {path}: the directory {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise SpecError(f"{flag} {path}: the file exists and is not writable")
    return p


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write `text` to `path` whole: a temporary file in the same directory, flushed to disk, then
    renamed over the target (atomic on POSIX). On any failure the target is untouched and the
    temporary file removed."""
    p = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
