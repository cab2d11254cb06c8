"""What a run is asked to do, typed: `RunSettings` (data, model, parallel, train and record settings),
and the field table the `hexiseq run` command line is made from.

Each option is declared once, here, as a field of one of the settings sections: its type, default,
range (a field type of hexiseq.specs.schema, checked before any work), help text and whether a
resumed run may change it (`option(...)`). The command line (`hexiseq.commands.run`), the notebook
launcher (`hexiseq.runs.launch`) and the record of a run (`RunConfig`, config.json) read this table;
adding a run option is adding a field here and reading it where it is used.

`hexiseq.runs.config.resolve(plan, settings, workdir)` turns settings into the run's resolved
configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..runtime.emulation import Emulation
from ..specs import RECOMPUTE_POLICIES, RecomputePolicy
from ..specs.schema import count, number
from ..specs.workload import GlobalBatch

DEFAULT_STEPS = 5  # optimizer steps of a run that does not say
# The default run length: plans longer than LONGEST_UNSCALED_TOKENS run scaled to DEFAULT_RUN_TOKENS
# (same groups, heads and shard proportions) unless --seq-len or --full-length says otherwise, so that
# a production-length plan runs on CPU ranks at all.
LONGEST_UNSCALED_TOKENS = 8192
DEFAULT_RUN_TOKENS = 2048
MAX_WARMUP_STEPS = 100  # the default warmup: a tenth of the steps, at most this
DTYPES = ("float32", "float64")
SCHEDULES = ("cosine", "constant")

# The numbers of a run, with their range and unit (refused with the rule and the limit in the message).
# Upper limits are sanity bounds: far above any real run, far below what would overflow.
Steps = count("optimizer steps of the run", le=10_000_000)
WarmupSteps = count("linear warmup steps", ge=0, le=10_000_000)
LearningRate = number(
    "peak AdamW learning rate", gt=0, le=1.0, limit_why="an update of more than 1 per weight is not training"
)
MinLrRatio = number("final learning rate of the cosine schedule, a fraction of --lr", ge=0, le=1.0)
WeightDecay = number("AdamW weight decay", ge=0, le=10.0)
GradClip = number("max global gradient norm (0: no clipping)", ge=0, le=1e6)
Seed = count("seed of weights and data order", ge=0, le=2**63 - 1)
LossChunk = count("tokens per chunk of the LM head and loss", unit="tokens", le=1 << 24)
CheckpointEvery = count("steps between checkpoints (0: at the end only)", ge=0, le=10_000_000)
KeepCheckpoints = count("newest checkpoints kept", le=10_000)
LogEvery = count("steps between progress lines on the console", le=10_000_000)


@dataclass(frozen=True)
class Option:
    """How a settings field appears on the command line. The kind of value: `number` (a field type:
    range and unit), `tokens` (a token count: 4096, 128K, 1M), `choices`, a bool (a flag; `negate`:
    the flag turns it off), else text. `bare`: the value of the flag given without one."""

    help: str
    flag: str = ""  # default: --<field name with dashes>
    number: Any = None
    tokens: bool = False
    choices: tuple[str, ...] = ()
    bare: str | None = None
    negate: bool = False
    fixed_on_resume: bool = True  # a resumed run continues as configured: giving it on --resume is refused


def option(default: Any, help: str, **how: Any) -> Any:
    """A settings field that is a `hexiseq run` option (see `Option`)."""
    return field(default=default, metadata={"option": Option(help, **how)})


@dataclass(frozen=True)
class DataSettings:
    """What the run trains on (none: one synthetic sequence)."""

    path: str | None = option(
        None,
        "text file or folder (*.txt, *.md), or token file (.bin uint16, .npy 1-D stream or 2-D [N, S])",
        flag="--data",
    )
    tokenizer: str | None = option(None, "a Hugging Face tokenizer.json (or its folder) for text; default: byte-level")
    labels: str | None = option(None, "labels .npy of 2-D token data, Hugging Face convention (-100 = ignored)")
    token_dtype: str | None = option(None, "dtype of a raw .bin token file (default uint16)")


@dataclass(frozen=True)
class ModelSettings:
    """Which model runs, at which length and precision."""

    name: str | None = option(
        None,
        "Llama-family model of data/models.yaml or a HF config.json (default: a small proxy "
        "Llama with the plan's head counts)",
        flag="--model",
    )
    init_from: str | None = option(None, "Hugging Face checkpoint directory to start from (overrides --model)")
    seq_len: int | None = option(
        None,
        "scale the plan to this many tokens, same groups, heads and shard proportions (default: plans over "
        f"{LONGEST_UNSCALED_TOKENS} tokens are scaled to {DEFAULT_RUN_TOKENS} unless --full-length; 2-D token data: "
        "its length)",
        tokens=True,
    )
    full_length: bool = option(False, "run the plan at its own length (for a real GPU run)")
    dtype: str = option(
        "float32",
        "CPU parameters and activations (default float32; float64 for exact comparisons); CUDA runs bf16 autocast",
        choices=DTYPES,
    )


@dataclass(frozen=True)
class ParallelSettings:
    """How the plan is applied to the model."""

    recompute: str | None = option(
        None,
        "activation checkpointing policy: none, selective (a bare --recompute), full "
        "(default: the plan file's policy, meta['recompute'], else none)",
        choices=tuple(str(p) for p in RECOMPUTE_POLICIES),
        bare=str(RecomputePolicy.SELECTIVE),
    )
    fsdp: bool = option(
        False, "shard parameters with FSDP2 (version-1 plans; a version-2 plan runs under its own sharding)"
    )
    loss_chunk: int = option(4096, "tokens per chunk of the LM head + loss (default 4096)", number=LossChunk)
    strict_gpus: bool = option(
        False, "refuse (not just warn) when a rank's GPU model differs from the plan's device", fixed_on_resume=False
    )


@dataclass(frozen=True)
class TrainSettings:
    """The optimizer, its schedule and the batch."""

    steps: int = option(
        DEFAULT_STEPS,
        f"optimizer steps (default {DEFAULT_STEPS}; with --resume: the run's, or more)",
        number=Steps,
        fixed_on_resume=False,
    )
    global_batch: int = option(1, "sequences per step, gradients accumulated (default 1)", number=GlobalBatch)
    lr: float = option(1e-3, "peak AdamW learning rate (default 1e-3)", number=LearningRate)
    warmup_steps: int | None = option(
        None,
        f"linear warmup steps (default: a tenth of the steps, at most {MAX_WARMUP_STEPS})",
        number=WarmupSteps,
    )
    schedule: str = option("cosine", "after warmup (default cosine, to --min-lr-ratio x lr)", choices=SCHEDULES)
    min_lr_ratio: float = option(
        0.1, "final learning rate of the cosine, as a fraction of --lr (default 0.1)", number=MinLrRatio
    )
    weight_decay: float = option(0.1, "AdamW weight decay on matrices (default 0.1)", number=WeightDecay)
    grad_clip: float = option(1.0, "max gradient norm (default 1.0; 0 disables)", number=GradClip)
    seed: int = option(0, "weights and data order (default 0)", number=Seed)
    timeout_s: float = 300.0  # every collective (the command line's --timeout, shared with hexiseq verify)

    @property
    def warmup(self) -> int:
        """The warmup steps: as given, else a tenth of the steps, at most MAX_WARMUP_STEPS."""
        return self.warmup_steps if self.warmup_steps is not None else min(MAX_WARMUP_STEPS, self.steps // 10)


@dataclass(frozen=True)
class RecordSettings:
    """What the run records and how often (config.json keeps these at its top level)."""

    checkpoint_every: int = option(
        0,
        "DCP checkpoint every K steps (default 0: at the end, and when stopped)",
        number=CheckpointEvery,
        fixed_on_resume=False,
    )
    keep_checkpoints: int = option(
        2, "newest checkpoints kept (default 2)", number=KeepCheckpoints, fixed_on_resume=False
    )
    tensorboard: bool = option(
        True, "no TensorBoard event files", flag="--no-tensorboard", negate=True, fixed_on_resume=False
    )
    log_every: int | None = option(
        None,
        "a progress line every N steps on the console (default: about 100 lines a run); metrics.jsonl gets every step",
        number=LogEvery,
        fixed_on_resume=False,
    )


@dataclass(frozen=True)
class RunSettings:
    """Everything a run is asked to do. `emulation`: how CPU ranks emulate the plan's cluster, handed in
    by the caller (hexiseq.calibrate.emulated_clusters derives it; None: plain ranks). `prediction`: a step
    time the caller predicted (calibration, with its profile); None: the cost model's on the plan's
    cluster."""

    data: DataSettings = DataSettings()
    model: ModelSettings = ModelSettings()
    parallel: ParallelSettings = ParallelSettings()
    train: TrainSettings = TrainSettings()
    record: RecordSettings = RecordSettings()
    emulation: Emulation | None = None
    prediction: dict[str, Any] | None = None

    @classmethod
    def from_options(cls, values: dict[str, Any], **extra: Any) -> RunSettings:
        """Settings from option values by option key (`OptionField.key`: `data`, `lr`, `no_tensorboard`,
        ...); options not given (absent, None, or an unset flag) keep their defaults. `extra`:
        `emulation`, `prediction`."""
        given: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for row in options():
            value = values.get(row.key)
            if given_value(value):
                given[row.section][row.name] = (not value) if row.option.negate else value
        base = cls()
        return cls(
            **{section: dataclasses.replace(getattr(base, section), **given[section]) for section in SECTIONS},
            **extra,
        )

    def with_options(self, values: dict[str, Any]) -> RunSettings:
        """These settings with the given options (by key, as `from_options`) changed."""
        changed = RunSettings.from_options(values)
        sections = {}
        for section in SECTIONS:
            names = {row.name for row in options() if row.section == section and given_value(values.get(row.key))}
            sections[section] = dataclasses.replace(
                getattr(self, section), **{n: getattr(getattr(changed, section), n) for n in names}
            )
        return dataclasses.replace(self, **sections)


def given_value(value: Any) -> bool:
    """Whether an option was given: a value, or a flag that is set (None and False are "not given")."""
    return value is not None and value is not False


SECTIONS = ("data", "model", "parallel", "train", "record")


@dataclass(frozen=True)
class OptionField:
    """One row of the field table: where the option lives (`section`, `name`) and how it is given."""

    section: str
    name: str
    default: Any
    option: Option

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The option's name in Python (`hexiseq.runs.launch` keywords, argparse's dest)."""
        return self.flag[2:].replace("-", "_")


def options() -> Iterator[OptionField]:
    """The field table: every `hexiseq run` option of the settings, section by section."""
    for section in SECTIONS:
        for f in dataclasses.fields(type(getattr(RunSettings(), section))):
            if "option" in f.metadata:
                yield OptionField(section, f.name, f.default, f.metadata["option"])
