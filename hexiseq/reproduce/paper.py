"""The figures the HexiSeq paper publishes (arXiv 2605.07569), written once: the comparison
document and the plots both read them from here.

`certainty` says where a number comes from: "abstract" (stated in the abstract, certain) or
"summary" (two independent summaries of the full paper agree; likely, not verified). Each figure
also lists the assumptions our reproduction has to make that the paper does not state; the
comparison prints them where our value differs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperFigure:
    key: str
    what: str  # one line: what the number is
    value: float
    unit: str  # "x" (a speedup), "" (a plain ratio) or "s"
    certainty: str  # "abstract" | "summary"
    unstated: tuple[str, ...] = ()  # what we had to assume because the paper does not say
    label: str = ""  # short legend label on plots

    @property
    def legend(self) -> str:
        return f"paper: {self.label or self.what} {self.format(self.value)}"

    def format(self, v: float) -> str:
        """A value in this figure's unit: 1.11x, 0.995, 9 s."""
        return f"{v:.3g} s" if self.unit == "s" else f"{v:.2f}x" if self.unit == "x" else f"{v:.3f}"


_TESTBED_UNSTATED = (
    "the testbed's node composition (ours: data/clusters/testbed-8.yaml and testbed-16.yaml)",
    "per-GPU kernel efficiencies (ours: the catalog's eff_matmul / eff_attention in data/gpus.yaml)",
    "whether the CP/HP baselines may leave slow devices out (ours: they may, on every single-type subset)",
)
_SIM_UNSTATED = (
    "the per-type GPU counts of the simulation clusters (ours: data/clusters/README.md)",
    "the NIC bandwidth per GPU type (ours: H100 50, A100/A800 25, L40S 12.5 GB/s)",
    "per-GPU kernel efficiencies (ours: the catalog's eff_matmul / eff_attention)",
)

FIGURES: tuple[PaperFigure, ...] = (
    PaperFigure(
        "testbed_mean",
        "real H100+A100 testbeds: mean speedup over the best CP/HP baseline",
        1.11,
        "x",
        "abstract",
        _TESTBED_UNSTATED,
        label="testbed mean",
    ),
    PaperFigure(
        "testbed_max",
        "real H100+A100 testbeds: max speedup over the best CP/HP baseline",
        1.19,
        "x",
        "abstract",
        _TESTBED_UNSTATED,
        label="testbed max",
    ),
    PaperFigure(
        "sim_mean",
        "simulations (32-128 GPUs, up to 4 GPU types): mean speedup",
        1.36,
        "x",
        "abstract",
        _SIM_UNSTATED,
        label="simulation mean",
    ),
    PaperFigure(
        "sim_max",
        "simulations (32-128 GPUs, up to 4 GPU types): max speedup",
        1.72,
        "x",
        "abstract",
        _SIM_UNSTATED,
        label="simulation max",
    ),
    PaperFigure(
        "testbed_7b_16k",
        "testbed, 7B model at 16K tokens: speedup",
        1.08,
        "x",
        "summary",
        _TESTBED_UNSTATED,
        label="7B at 16K",
    ),
    PaperFigure(
        "testbed_7b_32k",
        "testbed, 7B model at 32K tokens: speedup",
        1.17,
        "x",
        "summary",
        _TESTBED_UNSTATED,
        label="7B at 32K",
    ),
    PaperFigure(
        "testbed_13b",
        "testbed, 13B model: speedup",
        1.13,
        "x",
        "summary",
        _TESTBED_UNSTATED + ("the sequence lengths behind the 13B figure (ours: the mean over 16K-256K)",),
        label="13B",
    ),
    PaperFigure(
        "pair_a_ratio",
        "FLOP-comparable pair A (48 H100 + 8 A100 vs 152 A100): mixed HexiSeq / best homogeneous baseline",
        0.995,
        "",
        "summary",
        (
            "the model and sequence lengths of the pair experiment (ours: data/scenarios/pairs.yaml)",
            "the NICs of both clusters (ours: 25 GB/s per GPU)",
            "that one H100 counts as three A100 by peak FLOP/s only (memory and links are not matched)",
        ),
        label="pair A",
    ),
    PaperFigure(
        "sched_128",
        "scheduler time for 128 GPUs",
        9.0,
        "s",
        "summary",
        ("the machine the scheduler ran on", "the model and sequence length planned"),
        label="128 GPUs",
    ),
    PaperFigure(
        "sched_1024",
        "scheduler time for 1024 GPUs",
        444.0,
        "s",
        "summary",
        ("the machine the scheduler ran on", "the model and sequence length planned"),
        label="1024 GPUs",
    ),
)

BY_KEY = {f.key: f for f in FIGURES}


def figure(key: str) -> PaperFigure:
    return BY_KEY[key]


# Scenario names whose cells the paper's figures summarize (bundled data/scenarios/*.yaml).
TESTBED, SIMULATION, PAIRS, SCALING = "testbed", "simulation", "pairs", "scaling"
# How the figures map onto our scenarios: the reference lines of a scenario's speedup plots,
# reference points at given lengths, and the FLOP-comparable pair the paper quotes.
REFERENCE_LINES = {TESTBED: ("testbed_mean", "testbed_max"), SIMULATION: ("sim_mean", "sim_max")}
REFERENCE_POINTS = {TESTBED: (("testbed_7b_16k", "gpt-7b", 16 * 1024), ("testbed_7b_32k", "gpt-7b", 32 * 1024))}
GPU_TYPES_OF = {TESTBED: (2, 2), SIMULATION: (3, 4)}  # GPU types in the paper's testbeds / simulations
PAIR_A = "pair-a-mixed vs pair-a-a100"
SCHEDULER_POINTS = (("sched_128", 128), ("sched_1024", 1024))
