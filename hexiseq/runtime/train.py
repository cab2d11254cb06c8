"""The training step and a short training loop, on one device or under a Plan.

- AdamW (decoupled weight decay on matrices only), linear warmup then cosine decay (`lr_at`),
  gradient accumulation over the global batch (a step is a list of sequences), global-norm clipping;
- bf16 autocast on CUDA (fp32 master weights), plain fp32 on CPU;
- a start-up check that the running world matches the Plan (size; on CUDA the GPU model of each
  rank against the Plan's cluster device) and process-group timeouts, so a mismatch fails loudly
  instead of hanging in a collective;
- `step_worker`: the module-level function that spawned ranks run (`hexiseq run`, `hexiseq verify`,
  the tests) — build the model, apply the plan, train a few steps, report.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import PlanError, SpecError
from ..plan import Plan
from ..specs import load_cluster
from .llama import Llama, LlamaConfig
from .parallel import ParallelOptions, PlanParallel, Runner, Shard, SingleDevice


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0  # max global gradient norm; None: no clipping
    timeout_s: float = 300.0  # every collective of the step
    warmup_steps: int = 0  # linear warmup from lr/warmup to lr
    schedule: str = "constant"  # "constant" | "cosine" (decay to min_lr_ratio * lr at the last step)
    min_lr_ratio: float = 0.1


def lr_at(cfg: TrainConfig, step: int, total_steps: int) -> float:
    """Learning rate of step `step` (0-based) of `total_steps`: linear warmup over the first
    `warmup_steps` steps, then constant or a cosine decay from lr to min_lr_ratio * lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule != "cosine":
        raise ValueError(f"unknown schedule {cfg.schedule!r} (constant, cosine)")
    span = max(1, total_steps - 1 - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def compute_device(rank: int) -> torch.device:
    """cuda:<local rank> when CUDA is there (torchrun sets LOCAL_RANK), else the CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on GPU; a disabled context on CPU, where the step runs in fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _gpu_matches(catalog_name: str, device_name: str) -> bool:
    """'A100-80GB' matches 'NVIDIA A100-SXM4-80GB': every token with a digit must appear in the device name."""
    have = device_name.upper().replace("-", " ").split()
    return all(tok in have for tok in catalog_name.upper().split("-") if any(c.isdigit() for c in tok))


def check_world(plan: Plan, strict: bool = False) -> list[str]:
    """Refuse a world that is not the Plan's; on CUDA compare each rank's GPU with the Plan's device.

    GPU mismatches raise PlanError with `strict`, else warn (a plan made for an H100 still runs on
    an A100, only not at the planned speed). Returns the mismatch messages.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world != plan.world_size:
        raise PlanError(f"plan {plan.name!r} has {plan.world_size} ranks but the running world has {world} processes")
    if not (torch.cuda.is_available() and dist.is_initialized() and plan.cluster):
        return []
    try:
        cluster = load_cluster(plan.cluster)
    except SpecError as e:
        warnings.warn(f"cannot check GPU models against the plan: {e}", stacklevel=2)
        return []
    names: list[Any] = [None] * world
    dist.all_gather_object(names, torch.cuda.get_device_name())
    problems = []
    for r, dev in enumerate(plan.rank_devices):
        want = cluster.devices[dev].gpu.name
        if not _gpu_matches(want, names[r]):
            problems.append(f"rank {r} runs on {names[r]!r} but the plan placed it on device {dev} ({want})")
    if problems and strict:
        raise PlanError(f"the GPUs do not match plan {plan.name!r}:", problems)
    for p in problems:
        warnings.warn(f"plan {plan.name!r}: {p}; the run is correct but its speed is not the planned one", stacklevel=2)
    return problems


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on norm gains (1-D), as in Llama training."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


@dataclass
class StepStats:
    step: int
    loss: float
    grad_norm: float
    tokens: int  # tokens the whole world processed
    seconds: float  # the whole step
    compute_s: float = 0.0  # up to the end of the last micro-step (the rest: waiting, the reduction, AdamW)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def train_step(
    runner: Runner,
    optimizer: torch.optim.Optimizer,
    batch: Tensor | Sequence[Shard],
    cfg: TrainConfig,
    step: int = 0,
    grads_hook: Callable[[torch.nn.Module], None] | None = None,
    lr: float | None = None,
    tokens: int | None = None,
) -> StepStats:
    """One optimizer step over a batch, the one step function of every runner and strategy: forward +
    backward of each micro-step the runner yields (`runner.micro_steps`: this rank's shards, one per
    sequence; a whole-sequence tensor is one sequence; under a joint plan's FSDP also the empty
    micro-steps of a smaller share), gradients summed over ranks (`runner.sync_gradients`), global-norm
    clipping, AdamW at `lr` (default: the optimizer's). The loss is the mean over the labelled positions
    of the whole global batch. `tokens`: tokens the whole world processed (for tokens/s; default the
    whole-sequence length)."""
    model = runner.model
    if isinstance(batch, Tensor):
        tokens = int(batch.numel()) if tokens is None else tokens
        batch = [runner.shard(batch)]
    device = batch[0].tokens.device if batch else torch.device("cpu")
    t0 = time.perf_counter()
    if lr is not None:
        for g in optimizer.param_groups:
            g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    count = runner.label_count(list(batch))
    total = torch.zeros((), dtype=torch.float64, device=device)
    for shard in runner.micro_steps(list(batch)):
        with autocast(device):
            loss = runner.shard_loss(shard, count)
        loss.backward()
        total += loss.detach().double()
    compute_s = time.perf_counter() - t0
    runner.sync_gradients()
    value = float(runner.global_sum(total))
    if grads_hook is not None:
        grads_hook(model)
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # same global grads on every rank -> same norm
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    return StepStats(step, value, norm, int(tokens or 0), time.perf_counter() - t0, compute_s)


def train(
    runner: Runner, optimizer: torch.optim.Optimizer, tokens: Tensor, steps: int, cfg: TrainConfig, show: bool = True
) -> list[StepStats]:
    """A short loop on one sequence (`hexiseq run`): a tqdm bar and one line per step on rank 0."""
    from tqdm import tqdm

    lead = not dist.is_initialized() or dist.get_rank() == 0
    out = []
    # The bar only on a terminal: in logs (CI, `make demo | tee`) its redraws would garble the per-step lines.
    bar = tqdm(range(steps), desc="train", unit="step", disable=not (show and lead and sys.stderr.isatty()))
    for i in bar:
        s = train_step(runner, optimizer, tokens, cfg, step=i)
        out.append(s)
        bar.set_postfix(loss=f"{s.loss:.4f}", tok_s=f"{s.tokens_per_s:,.0f}")
        if show and lead:
            bar.write(
                f"step {i + 1}/{steps}  loss {s.loss:.5f}  grad_norm {s.grad_norm:.3f}  "
                f"{s.tokens_per_s:,.0f} tokens/s  ({s.seconds:.3f} s)"
            )
    return out


# ------------------------------------------------------------------------- spawned ranks


@dataclass(frozen=True)
class StepJob:
    """Everything a rank needs to build the same model and data and train (picklable)."""

    plan: dict[str, Any] | None  # Plan.to_dict(); None: the single-device reference
    model: LlamaConfig
    steps: int = 1
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    options: ParallelOptions = field(default_factory=ParallelOptions)
    init_from: str | None = None  # a Hugging Face checkpoint directory
    save_to: str | None = None
    collect: bool = False  # return outputs, first-step gradients and final weights (verify, tests)
    show: bool = False  # progress bar and per-step lines (hexiseq run)
    warmup_steps: int = 0  # untimed steps first (benchmarks)
    strict_gpus: bool = False  # on CUDA: refuse, rather than warn, when a GPU model differs from the plan
    dtype: str = "float32"  # parameters and activations on CPU; "float64" for exact equivalence checks


def make_tokens(cfg: LlamaConfig, seq_len: int, seed: int) -> Tensor:
    """The synthetic training sequence: seeded random token ids, the same on every rank."""
    return torch.randint(0, cfg.vocab, (seq_len,), generator=torch.Generator().manual_seed(seed + 1))


def build_model(job: StepJob, device: torch.device) -> Llama:
    if job.init_from:
        from .hf_checkpoint import load_hf_checkpoint

        return load_hf_checkpoint(job.init_from, device=device, dtype=getattr(torch, job.dtype))
    return Llama(job.model).init_weights(job.seed).to(device, getattr(torch, job.dtype))


def run_job(
    job: StepJob, seq_len: int, runner_factory: Callable[[Llama], Runner], device: torch.device
) -> dict[str, Any]:
    """Build, train `job.steps` steps, and report (losses, timings; with `collect` the tensors)."""
    model = build_model(job, device)
    runner = runner_factory(model)
    tokens = make_tokens(model.cfg, seq_len, job.seed).to(device)
    # The optimizer first: after a forward FSDP may leave the root's parameters unsharded, and an
    # optimizer built then would hold those instead of the sharded ones that receive the gradients.
    opt = make_optimizer(runner.model, job.train)
    result: dict[str, Any] = {}
    if job.collect:
        pos, hidden = runner.output(tokens)
        result["positions"], result["output"] = pos.cpu(), _full(hidden)
    for i in range(job.warmup_steps):
        train_step(runner, opt, tokens, job.train, step=-1 - i)
    grads: dict[str, Tensor] = {}

    def keep(m: torch.nn.Module) -> None:
        if not grads:
            grads.update({n: _full(p.grad) for n, p in m.named_parameters()})

    hook = keep if job.collect else None
    stats = []
    if job.show:
        stats = train(runner, opt, tokens, job.steps, job.train)
    else:
        for i in range(job.steps):
            stats.append(train_step(runner, opt, tokens, job.train, step=i, grads_hook=hook))
    result["steps"] = [asdict(s) | {"tokens_per_s": s.tokens_per_s} for s in stats]
    if job.collect:
        result["grads"] = grads
        result["params"] = {n: _full(p.detach()) for n, p in runner.model.named_parameters()}
    if job.save_to:
        from .hf_checkpoint import save_hf_checkpoint

        # FSDP: every rank takes part in gathering the full weights; replicated: rank 0 has them all.
        sd = {n: _full(t) for n, t in runner.model.state_dict().items()} if job.options.fsdp else None
        if not dist.is_initialized() or dist.get_rank() == 0:
            save_hf_checkpoint(runner.model, job.save_to, state_dict=sd)  # type: ignore[arg-type]
    return result


def reference_job(job: StepJob, seq_len: int) -> dict[str, Any]:
    """The same job on one device, whole sequence, dense attention."""
    device = compute_device(0)
    return run_job(
        job, seq_len, lambda m: SingleDevice(m, job.options.loss_chunk, job.options.activation_checkpointing), device
    )


def step_worker(rank: int, world_size: int, job: StepJob) -> dict[str, Any]:
    """Body of one spawned rank (or of a torchrun process): the job under its Plan."""
    from .groups import build_context

    plan = Plan.from_dict(job.plan)  # type: ignore[arg-type]
    check_world(plan, strict=job.strict_gpus)
    ctx = build_context(plan, rank, timeout_s=job.train.timeout_s)
    device = compute_device(rank)
    result = run_job(job, plan.seq_len, lambda m: PlanParallel(m, ctx, job.options), device)
    result["rank"] = rank
    return portable(result)


def portable(obj: Any) -> Any:
    """Tensors as numpy arrays, recursively: results of spawned ranks travel back by value (a torch
    tensor would travel as a shared-memory handle that dies with the rank's process)."""
    if isinstance(obj, Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable(v) for v in obj)
    return obj


def unpack(obj: Any) -> Any:
    """Inverse of `portable`: numpy arrays back to tensors."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: unpack(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(unpack(v) for v in obj)
    return obj


def _full(t: Tensor) -> Tensor:
    """A CPU copy of a whole tensor, fp32 or fp64 (gathering an FSDP shard: a collective, every rank calls it)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().to("cpu", torch.float64 if t.dtype == torch.float64 else torch.float32).clone()


def step_worker_many(rank: int, world_size: int, jobs: list[StepJob]) -> list[dict[str, Any]]:
    """Several jobs one after another in one world (spawning a world costs seconds; tests share one)."""
    return [step_worker(rank, world_size, job) for job in jobs]
