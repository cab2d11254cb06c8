"""A run's resolved configuration: everything the ranks need, decided once by the launcher before any
work starts (the plan that runs, the model, the data, the training settings, the prediction), and
stored as `RUN_DIR/config.json` so that `--resume` continues exactly the same run.

`resolve` is shared by `hexiseq run` and `hexiseq.launch`; bad input raises a HexiSeqError here,
before a rank is started.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..costmodel import simulate
from ..errors import HexiSeqError, PlanError, SpecError
from ..plan import Plan
from ..runtime.checkpoint import inspect_checkpoint
from ..runtime.emulation import Emulation
from ..runtime.model import LlamaConfig
from ..runtime.parallel import ParallelOptions
from ..runtime.train import TrainConfig
from ..runtime.verify import proxy_config, scale_for_check
from ..specs import RECOMPUTE_POLICIES, ModelSpec, Workload, get_model, load_cluster
from .data import DataSpec, fit_plan, prepare_data

CONFIG_VERSION = 1
WARMUP_EXCLUDED = 2  # steps of each session left out of the measured step time (allocator, caches, first collectives)
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class RunConfig:
    """The resolved configuration of a run (JSON: `to_dict` / `from_dict`)."""

    plan: dict[str, Any]  # Plan.to_dict() of the plan that runs (scaled / fitted to the data)
    model: dict[str, Any]  # LlamaConfig fields
    model_name: str
    data: dict[str, Any]  # DataSpec fields
    steps: int  # total optimizer steps of the run
    global_batch: int = 1  # sequences per step (gradient accumulation)
    seed: int = 0
    dtype: str = "float32"  # parameters and activations on CPU ("float64" for exact comparisons); bf16 autocast on CUDA
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields
    options: dict[str, Any] = field(default_factory=dict)  # ParallelOptions fields
    init_from: str | None = None
    checkpoint_every: int = 0  # 0: only at the end (and when stopped)
    keep_checkpoints: int = 2
    strict_gpus: bool = False
    tensorboard: bool = True
    predicted: dict[str, Any] = field(default_factory=dict)  # step time from the cost model (predict())
    notes: tuple[str, ...] = ()
    emulation: dict[str, Any] | None = (
        None  # runtime.emulation.Emulation.to_dict(): CPU ranks emulating the plan's cluster
    )
    version: int = CONFIG_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        if d.get("version") != CONFIG_VERSION:
            raise HexiSeqError(
                f"run config has version {d.get('version')!r}; this HexiSeq reads version {CONFIG_VERSION}"
            )
        known = set(cls.__dataclass_fields__)
        return cls(**{k: (tuple(v) if k == "notes" else v) for k, v in d.items() if k in known})

    # typed views
    def plan_obj(self) -> Plan:
        return Plan.from_dict(self.plan)

    def model_cfg(self):

        return LlamaConfig(**self.model)

    def train_cfg(self):

        return TrainConfig(**{**self.train, "betas": tuple(self.train.get("betas", (0.9, 0.95)))})

    def options_obj(self):

        return ParallelOptions(**self.options)

    def data_spec(self) -> DataSpec:
        return DataSpec.from_dict(self.data)

    @property
    def tokens_per_step(self) -> int:
        return self.plan["seq_len"] * self.global_batch


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
        spec = get_model(model)
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
    try:
        cluster = load_cluster(plan.cluster)
        wl = Workload(plan.seq_len, global_batch, recompute, "zero3" if fsdp else "replicated", plan.block_size)
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


def resolve(
    plan: Plan,
    workdir: Path,
    *,
    model: str | None = None,
    init_from: str | None = None,
    seq_len: int | None = None,
    full_length: bool = False,
    data: str | None = None,
    tokenizer: str | None = None,
    labels: str | None = None,
    token_dtype: str | None = None,
    steps: int = 20,
    global_batch: int = 1,
    seed: int = 0,
    dtype: str = "float32",
    lr: float = 1e-3,
    warmup_steps: int | None = None,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.1,
    grad_clip: float | None = 1.0,
    recompute: str | None = None,
    fsdp: bool = False,
    loss_chunk: int = 4096,
    checkpoint_every: int = 0,
    keep_checkpoints: int = 2,
    strict_gpus: bool = False,
    tensorboard: bool = True,
    timeout_s: float = 300.0,
    emulation: Emulation | None = None,
) -> RunConfig:
    """The RunConfig of a new run; data are prepared into `workdir` (tokenized text). Everything is
    checked here, before any rank starts. `emulation`: how CPU ranks emulate the plan's cluster
    (hexiseq.calibrate.emulation derives it), None for plain ranks."""

    if dtype not in DTYPES:
        raise HexiSeqError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if schedule not in ("cosine", "constant"):
        raise HexiSeqError(f"--schedule must be cosine or constant, got {schedule!r}")
    warmup = warmup_steps if warmup_steps is not None else 0
    if warmup >= steps and warmup > 0:
        raise HexiSeqError(f"--warmup-steps ({warmup}) must be fewer than --steps ({steps})")
    policy = recompute or plan_recompute(plan) or "none"
    notes: list[str] = []
    spec = prepare_data(data, workdir, tokenizer, labels, token_dtype) if data else DataSpec("synthetic")
    if spec.kind == "sequences" and seq_len is None:
        plan.check()
        plan, fit_notes = fit_plan(plan, spec.seq_len)
        notes += fit_notes
    else:
        plan, scale_notes = scale_for_check(plan, plan.seq_len if full_length else seq_len)
        notes += scale_notes
    if spec.kind == "sequences" and spec.seq_len > plan.seq_len:
        raise PlanError(
            f"the data's sequences have {spec.seq_len:,} tokens but the plan holds {plan.seq_len:,}: "
            f"give --seq-len {spec.seq_len} or more (rounded up to the plan's alignment)"
        )
    cfg, name, model_notes = resolve_model(plan, model, init_from, spec.vocab)
    notes = model_notes + notes
    if spec.kind != "synthetic":
        notes.insert(0, f"data: {spec.describe()}")
    train = TrainConfig(
        lr=lr,
        weight_decay=weight_decay,
        grad_clip=grad_clip or None,
        timeout_s=timeout_s,
        warmup_steps=warmup,
        schedule=schedule,
        min_lr_ratio=min_lr_ratio,
    )
    options = ParallelOptions(fsdp=fsdp, activation_checkpointing=policy, loss_chunk=loss_chunk)
    return RunConfig(
        plan=plan.to_dict(),
        model=asdict(cfg),
        model_name=name,
        data=spec.to_dict(),
        steps=steps,
        global_batch=global_batch,
        seed=seed,
        dtype=dtype,
        train=asdict(train),
        options=asdict(options),
        init_from=init_from,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        strict_gpus=strict_gpus,
        tensorboard=tensorboard,
        predicted=predict(plan, cfg, name, global_batch, policy, fsdp),
        notes=tuple(notes),
        emulation=emulation.to_dict() if emulation is not None else None,
    )


def for_resume(
    cfg: RunConfig,
    plan: Plan | None = None,
    steps: int | None = None,
    timeout_s: float | None = None,
    emulation: Emulation | None = None,
) -> tuple[RunConfig, list[str]]:
    """The config of a resumed run: the same, under a new plan (elastic: any world size and shape
    with the same sequence length and heads, emulated as `emulation` says) and/or with more steps.
    Returns it with notes."""
    notes: list[str] = []
    if plan is not None:
        old = cfg.plan_obj()
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
        notes.append(
            f"plan: resuming under {plan.name!r} ({plan.world_size} ranks, {plan.num_groups} groups), was "
            f"{old.name!r} ({old.world_size} ranks, {old.num_groups} groups); the checkpoint is resharded"
        )
        opts = cfg.options_obj()
        cfg = replace(
            cfg,
            plan=plan.to_dict(),
            emulation=emulation.to_dict() if emulation is not None else None,
            predicted=predict(
                plan, cfg.model_cfg(), cfg.model_name, cfg.global_batch, opts.activation_checkpointing, opts.fsdp
            ),
        )
    if steps is not None and steps != cfg.steps:
        if cfg.train.get("schedule") == "cosine":
            notes.append(f"steps: {cfg.steps} -> {steps}; the cosine schedule now decays over {steps} steps")
        cfg = replace(cfg, steps=steps)
    if timeout_s is not None:
        cfg = replace(cfg, train={**cfg.train, "timeout_s": timeout_s})
    return cfg, notes
