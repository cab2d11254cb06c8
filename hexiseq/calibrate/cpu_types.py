"""data/gpus-cpu.yaml, the emulated CPU device types, written from a reference profile of this
project's machine (data/profiles/cpu-4.yaml):

    python -m hexiseq.calibrate.cpu_types data/profiles/cpu-4.yaml     # rewrites data/gpus-cpu.yaml

One unpaced rank, CPU-x1, is the profile's figures of each measured type with the rates multiplied
back by its factor (a CPU-x4 rank measured at r stands for a core at 4r) and its per-operator time
divided by it, the median over the types; every CPU-x<f> is then CPU-x1 with the compute and memory
rates divided by f and the per-operator time multiplied by f (emulated_clusters.derived_type).
Efficiencies, the per-row attention cost and the links are the measured ones; memory is the
machine's memory shared by four ranks. Every number cites `hexiseq_cpu_profile` (data/validation/sources.yaml).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable

from ..specs import GPUType
from ..specs.files import data_path, write_text_atomic
from ..specs.gpus import catalog_field_order, numeric_fields
from .emulated_clusters import at_factor, cpu_factor, derived_type
from .profile import Profile

# the CPU types the catalog holds: local worlds and cpu-4 use 1-10; cpu-8 uses 8 and 20 (twice cpu-4's
# factors: eight ranks in the 0.7 of a core cpu-4's four take)
FACTORS = (1.0, 2.0, 4.0, 8.0, 10.0, 20.0)
SOURCE_KEY = "hexiseq_cpu_profile"


def base_type(profile: Profile) -> GPUType:
    """CPU-x1 from the profile (module doc)."""
    rows = []
    for name, fields in profile.gpus.items():
        f = cpu_factor(name)
        if f is None:
            continue
        rows.append(at_factor(fields, 1.0 / f))
    if not rows:
        raise ValueError("the profile measured no CPU-x<f> type")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    mem = (profile.measured.get("machine") or {}).get("memory_gib") or 16.0
    return GPUType(
        name="CPU-x1",
        memory_gib=float(max(1, int(mem // 4))),
        link_kind="loopback",
        sources={k: SOURCE_KEY for k in numeric_fields()},
        **{k: float(v) for k, v in med.items()},
    )


def with_derived_types(profile: Profile, types: Iterable[str]) -> Profile:
    """`profile` with figures for each emulated CPU type of `types` it did not measure, by the
    catalog's own rule (module doc): CPU-x1 from the types it measured, then the rates divided by f.
    A calibration of cpu-4 (CPU-x4, CPU-x10) so describes cpu-8's CPU-x8 and CPU-x20: the same ranks
    of the same machine, slowed by other factors."""
    missing = [t for t in types if t not in profile.gpus and cpu_factor(t) is not None]
    if not missing:
        return profile
    base = base_type(profile)
    keys = list(next(iter(profile.gpus.values())))
    gpus = dict(profile.gpus)
    for name in missing:
        derived = derived_type(base, cpu_factor(name) or 1.0, name=name)
        gpus[name] = {k: float(getattr(derived, k)) for k in keys}
    notes = (profile.notes + " " if profile.notes else "") + (
        f"{', '.join(missing)} derived from the measured types (hexiseq.calibrate.cpu_types.with_derived_types)."
    )
    return Profile(gpus, profile.measured, notes)


def catalog_text(profile: Profile, where: str) -> str:
    """The text of data/gpus-cpu.yaml."""
    base = base_type(profile)
    m = profile.measured
    machine, load = m.get("machine") or {}, m.get("load_average") or {}
    lines = [
        "# yaml-language-server: $schema=schemas/gpus.schema.json",
        "# Emulated CPU device types (hexiseq/runtime/emulation.py): CPU-x<f> is one CPU rank (one torch thread) "
        "slowed f",
        "# times by pacing. Written by `python -m hexiseq.calibrate.cpu_types " + where + "` from that profile:",
        f"#   `{m.get('command')}`, {m.get('when')}, {machine.get('cpu')} ({machine.get('cores')} cores),",
        f"#   load average {(load.get('before') or ['?'])[0]} -> {(load.get('after') or ['?'])[0]}.",
        "# CPU-x1 = the measured types' figures with the rates times their factor (median); CPU-x<f> = CPU-x1 with",
        "# peak_bf16_tflops and hbm_bandwidth_gbps divided by f. Bytes are bf16-counted (2 per element) "
        "as the cost model",
        "# counts them; 'peak' is the fastest rate a rank reached, so the efficiencies are fractions of it. "
        "memory_gib: the",
        "# machine's memory shared by four ranks. These describe this project's machine: on another, profile it",
        "# (`hexiseq profile --cluster cpu-4`) and pass --profile, or rewrite this file from the new profile.",
    ]
    for f in FACTORS:
        g = derived_type(base, f, name=f"CPU-x{f:g}")
        lines.append(f"CPU-x{f:g}:")
        for key in catalog_field_order():
            v = getattr(g, key)
            lines.append(f"  {key}: {v}" if isinstance(v, str) else f"  {key}: {float(f'{v:.4g}'):g}")
        lines.append("  sources:")
        lines += [f"    {k}: {SOURCE_KEY}" for k in numeric_fields()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python -m hexiseq.calibrate.cpu_types PROFILE.yaml   (rewrites data/gpus-cpu.yaml)", file=sys.stderr
        )
        return 2
    prof = Profile.load(argv[0])
    out = data_path("gpus-cpu.yaml")
    write_text_atomic(out, catalog_text(prof, argv[0]))
    print(f"{out} written from {argv[0]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
