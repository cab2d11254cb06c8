"""Reading a checkpoint's files without running code from them.

torch.distributed.checkpoint (DCP) keeps a checkpoint's index in `.metadata`, a pickle, and the
non-tensor entries of the state (optimizer hyperparameters) as pickles inside the `__R_I.distcp`
files; it loads both with the unrestricted `pickle` (a pickle can call any function: `os.system`).
A run directory is shared between people and machines, so every checkpoint read here goes through:

- `read_metadata`: `.metadata` through an unpickler that admits only DCP's metadata classes and
  the few torch and standard types they hold (`_ALLOWED`); anything else is refused, named;
- `SafeReader` / `SafePlanner`: DCP's file reader and load planner with that metadata reader and
  `torch.load(weights_only=True)` for the non-tensor entries (DCP already loads tensors so);
- `load_rng`: the per-rank RNG states (`rng-RRRRR.pt`) with `weights_only=True`.

Every refusal is a `SpecError` that names the file, so a tampered or corrupt checkpoint reads as one
line, never as a traceback.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata

from ..errors import SpecError

METADATA = ".metadata"

# What a DCP `.metadata` pickle names (found by reading one written by this torch): its dataclasses,
# the Size, dtype and layout of each tensor, and the checkpoint's path. Each is a constructor with
# no effect outside the object it builds.
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}

_ADVICE = "the file was altered or is not a checkpoint; use another checkpoint (--checkpoint NAME)"


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that finds only the names of `_ALLOWED` (and torch's dtypes)."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise SpecError(
            f"{self.path}: refused: it asks to load {module}.{name}, which checkpoint metadata never holds "
            f"(unpickling it could run code); {_ADVICE}"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SpecError(f"{self.path}: refused: it holds a persistent reference, which checkpoint metadata never does")


def read_metadata(path: Path | str) -> Metadata:
    """The DCP metadata of the checkpoint directory (or `.metadata` file) `path`, unpickled with only
    the metadata classes admitted. SpecError naming the file when it holds anything else or is corrupt."""
    path = Path(path)
    file = path / METADATA if path.is_dir() else path
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f, file).load()
    except SpecError:
        raise
    except OSError as e:
        raise SpecError(f"{file}: cannot be read ({e.strerror or type(e).__name__})") from None
    except Exception as e:  # any unpickling failure: truncated, garbage, wrong arguments
        raise SpecError(f"{file}: not a readable checkpoint index ({type(e).__name__}); {_ADVICE}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise SpecError(f"{file}: holds a {type(metadata).__name__}, not checkpoint metadata; {_ADVICE}")
    return metadata


def load_weights_only(data: io.BytesIO | Path, where: Path | str) -> Any:
    """torch.load with weights_only=True (tensors and plain Python values only); SpecError naming
    `where` when the file holds anything else or is corrupt."""
    try:
        return torch.load(data, map_location="cpu", weights_only=True)
    except Exception as e:
        if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e) or "Weights only" in str(e):
            raise SpecError(
                f"{where}: refused: it holds pickled objects other than tensors and plain values "
                f"(unpickling them could run code); {_ADVICE}"
            ) from None
        raise SpecError(f"{where}: cannot be read ({type(e).__name__}); {_ADVICE}") from None


def load_rng(path: Path) -> dict[str, Any]:
    """A rank's RNG states (`rng-RRRRR.pt`), tensors and plain values only."""
    state = load_weights_only(path, path)
    if not isinstance(state, dict) or "torch" not in state:
        raise SpecError(f"{path}: not the RNG states of a rank; {_ADVICE}")
    return state


class SafeReader(FileSystemReader):
    """DCP's file reader with the restricted metadata unpickler; a file that fails to load is named."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(str(path))
        self._reading: str | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._reading = sinfo.relative_path  # named if this slice fails to load
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().read_data(plan, planner)
        except SpecError:
            raise
        except Exception as e:
            where = Path(self.path) / (self._reading or "?")
            if "weights_only" in str(e) or "Weights only" in str(e) or isinstance(e, pickle.UnpicklingError):
                raise SpecError(
                    f"{where}: refused: it holds pickled objects other than tensors (unpickling them could run "
                    f"code); {_ADVICE}"
                ) from None
            raise SpecError(f"{where}: cannot be read ({type(e).__name__}: {str(e)[:160]}); {_ADVICE}") from None


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner with the non-tensor entries loaded weights_only (DCP's own unpickles them)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.where = Path(path)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = load_weights_only(value, f"{self.where} (entry {read_item.dest_index.fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _first_spec_error(e: BaseException) -> SpecError | None:
    """The SpecError one of the ranks raised inside DCP (which wraps them in CheckpointException)."""
    if isinstance(e, SpecError):
        return e
    if isinstance(e, CheckpointException):
        for _rank, (exc, _trace) in sorted(e.failures.items()):
            found = _first_spec_error(exc)
            if found is not None:
                return found
    cause = e.__cause__ or e.__context__
    return _first_spec_error(cause) if cause is not None else None


def dcp_load(state: dict[str, Any], path: Path) -> None:
    """dcp.load of `state` from the checkpoint `path`, reading no code: SafeReader and SafePlanner.
    A refusal or corrupt file found by any rank is re-raised as its SpecError (one line, the file)."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafePlanner(path))
    except (Exception, CheckpointException) as e:
        found = _first_spec_error(e)
        if found is not None:
            raise SpecError(str(found)) from None
        if isinstance(e, CheckpointException):
            first = next(iter(sorted(e.failures.items())), None)
            what = f"{type(first[1][0]).__name__}: {str(first[1][0])[:200]}" if first else "unknown"
            raise SpecError(f"checkpoint {path} cannot be loaded ({what}); {_ADVICE}") from None
        raise


def verify_contents(path: Path) -> None:
    """Read what a checkpoint holds besides its tensors, without running code: `.metadata` through
    the restricted unpickler, every non-tensor entry of the `.distcp` files and every `rng-*.pt` with
    weights_only. (The tensors themselves DCP loads weights_only.) Cheap: these are small."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = read_metadata(path)
    for index, info in metadata.storage_data.items():
        entry = metadata.state_dict_metadata.get(getattr(index, "fqn", None))
        if not isinstance(entry, BytesStorageMetadata):
            continue
        f = path / str(getattr(info, "relative_path", ""))
        try:
            with open(f, "rb") as stream:
                stream.seek(int(info.offset))
                data = io.BytesIO(stream.read(int(info.length)))
        except (OSError, TypeError, ValueError) as e:
            raise SpecError(f"{f}: cannot be read ({type(e).__name__}); {_ADVICE}") from None
        load_weights_only(data, f"{f} (entry {index.fqn})")
    for rng in sorted(path.glob("rng-*.pt")):
        load_rng(rng)
