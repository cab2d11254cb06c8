"""The protocol between the step replay and the planner's optimization model: the pass list of one
iteration and the items of a traced critical path, as typed records.

The replay (simulate.py) lists an iteration's passes (`Pass`, `Barrier`: `simulate.pass_schedule`)
and, with `trace=True`, each pass kind's critical path as a list of path items, each one duration
of durations.py. The planner's model (planner/forms.py) turns every item into a linear form of the
plan's quantities, `simulate.path_length` sums their values at a plan; both read the items by
their fields, so a new kind of item is one record here and one case in each of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .comm import ParamComm

# ------------------------------------------------------------------------------ the passes of an iteration


class IterationShape(Protocol):
    """What the pass list of an iteration depends on (a Durations, a Coefficients or a StepShape)."""

    @property
    def params(self) -> ParamComm: ...

    @property
    def layers(self) -> int: ...

    @property
    def batch(self) -> int: ...

    @property
    def comm(self) -> bool: ...


@dataclass(frozen=True)
class StepShape:
    """An IterationShape without durations (the bounds list the passes before any plan is built)."""

    params: ParamComm
    layers: int
    batch: int
    comm: bool


@dataclass(frozen=True)
class Pass:
    """`count` layer passes of one chain ("f" forward, "b" backward, "h" the LM head), each with a
    prefetched parameter collective of `collective_s` seconds issued at its start (0: none)."""

    name: str
    chain: str
    count: float
    collective_s: float


@dataclass(frozen=True)
class Barrier:
    """`count` exposed collectives of `seconds` each, with every rank waiting."""

    name: str
    count: float
    seconds: float


Step = Pass | Barrier


# ------------------------------------------------------------------------------ the items of a critical path


@dataclass(frozen=True, slots=True)
class OwnWork:
    """A rank's work proportional to its own tokens: `part` is "pre_f", "post_f", "pre_b", "post_b"
    (the linear parts: durations.py's lin_*) or "head"."""

    part: str
    rank: int


@dataclass(frozen=True, slots=True)
class AllToAllPiece:
    """One piece of a rank's ragged all-to-all ("in" before attention, "out" after): piece 0 is its
    send, piece 1 its receive (the duration is the larger: the path takes the one that sets it)."""

    direction: str
    rank: int
    piece: int


@dataclass(frozen=True, slots=True)
class AttentionRound:
    """A rank's attention of exchange round `round` (0: its own chunks), forward or backward."""

    rank: int
    round: int
    backward: bool


@dataclass(frozen=True, slots=True)
class OverlapSlowdown:
    """The slowdown of a rank's attention by the transfer of round `round` that overlaps it (charged to
    round `round` - 1's attention; twice in backward: K/V in and dK/dV back)."""

    rank: int
    round: int
    backward: bool


@dataclass(frozen=True, slots=True)
class ForwardTransfer:
    """One piece of a rank's forward K/V transfer of round `round`: 0 the receive, 1 the send."""

    rank: int
    round: int
    piece: int


@dataclass(frozen=True, slots=True)
class BackwardTransfer:
    """A rank's backward transfer of round `round` (K/V in and dK/dV back)."""

    rank: int
    round: int


@dataclass(frozen=True, slots=True)
class ExposedCollective:
    """The part of a prefetched collective of `collective_s` seconds that a rank's compute window of
    chain `chain` ("f", "b", "h") does not hide: collective_s - window."""

    chain: str
    rank: int
    collective_s: float


@dataclass(frozen=True, slots=True)
class Constant:
    """Seconds that depend on no quantity of the plan (a collective, the optimizer step)."""

    seconds: float


PathItem = (
    OwnWork
    | AllToAllPiece
    | AttentionRound
    | OverlapSlowdown
    | ForwardTransfer
    | BackwardTransfer
    | ExposedCollective
    | Constant
)
