"""Check a plan numerically: one training step under the plan (spawned ranks) against the same
step in one process on the whole sequence.

A production plan (say llama2-7b at 128K tokens on 8 GPUs) is too big to replay on a laptop,
so `prepare_check` keeps everything that makes the plan what it is — groups, ring order,
head ranges, token-shard proportions — and shrinks the rest: a *proxy* Llama with the plan's
head counts and small widths, and the plan scaled to a short sequence (`Plan.scaled`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import PlanError
from ..plan import Plan
from ..specs import ModelSpec
from ..specs.identity import model_named
from .capacity import check_local_world
from .llama import LlamaConfig
from .replicas import runs_as_replicas

# Largest relative error accepted, by compute dtype: fp32 reorders sums only (~1e-7 seen), bf16
# rounds every matmul input (~1e-2 typical between two bf16 runs).
# Relative error bars of a check: fp32 rounding of these comparisons is ~1e-6 (measured on 2-4 CPU ranks under
# 1 and 2 threads, .ci/numerics_audit.py), a layout bug shows at 1e-2 or more; bf16 rounds at ~8e-3.
TOLERANCE = {"fp32": 1e-4, "bf16": 1e-1}
# Plans longer than this are scaled down to DEFAULT_CHECK_TOKENS for a check on CPU.
MAX_CHECK_TOKENS = 8192
DEFAULT_CHECK_TOKENS = 2048


@dataclass(frozen=True)
class CheckSetup:
    plan: Plan  # the plan that will run (possibly scaled)
    model: LlamaConfig
    model_name: str
    notes: tuple[str, ...] = ()


def proxy_config(
    num_heads: int, num_kv_heads: int, head_dim: int = 8, layers: int = 2, vocab: int = 512
) -> LlamaConfig:
    """A tiny Llama with the given head structure (what the executor's layout depends on)."""
    hidden = num_heads * head_dim
    return LlamaConfig(
        vocab=vocab,
        hidden=hidden,
        layers=layers,
        heads=num_heads,
        kv_heads=num_kv_heads,
        ffn=2 * hidden,
        head_dim=head_dim,
    )


def prepare_check(plan: Plan, model: str | ModelSpec | None = None, seq_len: int | None = None) -> CheckSetup:
    """The plan and model to run. `model=None`: a proxy with the plan's heads. `seq_len`: scale the
    plan to that length (default: scale plans longer than MAX_CHECK_TOKENS to DEFAULT_CHECK_TOKENS)."""
    notes: list[str] = []
    if model is None:
        cfg, name = proxy_config(plan.num_heads, plan.num_kv_heads), f"proxy-{plan.num_heads}h{plan.num_kv_heads}kv"
        notes.append(
            f"model: a 2-layer proxy with the plan's {plan.num_heads} heads / {plan.num_kv_heads} KV heads "
            f"({plan.model or 'unnamed model'})"
        )
    else:
        spec = model if isinstance(model, ModelSpec) else model_named(model, plan.meta.get("model_spec"))
        plan.check(model=spec)
        cfg, name = LlamaConfig.from_spec(spec), spec.name
    plan, scale_notes = scale_for_check(plan, seq_len)
    return CheckSetup(plan, cfg, name, tuple(notes + scale_notes))


def scale_for_check(plan: Plan, seq_len: int | None = None) -> tuple[Plan, list[str]]:
    """The plan at `seq_len` tokens (default: plans longer than MAX_CHECK_TOKENS scaled to
    DEFAULT_CHECK_TOKENS, shorter ones kept), and a note when it was scaled."""
    plan.check()
    target = seq_len if seq_len is not None else (DEFAULT_CHECK_TOKENS if plan.seq_len > MAX_CHECK_TOKENS else None)
    if target is None or target == plan.seq_len:
        return plan, []
    note = f"sequence: scaled from {plan.seq_len:,} to {target:,} tokens, same groups, heads and shard proportions"
    return plan.scaled(target), [note]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|: a norm-wise relative error, robust to entries near zero."""
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def verify_plan(
    setup: CheckSetup,
    seed: int = 0,
    timeout_s: float = 300.0,
    tolerance: float | None = None,
    time_limit_s: float | None = None,
) -> dict[str, Any]:
    """One step under the plan (spawned world) and on one device; the errors between them.
    `timeout_s` bounds each collective, `time_limit_s` (None: none) the whole distributed step."""
    from .train import StepJob, TrainConfig, reference_job, step_worker, unpack
    from .world import local_backend, spawn_world

    plan = setup.plan
    backend = local_backend(plan.world_size)
    dtype = "bf16" if backend == "nccl" else "fp32"
    if runs_as_replicas(plan):  # a version-2 plan: its replicas under its own sharding
        return _verify_joint(setup, seed, timeout_s, tolerance, time_limit_s, backend, dtype)
    job = StepJob(
        plan=plan.to_dict(), model=setup.model, steps=1, seed=seed, collect=True, train=TrainConfig(timeout_s=timeout_s)
    )
    t0 = time.perf_counter()
    ranks = unpack(
        spawn_world(step_worker, plan.world_size, job, timeout_s=time_limit_s, pg_timeout_s=timeout_s, backend=backend)
    )
    seconds = time.perf_counter() - t0
    ref = reference_job(job, plan.seq_len)
    out = torch.empty_like(ref["output"])
    for r in ranks:  # every rank holds the rows of its own (possibly non-contiguous) shard
        out[r["positions"]] = r["output"]
    grad_errs = {n: max(rel_err(r["grads"][n], g) for r in ranks) for n, g in ref["grads"].items()}
    worst = max(grad_errs, key=grad_errs.__getitem__)
    loss_ref, loss_dist = ref["steps"][0]["loss"], ranks[0]["steps"][0]["loss"]
    errs = {
        "rel_err_loss": abs(loss_dist - loss_ref) / abs(loss_ref),
        "max_rel_err_out": rel_err(out, ref["output"]),
        "max_rel_err_grad": grad_errs[worst],
    }
    tol = tolerance if tolerance is not None else TOLERANCE[dtype]
    return {
        "plan": plan.name,
        "model": setup.model_name,
        "nproc": plan.world_size,
        "seq_len": plan.seq_len,
        "dtype": dtype,
        "backend": backend,
        "notes": list(setup.notes),
        "loss_ref": loss_ref,
        "loss_dist": loss_dist,
        **errs,
        "worst_grad": worst,
        "tolerance": tol,
        "passed": all(v <= tol for v in errs.values()),
        "seconds_dist": round(seconds, 3),
    }


def _verify_joint(
    setup: CheckSetup,
    seed: int,
    timeout_s: float,
    tolerance: float | None,
    time_limit_s: float | None,
    backend: str,
    dtype: str,
) -> dict[str, Any]:
    """A joint plan: one step of its replicas over their shares of a synthetic global batch (padded
    sequences, ignored labels) against one device over the whole batch: the loss and every gradient."""
    from .replicas import ReplicaLayout
    from .sharding import JointJob, joint_reference, joint_worker
    from .train import TrainConfig, unpack
    from .world import spawn_world

    plan = setup.plan
    layout = ReplicaLayout.from_plan(plan, sum(r.sequences for r in plan.replicas) or 1)
    job = JointJob(layout.to_dict(), setup.model, steps=1, seed=seed, collect=True,
                   train=TrainConfig(timeout_s=timeout_s))  # fmt: skip
    t0 = time.perf_counter()
    ranks = unpack(
        spawn_world(
            joint_worker, plan.world_size, [job], timeout_s=time_limit_s, pg_timeout_s=timeout_s, backend=backend
        )  # fmt: skip
    )
    seconds = time.perf_counter() - t0
    ranks = [r[0] for r in ranks]
    ref = joint_reference(job)
    grad_errs = {n: max(rel_err(r["grads"][n], g) for r in ranks) for n, g in ref["grads"].items()}
    worst = max(grad_errs, key=grad_errs.__getitem__)
    loss_ref, loss_dist = ref["steps"][0]["loss"], ranks[0]["steps"][0]["loss"]
    errs = {"rel_err_loss": abs(loss_dist - loss_ref) / abs(loss_ref), "max_rel_err_grad": grad_errs[worst]}
    tol = tolerance if tolerance is not None else TOLERANCE[dtype]
    shares = " + ".join(str(n) for n in layout.sequences)
    return {
        "plan": plan.name,
        "model": setup.model_name,
        "nproc": plan.world_size,
        "seq_len": plan.seq_len,
        "dtype": dtype,
        "backend": backend,
        "notes": [*setup.notes, f"replicas: {layout.num_replicas}, sequences per step {shares}, sharding "
                  f"{layout.stage} ({layout.scope}); compared with one device over all {layout.global_batch}"],
        "loss_ref": loss_ref,
        "loss_dist": loss_dist,
        **errs,
        "max_rel_err_out": None,
        "worst_grad": worst,
        "tolerance": tol,
        "passed": all(v <= tol for v in errs.values()),
        "seconds_dist": round(seconds, 3),
    }  # fmt: skip


def check_nproc(plan: Plan, nproc: int | None) -> None:
    if nproc is not None and nproc != plan.world_size:
        raise PlanError(f"plan {plan.name!r} has {plan.world_size} ranks but --nproc is {nproc}")
    check_local_world(plan.world_size, "--nproc" if nproc is not None else f"plan {plan.name!r} with")
