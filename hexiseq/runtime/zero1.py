"""ZeRO-1: AdamW whose states are split over a set of ranks by whole parameters, checkpointable by DCP.

Every rank holds the full parameters and, after the step's reduction, the full summed gradients (as
under the replicated strategy). Each parameter is owned by one rank of the set (`assign_owners`:
largest first, to the least loaded rank, so the state bytes are balanced and the same on every
machine); `Zero1AdamW.step` runs torch's own AdamW on the owned parameters only — so only those get
states — then every owner broadcasts its updated parameters (one flat broadcast per owner) and all
ranks again hold the same weights.

Why not `torch.distributed.optim.ZeroRedundancyOptimizer`: its `state_dict` is a collective that
gathers every state onto one rank, which DCP cannot use (DCP asks every rank for its own part).
Here the optimizer is an `AdamW` (a subclass) whose param_groups list every parameter and whose
`state` holds the owned ones: `get_state_dict` names each owned state by its parameter's FQN, each
rank writes the states it owns (together the set writes every one), and a load asks each rank only
for the states it will own — under the same set, another world, or another strategy altogether
(replicated, ZeRO-2/3: the checkpoint holds whole tensors, DCP reshards them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import PlanError


def assign_owners(sizes: Sequence[int], ranks: int) -> list[int]:
    """The owner (0 .. ranks-1) of each parameter of `sizes` elements: largest first (ties: earlier
    first) to the least loaded owner (ties: the lowest), so that every rank's state bytes are close to
    1/ranks of the total. Pure and deterministic: every rank computes the same table."""
    if ranks < 1:
        raise ValueError(f"ZeRO-1 needs at least one rank, got {ranks}")
    load, owner = [0] * ranks, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-int(sizes[i]), i)):
        o = min(range(ranks), key=lambda r: (load[r], r))
        owner[i], load[o] = o, load[o] + int(sizes[i])
    return owner


class Zero1AdamW(torch.optim.AdamW):
    """AdamW with its states split over `group` (default: the world) by whole parameters (module doc).

    Bad input is refused before any step: a set with more ranks than parameters (a rank would own
    nothing and could not take part in DCP's state initialisation the same way as the others)."""

    def __init__(self, params: Iterable[Any], group: Any = None, **hyper: Any) -> None:
        super().__init__(params, **hyper)
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.index = self.ranks.index(dist.get_rank())
        params_ = [p for g in self.param_groups for p in g["params"]]
        if len(params_) < len(self.ranks):
            raise PlanError(
                f"ZeRO-1 over {len(self.ranks)} ranks needs at least as many parameter tensors; "
                f"the model has {len(params_)}: shard over fewer ranks (a smaller scope) or use zero2"
            )
        owners = assign_owners([p.numel() for p in params_], len(self.ranks))
        self.owned: list[list[Tensor]] = [[] for _ in self.ranks]  # parameters of each owner, in model order
        for p, o in zip(params_, owners):
            self.owned[o].append(p)
        self._mine = {id(p) for p in self.owned[self.index]}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """AdamW on this rank's parameters (the others' gradients hidden for the call, so torch's
        AdamW neither updates them nor creates their states), then each owner's updated parameters
        broadcast to the set."""
        hidden = []
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) not in self._mine and p.grad is not None:
                    hidden.append((p, p.grad))
                    p.grad = None
        try:
            loss = super().step(closure)
        finally:
            for p, grad in hidden:
                p.grad = grad
        for o, params in enumerate(self.owned):
            self._broadcast(params, self.ranks[o])
        return loss

    def _broadcast(self, params: list[Tensor], src: int) -> None:
        """The parameters of owner `src` (a global rank) sent to the set, one flat tensor per dtype."""
        by_dtype: dict[torch.dtype, list[Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for ps in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in ps])
            dist.broadcast(flat, src=src, group=self.group)
            offset = 0
            for p in ps:
                p.detach().copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
