"""`hexiseq profile`: measure the local devices and links of a running world and write a profile the
cost model reads (`hexiseq plan/estimate --profile FILE`, data/profiles/README.md).

A profile is a `data/profiles/` YAML file: `gpus` holds, per device type of the world, the GPUType
fields the cost model uses, derived from the measurements (measure.py); `measured` keeps the record
— the command, when, on what machine and under what load, the world and its emulation, and every
raw figure. The derivation (per rank, then the median of the ranks of one type):

    peak_bf16_tflops     the fastest rate measured on the rank (linear layers, LM head, a square GEMM,
                         attention): on a CPU the "peak" is what this rank reaches, so efficiencies <= 1
    eff_matmul           the linear layers' rate (FLOP-weighted over one layer's projections) / peak
    eff_attention        the attention kernels' rate per visible pair (full blocks) / peak; per type,
                         one fit of all its ranks' block timings (`type_attention`)
    attn_block_half_keys the per-row cost of an attention block, in keys (the full blocks' intercept)
    hbm_bandwidth_gbps   the larger of a streaming copy and the memory-bound kernels' rate (bf16 bytes)
    eff_hbm              the memory-bound kernels' rate / hbm_bandwidth_gbps
    link_bandwidth_gbps, link_latency_us   the median ping-pong bandwidth and latency over the rank's
                         pairs inside its node (the real links; emulated ones are recorded as a check);
                         on an emulated world the latency is the paced exchange's (measure.py)

Emulated CPU types (CPU-x<f>) are measured like any other: the median over the type's own ranks. They
are not one core divided by f: a paced rank sleeps between its operators, and the more it sleeps the
more CPU each operator takes on waking (cold caches). Measured on this project's 2-core VM (cpu-8's
profile of 2026-12-04, `measured.ranks` of the calibration then kept in data/results/dp-calibration/
cpu-8/calibration.json): the CPU-x20 ranks'
per-operator time was 7.0-7.7 us of one core against 5.3-5.6 us on the CPU-x8 ranks, their linear
and memory-bound rates 10% and 12% lower per core (benchmarks/bench_pacing.py measures it alone).
Pooled into one core, those differences put every CPU-x20 rank's device time 5-20% short and every
CPU-x8 rank's a few % over.

Bytes are counted as the cost model counts them (bf16, 2 per element), whatever the CPU run's dtype,
so the figures plug into the cost model unchanged.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import HexiSeqError
from ..plan import symmetric_plan
from ..runtime.emulation import warm_cores
from ..runtime.llama import LlamaConfig
from ..runtime.world import spawn_world
from ..specs import ClusterSpec, get_model, gpu_catalog, load_cluster, load_profile, read_yaml
from ..specs.files import write_text_atomic
from .emulated_clusters import check_emulated, emulation_for, local_cluster
from .measure import MeasureJob, fit_attention, measure_worker

SCHEMA_LINE = "# yaml-language-server: $schema=../schemas/profile.schema.json\n"
DEFAULT_MODEL = "tiny"


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


@dataclass
class Profile:
    """A measured profile: `gpus` {device type: GPUType fields} (what the cost model reads) and the
    `measured` record (module doc)."""

    gpus: dict[str, dict[str, float]]
    measured: dict[str, Any] = field(default_factory=dict)
    notes: str = ""

    # ------------------------------------------------------------------ the cost model's view
    def apply(self, cluster: ClusterSpec) -> ClusterSpec:
        """`cluster` with the profile's figures for its device types (ClusterSpec.with_profile)."""
        return cluster.with_profile({k: v for k, v in self.gpus.items() if k in cluster.gpu_types})

    def cluster(self) -> ClusterSpec:
        """The world the profile measured, as a cluster with the profile applied."""
        world = self.measured.get("world", {})
        name = world.get("cluster")
        if name:
            return self.apply(load_cluster(name))
        types = world.get("types") or []
        if not types or len(set(types)) != 1:
            raise HexiSeqError("this profile does not record the world it measured (measured.world); give a cluster")
        return self.apply(
            ClusterSpec.from_nodes(
                f"cpu-local-{len(types)}", [(types[0], len(types), self.gpus[types[0]]["link_bandwidth_gbps"])]
            )
        )

    @property
    def world_size(self) -> int:
        return int(self.measured.get("world", {}).get("ranks", 0))

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return {"notes": self.notes, "gpus": self.gpus, "measured": self.measured}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """The inverse of `to_dict` (the `profile` record of a calibration.json)."""
        return cls(d["gpus"], d.get("measured") or {}, d.get("notes") or "")

    def to_yaml(self) -> str:
        """The profile file's text (data/profiles/README.md); `load_profile` reads it."""
        body = yaml.safe_dump(_plain(self.to_dict()), sort_keys=False, width=120, default_flow_style=None)
        return SCHEMA_LINE + body

    def save(self, path: Path | str) -> Path:
        """Write the file whole (a temporary file, then a rename)."""
        path = Path(path)
        write_text_atomic(path, self.to_yaml())
        return path

    @classmethod
    def load(cls, path: Path | str) -> Profile:
        """A profile file, checked as `hexiseq plan --profile` checks it (SpecError naming each problem)."""
        gpus = load_profile(path)
        raw = read_yaml(path)
        return cls(gpus, dict(raw.get("measured") or {}), raw.get("notes") or "")

    def summary(self) -> str:
        """One line per device type: the figures the cost model will use."""
        lines = [self.notes] if self.notes else []
        for name, g in self.gpus.items():
            lines.append(
                f"{name}: linear {g['peak_bf16_tflops'] * g['eff_matmul'] * 1e3:.2f} GFLOP/s, attention "
                f"{g['peak_bf16_tflops'] * g['eff_attention'] * 1e3:.2f} GFLOP/s (half rate at "
                f"{g['attn_block_half_keys']:.0f} keys), "
                f"memory-bound {g['hbm_bandwidth_gbps'] * g['eff_hbm']:.2f} GB/s"
                + (f" + {g['op_overhead_us']:.1f} us per operator" if "op_overhead_us" in g else "")
                + f", link {g['link_bandwidth_gbps']:.3f} GB/s + {g['link_latency_us']:.0f} us"
            )
        return "\n".join(lines)


def _plain(x: Any) -> Any:
    """YAML-friendly: floats to 4 significant digits, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, str):
        return str(x)  # also str subclasses (torch's version string)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float) or hasattr(x, "__float__"):
        return _sig(float(x))
    return x


def machine() -> dict[str, Any]:
    """What the profile was measured on, and the load it was measured under."""
    import torch

    cpu = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), None)
    except OSError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "system": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ---------------------------------------------------------------------- deriving the figures


def rank_figures(m: Mapping[str, Any], intra_pairs: list[dict[str, Any]]) -> dict[str, float]:
    """GPUType fields of one rank from its measurements (module doc)."""
    mm, att, mem = m["matmul"], m["attention"], m["memory"]
    peak = max(mm["layer_tflops"], mm["square"]["tflops"], mm["lm_head"]["tflops"], att["tflops"])
    hbm = max(mem["gbps"], mem["copy"]["gbps"])
    out = {
        "peak_bf16_tflops": peak,
        "eff_matmul": mm["layer_tflops"] / peak,
        "eff_attention": att["tflops"] / peak,
        "attn_block_half_keys": att["half_keys"],
        "hbm_bandwidth_gbps": hbm,
        "eff_hbm": mem["gbps"] / hbm,
        "op_overhead_us": mem.get("op_us", 0.0),
    }
    measured = [p["gbps"] for p in intra_pairs if p["gbps"]]
    if measured:
        out["link_bandwidth_gbps"] = statistics.median(measured)
        # an emulated world's per-message latency is what a message costs between paced ranks (measure.py)
        out["link_latency_us"] = statistics.median(p.get("paced_latency_us", p["latency_us"]) for p in intra_pairs)
    return out


def type_attention(atts: list[Mapping[str, Any]], op_us: float) -> dict[str, float]:
    """The attention fit of one device type: every rank's full-block timings in one fit
    (measure.fit_attention: slopes within each rank, their repeated median over the type) with the
    type's per-operator time. A median of per-rank fits carries one stretched rank half way when the
    type has two ranks (it is their mean); the fastest timing of each length over the ranks mixes
    ranks whose fixed costs differ. benchmarks/bench_profile_attention.py measures the spread of this
    fit over repeated profiles against the two-point fit it replaced
    (data/results/profile-attention.txt)."""
    first = atts[0]
    series = [[(b["lk"], b["seconds"]) for b in a["blocks"] if b["kind"] == "full"] for a in atts]
    lq = next(b["lq"] for b in first["blocks"] if b["kind"] == "full")
    return fit_attention(lq, series, first["per_pair_flops"], first["bwd_factor"], first["operators"], op_us)


def derive(
    ranks: list[dict[str, Any]], types: list[str], cluster: ClusterSpec, emulation: dict[str, Any] | None
) -> dict[str, dict[str, float]]:
    """{type: GPUType fields}: each rank's figures, then the median over the ranks of a type -- emulated
    CPU types too (module doc: a type's pacing changes what each operator costs, so one core divided by
    f is not what its ranks run; the per-rank figures stay in the record)."""
    pairs = [p for r in ranks for p in r["links"]["pairs"]]
    emulated = {
        (a, b)
        for a in range(len(types))
        for b in range(len(types))
        if emulation and emulation["link_gbps"] and emulation["link_gbps"][a][b] > 0
    }
    real = [p for p in pairs if (p["a"], p["b"]) not in emulated]
    per_rank = []
    for r in ranks:
        mine = [p for p in real if r["rank"] in (p["a"], p["b"])] or real
        per_rank.append(rank_figures(r, mine))
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(types):
        rows = [f for f, t in zip(per_rank, types) if t == name]
        keys = [k for k in rows[0] if all(k in row for row in rows)]
        fields = {k: statistics.median(row[k] for row in rows) for k in keys}
        att = type_attention([r["attention"] for r, t in zip(ranks, types) if t == name], fields["op_overhead_us"])
        fields.update(eff_attention=att["tflops"] / fields["peak_bf16_tflops"], attn_block_half_keys=att["half_keys"])
        if "link_bandwidth_gbps" not in fields:  # a world of one rank: no link measured, the catalog's stays
            g = gpu_catalog()[name]
            fields.update(link_bandwidth_gbps=g.link_bandwidth_gbps, link_latency_us=g.link_latency_us)
        fields.update(
            eff_matmul=min(1.0, fields["eff_matmul"]),
            eff_attention=min(1.0, fields["eff_attention"]),
            eff_hbm=min(1.0, fields["eff_hbm"]),
            link_efficiency=1.0,
            nic_efficiency=1.0,
            overlap_slowdown=0.0,
        )
        out[name] = {k: _sig(v) for k, v in fields.items()}
    return out


# ---------------------------------------------------------------------- the entry point


def resolve_world(world: int | None, cluster: str | ClusterSpec | None) -> tuple[ClusterSpec, bool]:
    """(the cluster whose devices 0..world-1 the ranks are, whether it was named); checked before any rank starts."""
    if cluster is not None:
        spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
        check_emulated(spec)
        n = spec.size if world is None else world
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise HexiSeqError(f"world must be a positive number of ranks, got {n!r}")
        if n > spec.size:
            raise HexiSeqError(
                f"world of {n} ranks, but cluster {spec.name!r} has {spec.size} devices: give --world {spec.size} "
                f"or less (ranks are its devices 0..{spec.size - 1})"
            )
        if n < spec.size:
            raise HexiSeqError(
                f"world of {n} ranks leaves devices {n}..{spec.size - 1} of cluster {spec.name!r} unmeasured; "
                f"profile the whole cluster (--world {spec.size})"
            )
        return spec, True
    return local_cluster(4 if world is None else world), False


def profile(
    world: int | None = None,
    cluster: str | ClusterSpec | None = None,
    model: str = DEFAULT_MODEL,
    seq_len: int | None = None,
    quick: bool = False,
    repeats: int | None = None,
    timeout_s: float = 900.0,
    say: Callable[[str], None] | None = None,
) -> Profile:
    """Measure a world of CPU ranks (module doc) and return its profile.

    `cluster`: an emulated cluster (e.g. "cpu-4"): its ranks emulate its devices and links; default:
    `world` (4) ranks of this machine in one node. `model`/`seq_len`: whose shapes are timed (default
    tiny at 8K tokens; `quick`: 2K tokens, 2 repeats — for tests)."""
    from dataclasses import asdict

    say = say or (lambda s: None)
    spec, named = resolve_world(world, cluster)
    n = spec.size
    mspec = get_model(model)
    cfg = LlamaConfig.from_spec(mspec)
    S = seq_len or (2048 if quick else 8192)
    ring = symmetric_plan(
        range(n), 2 * n * 64, mspec.heads, mspec.kv_heads, cp=n, hp=1, block_size=64, cluster=spec.name
    )
    emu = emulation_for(ring, spec)  # rank r = device r
    job = MeasureJob(
        asdict(cfg),
        mspec.name,
        S,
        emu.to_dict(),
        repeats=repeats or (2 if quick else 5),
        link_elems=(1 << 18) if quick else (1 << 20),
    )
    started, load0 = _dt.datetime.now(_dt.UTC), _load()
    say(
        f"profiling {n} CPU ranks ({', '.join(f'{t} x{c}' for t, c in spec.gpu_types.items())}) on {model} shapes at "
        f"S={S:,} ..."
    )
    with warm_cores():
        ranks = spawn_world(measure_worker, n, job, timeout_s=timeout_s)
    load1 = _load()
    types = [d.gpu.name for d in spec.devices]
    gpus = derive(ranks, types, spec, emu.to_dict())
    links = [
        {
            **p,
            "emulated": bool(emu.link(p["a"], p["b"])),
            **(
                {
                    "declared_gbps": _sig(emu.link(p["a"], p["b"])[0] / 1e9),
                    "declared_latency_us": _sig(emu.link(p["a"], p["b"])[1] * 1e6),
                }
                if emu.link(p["a"], p["b"])
                else {}
            ),
        }
        for r in ranks
        for p in r["links"]["pairs"]
    ]
    command = " ".join(
        ["hexiseq profile"]
        + ([f"--cluster {spec.name}"] if named else [f"--world {n}"])
        + [f"--model {model}"]
        + [f"--seq-len {S}"]
        + (["--quick"] if quick else [])
    )
    mach = machine()
    record = {
        "command": command,
        "when": started.isoformat(timespec="seconds"),
        "machine": mach,
        "load_average": {
            "before": load0,
            "after": load1,
            "note": "1/5/15-minute load of the machine; a loaded machine measures slower",
        },
        "world": {
            "ranks": n,
            "cluster": spec.name if named else None,
            "types": types,
            "backend": "gloo",
            "emulation": {"slowdown": list(emu.slowdown), "emulated_links": sum(1 for x in links if x["emulated"])},
        },
        "model": mspec.name,
        "seq_len": S,
        "repeats": job.repeats,
        "bytes_per_element": 2,
        "ranks": [{k: v for k, v in r.items() if k != "links"} for r in ranks],
        "links": links,
        "all_to_all": [r["links"]["all_to_all"] for r in ranks],
    }
    notes = (
        f"Measured by `{command}` on {mach['cpu']} ({mach['cores']} cores), torch {mach['torch']}, "
        f"{started:%Y-%m-%d %H:%M} UTC, load average {load0[:1]} -> {load1[:1]}. CPU ranks (gloo), every figure "
        f"emulated where the type is CPU-x<f> > 1 (hexiseq/runtime/emulation.py)."
    )
    prof = Profile(gpus, record, notes)
    say(prof.summary())
    return prof


__all__ = ["DEFAULT_MODEL", "Profile", "derive", "machine", "type_attention", "profile", "resolve_world"]
