"""Interactive plan explorer for Jupyter: pick a cluster, a model, a sequence length and the
software stack (data/stacks.yaml: its kernel rates judge every plan), press Plan, and see the
allocation, the comparison with every baseline and the time of each rank.

`plan_view(settings)` does the work and returns what to show (no widgets: tested directly);
`PlanExplorer` is the ipywidgets panel around it. While a plan is being made the controls and
the button are disabled (clicks do not queue up) and a status line counts the seconds; a result
always names the cluster, model and length it is for, and is cleared as soon as a control
changes, so no result ever sits under settings it was not made for. An infeasible setting shows
the planner's explanation instead of a result. Planning is `hexiseq.planner.plan_cluster`; the
figures are `hexiseq.reproduce.plan_figures`.
"""

from __future__ import annotations

import html
import io
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .costmodel import estimate
from .errors import HexiSeqError, InfeasibleError
from .reproduce.cells import joint_setting, plan_setting, stack_options, systems_of
from .reproduce.plan_figures import plot_allocation, plot_cell_systems, plot_rank_phases, plot_replicas
from .reproduce.style import si_label, style, tokens_label
from .specs import (
    RecomputePolicy,
    bundled_clusters,
    model_catalog,
    parse_tokens,
    recompute_policy,
)
from .specs.stacks import DEFAULT_STACK_NAME, get_stack, stack_catalog

SEQ_CHOICES = [
    ("8K", 8192),
    ("16K", 16384),
    ("32K", 32768),
    ("64K", 65536),
    ("128K", 131072),
    ("256K", 262144),
    ("512K", 524288),
    ("1M", 1048576),
]
TICK_S = 0.25  # how often the elapsed time is redrawn while planning


@dataclass(frozen=True)
class Settings:
    cluster: str
    model: str
    seq_len: int
    recompute: str = "auto"
    sharding: str = "zero3"
    global_batch: int = 1  # above 1: the whole step planned (replicas x sharding, planner.plan_joint)
    stack: str = DEFAULT_STACK_NAME  # the software stack whose kernel rates plan and judge it

    @property
    def label(self) -> str:
        batch = f" · batch {self.global_batch}" if self.global_batch > 1 else ""
        stack = f" · stack {self.stack}" if self.stack != DEFAULT_STACK_NAME else ""  # the default is said once, below
        return f"{self.cluster} · {self.model} · {tokens_label(self.seq_len)} tokens{batch}{stack}"


@dataclass
class PlanView:
    """What the explorer shows for one setting: a headline and details, or the explanation of
    why nothing fits (or of the error); the figures as (name, Figure)."""

    settings: Settings
    ok: bool
    headline: str
    details: list[str] = field(default_factory=list)
    explanation: str = ""
    figures: list[tuple[str, Any]] = field(default_factory=list)
    result: Any = None
    seconds: float = 0.0


def _left_out_text(result: Any, cluster: Any) -> str | None:
    """Which devices the plan leaves out, and the planner's evidence that leaving them out is faster
    (PlanResult.left_out: the fastest plan found with them and the bound of every plan with them)."""
    if not result.left_out:
        return None
    n = cluster.size - result.plan.world_size
    return f"{n} of {cluster.size} devices left out. " + "; ".join(result.left_out) + "."


def joint_view(s: Settings) -> PlanView:
    """A setting with a global batch above 1: the joint plan, its replicas and their shares, the
    best DP x symmetric baseline, and the replicas drawn."""
    t0 = time.perf_counter()
    try:
        cluster, model, wl, res = joint_setting(
            s.cluster, s.model, s.seq_len, s.global_batch, s.recompute, s.sharding, s.stack
        )
    except HexiSeqError as e:
        what = "nothing fits" if isinstance(e, InfeasibleError) else "cannot plan these settings"
        return PlanView(s, False, f"{s.label}: {what}", explanation=str(e), seconds=time.perf_counter() - t0)
    head = f"{s.label}: HexiSeq {res.tokens_per_s:,.0f} tokens/s with {res.plan.num_replicas} replicas"
    if res.speedup_vs_best_baseline is not None:
        head += f", {res.speedup_vs_best_baseline:.2f}x the best DP x symmetric baseline ({res.best_baseline.name})"
    if res.dp1 is not None:
        head += f", {res.dp1.iteration_time_s / res.step_time_s:.2f}x HexiSeq at DP = 1"
    details = res.explanation() + [f"planned in {res.plan_time_s:.1f} s; {_stack_line(s)}"] + list(res.notes)
    figures = [("allocation", plot_replicas(res.plan, cluster, res.step, title=f"{s.label}: replicas"))]
    return PlanView(s, True, head, details, figures=figures, result=res, seconds=time.perf_counter() - t0)


def plan_view(s: Settings) -> PlanView:
    """Plan one setting and build what the explorer shows (module doc)."""
    if s.global_batch > 1:
        return joint_view(s)
    t0 = time.perf_counter()
    try:
        cluster, model, wl, result = plan_setting(s.cluster, s.model, s.seq_len, s.recompute, s.sharding, s.stack)
    except HexiSeqError as e:
        what = "nothing fits" if isinstance(e, InfeasibleError) else "cannot plan these settings"
        return PlanView(s, False, f"{s.label}: {what}", explanation=str(e), seconds=time.perf_counter() - t0)
    options = stack_options(s.stack)
    systems = systems_of(result, cluster, model, wl, options)
    bs, bb = result.best_symmetric_baseline, result.best_baseline
    head = f"{s.label}: HexiSeq {result.tokens_per_s:,.0f} tokens/s, "
    if bs is not None:
        head += f"{result.speedup_vs_best_symmetric:.2f}x the best CP/HP baseline ({bs.name})"
        if bb is not None and bb.name != bs.name:
            head += f", {result.speedup_vs_best_baseline:.2f}x the best of all baselines ({bb.name})"
    elif bb is not None:
        head += f"no CP/HP baseline fits; {result.speedup_vs_best_baseline:.2f}x the best other baseline ({bb.name})"
    else:
        head += "and no baseline fits in memory: HexiSeq's is the only plan that does"
    gap = result.gap
    details = [
        f"recompute {result.recompute}; gap {'n/a' if gap != gap else f'{gap:.2%}'} (proven: no plan at all is "
        f"faster than {result.lower_bound_s:.4g} s; {result.search_gap:.2%} to the best candidate layout); "
        f"{si_label(result.bound_tokens_per_s)} tokens/s compute bound; "
        f"planned in {result.plan_time_s:.1f} s; {_stack_line(s)}"
    ]
    lo = _left_out_text(result, cluster)
    if lo:
        details.append(lo)
    details += [n for n in result.notes if n not in details]
    est = result.estimate
    if est is None:
        est = estimate(result.plan, cluster, model, wl.with_recompute(result.recompute), options)
    figures = [
        ("allocation", plot_allocation(result.plan, cluster)),
        (
            "systems",
            plot_cell_systems(
                systems, title=f"{s.label}: HexiSeq and every baseline", bound_tokens_per_s=result.bound_tokens_per_s
            ),
        ),
        ("phases", plot_rank_phases(est, title="HexiSeq: time by phase")),
    ]
    return PlanView(s, True, head, details, figures=figures, result=result, seconds=time.perf_counter() - t0)


def _stack_line(s: Settings) -> str:
    """Which stack judged the plan (the default said as such, like `hexiseq plan` does)."""
    return f"stack {s.stack}" + (" (the default)" if s.stack == DEFAULT_STACK_NAME else "")


def show_plan(
    cluster_name: str,
    model_name: str,
    seq_len: int,
    recompute: str = "auto",
    sharding: str = "zero3",
    global_batch: int = 1,
    stack: str = DEFAULT_STACK_NAME,
) -> Any:
    """Plan one case on the software stack `stack`, print its headline and details (or why nothing
    fits) and display its figures; returns the PlanResult (a JointResult with a global batch above
    1), or None when nothing fits."""
    from IPython.display import display

    view = plan_view(
        Settings(
            cluster_name, model_name, parse_tokens(seq_len), _policy(recompute), sharding, int(global_batch), stack
        )
    )
    print(view.headline)
    for line in view.details:
        print("  " + line)
    if view.explanation:
        print(view.explanation)
    for _, fig in view.figures:
        display(fig)
    return view.result


def _policy(recompute: str) -> str:
    return recompute_policy(recompute)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    with style():
        fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


class PlanExplorer:
    """The ipywidgets panel (module doc). `panel` is the widget to display; `plan()` plans the
    current settings (in a worker thread unless `background=False`); `wait()` joins it."""

    def __init__(
        self,
        cluster: str = "testbed-8",
        model: str = "llama2-7b",
        seq_len: int = 131072,
        recompute: str = "auto",
        sharding: str = "zero3",
        background: bool = True,
        global_batch: int = 1,
        stack: str = DEFAULT_STACK_NAME,
    ) -> None:
        import ipywidgets as W

        self.background = background
        seq_options = (
            SEQ_CHOICES
            if any(v == seq_len for _, v in SEQ_CHOICES)
            else sorted(SEQ_CHOICES + [(str(seq_len), seq_len)], key=lambda x: x[1])
        )
        self.w_cluster = W.Dropdown(options=bundled_clusters(), value=cluster, description="cluster")
        self.w_model = W.Dropdown(options=list(model_catalog()), value=model, description="model")
        self.w_seq = W.SelectionSlider(options=seq_options, value=seq_len, description="tokens")
        self.w_rec = W.Dropdown(options=[str(p) for p in RecomputePolicy], value=recompute, description="recompute")
        self.w_shard = W.ToggleButtons(options=["zero3", "replicated"], value=sharding, description="states")
        self.w_batch = W.BoundedIntText(value=global_batch, min=1, max=1024, description="batch")
        # the stacks of data/stacks.yaml; a name outside them fails here, with the known ones
        self.w_stack = W.Dropdown(options=list(stack_catalog()), value=get_stack(stack).name, description="stack")
        self.w_stack.add_class("hexiseq-stack")
        self.button = W.Button(description="Plan", button_style="primary", icon="play", tooltip="plan these settings")
        self.status = W.HTML()
        self.result = W.HTML()
        self.figures = W.VBox()
        for w, cls in (
            (self.button, "hexiseq-plan-button"),
            (self.status, "hexiseq-status"),
            (self.result, "hexiseq-result"),
            (self.figures, "hexiseq-figures"),
        ):
            w.add_class(cls)
        self.controls = [self.w_cluster, self.w_model, self.w_seq, self.w_rec, self.w_shard, self.w_batch, self.w_stack]
        self.panel = W.VBox(
            [
                W.HBox([self.w_cluster, self.w_model]),
                W.HBox([self.w_seq, self.w_rec, self.w_stack]),
                W.HBox([self.w_shard, self.w_batch, self.button]),
                self.status,
                self.result,
                self.figures,
            ]
        )
        self.panel.add_class("hexiseq-explorer")
        self.view: PlanView | None = None
        self._busy = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.button.on_click(lambda _: self.plan())
        for w in self.controls:
            w.observe(self._changed, names="value")
        self.status.value = "Press <b>Plan</b> to plan these settings."

    def settings(self) -> Settings:
        return Settings(
            self.w_cluster.value,
            self.w_model.value,
            int(self.w_seq.value),
            self.w_rec.value,
            self.w_shard.value,
            int(self.w_batch.value),
            self.w_stack.value,
        )

    @property
    def busy(self) -> bool:
        return self._busy

    def plan(self) -> bool:
        """Plan the current settings; False (and nothing happens) while a plan is being made."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True
        s = self.settings()
        self._set_enabled(False)
        self.view = None
        self.result.value = ""
        self.figures.children = ()
        if self.background:
            self._thread = threading.Thread(target=self._work, args=(s,), daemon=True, name="hexiseq-plan")
            self._thread.start()
        else:
            self._work(s)
        return True

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ internals
    def _set_enabled(self, on: bool) -> None:
        for w in self.controls:
            w.disabled = not on
        self.button.disabled = not on
        self.button.description = "Plan" if on else "Planning…"
        self.button.icon = "play" if on else "hourglass-half"

    def _work(self, s: Settings) -> None:
        t0 = time.monotonic()
        stop = threading.Event()

        def tick() -> None:
            while True:
                self.status.value = f"planning <b>{html.escape(s.label)}</b> … {time.monotonic() - t0:.1f} s"
                if stop.wait(TICK_S):
                    return

        ticker = threading.Thread(target=tick, daemon=True, name="hexiseq-plan-clock")
        ticker.start()
        try:
            view = plan_view(s)
            images = [(name, _png(fig)) for name, fig in view.figures]
        except Exception as e:  # a bug, not bad input: shown whole, never swallowed
            view = PlanView(s, False, f"{s.label}: error", explanation="".join(traceback.format_exception(e)))
            images = []
        finally:
            stop.set()
            ticker.join()
        if self.settings() == s:
            self._show(view, images, time.monotonic() - t0)
        else:  # the controls were changed under the running plan (in code): its result is not for them
            self.status.value = (
                f"Settings changed while planning: press <b>Plan</b> to plan {html.escape(self.settings().label)}."
            )
        with self._lock:
            self._busy = False
        self._set_enabled(True)

    def _show(self, view: PlanView, images: list[tuple[str, bytes]], seconds: float) -> None:
        import ipywidgets as W

        self.view = view
        if view.ok:
            items = "".join(f"<li>{html.escape(d)}</li>" for d in view.details)
            self.result.value = f"<div><b>{html.escape(view.headline)}</b><ul style='margin:2px 0'>{items}</ul></div>"
            self.status.value = f"✔ planned {html.escape(view.settings.label)} in {seconds:.1f} s"
        else:
            self.result.value = (
                "<div style='border-left:4px solid #c44e52;padding:4px "
                f"8px;background:#fbf1f1'><b>{html.escape(view.headline)}</b>"
                f"<pre style='white-space:pre-wrap;margin:4px 0 0 0'>{html.escape(view.explanation)}</pre></div>"
            )
            self.status.value = f"✘ {html.escape(view.settings.label)}: no plan ({seconds:.1f} s)"
        boxes = []
        for name, png in images:
            img = W.Image(value=png, format="png", layout=W.Layout(max_width="100%", height="auto"))
            img.add_class(f"hexiseq-{name}")
            boxes.append(img)
        self.figures.children = tuple(boxes)

    def _changed(self, change: Any) -> None:
        if self._busy:
            return  # controls are disabled while planning; a programmatic change waits for the result
        if self.view is not None and self.view.settings != self.settings():
            self.view = None
            self.result.value = ""
            self.figures.children = ()
        if self.view is None:
            self.status.value = f"Settings changed: press <b>Plan</b> to plan {html.escape(self.settings().label)}."


def plan_explorer(
    cluster: str = "testbed-8",
    model: str = "llama2-7b",
    seq_len: int = 131072,
    plan_now: bool = True,
    global_batch: int = 1,
    stack: str = DEFAULT_STACK_NAME,
) -> PlanExplorer:
    """Display the explorer panel (its stack dropdown set to `stack`); with `plan_now` the initial
    settings are planned right away (in the cell, so an executed notebook holds the result)."""
    from IPython.display import display

    ex = PlanExplorer(cluster, model, seq_len, global_batch=global_batch, stack=stack)
    display(ex.panel)
    if plan_now:
        ex.background = False
        ex.plan()
        ex.background = True
    return ex
