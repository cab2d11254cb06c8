"""Error types. Every error a user can provoke is a `HexiSeqError` with a specific message;
the CLI prints it without a traceback."""

from __future__ import annotations


class HexiSeqError(ValueError):
    """Base class for bad input: a spec, a plan, a solver outcome the user must act on."""


class SpecError(HexiSeqError):
    """A cluster, GPU, model or workload description is invalid."""


class PlanError(HexiSeqError):
    """A plan is inconsistent, or does not match the cluster / model / workload / world."""

    def __init__(self, message: str, violations: list[str] | None = None) -> None:
        self.violations = list(violations or [])
        if self.violations:
            message = message + "\n" + "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(message)


class InfeasibleError(HexiSeqError):
    """No plan fits: carries a human explanation of why and what would make it fit."""


class RunFailed(HexiSeqError):
    """A background run (local or Slurm) ended with an error; the message is the run's own."""
