"""A real Slurm on this machine for the tests: munged, slurmctld and two slurmd ("nodes" n1 and n2,
partitions h100 and a100, two stand-in GPUs each) started as root in a scratch directory.

Everything is private to the scratch directory: its own munge key and socket (slurm.conf's
AuthInfo points at it), its own slurm.conf (clients find it through SLURM_CONF), free ports; nothing
in /etc is touched. `LocalSlurm.start()` returns the cluster, or raises `SlurmUnavailable` with the
reason it cannot run here (not root, a package missing) or `SlurmFailed` (a daemon that did not come
up, with their logs); `stop()` ends the daemons by their pid files. Heterogeneous jobs are placed by
the backfill scheduler: bf_interval=1 makes that ~1 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "srun", "scontrol", "scancel", "squeue")
PARTITIONS = {"n1": "h100", "n2": "a100"}


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be started here (not root, not installed); the message says why."""


class SlurmFailed(RuntimeError):
    """Slurm is installed and we are root, but a daemon did not come up: a fault, not a skip."""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalSlurm:
    """A running two-node Slurm; `env` is what a client process needs (SLURM_CONF)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.pidfiles: list[Path] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, root: Path) -> LocalSlurm:
        if os.geteuid() != 0:
            raise SlurmUnavailable("the Slurm daemons are started as root (SlurmUser=root); these tests run as a user")
        missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
        if missing:
            raise SlurmUnavailable(
                f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
            )
        cluster = cls(root)
        try:
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        os.chmod(r / "munge", 0o700)
        sock = r / "munge" / "munge.socket"
        munge_pid = r / "run" / "munged.pid"
        self.pidfiles.append(munge_pid)
        self._run(
            [
                "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={munge_pid}",
                f"--log-file={r / 'log' / 'munged.log'}",
                f"--seed-file={r / 'munge' / 'munged.seed'}",
            ],
            "munged",
        )
        ctld, n1, n2 = _free_ports(3)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            f"""ClusterName=hexiseq-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerParameters=bf_interval=1
KillWait=30
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}/%n
SlurmctldPidFile={r / "run"}/slurmctld.pid
SlurmdPidFile={r / "run"}/slurmd-%n.pid
SlurmctldLogFile={r / "log"}/slurmctld.log
SlurmdLogFile={r / "log"}/slurmd-%n.log
GresTypes=gpu
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs=2 Gres=gpu:h100:2 Feature=ib State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs=2 Gres=gpu:a100:2 Feature=ib State=UNKNOWN
PartitionName=h100 Nodes=n1 Default=YES MaxTime=INFINITE State=UP
PartitionName=a100 Nodes=n2 MaxTime=INFINITE State=UP
"""
        )
        # two stand-in "GPUs" per node (any device files do): jobs' GPU requests are checked and granted
        (r / "gres.conf").write_text(
            "".join(f"NodeName={n} Name=gpu Type={p} File=/dev/null,/dev/zero\n" for n, p in PARTITIONS.items())
        )
        for n in ("n1", "n2"):
            (r / "spool" / n).mkdir(exist_ok=True)
        self.pidfiles.append(r / "run" / "slurmctld.pid")
        self._run(["slurmctld", "-f", str(self.conf)], "slurmctld")
        for n in ("n1", "n2"):
            self.pidfiles.append(r / "run" / f"slurmd-{n}.pid")
            self._run(["slurmd", "-f", str(self.conf), "-N", n], f"slurmd {n}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if len(states) == 2 and all(s.startswith("idle") for s in states.values()):
                return
            time.sleep(0.5)
        raise SlurmFailed(f"the two slurmd did not become idle in 30 s: {out.stdout or out.stderr}\n{self.logs()}")

    def _run(self, cmd: list[str], what: str) -> None:
        res = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=30)
        if res.returncode != 0:
            raise SlurmFailed(f"{what} did not start (exit {res.returncode}): {res.stderr or res.stdout}")

    def logs(self) -> str:
        """The tails of the daemons' logs (for a failing test's message)."""
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def stop(self) -> None:
        """End every daemon by its pid file: SIGTERM to all (slurmd and slurmctld before munged),
        then wait for each, SIGKILL after 15 s."""
        pids = []
        for pidfile in reversed(self.pidfiles):
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except (OSError, ValueError, IndexError):
                continue
        deadline = time.monotonic() + 15
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
