"""Sharding strategies of data-parallel replicas, on torch's own parts (the step: `train.train_step`).

The update is the one of one process stepping over the whole global batch: every rank divides its
loss sum by the labelled positions of the whole global batch (all replicas, padding and ignored
labels excluded), so the gradients summed over all ranks are those of the global mean, however
unevenly the sequences and tokens are shared; clipping then uses the global norm.

Strategies (`ReplicaLayout.stage` over `ReplicaLayout.shard_sets()`):
- replicated: full parameters and AdamW everywhere; gradients summed by a flat all-reduce over
  the world (in buckets).
- zero1: the same gradients, the optimizer states sharded inside each shard set by whole parameters
  (`zero1.Zero1AdamW`: each rank steps the parameters it owns and broadcasts them; DCP checkpoints it).
- zero2 / zero3: FSDP2 `fully_shard` on each block and the root, `reshard_after_forward` False /
  True; zero2 also keeps the parameters gathered through the step's micro-steps
  (`set_reshard_after_backward(False)` until the last one), so it gathers once per step.
  One shard set: FSDP over the world. Equal sets: HSDP on a 2-D DeviceMesh (replicate x shard) —
  FSDP reduce-scatters inside a set and all-reduces across sets, shard position by shard position,
  layer by layer in the last micro-step's backward, as the step model charges it (costmodel/step.py).
  Except on gloo when the sets run different numbers of micro-steps: gloo's collectives block the
  host (NCCL's wait on a stream), so a set with fewer micro-steps would stop in its first backward at
  its first layer's all-reduce until the busiest set's last backward reaches that layer, then run
  each remaining layer at its own speed while the busiest set waits for it at the next all-reduce —
  a coupling a GPU run does not have (measured on the CPU emulation, 2026-12-07: cpu-4's 5:1 shares
  under ZeRO-2 inside each replica, 0.55 s a step of the busy ranks' waits after those all-reduces,
  7.3 s steps predicted 6.0 s). There FSDP runs on the shard dimension alone and each shard is
  all-reduced over the replicate dimension once, after the backward: not overlapped, which the model
  does not charge (one all-reduce of a shard of the model: 0.016 s of a 6 s step on cpu-4).
  Unequal sets: FSDP inside each set (a 1-D mesh from the set's group); shard positions do not
  line up across sets, so after the backward each pair of ranks in different sets swaps the rows
  their shards share, in one ragged all-to-all over the world, and each rank adds what it received
  to its shard: a rank moves its shard once per other set, about what the step model charges for
  the copies' all-reduce (a full-size world all-reduce of each shard at its offset moved the whole
  model: benchmarks/bench_unequal_sets.py, 3 + 2 ranks, 17M float32 parameters, the busy replica's
  time after its compute 0.44-0.47 s with it, 0.23-0.25 s with the swap, gloo, 2026-12-07).
  FSDP's collectives run on every micro-step over the set, so every rank of a set runs as many
  micro-steps as the set's busiest replica: a replica with fewer sequences runs empty ones (no
  tokens, no attention traffic, zero gradient) — the waiting of an uneven share under ZeRO-2/3.

On CPU/gloo (torch 2.13) every part used here works: `fully_shard` on 1-D and 2-D meshes,
`DeviceMesh.from_group`, `set_reshard_after_backward`. What gloo lacks is
PREMUL_SUM (FSDP's divide factors), so the backward loss is scaled by the mesh size instead (FSDP
averages, the update needs the sum) and the logged loss is the unscaled one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from . import emulation
from .comm import ragged_all_to_all
from .llama import IGNORE_INDEX, Llama, LlamaConfig, shift_labels
from .parallel import ParallelOptions, PlanParallel, Shard, SingleDevice
from .replicas import JointContext, ReplicaLayout, build_joint_context
from .train import TrainConfig, _full, compute_device, make_optimizer, portable, train_step
from .zero1 import Zero1AdamW

_BUCKET_ELEMS = 32 * 2**20  # flat reductions in buckets of this many elements (bounded extra memory)


def flat_all_reduce(tensors: Sequence[Tensor], group: Any = None) -> None:
    """Sum each tensor in place over `group` (default: the world), one flat all-reduce per bucket."""
    buckets: list[list[Tensor]] = []
    current: list[Tensor] = []
    size = 0
    for t in tensors:
        if current and (t.dtype != current[0].dtype or size + t.numel() > _BUCKET_ELEMS):
            buckets.append(current)
            current, size = [], 0
        current.append(t)
        size += t.numel()
    if current:
        buckets.append(current)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    for bucket in buckets:
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, group=group)
        emulation.after_all_reduce(ranks, flat.numel())  # off: nothing
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _shard_offset(rows: int, parts: int, index: int) -> int:
    """First dim-0 row of shard `index` of `rows` split `parts` ways as FSDP2 splits (torch.chunk)."""
    return min(index * math.ceil(rows / parts), rows) if rows else 0


class Strategy:
    """How the replicas' parameters, gradients and optimizer states are held and reduced (module doc)."""

    def __init__(self, joint: JointContext, timeout_s: float = 300.0) -> None:
        self.joint, self.layout = joint, joint.layout
        self.stage = self.layout.stage
        self.sets = self.layout.shard_sets()
        self.fsdp = self.stage in ("zero2", "zero3")
        self.mesh: Any = None
        self.set_group: Any = None  # the process group of this rank's shard set (None: the world)
        self.loss_scale = 1.0  # backward factor: FSDP averages over its mesh, the update needs the sum
        self.flat_after_fsdp = False
        timeout = timedelta(seconds=timeout_s)
        mine = next(s for s in self.sets if joint.rank in s)
        equal = len({len(s) for s in self.sets}) == 1
        self.copies_group: Any = None  # HSDP after the backward: the ranks holding this rank's shard position
        if self.fsdp:  # FSDP's meshes, on the backend's device
            from torch.distributed.device_mesh import DeviceMesh

            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        if self.fsdp and len(self.sets) > 1 and equal:
            hsdp = DeviceMesh(device, torch.tensor(self.sets), mesh_dim_names=("replicate", "shard"))
            if dist.get_backend() == "gloo" and len({self._set_micro_steps(s) for s in self.sets}) > 1:
                # FSDP on the shard dimension, the copies' all-reduce once after the backward (module doc)
                self.mesh, self.copies_group = hsdp["shard"], hsdp.get_group("replicate")
                self.loss_scale = float(len(mine))
            else:
                self.mesh, self.loss_scale = hsdp, float(self.layout.world_size)
        elif len(self.sets) > 1:  # every rank creates every set's group, in the same order
            for s in self.sets:
                pg = dist.new_group(list(s), timeout=timeout)
                if s is mine:
                    self.set_group = pg
        if self.fsdp and self.mesh is None:
            self.mesh = DeviceMesh.from_group(self.set_group or dist.group.WORLD, device)
            self.loss_scale = float(len(mine))
            self.flat_after_fsdp = len(self.sets) > 1
        self.set_index = mine.index(joint.rank)
        self.set_size = len(mine)

    @property
    def writes_checkpoint(self) -> bool:
        """Does this rank write its states into a checkpoint? Not in a later shard set where each set
        has its own 1-D mesh (unequal sets, or equal ones reduced after the backward): the first set
        holds the same values, and DCP refuses overlapping chunks from meshes it cannot relate."""
        return (not self.flat_after_fsdp and self.copies_group is None) or self.joint.rank in self.sets[0]

    # ------------------------------------------------------------------ set-up
    def wrap(self, model: torch.nn.Module) -> None:
        """FSDP2 on each block, then the root (zero2/zero3); nothing otherwise."""
        if not self.fsdp:
            return
        from torch.distributed.fsdp import fully_shard

        reshard = self.stage == "zero3"
        for layer in model.layers:
            fully_shard(layer, mesh=self.mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=reshard)

    def make_optimizer(self, model: torch.nn.Module, groups: list[dict[str, Any]], **hyper: Any) -> Any:
        """AdamW over `groups`; under zero1 its states sharded inside the shard set."""
        if self.stage != "zero1":
            return torch.optim.AdamW(groups, **hyper)
        return Zero1AdamW(groups, group=self.set_group, **hyper)

    def micro_steps(self) -> int:
        """Micro-steps this rank runs per step: its replica's sequences, or under FSDP the most of any
        replica sharing its shard set (the others run empty ones)."""
        if not self.fsdp:
            return self.joint.sequences
        return self._set_micro_steps(next(s for s in self.sets if self.joint.rank in s))

    def _set_micro_steps(self, ranks: Sequence[int]) -> int:
        """Under FSDP, the micro-steps of a shard set: the most sequences of a replica in it."""
        return max(self.layout.sequences[i] for i in {self.layout.replica_of(r) for r in ranks})

    # ------------------------------------------------------------------ per step
    def before_micro(self, model: torch.nn.Module, i: int, n: int) -> None:
        """FSDP: reduce gradients on the last micro-step only; zero2 keeps parameters gathered until then."""
        if self.fsdp:
            last = i == n - 1
            model.set_requires_gradient_sync(last)
            if self.stage == "zero2":
                model.set_reshard_after_backward(last)

    @torch.no_grad()
    def reduce(self, model: torch.nn.Module) -> None:
        """After the last micro-step: every gradient the sum over all ranks."""
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # e.g. a rank without tokens: it still contributes zeros
                p.grad = torch.zeros_like(p)
        if not self.fsdp:
            flat_all_reduce([p.grad for p in params])
        elif self.copies_group is not None:  # shard positions line up: each shard summed over its copies
            flat_all_reduce([p.grad.to_local() for p in params], group=self.copies_group)
        elif self.flat_after_fsdp:
            self._sum_shards_across_sets(params)

    def _sum_shards_across_sets(self, params: list[torch.nn.Parameter]) -> None:
        """Unequal shard sets: each rank's shard summed with the rows of it that every other set's
        ranks hold, which it receives from them in one ragged all-to-all over the world (per dtype):
        each pair of ranks in different sets swaps the rows their shards share, so a rank sends and
        receives its shard once per other set — the volume of the all-reduce of a shard across the
        copies that the step model charges, where a full-size world all-reduce moved the whole model."""
        me, world = self.joint.rank, dist.get_world_size()
        others = [(q, len(s), i) for s in self.sets if me not in s for i, q in enumerate(s)]
        by_dtype: dict[torch.dtype, list[int]] = {}
        locals_ = [p.grad.to_local() for p in params]
        for j, local in enumerate(locals_):
            by_dtype.setdefault(local.dtype, []).append(j)
        for indices in by_dtype.values():
            send: list[list[Tensor]] = [[] for _ in range(world)]
            segments: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]  # (param, first row, rows)
            for j in indices:
                rows, local = params[j].shape[0], locals_[j]
                a = _shard_offset(rows, self.set_size, self.set_index)
                b = a + local.shape[0]
                for q, size, index in others:
                    lo = max(a, _shard_offset(rows, size, index))
                    hi = min(b, _shard_offset(rows, size, index + 1))
                    if lo < hi:  # the rows both shards hold: same parameter order on every rank
                        send[q].append(local[lo - a : hi - a].reshape(-1))
                        segments[q].append((j, lo - a, hi - lo))
            splits = [sum(t.numel() for t in parts) for parts in send]  # each pair's overlap, both ways
            flat = [t for parts in send for t in parts]
            # every rank takes part, with nothing to swap too (an empty shard): the exchange spans the world
            out = torch.cat(flat) if flat else locals_[indices[0]].new_zeros(0)
            received = ragged_all_to_all(out, splits, splits)
            pos = 0
            for q in range(world):
                for j, first, n in segments[q]:
                    local = locals_[j]
                    width = local[0].numel()
                    local[first : first + n] += received[pos : pos + n * width].view(n, *local.shape[1:])
                    pos += n * width


class JointParallel(PlanParallel):
    """The model run as one replica of a joint plan on this rank (the world spans every replica).
    Attention runs inside the replica; the loss count, logged sums and gradients span the world."""

    def __init__(self, model: Llama, joint: JointContext, options: ParallelOptions, timeout_s: float = 300.0) -> None:
        # the plan's sharding replaces the one-replica `fsdp` option (the strategy wraps the model below)
        super().__init__(model, joint.ctx, replace(options, fsdp=False))
        self.joint = joint
        self.idle = False
        self.strategy = Strategy(joint, timeout_s)
        self._attend = self._plan_attention()
        model.set_attention(self._attention)
        self.strategy.wrap(model)

    def _plan_attention(self) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        from .attention import plan_attention

        ctx = self.ctx
        return lambda q, k, v: plan_attention(q, k, v, ctx)

    def _attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.idle:  # an empty micro-step: no tokens, no traffic
            return q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        return self._attend(q, k, v)

    def empty_shard(self, device: torch.device) -> Shard:
        """The input of an empty micro-step (FSDP's collectives still run)."""
        none = torch.zeros(0, dtype=torch.long, device=device)
        return Shard(none, none.clone(), none.clone())

    def micro_steps(self, batch: list[Shard]) -> Iterator[Shard]:
        """This replica's sequences, then under FSDP empty micro-steps up to the busiest replica of
        the shard set (FSDP's collectives run on every micro-step over the whole set)."""
        strategy = self.strategy
        n = strategy.micro_steps()
        device = batch[0].tokens.device if batch else torch.device("cpu")
        try:
            for i in range(n):
                strategy.before_micro(self.model, i, n)
                self.idle = i >= len(batch)
                yield batch[i] if i < len(batch) else self.empty_shard(device)
        finally:
            self.idle = False

    def shard_loss(self, shard: Shard, count: float) -> Tensor:
        """This rank's share of the global batch's mean loss, for backward: times the strategy's
        factor (FSDP averages over its mesh, the update needs the sum)."""
        loss = super().shard_loss(shard, count)
        return loss * self.strategy.loss_scale if self.strategy.loss_scale != 1.0 else loss

    def global_sum(self, value: Tensor) -> Tensor:
        """The logged loss: the per-rank sums over the world, each rank's factor undone before the sum
        (unequal shard sets scale by their own sizes)."""
        return super().global_sum(value / self.strategy.loss_scale)

    def sync_gradients(self) -> None:
        self.strategy.reduce(self.model)


# ------------------------------------------------------------------------- spawned ranks


@dataclass(frozen=True)
class JointJob:
    """Everything a rank needs to train the replicas on synthetic data (picklable)."""

    layout: dict[str, Any]  # ReplicaLayout.to_dict()
    model: LlamaConfig
    steps: int = 1
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    options: ParallelOptions = field(default_factory=ParallelOptions)
    collect: bool = False  # return first-step gradients and final weights (tests)
    dtype: str = "float32"


def synthetic_sequence(cfg: LlamaConfig, seq_len: int, index: int, seed: int) -> tuple[Tensor, Tensor]:
    """Sequence `index` of a synthetic run: seeded tokens, a padded tail (pad id 0, labels ignored) of a
    length that varies with the index, and a few ignored labels inside — uneven token counts."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    tokens = torch.randint(1, cfg.vocab, (seq_len,), generator=gen)
    pad = (index * 7) % max(1, seq_len // 3)
    if pad:
        tokens[seq_len - pad :] = 0
    labels = shift_labels(tokens)
    if pad:
        labels[seq_len - pad - 1 :] = IGNORE_INDEX
    labels[torch.randint(0, seq_len, (index % 3,), generator=gen)] = IGNORE_INDEX
    return tokens, labels


def joint_worker(rank: int, world_size: int, jobs: list[JointJob]) -> list[dict[str, Any]]:
    """Body of one spawned rank: each job's replicas trained `steps` steps (several jobs per world)."""
    return [_joint_job(rank, job) for job in jobs]


def _joint_job(rank: int, job: JointJob) -> dict[str, Any]:
    layout = ReplicaLayout.from_dict(job.layout)
    joint = build_joint_context(layout, rank, timeout_s=job.train.timeout_s)
    device = compute_device(rank)
    model = Llama(job.model).init_weights(job.seed).to(device, getattr(torch, job.dtype))
    runner = JointParallel(model, joint, job.options, job.train.timeout_s)
    opt = runner.strategy.make_optimizer(model, param_groups(model, job.train), **train_hyper(job.train))
    grads: dict[str, Tensor] = {}

    def keep(m: torch.nn.Module) -> None:
        if not grads:
            grads.update({n: _full(p.grad) for n, p in m.named_parameters()})

    first, seq_len = layout.first_sequence(joint.replica), layout.plans[0].seq_len
    steps = []
    for k in range(job.steps):
        data = [synthetic_sequence(job.model, seq_len, k * layout.global_batch + first + j, job.seed)
                for j in range(joint.sequences)]  # fmt: skip
        batch = [runner.shard(t.to(device), y.to(device)) for t, y in data]
        s = train_step(runner, opt, batch, job.train, step=k, grads_hook=keep if job.collect else None,
                       lr=job.train.lr, tokens=seq_len * layout.global_batch)  # fmt: skip
        steps.append(asdict(s))
    out: dict[str, Any] = {"rank": rank, "replica": joint.replica, "steps": steps}
    if job.collect:
        out["grads"] = grads
        out["params"] = {n: _full(p.detach()) for n, p in model.named_parameters()}
        out["states"] = len(opt.state)  # parameters whose AdamW states this rank holds (ZeRO-1: its own)
    return portable(out)


def joint_reference(job: JointJob) -> dict[str, Any]:
    """The same steps on one process: every sequence of the global batch, whole, dense attention."""
    layout = ReplicaLayout.from_dict(job.layout)
    model = Llama(job.model).init_weights(job.seed).to("cpu", getattr(torch, job.dtype))
    runner = SingleDevice(model, job.options.loss_chunk, job.options.activation_checkpointing)
    opt = make_optimizer(model, job.train)
    grads: dict[str, Tensor] = {}

    def keep(m: torch.nn.Module) -> None:
        if not grads:
            grads.update({n: _full(p.grad) for n, p in m.named_parameters()})

    steps, seq_len = [], layout.plans[0].seq_len
    for k in range(job.steps):
        data = [synthetic_sequence(job.model, seq_len, k * layout.global_batch + j, job.seed)
                for j in range(layout.global_batch)]  # fmt: skip
        batch = [runner.shard(t, y) for t, y in data]
        s = train_step(runner, opt, batch, job.train, step=k, grads_hook=keep, lr=job.train.lr)
        steps.append(asdict(s))
    return {"steps": steps, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """AdamW groups as `train.make_optimizer` builds them (no weight decay on 1-D gains)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train_hyper(cfg: TrainConfig) -> dict[str, Any]:
    """AdamW's hyper-parameters of a TrainConfig."""
    return {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps}
