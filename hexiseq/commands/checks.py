"""The numbers of the commands, declared once with their range and unit (the field helpers of
hexiseq.specs.schema), parsed by argparse with `number_arg`: a bad value is refused before any work,
with the rule and the limit in the message. The numbers of a run's settings are declared with them,
in hexiseq.runs.settings; the ones here are the world's and the checks'.

Upper limits are sanity bounds: far above any real run, far below what would overflow or allocate
absurd memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..errors import SpecError
from ..runs.settings import Seed, Steps
from ..specs import MAX_DEVICES, parse_tokens
from ..specs.schema import count, number, problems


def number_arg(field_type: Any) -> Callable[[str], Any]:
    """An argparse `type=`: the text as a number, checked against a declared field type (its
    range and unit), so a bad value is refused with the rule before any work starts."""
    adapter = TypeAdapter(field_type)

    def parse(text: str) -> Any:
        value: Any = text
        for convert in (int, float):
            try:
                value = convert(text)
                break
            except ValueError:
                pass
        try:
            return adapter.validate_python(value)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(problems(e)[0]) from None

    return parse


def tokens_arg(text: str) -> int:
    """An argparse `type=` for token counts: 4096, 128K, 1M (parse_tokens, with its limit)."""
    try:
        return parse_tokens(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


Ranks = count("ranks to spawn", le=MAX_DEVICES)
Timeout = number("seconds one collective may wait for a peer", unit="s", gt=0, le=7 * 86400.0, limit_why="a week")
TimeLimit = number("seconds the whole run may take", unit="s", gt=0, le=365 * 86400.0, limit_why="a year")
Tolerance = number("largest accepted relative error", gt=0, le=1.0)
Node = count("this node's index among the plan's nodes", ge=0, le=MAX_DEVICES)

steps_arg, seed_arg, ranks_arg, node_arg = map(number_arg, (Steps, Seed, Ranks, Node))
timeout_arg, time_limit_arg, tolerance_arg = map(number_arg, (Timeout, TimeLimit, Tolerance))
