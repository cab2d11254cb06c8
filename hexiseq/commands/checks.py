"""The numbers of `hexiseq run` / `verify` / `export`, declared once with their range and unit (the
field helpers of hexiseq.specs.schema), parsed by argparse with `number_arg`: a bad value is refused
before any work, with the rule and the limit in the message.

Upper limits are sanity bounds: far above any real run, far below what would overflow or allocate
absurd memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..errors import SpecError
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


Steps = count("optimizer steps of the run", le=10_000_000)
WarmupSteps = count("linear warmup steps", ge=0, le=10_000_000)
LearningRate = number(
    "peak AdamW learning rate", gt=0, le=1.0, limit_why="an update of more than 1 per weight is not training"
)
MinLrRatio = number("final learning rate of the cosine schedule, a fraction of --lr", ge=0, le=1.0)
WeightDecay = number("AdamW weight decay", ge=0, le=10.0)
GradClip = number("max global gradient norm (0: no clipping)", ge=0, le=1e6)
Seed = count("seed of weights and data order", ge=0, le=2**63 - 1)
Ranks = count("ranks to spawn", le=MAX_DEVICES)
LossChunk = count("tokens per chunk of the LM head and loss", unit="tokens", le=1 << 24)
CheckpointEvery = count("steps between checkpoints (0: at the end only)", ge=0, le=10_000_000)
KeepCheckpoints = count("newest checkpoints kept", le=10_000)
Timeout = number("seconds one collective may wait for a peer", unit="s", gt=0, le=7 * 86400.0, limit_why="a week")
TimeLimit = number("seconds the whole run may take", unit="s", gt=0, le=365 * 86400.0, limit_why="a year")
Tolerance = number("largest accepted relative error", gt=0, le=1.0)
Node = count("this node's index among the plan's nodes", ge=0, le=MAX_DEVICES)

steps_arg, warmup_arg, lr_arg, min_lr_arg, wd_arg, clip_arg = map(
    number_arg, (Steps, WarmupSteps, LearningRate, MinLrRatio, WeightDecay, GradClip)
)
seed_arg, ranks_arg, loss_chunk_arg, every_arg, keep_arg = map(
    number_arg, (Seed, Ranks, LossChunk, CheckpointEvery, KeepCheckpoints)
)
timeout_arg, time_limit_arg, tolerance_arg, node_arg = map(number_arg, (Timeout, TimeLimit, Tolerance, Node))
