"""The Plan applied to a one-device model.

On rank r (see DESIGN.md, "The layout" and "The executor"):
- it embeds its own token shard (tokens at `layout.token_indices()`, possibly two zigzag ranges)
  and rotates q/k with those *global* positions;
- every layer's attention is `plan_attention` (ragged all-to-all inside the HP group + KV ring
  across groups), swapped into the model through `Llama.set_attention` — the model has no
  parallel logic of its own;
- the loss is computed on its own tokens with labels that follow global positions (label at t is
  token t+1 wherever it lives; the last position has none), divided by the number of labelled
  tokens of the *whole* sequence, so the sum over ranks is the global mean;
- parameter gradients are summed over all ranks (each rank saw different tokens). Replicated
  parameters by default (one all-reduce per bucket of gradients); FSDP2 `fully_shard` as an option
  (its reduce-scatter averages, so the backward loss is scaled by the world size to make it a sum).

`SingleDevice` is the same interface without a plan: the numeric reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from ..specs import recompute_policy
from .model import IGNORE_INDEX, Llama, shift_labels

if TYPE_CHECKING:  # pragma: no cover
    from ..plan import RankLayout
    from .groups import RankContext

_BUCKET_ELEMS = 32 * 2**20  # gradients all-reduced in buckets of this many elements (bounded extra memory)


@dataclass(frozen=True)
class ParallelOptions:
    """How the plan is applied. `broadcast_from`: rank whose initial weights every rank takes (None: trust the caller).
    `activation_checkpointing`: the recompute policy, "none" | "selective" | "full" (False / True =
    selective also accepted; stored normalized), see `Block.forward`."""

    fsdp: bool = False
    activation_checkpointing: bool | str = "none"
    loss_chunk: int = 4096
    broadcast_from: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation_checkpointing",
                           recompute_policy(self.activation_checkpointing, allow_auto=False, owner="parallel options"))


@dataclass(frozen=True)
class Shard:
    """One rank's inputs: its tokens, their global positions and next-token labels."""

    tokens: Tensor
    positions: Tensor
    labels: Tensor


def shard_sequence(tokens: Tensor, layout: "RankLayout") -> Shard:
    """The rank's rows of a whole sequence; labels come from global positions (not the shard's order)."""
    idx = torch.tensor(layout.token_indices(), dtype=torch.long, device=tokens.device)
    return Shard(tokens[idx], idx, shift_labels(tokens)[idx])


class Runner(Protocol):
    """What the training step needs: a loss to backpropagate, then gradients made global."""

    model: torch.nn.Module

    def loss(self, tokens: Tensor) -> tuple[Tensor, float]: ...
    def sync_gradients(self) -> None: ...
    def output(self, tokens: Tensor) -> tuple[Tensor, Tensor]: ...


class SingleDevice:
    """The whole sequence on one device with dense causal attention (the reference)."""

    def __init__(self, model: Llama, loss_chunk: int = 4096, activation_checkpointing: bool | str = "none") -> None:
        self.model, self.loss_chunk = model, loss_chunk
        model.activation_checkpointing = activation_checkpointing

    def loss(self, tokens: Tensor) -> tuple[Tensor, float]:
        labels = shift_labels(tokens)
        count = int((labels != IGNORE_INDEX).sum().clamp(min=1))
        loss = self.model(tokens, labels=labels, loss_chunk=self.loss_chunk) / count
        return loss, float(loss.detach())

    def sync_gradients(self) -> None:
        pass

    @torch.no_grad()
    def output(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(global positions, final hidden states) of every token."""
        return torch.arange(tokens.shape[0], device=tokens.device), self.model(tokens)


class PlanParallel:
    """The model run under a Plan on this rank (the default process group spans the plan's ranks).

    With `fsdp`, build the optimizer on `self.model` right after this constructor, before any
    forward: FSDP2 swaps sharded and unsharded parameters during a forward.
    """

    def __init__(self, model: Llama, ctx: "RankContext", options: ParallelOptions = ParallelOptions()) -> None:
        from .attention import plan_attention  # the distributed attention (executor part 1)

        self.model, self.ctx, self.options = model, ctx, options
        self.layout = ctx.layout

        def attn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return plan_attention(q, k, v, ctx)

        model.set_attention(attn)
        model.activation_checkpointing = options.activation_checkpointing
        if options.broadcast_from is not None:
            with torch.no_grad():  # same starting weights everywhere, whatever each rank initialized
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=options.broadcast_from)
        if options.fsdp:
            self._shard_parameters()

    def _shard_parameters(self) -> None:
        """FSDP2: each block, then the root (embeddings, final norm, head)."""
        from torch.distributed.fsdp import fully_shard

        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)

    def loss(self, tokens: Tensor) -> tuple[Tensor, float]:
        """(this rank's share of the global mean loss, for backward; the global mean loss, for logging)."""
        shard = shard_sequence(tokens, self.layout)
        count = torch.tensor([(shard.labels != IGNORE_INDEX).sum().item()], dtype=torch.float64, device=tokens.device)
        dist.all_reduce(count)  # labelled tokens of the whole sequence
        local = self.model(shard.tokens, shard.positions, shard.labels, self.options.loss_chunk) / count.clamp(min=1).item()
        total = local.detach().clone().double().reshape(1)
        dist.all_reduce(total)
        if self.options.fsdp:
            # FSDP's reduce-scatter averages over the ranks; we need the sum. Scaling the loss keeps to
            # plain SUM collectives (its divide-factor path uses PREMUL_SUM, which gloo lacks).
            local = local * dist.get_world_size()
        return local, float(total.item())

    def sync_gradients(self) -> None:
        """Sum every parameter's gradient over the ranks (FSDP already did, in its reduce-scatter)."""
        if self.options.fsdp:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # e.g. a rank whose shard is empty: it still contributes zeros
                p.grad = torch.zeros_like(p)
        buckets: list[list[Tensor]] = []
        current: list[Tensor] = []
        size = 0
        for p in params:
            if current and (p.grad.dtype != current[0].dtype or size + p.numel() > _BUCKET_ELEMS):
                buckets.append(current)
                current, size = [], 0
            current.append(p.grad)
            size += p.numel()
        if current:
            buckets.append(current)
        for bucket in buckets:  # one flat all-reduce per bucket instead of one per tensor
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    @torch.no_grad()
    def output(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(global positions, final hidden states) of this rank's tokens."""
        shard = shard_sequence(tokens, self.layout)
        return shard.positions, self.model(shard.tokens, shard.positions)
