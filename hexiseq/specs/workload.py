"""What one training iteration processes and how: sequence length, batch, recompute policy,
parameter sharding, chunk alignment. Also the token-count parser of the CLI (`128K`, `1M`)."""

from dataclasses import replace
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from ..errors import SpecError
from .schema import MAX_BLOCK_SIZE, MAX_GLOBAL_BATCH, MAX_SEQ_LEN, STRICT, KnownKeys, count, one_of, spec_class


class RecomputePolicy(StrEnum):
    """Activation checkpointing policy. A `str` enum: each member equals (and hashes as) its
    string, so `policy == "full"` and `{"full": ...}[policy]` keep working."""

    NONE = "none"  # keep every activation
    SELECTIVE = "selective"  # recompute the linear parts of each layer in backward
    FULL = "full"  # keep each layer's input; recompute the whole layer, attention and its communication included
    AUTO = "auto"  # a planner request: the fastest of the three that fits (the cost model refuses it)

    @property
    def concrete(self) -> bool:
        """A policy the cost model and the runtime can run (not AUTO)."""
        return self is not RecomputePolicy.AUTO


# In order of increasing recompute time, decreasing memory.
RECOMPUTE_POLICIES = (RecomputePolicy.NONE, RecomputePolicy.SELECTIVE, RecomputePolicy.FULL)


def recompute_policy(value: str, allow_auto: bool = True, owner: str = "workload") -> RecomputePolicy:
    """The recompute policy named `value`: "none" | "selective" | "full" (| "auto" where `allow_auto`:
    the planner's search over the three); a SpecError naming `owner` for anything else (booleans included)."""
    allowed = RECOMPUTE_POLICIES + ((RecomputePolicy.AUTO,) if allow_auto else ())
    if isinstance(value, str) and value in allowed:
        return RecomputePolicy(value)
    raise SpecError(
        f"{owner}: activation_checkpointing (recompute policy) must be one of "
        f"{', '.join(repr(str(x)) for x in allowed)}; got {value!r}"
    )


def _workload_recompute(value: Any) -> RecomputePolicy:
    """The field's validator: the policy, with the error phrased as the other fields' errors."""
    try:
        return recompute_policy(value)
    except SpecError as e:
        reason = str(e).removeprefix("workload: activation_checkpointing ")  # the error names the field itself
        raise PydanticCustomError("hexiseq", "{reason}", {"reason": reason}) from None


SeqLen = count("tokens per sequence", le=MAX_SEQ_LEN, limit_why="128M tokens")
GlobalBatch = count("sequences per iteration (gradient accumulation)", le=MAX_GLOBAL_BATCH)
BlockSize = count("chunk alignment", unit="tokens", le=MAX_BLOCK_SIZE)


@spec_class(lambda kw: "workload")
@dataclass(frozen=True, config=STRICT)
class Workload(KnownKeys):
    """One training iteration: `global_batch` sequences of `seq_len` tokens, processed one after
    another by the whole cluster (gradient accumulation), then one optimizer step.

    `param_sharding`: "replicated" (every rank holds all states; gradients all-reduced) or
    "zero3" (FSDP: states sharded; weights all-gathered per layer, gradients reduce-scattered).

    `activation_checkpointing` (the key of scenario files; `recompute` reads it) is the recompute
    policy: "none" keeps every activation; "selective" recomputes only the linear parts of each layer
    in backward (the attention core's inputs/outputs are kept); "full" keeps only each layer's input
    and recomputes the whole layer, attention and its communication included; "auto" lets the planner
    pick the fastest of the three that fits (the cost model refuses it).
    """

    seq_len: SeqLen
    global_batch: GlobalBatch = 1
    activation_checkpointing: Annotated[
        RecomputePolicy,
        BeforeValidator(_workload_recompute),
        Field(description="recompute policy: none | selective | full | auto"),
    ] = RecomputePolicy.NONE
    param_sharding: one_of(("replicated", "zero3"), "parameter/optimizer state sharding") = "zero3"
    block_size: BlockSize = 128

    @property
    def recompute(self) -> RecomputePolicy:
        """The recompute policy: NONE, SELECTIVE, FULL or AUTO (equal to "none", "selective", ...)."""
        return self.activation_checkpointing

    def with_recompute(self, policy: RecomputePolicy | str) -> "Workload":
        """The same workload under another recompute policy."""
        return replace(self, activation_checkpointing=policy)

    @property
    def tokens(self) -> int:
        return self.seq_len * self.global_batch


_SUFFIX = {"K": 1024, "M": 1024 * 1024}


def parse_tokens(text: str | int) -> int:
    """'128K' -> 131072, '1M' -> 1048576, '4096' -> 4096, '1.5K' -> 1536; a whole, positive
    number of tokens up to MAX_SEQ_LEN, else a SpecError that says why."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = Fraction(text)
    else:
        s = str(text).strip().upper().replace("_", "")
        mult = _SUFFIX.get(s[-1:], 1)
        if s[-1:] in _SUFFIX:
            s = s[:-1]
        try:
            value = Fraction(s) * mult
        except (ValueError, ZeroDivisionError):  # "lots", "inf", "nan", "1/0"
            raise SpecError(f"not a token count: {text!r} (examples: 4096, 128K, 1M)") from None
    if value.denominator != 1:
        raise SpecError(f"token count {text!r} is not a whole number of tokens")
    if value <= 0:
        raise SpecError(f"token count must be positive, got {text!r}")
    if value > MAX_SEQ_LEN:
        shown = f"{int(value):,}" if value < 10**16 else f"{float(value):.3g}"
        raise SpecError(f"token count {text!r} ({shown} tokens) is above the limit of {MAX_SEQ_LEN:,} (128M) tokens")
    return int(value)
