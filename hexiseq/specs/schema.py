"""Building blocks of the strict schemas (pydantic v2) and the one way their errors read.

Every field of an input file is declared once, as an annotated type made by `number(...)` (or a
strict str / bool / literal), with its unit, range and description. The same declaration validates
the file, builds the JSON Schema editors use, and phrases the error: which field, the value, the
allowed range and what to do. Strict means: no bool where a number goes (`count: true`), no float
where an integer goes (`chunk_len: 2048.7`), no string for a number (`devices: "01"`), no NaN/inf.

`spec_class` turns a pydantic dataclass into a frozen value object whose constructor raises
`SpecError` (one message, every problem listed) instead of pydantic's ValidationError, so that
Python callers and file loaders see the same errors.

The size limits of the whole project live here (one place): they keep a typo from allocating
gigabytes or overflowing integer arithmetic, and each message states the limit.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ArgsKwargs, PydanticCustomError

from ..errors import HexiSeqError, SpecError

# ---------------------------------------------------------------------------------------- limits
# Sanity limits on sizes. Generous against any real system, small enough that a slip (a byte count
# typed as GB/s, an extra zero) is caught before it allocates memory or overflows int64 arithmetic.
MAX_DEVICES = 4096  # per cluster; the planner and cost model hold N x N link matrices
MAX_SEQ_LEN = 1 << 27  # 128M tokens; S^2 x heads must stay far inside int64 in the cost model
MAX_GLOBAL_BATCH = 1 << 16
MAX_BLOCK_SIZE = 1 << 20
MAX_BANDWIDTH_GBPS = 1e4  # 10 TB/s per direction: more than any link built (NVLink 5: 900 GB/s)
MAX_LATENCY_US = 1e6  # one second per message
MAX_TFLOPS = 1e5
MAX_MEMORY_GIB = 1e5
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_WIDTH = 1 << 20  # hidden size, MLP width, head dimension
MAX_VOCAB = 1 << 24

STRICT = ConfigDict(extra="forbid", str_strict=True, revalidate_instances="never")
"""Config of every schema class: unknown keys are refused (by `KnownKeys`, with a suggestion)."""

StrictStr = pydantic.StrictStr
StrictBool = pydantic.StrictBool


def _fmt(v: Any) -> str:
    """A value as the user wrote it (YAML/JSON spelling for booleans and null)."""
    if v is True or v is False:
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return _num(v) if math.isfinite(v) else str(v)
    if isinstance(v, int):
        return _num(v)
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(x: float) -> str:
    """1e4 -> '10,000', 134217728 -> '134,217,728', 0.5 -> '0.5', 1e30 -> '1e+30'."""
    if float(x).is_integer() and 1e4 <= abs(x) < 1e16:
        return f"{int(x):,}"
    return f"{x:g}"


_ARTICLE = {
    "int": "an integer",
    "float": "a number",
    "list": "a list",
    "dict": "a mapping",
    "tuple": "a list",
    "NoneType": "null",
}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return "a string: write the number without quotes" if _looks_numeric(v) else "a string"
    if isinstance(v, float):
        return "a fraction" if math.isfinite(v) and v != int(v) else "a float: write it without the '.0'"
    return _ARTICLE.get(type(v).__name__, f"a {type(v).__name__}")


def _looks_numeric(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _fail(reason: str) -> PydanticCustomError:
    return PydanticCustomError("hexiseq", "{reason}", {"reason": reason})


def _range_text(integer: bool, gt: float | None, ge: float | None, le: float | None, unit: str) -> str:
    """'a positive integer', 'a number > 0 and <= 10,000 GB/s', ..."""
    kind = "integer" if integer else "number"
    u = f" {unit}" if unit else ""
    if le is None:
        if gt == 0 or (integer and ge == 1):
            return f"a positive {kind}{' of ' + unit if unit else ''}"
        if ge == 0:
            return f"a non-negative {kind}{' of ' + unit if unit else ''}"
    low = f"> {_num(gt)}" if gt is not None else f">= {_num(ge)}" if ge is not None else ""
    if integer and ge is not None and le is not None:
        return f"an integer from {_num(ge)} to {_num(le)}{u}"
    high = f"<= {_num(le)}" if le is not None else ""
    return f"a {kind} " + " and ".join(x for x in (low, high) if x) + u


def number(
    description: str,
    *,
    integer: bool = False,
    unit: str = "",
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    limit_why: str = "",
    **extra: Any,
) -> Any:
    """An int (`integer`) or float field type: description, unit and range declared once.

    Accepts Python and numpy numbers; refuses booleans, strings, NaN/inf and (for integers) floats.
    `limit_why` says why the upper bound is there (it ends the message of a value above it).
    `extra` goes into the JSON Schema (e.g. `profile=True`: a profile may override the field).
    """
    wanted = _range_text(integer, gt, ge, le, unit)

    def check(v: Any) -> Any:
        ok = isinstance(v, numbers.Integral) if integer else isinstance(v, numbers.Real)
        if isinstance(v, bool) or not ok:
            raise _fail(f"must be {wanted}, got {_fmt(v)} ({_kind(v)})")
        v = int(v) if integer else float(v)
        if not integer and not math.isfinite(v):
            raise _fail(f"must be {wanted}, got {_fmt(v)}")
        if (gt is not None and not v > gt) or (ge is not None and not v >= ge):
            raise _fail(f"must be {wanted}, got {_fmt(v)}")
        if le is not None and v > le:
            why = f" ({limit_why})" if limit_why else ""
            raise _fail(f"must be at most {_num(le)}{' ' + unit if unit else ''}, got {_fmt(v)}{why}")
        return v

    schema: dict[str, Any] = {
        k: x for k, x in (("exclusiveMinimum", gt), ("minimum", ge), ("maximum", le)) if x is not None
    }
    if unit:
        schema["unit"] = unit
    schema.update(extra)
    text = description + (f" [{unit}]" if unit else "")
    return Annotated[
        int if integer else float, BeforeValidator(check), Field(description=text, json_schema_extra=schema)
    ]


def count(description: str, *, ge: int = 1, le: int | None = None, unit: str = "", limit_why: str = "") -> Any:
    """An integer field (a count, a size, an index)."""
    return number(description, integer=True, ge=ge, le=le, unit=unit, limit_why=limit_why)


def one_of(values: Iterable[str], description: str) -> Any:
    """A string field that must be one of `values` (with a suggestion for a near miss)."""
    allowed = tuple(values)

    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in allowed:
            hint = did_you_mean(v, allowed) if isinstance(v, str) else ""
            raise _fail(f"must be one of {', '.join(repr(a) for a in allowed)}, got {_fmt(v)}{hint}")
        return v

    return Annotated[
        str, BeforeValidator(check), Field(description=description, json_schema_extra={"enum": list(allowed)})
    ]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a near miss among `known`, else ''."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def field_names(cls: type) -> list[str]:
    """The declared fields of a pydantic dataclass or model, in order."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    return [info.alias or name for name, info in cls.model_fields.items()]


class KnownKeys:
    """Mixin of every schema class: an unknown key is refused by name, with a suggestion, before
    anything else is checked (so a typo `nic_gbsp` is not reported as a missing `nic_gbps`)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, ArgsKwargs):
            keys: Iterable[Any] = (data.kwargs or {}).keys()
        elif isinstance(data, Mapping):
            keys = data.keys()
        else:
            return data
        known = field_names(cls)
        for key in keys:
            if key not in known:
                raise PydanticCustomError(
                    "unknown_key",
                    "{reason}",
                    {"reason": f"has unknown key {key!r}{did_you_mean(key, known)}; known keys: {', '.join(known)}"},
                )
        return data


# ---------------------------------------------------------------------------------------- errors

_PLAIN = {
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "dict_type": "must be a mapping (key: value)",
    "model_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
    "dataclass_type": "must be a mapping (key: value)",
    "dataclass_exact_type": "must be a mapping (key: value)",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
}


def _path(loc: Iterable[Any], positional: list[str] | None = None) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            if i == 0 and positional:  # a positional constructor argument
                out += positional[part] if part < len(positional) else f"argument {part}"
            else:
                out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part.startswith("function-")):
            continue  # pydantic's internal step names (unions, validators)
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err: Mapping[str, Any]) -> str:
    kind, value = err["type"], err.get("input")
    if kind in ("hexiseq", "unknown_key"):
        return err["msg"]
    if kind in ("value_error", "assertion_error"):
        return str(err.get("ctx", {}).get("error", err["msg"]))
    if kind in ("missing", "missing_argument", "missing_keyword_only_argument", "missing_positional_only_argument"):
        return "is missing (required)"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "is not a known key"
    if kind == "literal_error":
        return f"must be {err['ctx']['expected']}, got {_fmt(value)}"
    if kind == "too_short":
        return f"must have at least {err['ctx']['min_length']} entr{'y' if err['ctx']['min_length'] == 1 else 'ies'}"
    if kind in _PLAIN:
        return f"{_PLAIN[kind]}, got {_fmt(value)} ({_kind(value)})"
    return f"{err['msg'][0].lower()}{err['msg'][1:]}, got {_fmt(value)}"


def problems(error: ValidationError, positional: list[str] | None = None, data: Any = None) -> list[str]:
    """One line per problem: 'nodes[1].count must be an integer from 1 to 4096, got true (a boolean)'.
    A missing top-level key of `data` names a present key it may be a typo of."""
    out = []
    for err in error.errors(include_url=False):
        path = _path(err["loc"], positional)
        msg = _message(err)
        if err["type"] in ("missing", "missing_argument") and isinstance(data, Mapping) and len(err["loc"]) == 1:
            close = difflib.get_close_matches(str(err["loc"][0]), [str(k) for k in data], n=1, cutoff=0.6)
            msg += f" (found {close[0]!r}: a typo?)" if close else ""
        if not path and msg.startswith("has "):
            msg = msg[4:]
        out.append(f"{path} {msg}" if path else msg)
    return out


def join_problems(where: str, lines: list[str], limit: int = 12) -> str:
    """'where: problem' for one problem; a short list for several."""
    if len(lines) == 1:
        return f"{where}: {lines[0]}"
    shown = [f"  - {x}" for x in lines[:limit]] + (
        [f"  - ... and {len(lines) - limit} more"] if len(lines) > limit else []
    )
    return f"{where}: {len(lines)} problems:\n" + "\n".join(shown)


def validate(
    adapter: pydantic.TypeAdapter, data: Any, where: str, error: type[HexiSeqError] = SpecError, context: Any = None
) -> Any:
    """`adapter.validate_python(data)`, any problem raised as one `error` naming `where`."""
    try:
        return adapter.validate_python(data, context=context)
    except ValidationError as e:
        raise error(join_problems(where, problems(e, data=data))) from None


T = TypeVar("T")


def spec_class(owner: Callable[[Any], str]) -> Callable[[type[T]], type[T]]:
    """Class decorator (put it above `@pydantic.dataclasses.dataclass`): the constructor raises
    SpecError('<owner>: ...') listing every problem. `owner(kwargs)` names the object."""

    def wrap(cls: type[T]) -> type[T]:
        init = cls.__init__
        positional = field_names(cls)

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError as e:
                named = dict(zip(positional, args)) | kwargs
                raise SpecError(join_problems(owner(named), problems(e, positional, named))) from None

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return wrap
