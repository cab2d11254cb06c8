"""The notebook explorer (hexiseq.widgets) without a kernel: what it shows for a plan, for a
setting where no baseline fits and for one where nothing fits; the button and controls disabled
while planning, clicks not queued, the elapsed time shown, no result under changed settings."""

from __future__ import annotations

import dataclasses
import threading
import time

import matplotlib
import pytest

matplotlib.use("Agg")

import hexiseq.planner  # noqa: E402
from hexiseq import widgets  # noqa: E402
from hexiseq.widgets import PlanExplorer, Settings, plan_view, show_plan  # noqa: E402


@pytest.mark.parametrize("no_baseline", [False, True])
def test_plan_view_headline(monkeypatch, no_baseline):
    """The result line names cluster, model and length; with no baseline (speedup None) it says
    so instead of crashing; left-out devices are explained."""
    real = hexiseq.planner.plan_cluster

    def plan_cluster(*a, **kw):
        result = real(*a, **kw)
        return dataclasses.replace(result, baselines={}) if no_baseline else result

    monkeypatch.setattr(hexiseq.planner, "plan_cluster", plan_cluster)
    v = plan_view(Settings("testbed-8", "gpt-7b", 16384, "none"))
    assert v.ok and v.headline.startswith("testbed-8 · gpt-7b · 16K tokens: HexiSeq ")
    assert ("no baseline fits in memory" in v.headline) == no_baseline
    assert ("x the best CP/HP baseline (" in v.headline) != no_baseline
    assert v.details[0].startswith("recompute none; gap ")
    left = [d for d in v.details if "left out" in d]
    assert v.result.plan.world_size < 8  # at 16K the A100 node is left out (test_planner_search)
    assert left and left[0].startswith("4 of 8 devices left out. 4 x A100-80GB left out (devices 4..7)")
    assert "no plan with them can beat" in left[0]
    assert [n for n, _ in v.figures] == ["allocation", "systems", "phases"]


def test_infeasible_setting_shows_the_explanation(capsys):
    v = plan_view(Settings("testbed-8", "llama2-70b", 1 << 20, "none"))
    assert not v.ok and v.headline == "testbed-8 · llama2-70b · 1M tokens: nothing fits"
    assert "does not fit on testbed-8" in v.explanation and "what would make it fit" in v.explanation
    assert show_plan("testbed-8", "llama2-70b", 1 << 20, "none") is None
    assert "does not fit on testbed-8" in capsys.readouterr().out


@pytest.fixture
def gated(monkeypatch):
    """plan_cluster that waits for `gate` before planning (so a test can look at the panel mid-plan)."""
    gate, started = threading.Event(), threading.Event()
    real = hexiseq.planner.plan_cluster
    calls = []

    def plan_cluster(*a, **kw):
        calls.append(a[0].name)
        started.set()
        assert gate.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(hexiseq.planner, "plan_cluster", plan_cluster)
    monkeypatch.setattr(widgets, "TICK_S", 0.02)
    return gate, started, calls


def test_explorer_while_planning_and_after(gated):
    gate, started, calls = gated
    ex = PlanExplorer("testbed-8", "gpt-7b", 16384)
    assert ex.plan()
    assert started.wait(10)
    time.sleep(0.1)
    assert ex.busy and ex.button.disabled and all(w.disabled for w in ex.controls)
    assert ex.button.description == "Planning…"
    assert "planning <b>testbed-8 · gpt-7b · 16K tokens</b>" in ex.status.value and ex.status.value.endswith(" s")
    first = ex.status.value
    time.sleep(0.1)
    assert ex.status.value != first  # the elapsed time moves
    assert not ex.plan()  # a second click while planning does nothing (nothing queues up)
    gate.set()
    ex.wait(60)
    assert calls == ["testbed-8"]
    assert not ex.busy and not ex.button.disabled and not any(w.disabled for w in ex.controls)
    assert ex.status.value.startswith("✔ planned testbed-8 · gpt-7b · 16K tokens in ")
    assert "testbed-8 · gpt-7b · 16K tokens: HexiSeq" in ex.result.value
    assert [c._dom_classes for c in ex.figures.children] == [
        ("hexiseq-allocation",),
        ("hexiseq-systems",),
        ("hexiseq-phases",),
    ]
    assert ex.figures.children[0].value[:4] == b"\x89PNG"


def test_explorer_drops_a_result_whose_settings_changed_meanwhile(gated):
    """Controls are disabled in the browser while planning; changed in code, the finished plan's
    result is not shown under them."""
    gate, started, _ = gated
    ex = PlanExplorer("testbed-8", "gpt-7b", 16384)
    ex.plan()
    assert started.wait(10)
    ex.w_seq.value = 32768
    gate.set()
    ex.wait(60)
    assert ex.view is None and ex.figures.children == () and ex.result.value == ""
    assert "Settings changed while planning" in ex.status.value and "32K" in ex.status.value


def test_explorer_clears_a_result_when_a_control_changes():
    ex = PlanExplorer("testbed-8", "gpt-7b", 16384, background=False)
    ex.plan()
    assert ex.view is not None and ex.figures.children
    ex.w_seq.value = 32768
    assert ex.view is None and ex.result.value == "" and ex.figures.children == ()
    assert "Settings changed: press <b>Plan</b> to plan testbed-8 · gpt-7b · 32K tokens" in ex.status.value
    ex.w_seq.value = 16384  # back to the planned settings: still no result (it was cleared), no stale one
    assert ex.figures.children == ()


def test_explorer_shows_why_nothing_fits():
    ex = PlanExplorer("testbed-8", "llama2-70b", 1 << 20, recompute="none", background=False)
    ex.plan()
    assert ex.status.value.startswith("✘ testbed-8 · llama2-70b · 1M tokens: no plan")
    assert "does not fit on testbed-8" in ex.result.value and ex.figures.children == ()
    assert not ex.button.disabled


def test_explorer_shows_a_bug_instead_of_hanging(monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("planner bug")

    monkeypatch.setattr(hexiseq.planner, "plan_cluster", boom)
    ex = PlanExplorer("testbed-8", "gpt-7b", 16384, background=False)
    ex.plan()
    assert "RuntimeError: planner bug" in ex.result.value and not ex.busy and not ex.button.disabled


def test_explorer_has_a_stack_dropdown_and_plans_on_the_chosen_stack():
    """The stack control lists every stack of data/stacks.yaml (the default first chosen), is disabled
    with the others while planning, and the plan is made and judged on the chosen stack: FP8 layer
    GEMMs make the same setting faster, and the result says its stack."""
    from hexiseq.errors import SpecError
    from hexiseq.specs.stacks import stack_catalog

    ex = PlanExplorer("testbed-8", "gpt-7b", 16384, recompute="none", background=False)
    assert list(ex.w_stack.options) == list(stack_catalog()) and ex.w_stack.value == "fa2-bf16"
    assert ex.w_stack in ex.controls and "hexiseq-stack" in ex.w_stack._dom_classes
    ex.plan()
    default = ex.view
    assert default.ok and default.settings.stack == "fa2-bf16" and "stack fa2-bf16 (the default)" in default.details[0]
    ex.w_stack.value = "te-fp8"
    assert ex.view is None and "stack te-fp8" in ex.status.value  # a changed stack clears the old result
    ex.plan()
    fp8 = ex.view
    assert (
        fp8.ok
        and fp8.settings.stack == "te-fp8"
        and fp8.headline.startswith("testbed-8 · gpt-7b · 16K tokens · stack te-fp8")
    )
    assert "stack te-fp8" in fp8.details[0]
    assert fp8.result.tokens_per_s > 1.15 * default.result.tokens_per_s  # x1.7335 layer GEMMs (data/stacks.yaml)
    # the same as the library's plan on that stack
    assert fp8.result.tokens_per_s == pytest.approx(
        plan_view(Settings("testbed-8", "gpt-7b", 16384, "none", stack="te-fp8")).result.tokens_per_s, rel=1e-9
    )
    with pytest.raises(SpecError, match="unknown stack 'te-fp9'"):
        PlanExplorer("testbed-8", "gpt-7b", 16384, stack="te-fp9")
    bad = plan_view(Settings("testbed-8", "gpt-7b", 16384, "none", stack="te-fp9"))
    assert not bad.ok and "cannot plan these settings" in bad.headline and "unknown stack" in bad.explanation
