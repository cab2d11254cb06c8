"""Runs on a Slurm cluster: the sbatch script of a plan, the checks before submitting, the job handle.

A plan's nodes (in the order its node mapping expects: `runtime.placement.plan_nodes`) become one
Slurm job, or a heterogeneous job when they come from different partitions (one component per run
of consecutive nodes with the same partition and process count). Every node runs one `torchrun`
agent (`hexiseq.runs.slurm_node` starts it with HEXISEQ_NODE, that node's index among the plan's
nodes) and the agents meet at a c10d rendezvous on the first node. The job asks Slurm for SIGTERM before its time
ends (`--signal`); `scancel` sends SIGTERM too: the ranks finish their step, checkpoint and write
the summary ("stopped"), and `hexiseq launch --slurm --resume RUN_DIR` continues the run.

From Python (`hexiseq.launch(plan, backend="slurm", partition=...)`) a one-component job goes
through submitit, a heterogeneous one through the generated script; both return a `SlurmRun`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HexiSeqError, RunFailed
from ..plan import Plan
from ..runtime.placement import plan_nodes
from ..specs import ClusterFile, ClusterSpec, load_cluster, read_yaml
from ..specs.files import data_path
from ..specs.schema import validate
from .rundir import RunDir, RunView, load_summary

SLURM_COMMANDS = ("sbatch", "sinfo", "scontrol", "scancel", "squeue")
SIGNAL_BEFORE_END_S = 120  # SIGTERM this long before the time limit: enough to finish a step and checkpoint
NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
TERMINAL_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE")
ALL_TYPES = "*"  # the partition key of every GPU type (`--partition NAME`)
# The options of `hexiseq.launch(..., backend="slurm")` that are Slurm's, not the run's.
LAUNCH_OPTIONS = (
    "partition",
    "time",
    "account",
    "qos",
    "constraint",
    "gpus",
    "cpus_per_task",
    "env",
    "signal_s",
    "job_name",
    "submitit",
    "check",
)


def require_slurm() -> None:
    """HexiSeqError naming the Slurm commands that are not on PATH."""
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        raise HexiSeqError(
            f"Slurm commands not found: {', '.join(missing)} (not on PATH): run this on a Slurm login node, "
            "or give --dry-run to only print the job script"
        )


# ------------------------------------------------------------------------------ the job


@dataclass(frozen=True)
class SlurmOptions:
    """What the job asks Slurm for, besides the nodes. `partitions`: GPU type -> partition (`"*"`:
    every type); `time` a Slurm time (`4:00:00`, `30`: minutes); `gpus` False requests no GPUs
    (CPU ranks with gloo, e.g. a test cluster); `env` variables the job script exports."""

    partitions: Mapping[str, str] = field(default_factory=dict)
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus: bool = True
    cpus_per_task: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    signal_s: int = SIGNAL_BEFORE_END_S
    job_name: str | None = None

    def partition_of(self, gpu: str) -> str | None:
        return self.partitions.get(gpu) or self.partitions.get(ALL_TYPES)


@dataclass(frozen=True)
class Component:
    """One component of the job: `nodes` nodes of `partition`, `procs` ranks (GPUs) on each; its
    first node is the plan's node `first_node`."""

    partition: str
    gpu: str
    nodes: int
    procs: int
    first_node: int


@dataclass(frozen=True)
class SlurmJob:
    """A run as a Slurm job: its components in the plan's node order, the options, and the
    `hexiseq run` arguments every torchrun agent gets (HEXISEQ_NODE tells each its node)."""

    name: str
    run_dir: Path
    components: tuple[Component, ...]
    options: SlurmOptions
    run_args: tuple[str, ...]
    python: str = sys.executable
    workdir: Path = field(default_factory=Path.cwd)

    @property
    def heterogeneous(self) -> bool:
        return len(self.components) > 1

    @property
    def nnodes(self) -> int:
        return sum(c.nodes for c in self.components)

    @property
    def world_size(self) -> int:
        return sum(c.nodes * c.procs for c in self.components)

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "slurm"


def parse_partitions(values: Sequence[str] | str | Mapping[str, str] | None) -> dict[str, str]:
    """`--partition` values: `NAME` (every GPU type) or `GPU_TYPE=NAME`, repeated; or a mapping."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return {str(k): str(v) for k, v in values.items()}
    if isinstance(values, str):
        values = [values]
    out: dict[str, str] = {}
    for v in values:
        gpu, sep, name = v.partition("=")
        if not sep:
            gpu, name = ALL_TYPES, v
        if not gpu or not name:
            raise HexiSeqError(f"--partition {v!r}: give NAME or GPU_TYPE=NAME (e.g. H100-SXM=h100)")
        out[gpu] = name
    return out


def cluster_slurm(cluster_ref: str | None):
    """The `slurm:` section (SlurmSection) of a plan's cluster file, or None."""
    if not cluster_ref:
        return None
    p = Path(cluster_ref)
    if not p.suffix and not p.exists():
        p = data_path("clusters") / f"{cluster_ref}.yaml"
    if not p.exists():
        return None
    from pydantic import TypeAdapter

    return validate(TypeAdapter(ClusterFile), read_yaml(p), str(cluster_ref)).slurm


def options_with_cluster(options: SlurmOptions, cluster_ref: str | None) -> SlurmOptions:
    """`options` completed from the cluster file's `slurm:` section (given options win)."""
    section = cluster_slurm(cluster_ref)
    if section is None:
        return options
    return dataclasses.replace(
        options,
        partitions=dict(options.partitions) or dict(section.partitions),
        account=options.account or section.account,
        qos=options.qos or section.qos,
        constraint=options.constraint or section.constraint,
    )


def components(plan: Plan, cluster: ClusterSpec | None, options: SlurmOptions) -> tuple[Component, ...]:
    """The job's components: the plan's nodes in its node order, consecutive nodes of one partition
    and process count merged. HexiSeqError when a GPU type of the plan has no partition."""
    nodes = plan_nodes(plan, cluster)
    types = [cluster.devices[devs[0]].gpu.name if cluster is not None else ALL_TYPES for devs in nodes]
    unmapped = sorted({t for t in types if options.partition_of(t) is None})
    if unmapped and cluster is None:
        raise HexiSeqError(
            f"plan {plan.name!r} names no cluster (its {plan.world_size} ranks run on one node): give --partition NAME"
        )
    if unmapped:
        known = ", ".join(f"{k}={v}" for k, v in options.partitions.items()) or "none given"
        raise HexiSeqError(
            f"plan {plan.name!r} runs on {', '.join(dict.fromkeys(types))} nodes but no Slurm partition is given for "
            f"{', '.join(unmapped)} (partitions: {known}): give --partition GPU_TYPE=NAME for each type, "
            "--partition NAME for all, or a slurm: partitions section in the cluster file"
        )
    out: list[Component] = []
    for n, (devs, gpu) in enumerate(zip(nodes, types)):
        part = options.partition_of(gpu)
        last = out[-1] if out else None
        if last is not None and (last.partition, last.gpu, last.procs) == (part, gpu, len(devs)):
            out[-1] = dataclasses.replace(last, nodes=last.nodes + 1)
        else:
            out.append(Component(part, gpu, 1, len(devs), n))
    return tuple(out)


def make_job(
    plan: Plan,
    run_dir: Path | str,
    run_args: Sequence[str],
    options: SlurmOptions,
    *,
    python: str | None = None,
    workdir: Path | str | None = None,
) -> SlurmJob:
    """The Slurm job of a run of `plan` (its cluster file maps the plan's devices to nodes)."""
    cluster = load_cluster(plan.cluster) if plan.cluster else None
    options = options_with_cluster(options, plan.cluster)
    return SlurmJob(
        name=options.job_name or _job_name(plan.name),
        run_dir=Path(run_dir),
        components=components(plan, cluster, options),
        options=options,
        run_args=tuple(run_args),
        python=python or sys.executable,
        workdir=Path(workdir) if workdir is not None else Path.cwd(),
    )


def _job_name(plan_name: str) -> str:
    """hexiseq-<plan name> (the planner's plans are named "hexiseq": that name alone)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", plan_name or "run")
    return name if name.startswith("hexiseq") else f"hexiseq-{name}"


def _q(x: Any) -> str:
    return shlex.quote(str(x))


def _component_line(job: SlurmJob, c: Component) -> str:
    o = job.options
    flags = [f"--partition={c.partition}", f"--nodes={c.nodes}", "--ntasks-per-node=1"]
    if o.gpus:
        flags.append(f"--gres=gpu:{c.procs}")
    if o.cpus_per_task:
        flags.append(f"--cpus-per-task={o.cpus_per_task}")
    if o.constraint:
        flags.append(f"--constraint={_q(o.constraint)}")
    return "#SBATCH " + " ".join(flags)


def torchrun_path(python: str) -> str:
    """The torchrun next to the interpreter (the same environment on every node)."""
    return str(Path(python).with_name("torchrun"))


def render(job: SlurmJob) -> str:
    """The sbatch script of `job` (deterministic: the golden-file tests compare it)."""
    o, comps = job.options, job.components
    kind = "a heterogeneous job" if job.heterogeneous else "one job"
    lines = [
        "#!/bin/bash",
        f"# hexiseq launch: {job.world_size} ranks on {job.nnodes} node{'s' * (job.nnodes > 1)}, {kind}:",
        *(
            f"#   {'component ' + str(i) + ': ' if job.heterogeneous else ''}partition {c.partition}, "
            f"{c.nodes} node{'s' * (c.nodes > 1)} x {c.procs} {c.gpu if c.gpu != ALL_TYPES else 'ranks'} "
            f"(plan node{'s' * (c.nodes > 1)} {c.first_node}"
            f"{'-' + str(c.first_node + c.nodes - 1) if c.nodes > 1 else ''})"
            for i, c in enumerate(comps)
        ),
        "# A signal (scancel, or the time limit near) stops the run at a step boundary with a checkpoint;",
        f"# continue it with: hexiseq launch --slurm --resume {job.run_dir}",
        f"#SBATCH --job-name={_q(job.name)}",
        f"#SBATCH --output={_q(job.log_dir / '%j.out')}",
        f"#SBATCH --chdir={_q(job.workdir)}",
        "#SBATCH --export=ALL",
        f"#SBATCH --signal=TERM@{o.signal_s}",
    ]
    lines += [f"#SBATCH --{k}={_q(v)}" for k, v in (("time", o.time), ("account", o.account), ("qos", o.qos)) if v]
    for i, c in enumerate(comps):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(_component_line(job, c))
    first_nodes = "SLURM_JOB_NODELIST_HET_GROUP_0" if job.heterogeneous else "SLURM_JOB_NODELIST"
    lines += [
        "",
        "set -u",
        "export PYTHONUNBUFFERED=1",
        *(f"export {k}={_q(v)}" for k, v in sorted(o.env.items())),
        "# the c10d rendezvous: on the first node, at the address Slurm reaches it by",
        f'head=$(scontrol show hostnames "${first_nodes}" | head -n 1)',
        "addr=$(scontrol show node \"$head\" -o | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'export HEXISEQ_RDZV="${addr:-$head}:$((20000 + SLURM_JOB_ID % 20000))"',
        "trap 'echo \"hexiseq: signalled: the run stops at its next step boundary and checkpoints\"' TERM",
        "",
        "# one torchrun agent per node, each told its index among the plan's nodes",
    ]
    for i, c in enumerate(comps):
        group = f" --het-group={i}" if job.heterogeneous else ""
        torchrun = (
            f"{_q(torchrun_path(job.python))} --nnodes={job.nnodes} --nproc-per-node={c.procs} --rdzv-backend=c10d "
            '--rdzv-endpoint="$HEXISEQ_RDZV" --rdzv-id="$SLURM_JOB_ID" -m hexiseq.cli'
        )
        lines.append(
            f"srun{group} --nodes={c.nodes} --ntasks-per-node=1 "
            f"{_q(job.python)} -m hexiseq.runs.slurm_node --first-node {c.first_node} -- \\\n    {torchrun} \\\n    "
            + " ".join(_q(a) for a in job.run_args)
            + " &"
        )
    lines += [
        "",
        "# wait for every agent (a signal interrupts wait: wait again), then say how the run ended",
        "rc=0",
        "for pid in $(jobs -p); do",
        '    while true; do wait "$pid"; s=$?',
        '        if [ "$s" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi; break',
        "    done",
        '    [ "$s" -ne 0 ] && rc=$s',
        "done",
        f"{_q(job.python)} -m hexiseq.runs.slurm_node --report {_q(job.run_dir)} --rc $rc",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class PartitionInfo:
    """What sinfo says about a partition: its nodes and each node's generic resources."""

    name: str
    nodes: dict[str, str]  # node -> GRES ("gpu:h100:8", "(null)")
    state: str = "up"


def read_partitions() -> dict[str, PartitionInfo]:
    """Every partition with its nodes and their GRES (`sinfo -N`)."""
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%P|%G|%a"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise HexiSeqError(f"sinfo failed (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    parts: dict[str, PartitionInfo] = {}
    for line in res.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 4:
            continue
        node, part, gres, avail = fields[:4]
        part = part.rstrip("*")
        info = parts.setdefault(part, PartitionInfo(part, {}, avail))
        info.nodes[node] = gres
    return parts


def _gres_gpus(gres: str) -> tuple[str | None, int | None]:
    """('h100', 8) of 'gpu:h100:8(S:0-1)'; (None, 8) of 'gpu:8'; (None, None) without GPUs."""
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 2 and parts[1].isdigit():
            return None, int(parts[1])
        if len(parts) >= 3 and parts[-1].isdigit():
            return parts[1], int(parts[-1])
    return None, None


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def check_job(job: SlurmJob, partitions: Mapping[str, PartitionInfo] | None = None) -> list[str]:
    """Check the job against the cluster before submitting: every partition exists and is up, has
    the nodes the job needs, and (when GPUs are requested) enough GPUs of the plan's type per node.
    HexiSeqError on the first problem; returns warnings (a node-local run directory)."""
    parts = read_partitions() if partitions is None else partitions
    need: dict[str, int] = {}
    for c in job.components:
        need[c.partition] = need.get(c.partition, 0) + c.nodes
    for c in job.components:
        info = parts.get(c.partition)
        if info is None:
            raise HexiSeqError(
                f"Slurm has no partition {c.partition!r} (for the plan's {c.gpu} nodes); partitions: "
                f"{', '.join(sorted(parts)) or 'none'}: give --partition {c.gpu}=NAME"
            )
        if info.state not in ("up", ""):
            raise HexiSeqError(f"Slurm partition {c.partition!r} is {info.state}, not up")
        if len(info.nodes) < need[c.partition]:
            raise HexiSeqError(
                f"the plan needs {need[c.partition]} node{'s' * (need[c.partition] > 1)} of partition "
                f"{c.partition!r} but it has {len(info.nodes)} ({', '.join(info.nodes)})"
            )
        if job.options.gpus:
            fit = []
            for node, gres in info.nodes.items():
                gtype, count = _gres_gpus(gres)
                if gtype and c.gpu != ALL_TYPES and _norm(gtype) not in _norm(c.gpu):  # "h100" in "H100-SXM"
                    raise HexiSeqError(
                        f"partition {c.partition!r} has {gtype} GPUs (node {node}: {gres}) but the plan's nodes there "
                        f"are {c.gpu}: map {c.gpu} to its own partition (--partition {c.gpu}=NAME)"
                    )
                if count is not None and count >= c.procs:
                    fit.append(node)
            if len(fit) < c.nodes:
                have = ", ".join(f"{n}: {g}" for n, g in info.nodes.items())
                raise HexiSeqError(
                    f"the plan runs {c.procs} ranks per {c.gpu} node but partition {c.partition!r} has "
                    f"{len(fit)} node{'s' * (len(fit) != 1)} with {c.procs} or more GPUs ({have}); "
                    "use --no-gpus for CPU ranks"
                )
    warnings = []
    where = str(job.run_dir.resolve())
    if any(where == p or where.startswith(p + "/") for p in NODE_LOCAL_PREFIXES):
        warnings.append(
            f"the run directory {where} looks node-local: every node writes and reads it (plan, checkpoints, "
            "metrics); put it on a filesystem all nodes share"
        )
    return warnings


# ------------------------------------------------------------------------------ submitting


def sbatch(script: Path, test_only: bool = False) -> str:
    """Submit `script`; its job id (`test_only`: sbatch --test-only's answer, nothing submitted)."""
    cmd = ["sbatch", "--test-only", str(script)] if test_only else ["sbatch", "--parsable", str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise HexiSeqError(f"sbatch refused {script}: {(res.stderr or res.stdout).strip()}")
    if test_only:
        return (res.stderr + res.stdout).strip()
    return res.stdout.strip().split(";")[0]


def write_script(job: SlurmJob) -> Path:
    """The job's script in RUN_DIR/slurm/ (job-N.sbatch: the first free N)."""
    job.log_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while (job.log_dir / f"job-{n}.sbatch").exists():
        n += 1
    path = job.log_dir / f"job-{n}.sbatch"
    path.write_text(render(job))
    return path


def submit_script(job: SlurmJob) -> SlurmRun:
    """Write the job's script into the run directory and sbatch it."""
    script = write_script(job)
    job_id = sbatch(script)
    _record(job, job_id, script)
    return SlurmRun(job.run_dir, job_id)


def _record(job: SlurmJob, job_id: str, script: Path | None) -> None:
    """RUN_DIR/slurm/jobs.jsonl: every job of the run (a resumed run adds one); options.json: the
    Slurm options of the last one (a resume reuses them)."""
    entry = {"job_id": job_id, "script": str(script) if script else None, "time": time.time(), "name": job.name}
    with open(job.log_dir / "jobs.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    RunDir(job.run_dir).write_json(job.log_dir / "options.json", dataclasses.asdict(job.options))


def previous_options(run_dir: Path | str) -> SlurmOptions | None:
    """The Slurm options of the run's last job (RUN_DIR/slurm/options.json), or None."""
    data = RunDir(run_dir).read_json(Path(run_dir) / "slurm" / "options.json")
    if not data:
        return None
    known = {f.name for f in dataclasses.fields(SlurmOptions)}
    return SlurmOptions(**{k: v for k, v in data.items() if k in known})


def submit_submitit(job: SlurmJob) -> SlurmRun:
    """Submit a one-component job through submitit: one task per node runs `node_main`."""
    import submitit

    (c,) = job.components
    o = job.options
    executor = submitit.AutoExecutor(folder=str(job.log_dir / "submitit"), cluster="slurm")
    extra: dict[str, Any] = {"signal": f"TERM@{o.signal_s}", "chdir": str(job.workdir), "export": "ALL"}
    if o.time:
        extra["time"] = o.time
    params: dict[str, Any] = {
        "slurm_partition": c.partition,
        "nodes": c.nodes,
        "tasks_per_node": 1,
        "name": job.name,
        "slurm_additional_parameters": extra,
    }
    if o.gpus:
        params["slurm_gres"] = f"gpu:{c.procs}"
    for key, value in (("cpus_per_task", o.cpus_per_task), ("slurm_account", o.account), ("slurm_qos", o.qos)):
        if value:
            params[key] = value
    if o.constraint:
        params["slurm_constraint"] = o.constraint
    executor.update_parameters(**params)
    env = {"PYTHONUNBUFFERED": "1", **o.env}
    torchrun = [
        torchrun_path(job.python),
        f"--nnodes={job.nnodes}",
        f"--nproc-per-node={c.procs}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint={rdzv}",
        "--rdzv-id={job_id}",
        "-m",
        "hexiseq.cli",
        *job.run_args,
    ]
    sub = executor.submit(node_main, torchrun, c.first_node, env)
    _record(job, str(sub.job_id), None)
    return SlurmRun(job.run_dir, str(sub.job_id), submitit_job=sub)


def node_main(torchrun: list[str], first_node: int, env: Mapping[str, str]) -> int:
    """A submitit task (one per node): start this node's torchrun agent and wait for it; 0, or
    HexiSeqError with the agent's exit code. A signal (scancel, the time limit) reaches torchrun and
    the ranks directly from Slurm: this process only waits (submitit ignores SIGTERM here)."""
    import submitit

    jenv = submitit.JobEnvironment()
    head = jenv.hostnames[0]
    rdzv = f"{node_address(head)}:{20000 + int(jenv.job_id.split('_')[0]) % 20000}"
    cmd = [a.format(rdzv=rdzv, job_id=jenv.job_id) for a in torchrun]
    rc = subprocess.run(cmd, env={**os.environ, **env, "HEXISEQ_NODE": str(first_node + jenv.node)}).returncode
    summary = load_summary(_arg_after(cmd, "--out") or _arg_after(cmd, "--resume") or ".") or {}
    if rc != 0 and summary.get("status") != "stopped":
        raise HexiSeqError(f"torchrun on node {first_node + jenv.node} ({head}) exited with {rc}")
    return rc


def _arg_after(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def node_address(node: str) -> str:
    """The address Slurm reaches `node` by (its NodeAddr), else the name itself."""
    try:
        res = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return node
    found = re.search(r"NodeAddr=(\S+)", res.stdout)
    return found.group(1) if found else node


# ------------------------------------------------------------------------------ the handle


def job_state(job_id: str) -> str | None:
    """The job's Slurm state (PENDING, RUNNING, COMPLETED, CANCELLED, ...); a heterogeneous job's is
    its first component's; None when Slurm no longer knows the job."""
    res = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True, timeout=30)
    states = re.findall(r"JobState=(\S+)", res.stdout)
    if states:
        return "RUNNING" if "RUNNING" in states else states[0]
    res = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True, timeout=30
    )
    lines = [ln.split()[0] for ln in res.stdout.splitlines() if ln.strip()] if res.returncode == 0 else []
    return lines[0] if lines else None


class SlurmRun(RunView):
    """A run submitted to Slurm: `.state` (Slurm's), `.status` (the run's phase), live `.metrics` and
    `.summary` read from the run directory, `.wait()`, `.cancel()`, `.watch()`."""

    def __init__(self, run_dir: Path | str, job_id: str, submitit_job: Any = None) -> None:
        self.run_dir, self.job_id, self.submitit_job = Path(run_dir), job_id, submitit_job
        self._last_state: str | None = None

    def __repr__(self) -> str:
        return f"SlurmRun({str(self.run_dir)!r}, job {self.job_id}, state={self.state!r})"

    @property
    def state(self) -> str:
        """Slurm's state of the job (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...)."""
        state = job_state(self.job_id)
        if state is None:  # forgotten by the controller (MinJobAge) and no accounting: the record says
            summary = self.summary or {}
            state = {"completed": "COMPLETED", "stopped": "CANCELLED", "failed": "FAILED"}.get(
                summary.get("status", ""), self._last_state or "UNKNOWN"
            )
        self._last_state = state
        return state

    def running(self) -> bool:
        return self.state.split()[0] not in TERMINAL_STATES + ("UNKNOWN",)

    @property
    def status(self) -> str:
        """The run's own phase while it runs (status.json), its summary's status after."""
        if self.running():
            return self.phase() or self.state.lower()
        return (self.summary or {}).get("status") or self.state.lower()

    @property
    def log(self) -> Path | None:
        """The job's output file (the script's; submitit's for a submitit job)."""
        out = self.run_dir / "slurm" / f"{self.job_id}.out"
        if out.exists():
            return out
        found = sorted((self.run_dir / "slurm" / "submitit").glob(f"{self.job_id}_0_log.*"))
        return found[0] if found else None

    @property
    def error(self) -> str | None:
        """The run's error message when it failed (its summary's, else the last lines of the job log)."""
        if self.running():
            return None
        summary = self.summary or {}
        if summary.get("status") in ("completed", "stopped"):
            return None
        if summary.get("error"):
            return summary["error"]
        log = self.log
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log else []
        return "\n".join(lines[-8:]) or f"job {self.job_id}: {self.state}"

    def wait(self, timeout: float | None = None, every: float = 1.0) -> dict[str, Any]:
        """Block until the job ends; the run's summary. RunFailed with its message when it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.running():
            if deadline is not None and time.monotonic() > deadline:
                raise HexiSeqError(f"job {self.job_id} ({self.run_dir}) is still {self.state} after {timeout:g} s")
            time.sleep(every)
        summary = self.summary or {}
        if summary.get("status") not in ("completed", "stopped"):
            raise RunFailed(f"the run in {self.run_dir} (Slurm job {self.job_id}, {self.state}) failed:\n{self.error}")
        return summary

    def cancel(self, wait: bool = True, timeout: float = 120.0) -> dict[str, Any] | None:
        """scancel the job: the ranks get SIGTERM, finish their step, checkpoint and write the summary
        (status "stopped"); `hexiseq launch --slurm --resume RUN_DIR` continues it."""
        subprocess.run(["scancel", self.job_id], capture_output=True, text=True, timeout=30)
        if wait:
            deadline = time.monotonic() + timeout
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.5)
        return self.summary

    stop = cancel

    def watch(self, every: float = 2.0) -> dict[str, Any] | None:
        """A live display (notebook) of loss and tokens/s until the job ends, then predicted vs measured."""
        from .notebook import watch

        return watch(self, every)


# ------------------------------------------------------------------------------ from Python


def pop_options(options: dict[str, Any]) -> tuple[SlurmOptions, dict[str, Any]]:
    """Take the Slurm options out of `hexiseq.launch`'s keyword options (the rest are the run's):
    (SlurmOptions, how to submit: `submitit` None/True/False, `check` True/False)."""
    got = {k: options.pop(k) for k in LAUNCH_OPTIONS if k in options}
    how = {"submitit": got.pop("submitit", None), "check": got.pop("check", True)}
    env = {str(k): str(v) for k, v in (got.pop("env", None) or {}).items()}
    return SlurmOptions(partitions=parse_partitions(got.pop("partition", None)), env=env, **got), how


def submit(
    plan: Plan, run_dir: Path, run_args: Sequence[str], options: SlurmOptions, how: Mapping[str, Any]
) -> SlurmRun:
    """Submit a prepared run (`hexiseq.launch(..., backend="slurm")`): checks, then submitit for a
    one-component job (when installed and not `submitit=False`), the generated script otherwise.
    A refused job leaves no run directory behind (launch made it for this run)."""
    try:
        return _submit(plan, run_dir, run_args, options, how)
    except BaseException:
        shutil.rmtree(Path(run_dir) / "inputs", ignore_errors=True)
        shutil.rmtree(Path(run_dir) / "slurm", ignore_errors=True)
        try:
            Path(run_dir).rmdir()
        except OSError:
            pass
        raise


def _submit(
    plan: Plan, run_dir: Path, run_args: Sequence[str], options: SlurmOptions, how: Mapping[str, Any]
) -> SlurmRun:
    require_slurm()
    job = make_job(plan, Path(run_dir).resolve(), run_args, options)
    if how.get("check", True):
        for w in check_job(job):
            print(f"hexiseq launch: warning: {w}", file=sys.stderr)
    use = how.get("submitit")
    if use is None:
        try:
            import submitit  # noqa: F401

            use = not job.heterogeneous
        except ImportError:
            use = False
    if use and job.heterogeneous:
        raise HexiSeqError("submitit does not submit heterogeneous jobs: give submitit=False (the generated script)")
    job.log_dir.mkdir(parents=True, exist_ok=True)
    return submit_submitit(job) if use else submit_script(job)
