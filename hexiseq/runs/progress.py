"""What a run shows while it runs: a progress bar (loss, tokens/s) on a terminal, a line per step in
logs, a heartbeat during the start-up (spawning ranks and importing torch take ~20 s on a small
machine), and the closing lines with measured vs predicted step time. Everything printed is also
written to RUN_DIR/console.log."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from .config import RunConfig


class Console:
    """Prints to a stream and appends the same lines to the run's console.log."""

    def __init__(self, log: Path | None = None, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self._log = open(log, "a") if log is not None else None

    def print(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)
        if self._log is not None:
            self._log.write(text + "\n")
            self._log.flush()

    def attach(self, log: Path) -> None:
        if self._log is None:
            self._log = open(log, "a")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def step_line(r: dict[str, Any], steps: int) -> str:
    """A step's line; a run of several replicas adds one line per replica (its record in metrics.jsonl)."""
    line = (
        f"step {r['step']}/{steps}  loss {r['loss']:.5f}  grad_norm {r['grad_norm']:.3f}  {r['tokens_per_s']:,.0f} "
        f"tokens/s  "
        f"({r['step_time_s']:.3f} s)  lr {r['lr']:.2e}"
    )
    replicas = r.get("replicas") or ()
    return "\n".join([line, *(replica_line(x) for x in replicas)]) if len(replicas) > 1 else line


def replica_line(x: dict[str, Any]) -> str:
    """One replica of a step: its sequences and ranks, step and compute time, and its waiting for the
    slowest replica (the straggler waits 0)."""
    tok = f"{x['tokens_per_s']:,.0f} tokens/s" if x.get("tokens_per_s") else "no tokens"
    seqs, ranks = x["sequences"], x["ranks"]
    return (
        f"  replica {x['replica']}: {seqs} sequence{'s' * (seqs != 1)} on {ranks} rank{'s' * (ranks != 1)}  "
        f"step {x['step_time_s']:.3f} s  compute {x['compute_s']:.3f} s ({tok})  waiting {x['waiting_s']:.3f} s"
    )


class Progress:
    """Receives ("phase", text) and ("step", record) events; `heartbeat()` is called while waiting."""

    def __init__(
        self,
        console: Console,
        steps: int,
        start: int = 0,
        every_s: float = 5.0,
        bar: bool | None = None,
        lines_every: int | None = None,
    ) -> None:
        self.console, self.steps, self.every_s = console, steps, every_s
        self.t0 = self._last = time.monotonic()
        self.phase_text, self.started = "starting the ranks", False
        # a line every `lines_every` steps (and the last); default: at most ~100 lines in a log, and
        # under a progress bar every step into console.log
        self.lines_every = lines_every or max(1, (steps - start) // 100)
        self.log_every = lines_every or 1
        use_bar = bar if bar is not None else console.stream.isatty()
        self.bar = None
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=steps, initial=start, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def of_run(cls, console: Console, cfg: RunConfig, start: int = 0) -> Progress:
        """The progress display of a run as its settings ask."""
        return cls(console, cfg.steps, start, lines_every=cfg.record.log_every)

    def __call__(self, kind: str, value: Any) -> None:
        with self._lock:
            if kind == "phase":
                self.phase_text = value
            elif kind == "step":
                self._step(value)

    def _step(self, r: dict[str, Any]) -> None:
        if not self.started:
            self.started = True
            self.console.print(f"  first step after {time.monotonic() - self.t0:.1f} s of start-up")
        if self.bar is not None:
            self.bar.update(r["step"] - self.bar.n)
            self.bar.set_postfix(loss=f"{r['loss']:.4f}", tok_s=f"{r['tokens_per_s']:,.0f}", lr=f"{r['lr']:.1e}")
            if self.console._log is not None and (r["step"] % self.log_every == 0 or r["step"] == self.steps):
                self.console._log.write(step_line(r, self.steps) + "\n")
        elif r["step"] % self.lines_every == 0 or r["step"] == self.steps:
            self.console.print(step_line(r, self.steps))

    def heartbeat(self, elapsed: float | None = None) -> None:
        """A line every `every_s` seconds until the first step: nothing is silent for long."""
        with self._lock:
            now = time.monotonic()
            if self.started or now - self._last < self.every_s:
                return
            self._last = now
            self.console.print(f"  ... {now - self.t0:.0f} s: {self.phase_text}")

    def beat_in_background(self) -> None:
        """Heartbeats from a thread (torchrun rank 0, which is busy starting itself)."""

        def loop() -> None:
            while not self.started:
                time.sleep(0.5)
                self.heartbeat()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self.started = True
            if self.bar is not None:
                self.bar.close()
                self.bar = None


def closing_lines(summary: dict[str, Any]) -> list[str]:
    """The result of a run in three lines: the loss, measured vs predicted step time, the run directory."""
    if not summary:
        return []
    out = []
    if summary.get("loss_first") is not None:
        tok = summary.get("measured_tokens_per_s")
        out.append(
            f"done: loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f} over {summary['steps_done']} steps"
            + (f"; {tok:,.0f} tokens/s" if tok else "")
            + f" ({summary['status']})"
        )
    measured, predicted = summary.get("measured_step_time_s"), summary.get("predicted_step_time_s")
    m = (
        f"{measured:.4f} s measured on {summary['measured_on']} (median of {summary['measured_steps']} steps after "
        f"warm-up)"
        if measured is not None
        else "not measured"
    )
    pred = summary.get("prediction") or {}
    p = (
        f"{predicted:.6f} s predicted ({pred.get('note')})"
        if predicted is not None
        else f"no prediction ({pred.get('note')})"
    )
    out.append(f"step time: {m} vs {p}")
    if predicted is not None and not summary.get("emulated") and "CPU" in summary.get("measured_on", ""):
        out.append(
            "  (the prediction is for the plan's GPUs; these CPU ranks do not emulate them, so the two differ by "
            "design)"
        )
    out.append(f"run directory: {summary['run_dir']}")
    return out
