"""The results table: one row per cell and system (tidy), as `results.csv` holds it, and the
summaries every consumer (figures, comparison, notebooks) computes from it.

Cell-level columns (`speedup`, `best_symmetric`, ...) repeat on every row of their cell, like
`scenario` and `cluster`. `speedup` is HexiSeq's throughput over the best symmetric CP/HP baseline
(the paper's measure, `PlanResult.speedup_vs_best_symmetric`), `speedup_vs_all` over every baseline
including the proportional heuristic; `hexiseq_over_system` is HexiSeq's tokens/s over this row's.
Phase columns (`time_<phase>_s`, the critical rank's time by phase) follow the cost model's phase list.
`stack` is the software stack every system of the cell was planned and judged on (data/stacks.yaml;
one per results directory). `replicas` and `sharding` say each row's data parallelism and strategy:
the paper's cells are one replica under ZeRO-3 over all devices (its setting); the global-batch scenario's rows (`sweep`
"global_batch", `sweep_value` = G) plan whole steps, their `speedup` is over the best DP x symmetric baseline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from ..costmodel import PHASES
from .cache import write_atomic
from .cells import HEXISEQ

BASE_COLUMNS = (
    "scenario",
    "cluster",
    "gpus",
    "gpu_types",
    "gpu_mix",
    "peak_pflops",
    "matmul_pflops",
    "memory_gib",
    "model",
    "seq_len",
    "global_batch",
    "stack",
    "pair",
    "pair_role",
    "sweep",
    "sweep_value",
    "system",
    "feasible",
    "tokens_per_s",
    "step_time_s",
    "speedup",
    "best_symmetric",
    "speedup_vs_all",
    "best_baseline",
    "hexiseq_over_system",
    "memory_headroom_gib",
    "memory_peak_frac",
    "devices_used",
    "replicas",
    "sharding",
    "recompute",
    "config",
    "plan_time_s",
    "gap",
    "lower_bound_s",
    "efficiency_vs_bound",
    "critical_phase",
)
TAIL_COLUMNS = ("reason", "machine", "version")
CELL_KEYS = ("scenario", "cluster", "model", "seq_len", "pair", "pair_role", "sweep", "sweep_value")


def phase_columns() -> list[str]:
    return [f"time_{p}_s" for p in PHASES]


def machine_label(m: dict[str, Any]) -> str:
    """'Intel Xeon ..., 2 cores, load 1.1': where a cell's wall-clock figures were measured."""
    if not m:
        return ""
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, load {m.get('load_avg_1m', '?')}"


def gpu_mix(types: dict[str, int]) -> str:
    return " + ".join(f"{n}x{t}" for t, n in types.items())


def rows_of(cell: Any, record: dict[str, Any], version: str) -> list[dict[str, Any]]:
    """The table rows of one computed cell (one per system)."""
    base = {
        "scenario": cell.scenario,
        "cluster": record["cluster"]["name"],
        "gpus": record["cluster"]["gpus"],
        "gpu_types": len(record["cluster"]["types"]),
        "gpu_mix": gpu_mix(record["cluster"]["types"]),
        "model": cell.model,
        "seq_len": cell.seq_len,
        "global_batch": record.get("global_batch"),
        "stack": cell.stack,
        "pair": cell.pair,
        "pair_role": cell.role,
        "sweep": cell.sweep,
        "sweep_value": cell.sweep_value,
        "speedup": record.get("speedup"),
        "best_symmetric": record.get("best_symmetric"),
        "speedup_vs_all": record.get("speedup_vs_all"),
        "best_baseline": record.get("best_baseline"),
        "version": version,
        "peak_pflops": record["cluster"].get("peak_pflops"),
        "matmul_pflops": record["cluster"].get("matmul_pflops"),
        "memory_gib": record["cluster"].get("memory_gib"),
        "machine": machine_label(record.get("machine") or {}),
    }
    systems = record["systems"]
    hexiseq_tps = next((s.get("tokens_per_s") for s in systems if s["system"] == HEXISEQ and s.get("feasible")), None)
    out = []
    for s in systems:
        row = {**base, **{k: v for k, v in s.items() if k != "phases_s"}}
        for phase, t in (s.get("phases_s") or {}).items():
            row[f"time_{phase}_s"] = t
        tps = s.get("tokens_per_s")
        row["hexiseq_over_system"] = hexiseq_tps / tps if s.get("feasible") and hexiseq_tps and tps else None
        out.append(row)
    return out


def frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a DataFrame with the documented column order (unknown extra fields kept, at the end)."""
    df = pd.DataFrame(list(rows))
    front = [c for c in (*BASE_COLUMNS, *phase_columns()) if c in df.columns or c in BASE_COLUMNS]
    for c in front:
        if c not in df.columns:
            df[c] = None
    extra = sorted(c for c in df.columns if c not in front and c not in TAIL_COLUMNS)
    for c in TAIL_COLUMNS:
        if c not in df.columns:
            df[c] = None
    return _types(df[front + extra + list(TAIL_COLUMNS)])


NUMERIC_COLUMNS = (
    "gpus",
    "gpu_types",
    "seq_len",
    "global_batch",
    "sweep_value",
    "tokens_per_s",
    "step_time_s",
    "speedup",
    "speedup_vs_all",
    "hexiseq_over_system",
    "memory_headroom_gib",
    "memory_peak_frac",
    "devices_used",
    "replicas",
    "plan_time_s",
    "gap",
    "lower_bound_s",
    "efficiency_vs_bound",
    "estimate_time_s",
    "peak_pflops",
    "matmul_pflops",
    "memory_gib",
)


INT_COLUMNS = ("gpus", "gpu_types", "seq_len")  # never missing


def _types(df: pd.DataFrame) -> pd.DataFrame:
    """Text columns as strings ("" for none), numbers as floats (NaN for none), feasible as bool:
    the same types whether the frame was just built or read back from CSV."""
    df = df.copy()
    for c in df.columns:
        if c in INT_COLUMNS and df[c].notna().all():
            df[c] = pd.to_numeric(df[c]).astype("int64")
        elif c in NUMERIC_COLUMNS or (c.startswith("time_") and c.endswith("_s")):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
        elif c == "feasible":
            df[c] = df[c].map(lambda v: v if isinstance(v, bool) else str(v).strip().lower() == "true").astype(bool)
        else:
            df[c] = df[c].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return df


def write_csv(df: pd.DataFrame, path: Path) -> None:
    write_atomic(path, df.to_csv(index=False, float_format="%.10g"))


def read_csv(path: Path | str) -> pd.DataFrame:
    return _types(pd.read_csv(path, keep_default_na=True))


# ----------------------------------------------------------------------------- summaries


def table_stack(df: pd.DataFrame) -> str | None:
    """The software stack a results table was computed on (one per results directory); None (the
    default stack) for a table written before the `stack` column."""
    named = [s for s in dict.fromkeys(df["stack"]) if s] if "stack" in df.columns else []
    return named[0] if named else None


def hexiseq_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: HexiSeq's (its cell-level columns carry the comparison)."""
    return df[df["system"] == HEXISEQ]


def grid_rows(df: pd.DataFrame, scenario: str | None = None) -> pd.DataFrame:
    """HexiSeq rows of plain grid cells (not pairs, not sweeps), optionally of one scenario."""
    h = hexiseq_rows(df)
    h = h[(h["pair"] == "") & (h["sweep"] == "")]
    return h[h["scenario"] == scenario] if scenario is not None else h


def speedup_stats(rows: pd.DataFrame, column: str = "speedup") -> dict[str, float]:
    """Mean / max / min of a speedup column over the cells that have one, and how many do not."""
    vals = pd.to_numeric(rows[column], errors="coerce").dropna() if len(rows) else pd.Series(dtype=float)
    out: dict[str, float] = {"cells": int(len(vals)), "without": int(len(rows) - len(vals))}
    if len(vals):
        out.update(mean=float(vals.mean()), max=float(vals.max()), min=float(vals.min()))
    return out


def pair_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per FLOP-comparable pair, model and length: HexiSeq on the mixed cluster over the strongest
    baseline on the homogeneous one (the best of all, `best_baseline`: on a homogeneous cluster the
    proportional split is an even split that also handles lengths the even zigzag cannot cut);
    NaN where either side does not fit."""
    h = hexiseq_rows(df)
    h = h[h["pair"] != ""]
    cols = [
        "scenario",
        "pair",
        "model",
        "seq_len",
        "mixed_tokens_per_s",
        "homogeneous_best",
        "homogeneous_tokens_per_s",
        "ratio",
    ]
    out = []
    for (sc, pair, model, seq), g in h.groupby(["scenario", "pair", "model", "seq_len"], sort=False):
        mixed = g[g["pair_role"] == "mixed"]
        homo_cell = df[
            (df["scenario"] == sc)
            & (df["pair"] == pair)
            & (df["model"] == model)
            & (df["seq_len"] == seq)
            & (df["pair_role"] == "homogeneous")
        ]
        best = homo_cell["best_baseline"].iloc[0] if len(homo_cell) else ""
        best_row = homo_cell[(homo_cell["system"] == best) & homo_cell["feasible"]] if best else homo_cell.iloc[0:0]
        m = float(mixed["tokens_per_s"].iloc[0]) if len(mixed) and bool(mixed["feasible"].iloc[0]) else math.nan
        b = float(best_row["tokens_per_s"].iloc[0]) if len(best_row) else math.nan
        out.append(
            [sc, pair, model, seq, m, best, b, m / b if b and not math.isnan(m) and not math.isnan(b) else math.nan]
        )
    return pd.DataFrame(out, columns=cols)
