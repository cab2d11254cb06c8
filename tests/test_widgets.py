"""The notebook explorer's summary line (widgets.show_plan) without a kernel."""

from __future__ import annotations

import dataclasses

import matplotlib
import pytest

matplotlib.use("Agg")

import hexiseq.planner  # noqa: E402
from hexiseq.widgets import show_plan  # noqa: E402


@pytest.mark.parametrize("no_baseline", [False, True])
def test_show_plan_summary_line(monkeypatch, capsys, no_baseline):
    """A case where no baseline fits (speedup None, printed as such) must not crash the panel."""
    real = hexiseq.planner.plan_cluster

    def plan_cluster(*a, **kw):
        result = real(*a, **kw)
        return dataclasses.replace(result, baselines={}) if no_baseline else result

    monkeypatch.setattr(hexiseq.planner, "plan_cluster", plan_cluster)
    result = show_plan("testbed-8", "llama2-7b", 32768, recompute="none")
    assert result is not None and result.recompute == "none"
    out = capsys.readouterr().out
    assert out.startswith("HexiSeq ") and "tokens/s" in out and "recompute none" in out
    assert ("no baseline fits" in out) == no_baseline and ("x the best baseline" in out) != no_baseline
