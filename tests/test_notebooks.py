"""The notebooks run top to bottom headless (small settings: HEXISEQ_QUICK=1), so a change in
the library that breaks a notebook fails the suite. The full-size runs are a benchmark
(`make notebooks-full`, benchmarks/bench_notebooks.py); the real-browser run is `make test-browser`."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


# (notebook, variant): 02 reads data/results/ when it holds results of its stack and computes the
# quick grid when not; both paths run (one quick grid: an empty results directory and the te-fp8
# stack; results of another stack are tests/test_reproduce_stacks.py's notebook_results case).
CASES = [(p, "") for p in NOTEBOOKS if p.stem != "02_paper_figures"] + [
    (NOTEBOOK_DIR / "02_paper_figures.ipynb", "results"),
    (NOTEBOOK_DIR / "01_plan_explorer.ipynb", "te-fp8"),  # the STACK parameter (HEXISEQ_STACK)
    (NOTEBOOK_DIR / "02_paper_figures.ipynb", "te-fp8"),  # no results: the quick grid on te-fp8
]


def execute(path: Path, tmp_path: Path, env: dict[str, str], monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("HEXISEQ_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, "\n".join("\n".join(e.get("traceback", [])) for e in errors)
    return nb


def outputs(nb: nbformat.NotebookNode, mime: str) -> list:
    return [
        o["data"][mime]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if mime in o.get("data", {})
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path, variant", CASES, ids=[p.stem + (f"-{v}" if v else "") for p, v in CASES])
def test_notebook_runs(path, variant, monkeypatch, tmp_path):
    env = {"HEXISEQ_QUICK_OUT": str(tmp_path / "quick")}
    if path.stem == "02_paper_figures" and variant == "te-fp8":
        (tmp_path / "none").mkdir()
        env["HEXISEQ_RESULTS"] = str(tmp_path / "none")
    if variant == "te-fp8":
        env["HEXISEQ_STACK"] = variant
    nb = execute(path, tmp_path, env, monkeypatch)
    if path.stem == "01_plan_explorer":
        assert outputs(nb, "application/vnd.jupyter.widget-view+json"), "the explorer panel was not displayed"
        assert len(outputs(nb, "image/png")) >= 5  # the plan's figures and the baseline's
        printed = "".join(
            o.get("text", "")
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "stream"
        )
        stack = f" · stack {variant}" if variant else ""
        assert f"testbed-8 · llama2-7b · 128K tokens{stack}: HexiSeq" in printed
        assert f"stack {variant or 'fa2-bf16 (the default)'}" in printed
    if path.stem == "04_calibrate":
        assert len(outputs(nb, "image/png")) >= 1  # the before/after figure
        assert "after the fit:" in "".join(
            o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        )
    if path.stem == "02_paper_figures":
        md = "".join("".join(x) for x in outputs(nb, "text/markdown"))
        assert "The HexiSeq paper's figures vs this reproduction" in md
        assert len(outputs(nb, "image/png")) >= 15
        # the quick grid is computed, where it was told, only when there are no stored results of the stack
        assert (tmp_path / "quick" / "results.csv").exists() == (variant == "te-fp8")
        printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert f"stack {variant if variant == 'te-fp8' else 'fa2-bf16'}" in printed
        assert ("software stack `te-fp8`" in md) == (variant == "te-fp8")


def test_notebooks_exist_and_are_stripped():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_plan_explorer", "02_paper_figures", "03_launch_run", "04_calibrate"} <= names
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{p.name} committed with outputs"
