"""The body of one rank of a run (spawned, or one torchrun process): build, resume, train, record.

Per step: this rank reads only its own rows of each sequence of the global batch, `train_step`
accumulates over them, then (outside the timed step) the ranks exchange their peak memory and
whether a stop was asked for (SIGTERM, or a file RUN_DIR/STOP), so that they stop together at a
step boundary. Rank 0 appends the step's record to metrics.jsonl (and TensorBoard), checkpoints are
written every `checkpoint_every` steps, at the end and when stopped, and rank 0 writes summary.json.
"""

from __future__ import annotations

import os
import resource
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import PlanError
from ..plan import Plan
from ..runtime import emulation
from ..runtime.groups import build_context
from ..runtime.hf_checkpoint import load_hf_checkpoint
from ..runtime.llama import Llama, shift_labels
from ..runtime.parallel import PlanParallel, Shard
from ..runtime.replicas import ReplicaLayout, build_joint_context, runs_as_replicas
from ..runtime.sharding import JointParallel, param_groups, train_hyper
from ..runtime.train import check_world, compute_device, lr_at, make_optimizer, make_tokens, train_step
from ..specs import load_cluster
from . import checkpoint as ckpt
from .config import WARMUP_EXCLUDED, RunConfig
from .data import PackedStream, Sampler, open_dataset
from .rundir import RunDir


@dataclass(frozen=True)
class RunJob:
    """What a rank is given (picklable): the run directory, its config, the checkpoint to resume
    from, the session number (0 for a fresh start, +1 per resume) and, under torchrun, where it runs."""

    run_dir: str
    config: RunConfig
    resume: str | None = None
    session: int = 0
    placement: dict[str, Any] | None = None  # runtime.placement.Placement fields (torchrun)
    console: bool = False  # rank 0 prints the progress itself (torchrun: there is no parent)


_STOP = {"asked": False}


def _ask_stop(signum: int, frame: Any) -> None:
    _STOP["asked"] = True


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank: CUDA's max allocated on GPU, the process's max resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class Synthetic:
    """No --data: one seeded random sequence, the same every step (the executor's smoke test)."""

    def __init__(self, cfg: Any, seq_len: int, seed: int) -> None:
        tokens = make_tokens(cfg, seq_len, seed)
        self.tokens, self.labels, self.samples = tokens.numpy(), shift_labels(tokens).numpy(), 1

    def read(self, index: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens[positions], self.labels[positions]


def _dataset(cfg: RunConfig, seq_len: int) -> tuple[Any, Sampler]:
    spec = cfg.data
    if spec.kind == "synthetic":
        data: Any = Synthetic(cfg.model, seq_len, cfg.seed)
        return data, Sampler(1, cfg.seed, shuffle=False)
    data = open_dataset(spec, seq_len)
    return data, Sampler(data.samples, cfg.seed, shuffle=isinstance(data, PackedStream))


class _TensorBoard:
    def __init__(self, path: Path, enabled: bool, first_step: int = 1) -> None:
        self.writer = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: TensorBoard drops the earlier sessions' events from this step on (a resume)
                self.writer = SummaryWriter(str(path), purge_step=first_step)
            except ImportError:  # the optional extra: pip install tensorboard
                self.writer = None

    def add(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"):
                self.writer.add_scalar(f"train/{key}", record[key], record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def run_worker(
    rank: int, world: int, job: RunJob, progress: Callable[[str, Any], None] | None = None
) -> dict[str, Any]:
    """Train the run of `job` on this rank; returns rank 0's records (other ranks: an empty list)."""
    cfg, run, lead = job.config, RunDir(job.run_dir), rank == 0
    say = progress if (lead and progress is not None) else (lambda kind, value: None)
    try:
        signal.signal(signal.SIGTERM, _ask_stop)  # a graceful stop at the next step boundary
    except ValueError:  # not the main thread: the STOP file still works
        pass
    plan = cfg.plan
    check_world(plan, strict=cfg.strict_gpus)
    train = cfg.train
    # a version-2 plan (replicas, or a sharding of its own) runs under its sharding; a version-1 plan
    # as one replica, replicated or (--fsdp) FSDP2 over the world
    joint = replica_layout(plan, cfg.global_batch) if runs_as_replicas(plan) else None
    if joint is not None:
        jctx = build_joint_context(joint, rank, timeout_s=train.timeout_s)
    else:
        ctx = build_context(plan, rank, timeout_s=train.timeout_s)
    if job.placement is not None and torch.cuda.is_available():
        torch.cuda.set_device(job.placement["cuda_index"])
        device = torch.device("cuda", job.placement["cuda_index"])
    else:
        device = compute_device(rank)
    if lead:
        run.set_status("building the model")
        say("phase", "building the model")
    dtype = getattr(torch, cfg.dtype)
    if cfg.init_from and job.resume is None:
        model = load_hf_checkpoint(cfg.init_from, device=device, dtype=dtype)
    else:
        model = Llama(cfg.model).init_weights(cfg.seed).to(device, dtype)
    if joint is not None:
        runner: Any = JointParallel(model, jctx, cfg.options, train.timeout_s)
        opt = runner.strategy.make_optimizer(model, param_groups(model, train), **train_hyper(train))
    else:
        runner = PlanParallel(model, ctx, cfg.options)
        opt = make_optimizer(runner.model, train)
    start = 0
    if job.resume is not None:
        if lead:
            run.set_status("loading the checkpoint", checkpoint=Path(job.resume).name)
            say("phase", f"loading checkpoint {Path(job.resume).name}")
        start = int(ckpt.load(Path(job.resume), runner.model, opt)["step"])
    data, sampler = _dataset(cfg, plan.seq_len)
    positions = np.asarray(runner.positions(), dtype=np.int64)
    pos_t = torch.from_numpy(positions).to(device)
    env: list[Any] = [None] * world
    dist.all_gather_object(
        env,
        {
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
    )
    tb = _TensorBoard(run.tensorboard, cfg.record.tensorboard, first_step=start + 1) if lead else None
    stop_file = run.path / "STOP"
    records: list[dict[str, Any]] = []
    stopped, step = False, start
    B, S = cfg.global_batch, plan.seq_len
    # the step's sequences are samples step*B .. step*B + B-1 whatever the plan; a replica reads its share
    first, share = (joint.first_sequence(jctx.replica), jctx.sequences) if joint is not None else (0, B)
    pacer = emulation.Pacer(cfg.emulation, rank) if cfg.emulation is not None else None
    after_warmup: emulation.PacerStats | None = None  # the pacing when the measured steps begin
    if lead:
        run.set_status("training", step=start, steps=cfg.steps)
        say("phase", "first step")
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        batch = []
        for m in range(first, first + share):
            tok, lab = data.read(sampler(step * B + m), positions)
            batch.append(Shard(torch.from_numpy(tok).to(device), pos_t, torch.from_numpy(lab).to(device)))
        data_s = time.perf_counter() - t0
        lr = lr_at(train, step, cfg.steps)
        with emulation.activate(None, rank, pacer):  # off without an emulation
            stats = train_step(runner, opt, batch, train, step, lr=lr, tokens=B * S)
        if pacer is not None and step - start == WARMUP_EXCLUDED - 1:
            after_warmup = replace(pacer.stats)
        # outside the timed step: peak memory of every rank, whether any was asked to stop, its timing
        mine = torch.tensor(
            [
                peak_memory_mb(device),
                float(_STOP["asked"] or (lead and stop_file.exists())),
                stats.seconds,
                stats.compute_s,
            ],
            dtype=torch.float64,
            device=device,
        )
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        stopped = any(float(t[1]) > 0 for t in every)
        record = {
            "step": step + 1,
            "loss": stats.loss,
            "lr": lr,
            "grad_norm": stats.grad_norm,
            "step_time_s": stats.seconds,
            "tokens_per_s": stats.tokens_per_s,
            "tokens": stats.tokens,
            "data_s": data_s,
            "peak_mem_mb": [round(float(t[0]), 1) for t in every],
            "session": job.session,
            "warmup": step - start < WARMUP_EXCLUDED,
            "time": time.time(),
        }
        if joint is not None:
            record["replicas"] = replica_records(joint, [(float(t[2]), float(t[3])) for t in every], S)
        done = step + 1
        save = done == cfg.steps or stopped or (cfg.record.checkpoint_every and done % cfg.record.checkpoint_every == 0)
        if save:
            if lead:
                run.set_status("checkpoint", step=done, steps=cfg.steps)
            t1 = time.perf_counter()
            trainer = {
                "samples": done * B,
                "session": job.session,  # data position: samples used, in the Sampler's order
                "schedule": {
                    **{k: getattr(train, k) for k in ("lr", "warmup_steps", "schedule", "min_lr_ratio")},
                    "total_steps": cfg.steps,
                    "next_lr": lr_at(train, done, cfg.steps),
                },
            }
            writes = joint is None or runner.strategy.writes_checkpoint
            ckpt.save(run.checkpoints, done, runner.model, opt, trainer, cfg.record.keep_checkpoints, writes)
            record["checkpoint_s"] = time.perf_counter() - t1
        if lead:
            run.append_metrics(record)
            tb.add(record)
            records.append(record)
            say("step", record)
            run.set_status("training", step=done, steps=cfg.steps)
        if stopped:
            break
    paced: list[Any] = [None] * world
    if pacer is not None:  # what the emulation did on every rank, for the record
        mine_paced: dict[str, Any] = pacer.stats.to_dict()
        if after_warmup is not None:  # the measured steps alone, as the measured step time counts them
            mine_paced["measured"] = {
                **pacer.stats.since(after_warmup).to_dict(),
                "steps": step - start + 1 - WARMUP_EXCLUDED,
            }
        dist.all_gather_object(paced, mine_paced)
    if lead:
        tb.close()
        write_summary(
            run,
            cfg,
            env,
            "stopped" if stopped and step + 1 < cfg.steps else "completed",
            pacing=paced if pacer is not None else None,
        )
    return {"rank": rank, "steps": records, "stopped": stopped}


def replica_layout(plan: Plan, global_batch: int) -> ReplicaLayout:
    """The replicas of a joint plan as the runtime runs them (the node of every rank from the plan's
    cluster when its sharding stays inside nodes)."""
    nodes: tuple[int, ...] = ()
    if str(plan.sharding.scope) == "node" and str(plan.sharding.stage) != "replicated":
        if not plan.cluster:
            raise PlanError(f"plan {plan.name!r} shards inside each node but names no cluster (its nodes)")
        cluster = load_cluster(plan.cluster)
        nodes = tuple(cluster.devices[d].node for d in plan.rank_devices)
    return ReplicaLayout.from_plan(plan, global_batch, nodes)


def replica_records(layout: ReplicaLayout, timings: list[tuple[float, float]], seq_len: int) -> list[dict[str, Any]]:
    """Per replica (from its first rank's (step seconds, compute seconds)): its sequences, step time,
    compute time, tokens/s of its compute, and its waiting for the slowest replica (0: the straggler)."""
    compute = [timings[layout.starts[i]][1] for i in range(layout.num_replicas)]
    slowest = max(compute)
    return [
        {
            "replica": i,
            "sequences": layout.sequences[i],
            "ranks": layout.plans[i].world_size,
            "step_time_s": timings[layout.starts[i]][0],
            "compute_s": compute[i],
            "tokens_per_s": layout.sequences[i] * seq_len / compute[i] if compute[i] > 0 else None,
            "waiting_s": slowest - compute[i],
        }
        for i in range(layout.num_replicas)
    ]


def replica_summary(records: list[dict[str, Any]], predicted: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Per replica of a joint plan: predicted vs measured (medians after each session's warm-up) step
    time of its own micro-steps, its tokens/s and its waiting; None for a one-replica run."""
    steady = [r for r in records if r.get("replicas") and not r.get("warmup")] or [
        r for r in records if r.get("replicas")
    ]
    if not steady:
        return None
    guesses = {p["replica"]: p["step_time_s"] for p in predicted.get("replicas", [])}
    out = []
    for i, first in enumerate(steady[-1]["replicas"]):
        mine = [r["replicas"][i] for r in steady if len(r["replicas"]) > i]
        out.append(
            {
                "replica": i,
                "sequences": first["sequences"],
                "ranks": first["ranks"],
                "predicted_compute_s": guesses.get(i),
                "measured_compute_s": statistics.median(x["compute_s"] for x in mine),
                "measured_step_time_s": statistics.median(x["step_time_s"] for x in mine),
                "measured_tokens_per_s": statistics.median(x["tokens_per_s"] or 0.0 for x in mine),
                "measured_waiting_s": statistics.median(x["waiting_s"] for x in mine),
            }
        )
    return out


def measured_step_time(records: list[dict[str, Any]]) -> tuple[float | None, int]:
    """Median step time over the steps after each session's warm-up, and how many steps it spans
    (all steps when there are no others)."""
    steady = [r["step_time_s"] for r in records if not r.get("warmup")]
    if not steady:
        steady = [r["step_time_s"] for r in records]
    return (statistics.median(steady) if steady else None), len(steady)


def describe_emulation(emu: emulation.Emulation) -> dict[str, object]:
    """What a run records about its emulation (summary.json `emulation`)."""
    links = sorted(
        {
            (round(emu.link_gbps[a][b], 6), round(emu.link_latency_us[a][b], 3))
            for a in range(emu.world_size)
            for b in range(emu.world_size)
            if emu.link_gbps and emu.link_gbps[a][b] > 0
        }
    )
    return {
        "method": "each CPU operator stretched to f x its reference CPU time (the least of its first samples of "
        "the same shapes) by sleeping; transfers over emulated links held to "
        "alpha + bytes(bf16)/beta (hexiseq/runtime/emulation.py)",
        "slowdown": list(emu.slowdown),
        "links": [{"gbps": g, "latency_us": lat} for g, lat in links],
        "source": emu.source,
    }


def _emulation_record(cfg: RunConfig, pacing: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if cfg.emulation is None:
        return None
    return {**describe_emulation(cfg.emulation), "pacing": pacing}


def environment(env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Versions and machines of a run: torch, CUDA, flash-attn, Python, and per rank its host and GPU."""
    import platform
    from importlib import metadata

    try:
        flash = metadata.version("flash-attn")
    except metadata.PackageNotFoundError:
        flash = None
    cpu = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), None)
    except OSError:
        pass
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flash_attn": flash,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
    }
    if env:
        out.update(
            {
                "hostnames": [e["host"] for e in env],
                "gpus": [e["gpu"] for e in env],
                "devices": [e["device"] for e in env],
            }
        )
    return out


def write_summary(
    run: RunDir,
    cfg: RunConfig,
    env: list[dict[str, Any]] | None,
    status: str,
    error: str | None = None,
    pacing: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """summary.json from the config and every record of metrics.jsonl. An emulated run (CPU ranks
    emulating the plan's cluster) says so: `emulated` true, `emulation` its factors, links and what
    the pacing did on each rank (`pacing`)."""
    records = run.read_metrics()
    measured, n = measured_step_time(records)
    plan = cfg.plan
    backend = "nccl" if env and env[0]["gpu"] != "cpu" else "gloo"
    summary = {
        "status": status,
        "error": error,
        "run_dir": str(run.path),
        "plan": plan.name,
        "world_size": plan.world_size,
        "groups": plan.num_groups,
        "seq_len": plan.seq_len,
        "global_batch": cfg.global_batch,
        "model": cfg.model_name,
        "data": cfg.data.describe(),
        "steps": cfg.steps,
        "steps_done": records[-1]["step"] if records else 0,
        "loss_first": records[0]["loss"] if records else None,
        "loss_last": records[-1]["loss"] if records else None,
        "predicted_step_time_s": cfg.predicted.get("step_time_s"),
        "prediction": cfg.predicted,
        "measured_step_time_s": measured,
        "measured_steps": n,
        "warmup_steps_excluded_per_session": WARMUP_EXCLUDED,
        "measured_tokens_per_s": cfg.tokens_per_step / measured if measured else None,
        "measured_on": f"{plan.world_size} {'GPU' if backend == 'nccl' else 'CPU'} processes ({backend})"
        + (f", emulating {cfg.emulation.source}" if cfg.emulation is not None else ""),
        "emulated": cfg.emulation is not None,
        "emulation": _emulation_record(cfg, pacing),
        "replicas": replica_summary(records, cfg.predicted),
        "dtype": cfg.dtype if backend == "gloo" else "bf16 autocast",
        "environment": environment(env),
        "finished_at": time.time(),
    }
    run.write_json(run.summary, summary)
    run.set_status(status)
    return summary
