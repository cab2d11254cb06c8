"""The Plan applied to a one-device model.

On rank r (the layout: hexiseq/plan.py; the exchange: hexiseq/schedule.py):
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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from ..specs import RecomputePolicy, recompute_policy
from . import emulation
from .llama import IGNORE_INDEX, Llama, shift_labels

if TYPE_CHECKING:  # pragma: no cover
    from ..plan import RankLayout
    from .groups import RankContext

_BUCKET_ELEMS = 32 * 2**20  # gradients all-reduced in buckets of this many elements (bounded extra memory)


@dataclass(frozen=True)
class ParallelOptions:
    """How the plan is applied. `broadcast_from`: rank whose initial weights every rank takes (None: trust the caller).
    `activation_checkpointing`: the recompute policy, "none" | "selective" | "full" (stored as a
    RecomputePolicy), see `Block.forward`."""

    fsdp: bool = False
    activation_checkpointing: RecomputePolicy = RecomputePolicy.NONE
    loss_chunk: int = 4096
    broadcast_from: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "activation_checkpointing",
            recompute_policy(self.activation_checkpointing, allow_auto=False, owner="parallel options"),
        )


@dataclass(frozen=True)
class Shard:
    """One rank's inputs: its tokens, their global positions and next-token labels."""

    tokens: Tensor
    positions: Tensor
    labels: Tensor


def shard_sequence(tokens: Tensor, layout: RankLayout, labels: Tensor | None = None) -> Shard:
    """The rank's rows of a whole sequence; labels come from global positions (not the shard's order).
    `labels` [S]: the target of each position (default: the next token, none for the last)."""
    idx = torch.tensor(layout.token_indices(), dtype=torch.long, device=tokens.device)
    labels = shift_labels(tokens) if labels is None else labels
    return Shard(tokens[idx], idx, labels[idx])


class Runner(Protocol):
    """What the training step needs. A batch is a list of this rank's `Shard`s, one per sequence
    (gradient accumulation); `label_count` is the batch's labelled positions over all ranks, by which
    every shard's loss sum is divided, so that the summed gradients are those of the batch mean."""

    model: torch.nn.Module

    def positions(self, seq_len: int) -> list[int]: ...
    def shard(self, tokens: Tensor, labels: Tensor | None = None) -> Shard: ...
    def label_count(self, batch: list[Shard]) -> float: ...
    def shard_loss(self, shard: Shard, count: float) -> Tensor: ...
    def global_sum(self, value: Tensor) -> Tensor: ...
    def micro_steps(self, batch: list[Shard]) -> Iterator[Shard]: ...
    def sync_gradients(self) -> None: ...
    def output(self, tokens: Tensor) -> tuple[Tensor, Tensor]: ...


def _labelled(batch: list[Shard]) -> int:
    return sum(int((s.labels != IGNORE_INDEX).sum()) for s in batch)


class SingleDevice:
    """The whole sequence on one device with dense causal attention (the reference)."""

    def __init__(
        self, model: Llama, loss_chunk: int = 4096, recompute: RecomputePolicy | str = RecomputePolicy.NONE
    ) -> None:
        self.model, self.loss_chunk = model, loss_chunk
        model.recompute = recompute

    def positions(self, seq_len: int) -> list[int]:
        return list(range(seq_len))

    def shard(self, tokens: Tensor, labels: Tensor | None = None) -> Shard:
        labels = shift_labels(tokens) if labels is None else labels
        return Shard(tokens, torch.arange(tokens.shape[0], device=tokens.device), labels)

    def label_count(self, batch: list[Shard]) -> float:
        return float(max(1, _labelled(batch)))

    def shard_loss(self, shard: Shard, count: float) -> Tensor:
        return self.model(shard.tokens, labels=shard.labels, loss_chunk=self.loss_chunk) / count

    def global_sum(self, value: Tensor) -> Tensor:
        return value

    def micro_steps(self, batch: list[Shard]) -> Iterator[Shard]:
        """The step's micro-steps: one per sequence."""
        yield from batch

    def loss(self, tokens: Tensor) -> tuple[Tensor, float]:
        """(mean loss of one whole sequence, for backward; its value)."""
        shard = self.shard(tokens)
        loss = self.shard_loss(shard, self.label_count([shard]))
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

    def __init__(self, model: Llama, ctx: RankContext, options: ParallelOptions = ParallelOptions()) -> None:
        from .attention import plan_attention  # the distributed attention (executor part 1)

        self.model, self.ctx, self.options = model, ctx, options
        self.layout = ctx.layout

        def attn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return plan_attention(q, k, v, ctx)

        model.set_attention(attn)
        model.recompute = options.activation_checkpointing
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

    def positions(self, seq_len: int | None = None) -> list[int]:
        """Global positions of this rank's tokens (the rows it reads of each sequence)."""
        return self.layout.token_indices()

    def shard(self, tokens: Tensor, labels: Tensor | None = None) -> Shard:
        return shard_sequence(tokens, self.layout, labels)

    def label_count(self, batch: list[Shard]) -> float:
        """Labelled positions of the whole batch, all ranks (one all-reduce)."""
        device = batch[0].tokens.device if batch else torch.device("cpu")
        count = torch.tensor([float(_labelled(batch))], dtype=torch.float64, device=device)
        dist.all_reduce(count)
        return float(count.clamp(min=1).item())

    def shard_loss(self, shard: Shard, count: float) -> Tensor:
        """This rank's share of the batch mean loss (for backward)."""
        local = self.model(shard.tokens, shard.positions, shard.labels, self.options.loss_chunk) / count
        if self.options.fsdp:
            # FSDP's reduce-scatter averages over the ranks; we need the sum. Scaling the loss keeps to
            # plain SUM collectives (its divide-factor path uses PREMUL_SUM, which gloo lacks). Logged
            # values undo the factor (global_sum).
            local = local * dist.get_world_size()
        return local

    def global_sum(self, value: Tensor) -> Tensor:
        """Sum of a per-rank value over the ranks (the logged loss: each rank's shares, summed)."""
        total = value.detach().clone().double().reshape(1)
        dist.all_reduce(total)
        return total[0] / (dist.get_world_size() if self.options.fsdp else 1)

    def micro_steps(self, batch: list[Shard]) -> Iterator[Shard]:
        """One micro-step per sequence; under FSDP2 gradients reduce-scatter on the last one only."""
        for i, shard in enumerate(batch):
            if self.options.fsdp:
                self.model.set_requires_gradient_sync(i == len(batch) - 1)  # type: ignore[operator]
            yield shard

    def loss(self, tokens: Tensor) -> tuple[Tensor, float]:
        """(this rank's share of the global mean loss of one sequence, for backward; the global mean loss)."""
        shard = self.shard(tokens)
        local = self.shard_loss(shard, self.label_count([shard]))
        return local, float(self.global_sum(local))

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
            emulation.after_all_reduce(range(dist.get_world_size()), flat.numel())  # off: nothing
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    @torch.no_grad()
    def output(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(global positions, final hidden states) of this rank's tokens."""
        shard = shard_sequence(tokens, self.layout)
        return shard.positions, self.model(shard.tokens, shard.positions)
