"""Recompute policies: one home for what each policy repeats in backward and keeps in memory.

The runtime (runtime/llama.py) implements the same three policies; the time model, the memory
model and the planner's optimization model read this table.

    none       keeps every activation; nothing runs twice.
    selective  checkpoints each layer's two linear parts (norm + QKV, and O + MLP) and keeps the
               attention core's tensors: the linear parts' forward runs again inside their backward;
               no attention, all-to-all or KV exchange is repeated.
    full       keeps only each layer's input: the whole layer forward — linear parts, both ragged
               all-to-alls and the attention with its KV exchange — runs again before its backward.

"auto" is a request to the planner to choose one; a time or a memory needs a concrete policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..specs import RECOMPUTE_POLICIES, Workload


@dataclass(frozen=True)
class BackwardFactors:
    """What a recompute rule adds to a layer's backward pass, in multiples of forward work (each 0 or
    1): every time model (durations.py, bound.py, the planner's forms and bounds) reads these."""

    rerun_linear: float  # the linear parts' forward, again inside their backward (selective)
    replay_layer: float  # the whole layer forward, attention and collectives included, before the backward (full)

    @property
    def forward_linear(self) -> float:
        """The forward linear work a backward pass repeats, either way."""
        return self.rerun_linear + self.replay_layer

    def attention(self, attn_bwd_factor: float) -> float:
        """A backward pass's attention in multiples of the forward attention: the kernels' backward
        factor, plus the forward again under full recompute."""
        return attn_bwd_factor + self.replay_layer


@dataclass(frozen=True)
class RecomputeRule:
    """What a recompute policy costs and keeps."""

    name: str
    rerun_linear: bool  # the linear parts' forward runs again inside their backward (selective)
    replay_layer: bool  # the whole layer forward, with its collectives, runs again before its backward (full)
    # memory (memory.py): the activations each layer keeps for its backward
    keep: str  # "all" | "checkpoints" (inputs of the two linear parts + the attention core) | "inputs" (layer inputs)

    @property
    def extra_forward(self) -> bool:
        """Some forward work runs twice."""
        return self.rerun_linear or self.replay_layer

    def backward_factors(self) -> BackwardFactors:
        """What the rule adds to a backward pass's time (the one place the booleans become factors)."""
        return BackwardFactors(1.0 if self.rerun_linear else 0.0, 1.0 if self.replay_layer else 0.0)


RULES: dict[str, RecomputeRule] = {
    "none": RecomputeRule("none", rerun_linear=False, replay_layer=False, keep="all"),
    "selective": RecomputeRule("selective", rerun_linear=True, replay_layer=False, keep="checkpoints"),
    "full": RecomputeRule("full", rerun_linear=False, replay_layer=True, keep="inputs"),
}
assert tuple(RULES) == tuple(RECOMPUTE_POLICIES)


def rule_of(workload: Workload) -> RecomputeRule:
    """The workload's concrete recompute rule; "auto" is refused (only the planner chooses a policy)."""
    policy = getattr(workload.recompute, "value", workload.recompute)  # a plain string or a str-valued enum
    if policy == "auto":
        raise SpecError(
            'the cost model needs a concrete recompute policy ("none", "selective" or "full"), got "auto": '
            "only the planner chooses one (plan_cluster); pass the plan's policy (plan.meta['recompute'])"
        )
    return RULES[policy]
