"""`hexiseq reproduce`: scenario files expand and fail early, the cache key follows every input,
and the quick grid runs end to end (CSV, figures, comparison), reruns from the cache, and keeps
the rows of scenarios it did not rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from hexiseq.errors import SpecError  # noqa: E402
from hexiseq.reproduce import cache as cache_mod  # noqa: E402
from hexiseq.reproduce import paper  # noqa: E402
from hexiseq.reproduce.recipes import Cell, cluster_recipe  # noqa: E402
from hexiseq.reproduce.scenarios import bundled_scenarios, load_scenario, load_scenarios  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_every_bundled_scenario_expands_full_and_quick():
    full, quick = load_scenarios(), load_scenarios(quick=True)
    assert (
        {s.name for s in full}
        == set(bundled_scenarios())
        >= {"testbed", "simulation", "pairs", "scaling", "sensitivity"}
    )
    n_full, n_quick = (sum(len(s.cells) for s in x) for x in (full, quick))
    assert n_quick < n_full / 3
    sim = load_scenario("simulation")
    assert len(sim.cells) == 3 * 2 * 4  # clusters x models x lengths
    pairs = load_scenario("pairs")
    assert {c.role for c in pairs.cells} == {"mixed", "homogeneous"}
    sweeps = {c.sweep for c in load_scenario("sensitivity").cells}
    assert sweeps == {"inter_node_bandwidth", "old_fraction", "seq_len"}
    bw = [c for c in load_scenario("sensitivity").cells if c.sweep == "inter_node_bandwidth"]
    assert [c.sweep_value for c in bw] == [12.5, 25.0, 50.0, 100.0]
    assert {d.nic_gbps for c in bw[:1] for d in c.cluster.build().devices} == {12.5}
    old = [c for c in load_scenario("sensitivity").cells if c.sweep == "old_fraction"]
    assert [c.cluster.build().gpu_types.get("A100-80GB", 0) for c in old] == [0, 16, 32, 48, 64]
    assert [c.cluster.build().size for c in load_scenario("scaling").cells] == [32, 64, 128, 256, 512, 1024]


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "name: x\nmodels: [gpt-7b]\nseq_lens: [16K]\nclusters: [no-such-cluster]\n",
            "clusters\\[0\\]: cluster 'no-such-cluster' not found",
        ),
        ("name: x\nmodels: [gpt-7b]\nseq_lens: [16K]\nclusters: [testbed-8]\ntypo: 1\n", "unknown keys \\['typo'\\]"),
        ("name: x\nmodels: [no-model]\nseq_lens: [16K]\nclusters: [testbed-8]\n", "models: unknown model"),
        ("name: x\nmodels: [gpt-7b]\nseq_lens: [lots]\nclusters: [testbed-8]\n", "seq_lens: not a token count"),
        # issue 22: a bare string was read character by character
        ("name: x\nmodels: [gpt-7b]\nseq_lens: abc\nclusters: [testbed-8]\n", "seq_lens: a list of token counts"),
        (
            "name: x\nmodels: [gpt-7b]\nseq_lens: [16K]\nclusters: [testbed-8]\nworkload: {param_sharding: nope}\n",
            "workload: bad workload",
        ),
        (
            "name: x\nsweeps:\n  old_fraction: {nodes: 4, node_size: 8, new: H100-SXM, old: A100-80GB, nic_gbps: 25, "
            "model: gpt-7b, seq_len: 64K, fractions: [0.3]}\n",
            "fraction 0.3 of 4 nodes is not a whole number",
        ),
        ("name: x\nsweeps:\n  seq_len: {cluster: testbed-8, model: gpt-7b}\n", "missing \\['seq_lens'\\]"),
        ("name: x\nsweeps:\n  latency: {}\n", "unknown sweep 'latency'"),
        ("name: x\nclusters: [{mixed: 30}]\nmodels: [gpt-7b]\nseq_lens: [16K]\n", "30 GPUs do not split"),
        ("name: x\nmodels: [gpt-7b]\n", "no cells"),
    ],
)
def test_bad_scenario_files_fail_before_any_work(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=match):
        load_scenario(p)


def _copy_tree(tmp: Path) -> Path:
    """The files the cost-model version reads, copied so that a test can change them."""
    pkg = tmp / "hexiseq"
    for rel in cache_mod.VERSION_SOURCES:
        src = cache_mod.PACKAGE_DIR / rel
        if src.is_dir():
            shutil.copytree(src, pkg / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, pkg / rel)
    shutil.copytree(REPO / "data", tmp / "data", ignore=shutil.ignore_patterns("results", "text", "validation"))
    return pkg


@pytest.mark.parametrize(
    "edit",
    [
        "hexiseq/costmodel/estimate.py",
        "hexiseq/planner/scheduler.py",
        "hexiseq/plan.py",
        "data/gpus.yaml",
        "data/models.yaml",
    ],
)
def test_version_follows_every_input(tmp_path, monkeypatch, edit):
    pkg = _copy_tree(tmp_path)
    monkeypatch.setattr(cache_mod, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(cache_mod, "REPO_DIR", tmp_path)
    monkeypatch.setattr(cache_mod, "DATA_DIR", tmp_path / "data")
    before = cache_mod.model_version()
    assert before == cache_mod.model_version()  # deterministic
    f = tmp_path / edit
    f.write_text(f.read_text() + "\n# a change\n")
    assert cache_mod.model_version() != before


def test_cell_key_follows_the_cluster_file_and_the_cell(tmp_path):
    src = REPO / "data" / "clusters" / "testbed-8.yaml"
    p = tmp_path / "tb.yaml"
    p.write_text(src.read_text())
    wl = (("activation_checkpointing", "auto"),)
    cell = Cell("s", cluster_recipe(str(p), "t"), "gpt-7b", 16384, wl)
    k = cache_mod.cell_key(cell, "v1")
    assert k == cache_mod.cell_key(
        Cell("other-scenario", cluster_recipe(str(p), "t"), "gpt-7b", 16384, wl), "v1"
    )  # labels do not count
    assert k != cache_mod.cell_key(cell, "v2")
    assert k != cache_mod.cell_key(Cell("s", cell.cluster, "gpt-7b", 32768, wl), "v1")
    assert k != cache_mod.cell_key(
        Cell("s", cell.cluster, "gpt-7b", 16384, (("activation_checkpointing", "full"),)), "v1"
    )
    p.write_text(src.read_text().replace("nic_gbps: 25", "nic_gbps: 50"))
    assert k != cache_mod.cell_key(Cell("s", cluster_recipe(str(p), "t"), "gpt-7b", 16384, wl), "v1")


def test_damaged_cache_entry_is_recomputed(tmp_path):
    c = cache_mod.CellCache(tmp_path)
    c.put("abc", {"x": 1})
    assert c.get("abc")["x"] == 1
    c.path("abc").write_text("{not json")
    assert c.get("abc") is None
    c.path("abd").write_text(json.dumps({"key": "other"}))
    assert c.get("abd") is None


@pytest.mark.slow
def test_reproduce_quick_end_to_end(tmp_path, capsys):
    """The whole quick pipeline through the CLI; then a rerun from the cache, --force on one
    scenario, and the other scenarios' rows kept."""
    from hexiseq.cli import main
    from hexiseq.reproduce import load_results, reproduce
    from hexiseq.reproduce.table import BASE_COLUMNS

    out = tmp_path / "res"
    assert main(["reproduce", "--quick", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "computed" in printed and "paper" in printed and "stack fa2-bf16" in printed
    assert "stack: fa2-bf16 assumed" in captured.err  # the default stack, said as plan and estimate say it
    res = load_results(out)
    df = res.table
    assert set(BASE_COLUMNS) <= set(df.columns)
    # without --stack every cell is the default stack's, and results.csv and meta.json say so
    assert set(df["stack"]) == {"fa2-bf16"} and res.meta["stack"] == "fa2-bf16" == res.stack
    cells = df[df["system"] == "hexiseq"]
    n_cells = sum(len(s.cells) for s in load_scenarios(quick=True))
    assert len(cells) == n_cells == res.meta["cells"]
    # one row per cell and system, the systems being whatever the planner returned
    for _, g in df.groupby(
        ["scenario", "cluster", "model", "seq_len", "pair_role", "sweep", "sweep_value"], dropna=False
    ):
        assert g["system"].is_unique and g["system"].iloc[0] == "hexiseq"
    # sim-32 gpt-70b 128K (the case that crashed the old notebook): HexiSeq fits; of the symmetric
    # CP/HP baselines none does (no speedup over the best symmetric one); over all baselines it is
    # defined exactly when some baseline fits
    hard = df[(df["cluster"] == "sim-32") & (df["model"] == "gpt-70b") & (df["seq_len"] == 128 * 1024)]
    ours = hard[hard["system"] == "hexiseq"]
    assert ours["feasible"].all()
    assert not hard[hard["system"].isin(["ring", "ulysses", "usp"])]["feasible"].any()
    others = hard[(hard["system"] != "hexiseq") & hard["feasible"]]
    assert ours["speedup"].isna().all()
    assert ours["speedup_vs_all"].isna().all() == others.empty
    assert (others["tokens_per_s"] <= ours["tokens_per_s"].iloc[0] * (1 + 1e-9)).all()
    # ... and at 1M nothing fits: one row, HexiSeq infeasible, with the planner's explanation
    none = df[(df["cluster"] == "sim-32") & (df["model"] == "gpt-70b") & (df["seq_len"] == 1 << 20)]
    assert len(none) == 1 and not none["feasible"].iloc[0] and "does not fit" in none["reason"].iloc[0]
    # figures: PNG and PDF of each; the comparison names every paper figure
    figs = {p.name for p in (out / "figures").iterdir()}
    for name in (
        "speedup_vs_length",
        "speedup_vs_gpu_types",
        "flop_comparable_pairs",
        "planner_time",
        "sensitivity_inter_node_bandwidth",
        "sensitivity_old_fraction",
        "sensitivity_seq_len",
        "systems_simulation",
        "allocation_scaling",
        "phases_testbed",
    ):
        assert {f"{name}.png", f"{name}.pdf"} <= figs, name
    md = (out / "paper_comparison.md").read_text()
    for f in paper.FIGURES:
        assert f.what in md
    assert "QUICK grid" in md and "1.11x" in md and "scheduler time for 1024 GPUs: needs a cell with 1024 GPUs" in md
    assert res.meta["last_run"]["computed"] == len(
        {cache_mod.cell_key(c, res.meta["version"]) for s in load_scenarios(quick=True) for c in s.cells}
    )
    # a rerun: everything from the cache, identical numbers
    again = reproduce(quick=True, out=out, progress=False, draw=False)
    assert again.meta["last_run"]["computed"] == 0
    cols = ["scenario", "cluster", "model", "seq_len", "system", "tokens_per_s"]
    assert again.table[cols].equals(df[cols])
    # --force on one scenario recomputes its cells only, and the other scenarios' rows stay
    forced = reproduce(["testbed"], quick=True, out=out, force=True, progress=False, draw=False)
    assert forced.meta["last_run"]["computed"] == len(load_scenario("testbed", quick=True).cells)
    assert set(forced.table["scenario"]) == set(df["scenario"]) and len(forced.table) == len(df)
