"""A run's resolved configuration: everything the ranks need, decided once by the launcher before any
work starts (the plan that runs, the model, the data, the training settings, the prediction), and
stored as `RUN_DIR/config.json` so that `--resume` continues exactly the same run.

`resolve(plan, settings, workdir)` turns a run's settings (hexiseq.runs.settings) into it; every
starter of a run goes through `hexiseq.runs.start.start_run`. Bad input raises a HexiSeqError here,
before a rank is started.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..costmodel import simulate
from ..costmodel.step import estimate_step
from ..errors import HexiSeqError, PlanError, SpecError
from ..plan import Plan, Sharding
from ..planfile import ShardingScope, ShardingStage
from ..runtime.emulation import Emulation
from ..runtime.hf_checkpoint import inspect_checkpoint
from ..runtime.llama import LlamaConfig
from ..runtime.parallel import ParallelOptions
from ..runtime.replicas import runs_as_replicas
from ..runtime.train import TrainConfig
from ..runtime.verify import proxy_config, scale_for_check
from ..specs import RECOMPUTE_POLICIES, ModelSpec, Workload, load_cluster
from ..specs.identity import model_named
from .data import DataSpec, fit_plan, prepare_data
from .settings import (
    DEFAULT_RUN_TOKENS,
    DTYPES,
    LONGEST_UNSCALED_TOKENS,
    SCHEDULES,
    RecordSettings,
    RunSettings,
    given_value,
    options,
)

CONFIG_VERSION = 1
WARMUP_EXCLUDED = 2  # steps of each session left out of the measured step time (allocator, caches, first collectives)


# What a config.json must hold (the other fields have defaults).
REQUIRED_KEYS = ("plan", "model", "model_name", "data", "steps")


@dataclass(frozen=True)
class RunConfig:
    """The resolved configuration of a run, typed; `to_dict` / `from_dict` are its JSON (config.json:
    the sections as dicts, the record settings at the top level, as version 1 has always written them)."""

    plan: Plan  # the plan that runs (scaled / fitted to the data)
    model: LlamaConfig
    model_name: str
    data: DataSpec
    steps: int  # total optimizer steps of the run
    global_batch: int = 1  # sequences per step (gradient accumulation)
    seed: int = 0
    dtype: str = "float32"  # parameters and activations on CPU ("float64" for exact comparisons); bf16 autocast on CUDA
    train: TrainConfig = TrainConfig()
    options: ParallelOptions = ParallelOptions()
    init_from: str | None = None
    record: RecordSettings = RecordSettings()
    strict_gpus: bool = False
    predicted: dict[str, Any] = field(default_factory=dict)  # step time from the cost model (predict())
    notes: tuple[str, ...] = ()
    emulation: Emulation | None = None  # CPU ranks emulating the plan's cluster
    version: int = CONFIG_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "model": asdict(self.model),
            "model_name": self.model_name,
            "data": self.data.to_dict(),
            "steps": self.steps,
            "global_batch": self.global_batch,
            "seed": self.seed,
            "dtype": self.dtype,
            "train": asdict(self.train),
            "options": asdict(self.options),
            "init_from": self.init_from,
            **asdict(self.record),
            "strict_gpus": self.strict_gpus,
            "predicted": self.predicted,
            "notes": list(self.notes),
            "emulation": self.emulation.to_dict() if self.emulation is not None else None,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """The config of a config.json; record settings it does not hold (written by an older
        HexiSeq) take their defaults."""
        if d.get("version") != CONFIG_VERSION:
            raise HexiSeqError(
                f"run config has version {d.get('version')!r}; this HexiSeq reads version {CONFIG_VERSION}"
            )
        missing = [name for name in REQUIRED_KEYS if name not in d]
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")  # RunDir.read_config names the file
        train = d.get("train") or {}
        record = {f.name: d[f.name] for f in fields(RecordSettings) if f.name in d}
        scalars = ("model_name", "steps", "global_batch", "seed", "dtype", "init_from", "strict_gpus", "predicted")
        return cls(
            plan=Plan.from_dict(d["plan"]),
            model=LlamaConfig(**d["model"]),
            data=DataSpec.from_dict(d["data"]),
            train=TrainConfig(**{**train, "betas": tuple(train.get("betas", (0.9, 0.95)))}),
            options=ParallelOptions(**(d.get("options") or {})),
            record=RecordSettings(**record),
            notes=tuple(d.get("notes") or ()),
            emulation=Emulation.from_dict(d["emulation"]) if d.get("emulation") else None,
            **{k: d[k] for k in scalars if k in d},
        )

    @property
    def tokens_per_step(self) -> int:
        return self.plan.seq_len * self.global_batch


def plan_recompute(plan: Plan) -> str | None:
    """The recompute policy a plan file records (`hexiseq plan` writes it into meta), if any."""
    policy = (plan.meta or {}).get("recompute")
    return policy if policy in RECOMPUTE_POLICIES else None


def _round_up(n: int, unit: int) -> int:
    return int(math.ceil(n / unit) * unit)


def resolve_model(plan: Plan, model: str | None, init_from: str | None, vocab_needed: int):
    """(LlamaConfig, name, notes) of the model to run: a checkpoint's, a catalog / HF config model
    (checked against the plan's heads), or a small proxy with the plan's heads."""
    notes: list[str] = []
    if init_from:
        cfg = inspect_checkpoint(init_from)  # readable, complete, right shapes, floating dtypes
        name = Path(init_from).name
    elif model:
        spec = model_named(model, plan.meta.get("model_spec"))
        plan.check(model=spec)
        cfg, name = LlamaConfig.from_spec(spec), spec.name
    else:
        vocab = max(512, _round_up(vocab_needed, 64))
        cfg = proxy_config(plan.num_heads, plan.num_kv_heads, vocab=vocab)
        name = f"proxy-{plan.num_heads}h{plan.num_kv_heads}kv"
        notes.append(
            f"model: a 2-layer proxy with the plan's {plan.num_heads} heads / {plan.num_kv_heads} KV heads "
            f"({plan.model or 'unnamed model'}), vocabulary {vocab}"
        )
    if init_from or model:
        if (cfg.heads, cfg.kv_heads) != (plan.num_heads, plan.num_kv_heads):
            raise PlanError(
                f"plan has {plan.num_heads} heads / {plan.num_kv_heads} KV heads but model {name!r} has "
                f"{cfg.heads} / {cfg.kv_heads}: plan for this model (hexiseq plan --model ...)"
            )
        if vocab_needed > cfg.vocab:
            raise SpecError(
                f"the data holds token ids up to {vocab_needed - 1} but model {name!r} has a vocabulary of "
                f"{cfg.vocab}: use the model's own tokenizer (--tokenizer) or another model"
            )
    return cfg, name, notes


def model_spec(cfg, name: str):
    """The cost model's ModelSpec of a runtime LlamaConfig."""
    return ModelSpec(
        name=name,
        layers=cfg.layers,
        hidden=cfg.hidden,
        heads=cfg.heads,
        kv_heads=cfg.kv_heads,
        ffn=cfg.ffn,
        vocab=cfg.vocab,
        tie_embeddings=cfg.tie_embeddings,
        rope_theta=cfg.rope_theta,
        head_dim=cfg.head_dim,
    )


def predict(plan: Plan, cfg, name: str, global_batch: int, recompute: str, fsdp: bool) -> dict[str, Any]:
    """The cost model's step time for this plan and model on the plan's cluster (the simulator: the
    judge of a plan). `step_time_s` None, with the reason, when the plan names no usable cluster."""
    if not plan.cluster:
        return {"step_time_s": None, "cluster": None, "note": "the plan names no cluster: no prediction"}
    if runs_as_replicas(plan):
        return predict_replicas(plan, cfg, name, global_batch, recompute)
    try:
        cluster = load_cluster(plan.cluster)
        wl = Workload(plan.seq_len, global_batch, recompute, pass_sharding(plan, fsdp), plan.block_size)
        sim = simulate(plan, cluster, model_spec(cfg, name), wl)
    except HexiSeqError as e:
        return {"step_time_s": None, "cluster": plan.cluster, "note": f"no prediction: {e}"}
    gpus = ", ".join(f"{n}x {t}" for t, n in cluster.gpu_types.items())
    return {
        "step_time_s": float(sim.iteration_time_s),
        "cluster": cluster.name,
        "gpus": gpus,
        "critical_rank": sim.critical_rank,
        "note": f"simulated iteration of this plan on {cluster.name} ({gpus})",
    }


def predict_replicas(plan: Plan, cfg, name: str, global_batch: int, recompute: str) -> dict[str, Any]:
    """A version-2 plan: the step model (costmodel/step.py, what the joint planner optimises) under the
    plan's own sharding: each replica's micro-steps, the synchronisation terms after the slowest one
    (cross-replica reduction, gathers) and the optimizer."""
    try:
        cluster = load_cluster(plan.cluster)
        wl = Workload(plan.seq_len, global_batch, recompute, pass_sharding(plan, False), plan.block_size)
        est = estimate_step(plan, cluster, model_spec(cfg, name), wl)
    except HexiSeqError as e:
        return {"step_time_s": None, "cluster": plan.cluster, "note": f"no prediction: {e}"}
    gpus = ", ".join(f"{n}x {t}" for t, n in cluster.gpu_types.items())
    return {
        "step_time_s": float(est.step_time_s),
        "cluster": cluster.name,
        "gpus": gpus,
        # a replica's compute as the run measures it: its micro-steps and its waits inside them (lockstep)
        "replicas": [
            {
                "replica": r.index,
                "sequences": r.sequences,
                "step_time_s": r.time_s + r.waiting_s,
                "waiting_s": r.waiting_s,
            }
            for r in est.replicas
        ],
        "sync_s": dict(est.sync_s),
        "note": f"the step model of this plan's {len(est.replicas)} replica(s) under {est.sharding} on "
        f"{cluster.name} ({gpus}): the slowest replica's micro-steps (replicas in lockstep: together), then the "
        "synchronisation and the optimizer",
    }


def pass_sharding(plan: Plan, fsdp: bool) -> str:
    """The cost model's pass shape (Workload.param_sharding) of a run of `plan`: a version-2 plan's own
    stage (ZeRO-2/3 gather parameters per pass, ZeRO-1 and replicated hold them whole — as
    costmodel.step shapes a replica's passes), a version-1 plan's the --fsdp option."""
    if runs_as_replicas(plan):
        return "zero3" if plan.sharding.stage in (ShardingStage.ZERO2, ShardingStage.ZERO3) else "replicated"
    return "zero3" if fsdp else "replicated"


def refuse_conflicting_fsdp(plan: Plan, fsdp: bool) -> None:
    """A version-2 plan runs under its own sharding: --fsdp (ZeRO-3 over all devices) asking another
    one is refused, naming both."""
    if fsdp and runs_as_replicas(plan) and plan.sharding != Sharding(ShardingStage.ZERO3, ShardingScope.ALL):
        raise PlanError(
            f"plan {plan.name!r} shards by its own strategy, {plan.sharding.describe()}, but --fsdp asks for "
            "zero3 over all devices: drop --fsdp (a version-2 plan runs under its sharding) or plan that sharding"
        )


def joint_global_batch(plan: Plan, asked: int) -> int:
    """The global batch of a run of `plan`: a joint plan's replicas fix it (the default 1 takes theirs)."""
    if plan.num_replicas == 1:
        return asked
    total = sum(r.sequences for r in plan.replicas)
    if asked not in (1, total):
        plan.sequences_of(asked)  # raises, naming both
    return total


def scale_to_run_length(plan: Plan, seq_len: int | None = None) -> tuple[Plan, list[str]]:
    """The plan at the run's length: `seq_len` tokens when given, else plans longer than
    LONGEST_UNSCALED_TOKENS scaled to DEFAULT_RUN_TOKENS (same groups, heads and shard proportions);
    with a note when it was scaled."""
    if seq_len is None:
        seq_len = DEFAULT_RUN_TOKENS if plan.seq_len > LONGEST_UNSCALED_TOKENS else plan.seq_len
    return scale_for_check(plan, seq_len)


def resolve(plan: Plan, settings: RunSettings, workdir: Path) -> RunConfig:
    """The RunConfig of a new run of `plan` as `settings` ask; data are prepared into `workdir`
    (tokenized text). Everything is checked here, before any rank starts."""
    data, model, par, train, record = settings.data, settings.model, settings.parallel, settings.train, settings.record
    if model.dtype not in DTYPES:
        raise HexiSeqError(f"--dtype must be one of {', '.join(DTYPES)}, got {model.dtype!r}")
    if train.schedule not in SCHEDULES:
        raise HexiSeqError(f"--schedule must be cosine or constant, got {train.schedule!r}")
    warmup = train.warmup
    if warmup >= train.steps and warmup > 0:
        raise HexiSeqError(f"--warmup-steps ({warmup}) must be fewer than --steps ({train.steps})")
    refuse_conflicting_fsdp(plan, par.fsdp)
    policy = par.recompute or plan_recompute(plan) or "none"
    notes: list[str] = []
    if data.path:
        spec = prepare_data(data.path, workdir, data.tokenizer, data.labels, data.token_dtype)
    else:
        spec = DataSpec("synthetic")
    if spec.kind == "sequences" and model.seq_len is None:
        plan.check()
        plan, fit_notes = fit_plan(plan, spec.seq_len)
        notes += fit_notes
    else:
        plan, scale_notes = scale_to_run_length(plan, plan.seq_len if model.full_length else model.seq_len)
        notes += scale_notes
    if spec.kind == "sequences" and spec.seq_len > plan.seq_len:
        raise PlanError(
            f"the data's sequences have {spec.seq_len:,} tokens but the plan holds {plan.seq_len:,}: "
            f"give --seq-len {spec.seq_len} or more (rounded up to the plan's alignment)"
        )
    global_batch = joint_global_batch(plan, train.global_batch)
    if plan.num_replicas > 1:
        shares = " + ".join(str(r.sequences) for r in plan.replicas)
        notes.append(
            f"replicas: {plan.num_replicas}, sequences per step {shares} (replica i reads the next share of the "
            f"step's samples, in order), sharding {plan.sharding.describe()}"
        )
    elif runs_as_replicas(plan):
        notes.append(f"sharding: the plan's own, {plan.sharding.describe()} (a version-2 plan file)")
    cfg, name, model_notes = resolve_model(plan, model.name, model.init_from, spec.vocab)
    notes = model_notes + notes
    if spec.kind != "synthetic":
        notes.insert(0, f"data: {spec.describe()}")
    train_cfg = TrainConfig(
        lr=train.lr,
        weight_decay=train.weight_decay,
        grad_clip=train.grad_clip or None,
        timeout_s=train.timeout_s,
        warmup_steps=warmup,
        schedule=train.schedule,
        min_lr_ratio=train.min_lr_ratio,
    )
    parallel = ParallelOptions(fsdp=par.fsdp, activation_checkpointing=policy, loss_chunk=par.loss_chunk)
    predicted = settings.prediction
    if predicted is None:
        predicted = predict(plan, cfg, name, global_batch, policy, par.fsdp)
    return RunConfig(
        plan=plan,
        model=cfg,
        model_name=name,
        data=spec,
        steps=train.steps,
        global_batch=global_batch,
        seed=train.seed,
        dtype=model.dtype,
        train=train_cfg,
        options=parallel,
        init_from=model.init_from,
        record=record,
        strict_gpus=par.strict_gpus,
        predicted=predicted,
        notes=tuple(notes),
        emulation=settings.emulation,
    )


def for_resume(
    cfg: RunConfig,
    plan: Plan | None = None,
    changes: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    emulation: Emulation | None = None,
) -> tuple[RunConfig, list[str]]:
    """The config of a resumed run: the same, under a new plan (elastic: any world size and shape
    with the same sequence length and heads, emulated as `emulation` says), with the options a
    resumed run may change (`changes`, by option key: more steps, the record settings, ...) and
    another collective timeout. Returns it with notes."""
    notes: list[str] = []
    if plan is not None:
        old = cfg.plan
        if plan.seq_len != old.seq_len:  # e.g. a production-length plan for a run trained at a scaled length
            plan.check()
            try:
                scaled = plan.scaled(old.seq_len)
            except PlanError as e:
                raise PlanError(
                    f"the run trains sequences of {old.seq_len:,} tokens and the new plan ({plan.seq_len:,} tokens) "
                    f"cannot be scaled to that: {e}"
                ) from None
            notes.append(f"plan: {plan.name!r} scaled from {plan.seq_len:,} to the run's {old.seq_len:,} tokens")
            plan = scaled
        if (plan.num_heads, plan.num_kv_heads) != (old.num_heads, old.num_kv_heads):
            raise PlanError(
                f"the run's model has {old.num_heads} heads / {old.num_kv_heads} KV heads but the new plan "
                f"{plan.name!r} has {plan.num_heads} / {plan.num_kv_heads}"
            )
        plan.check()
        if plan.num_replicas > 1:
            plan.sequences_of(cfg.global_batch)  # the run's global batch stays: the replicas must share it
        notes.append(
            f"plan: resuming under {plan.name!r} ({plan.world_size} ranks, {plan.num_groups} groups), was "
            f"{old.name!r} ({old.world_size} ranks, {old.num_groups} groups); the checkpoint is resharded"
        )
        opts = cfg.options
        cfg = replace(
            cfg,
            plan=plan,
            emulation=emulation,
            predicted=predict(
                plan, cfg.model, cfg.model_name, cfg.global_batch, opts.activation_checkpointing, opts.fsdp
            ),
        )
    for row in options():
        value = (changes or {}).get(row.key)
        if row.option.fixed_on_resume or not given_value(value):
            continue
        value = (not value) if row.option.negate else value
        if row.section == "record":
            cfg = replace(cfg, record=replace(cfg.record, **{row.name: value}))
        elif row.name == "steps":
            if value != cfg.steps and cfg.train.schedule == "cosine":
                notes.append(f"steps: {cfg.steps} -> {value}; the cosine schedule now decays over {value} steps")
            cfg = replace(cfg, steps=value)
        else:  # a setting the config keeps at its top level (strict_gpus)
            cfg = replace(cfg, **{row.name: value})
    if timeout_s is not None:
        cfg = replace(cfg, train=replace(cfg.train, timeout_s=timeout_s))
    return cfg, notes
