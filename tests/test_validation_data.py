"""Structure and internal consistency of the evidence in data/validation/ and the catalog's citations.

Reads the YAML with plain PyYAML (no hexiseq import): these files are data, and this test is what
keeps them honest - every point cites a source, every conversion can be redone from the numbers
in the file, and the fit/holdout split follows the rule written in the file.
"""

import math
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

DATA = Path(__file__).resolve().parent.parent / "data"
VAL = DATA / "validation"
CITED_GPU_FIELDS = ("peak_bf16_tflops", "memory_gib", "hbm_bandwidth_gbps", "link_bandwidth_gbps", "link_latency_us")
POINT_KEYS = (
    "id",
    "source",
    "locator",
    "published",
    "gpu",
    "num_gpus",
    "nodes",
    "gpus_per_node",
    "interconnect",
    "model",
    "seq_len",
    "batch",
    "layout",
    "recompute",
    "precision",
    "measured",
    "tokens_per_s_per_gpu",
    "conversion",
    "uncertainty",
    "quality",
    "split",
)
ARCH_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
FAMILIES = ("cp", "hp", "hybrid", "none")


def _load(path: Path):
    with open(path) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def published():
    return _load(VAL / "published.yaml")


@pytest.fixture(scope="module")
def points(published):
    return published["points"]


@pytest.fixture(scope="module")
def sources():
    return _load(VAL / "sources.yaml")


@pytest.fixture(scope="module")
def kernels():
    return _load(VAL / "kernels.yaml")


@pytest.fixture(scope="module")
def gpus():
    return _load(DATA / "gpus.yaml")


@pytest.fixture(scope="module")
def models():
    return _load(DATA / "models.yaml")


def _arch(point, models):
    """Architecture numbers of a point's model: a data/models.yaml key, an inline mapping, or both."""
    m = point["model"]
    if isinstance(m, str):
        return models[m]
    if "same_as" in m:
        return {**models[m["same_as"]], **m}
    return m


# --------------------------------------------------------------------------- FLOP conventions
# Independent copies of the formulas documented in data/validation/README.md.


def _megatron_noncausal(a, s):
    L, h = a["layers"], a["hidden"]
    return 12 * L * h * h * (1 + a["kv_heads"] / a["heads"] + s / h) + 18 * L * h * a["ffn"] + 6 * h * a["vocab"]


def _palm(args, s, causal):
    return 6 * args["params"] + (6 if causal else 12) * args["layers"] * args["hidden"] * s


def _megds(args, s, ckpt):
    L, h, V = args["layers"], args["hidden"], args["vocab"]
    return 24 * (4 if ckpt else 3) * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def _flops_per_token(formula, args, s):
    return {
        "megatron_noncausal": lambda: _megatron_noncausal(args, s),
        "palm_noncausal": lambda: _palm(args, s, causal=False),
        "palm_causal": lambda: _palm(args, s, causal=True),
        "megds_ckpt": lambda: _megds(args, s, ckpt=True),
        "megds_nockpt": lambda: _megds(args, s, ckpt=False),
    }[formula]()


def _measured_flops_per_s(point):
    """The published figure as FLOP/s per GPU (TFLOP/s, or MFU percent times the stated peak)."""
    unit, value = point["measured"]["unit"], point["measured"]["value"]
    if unit.startswith("MFU percent"):
        return value / 100 * point["conversion"]["peak_tflops"] * 1e12
    assert "TFLOP" in unit, f"{point['id']}: cannot read a FLOP rate from unit {unit!r}"
    return value * 1e12


# --------------------------------------------------------------------------- points


def test_points_have_every_field(points):
    ids = [p["id"] for p in points]
    assert len(ids) == len(set(ids)), "duplicate point ids"
    for p in points:
        missing = [k for k in POINT_KEYS if k not in p]
        assert not missing, f"{p['id']}: missing {missing}"
        assert p["split"] in ("fit", "holdout", "unseen"), p["id"]
        assert p["quality"] in ("A", "B", "C"), p["id"]
        assert p["layout"]["family"] in FAMILIES, p["id"]
        assert p["tokens_per_s_per_gpu"] > 0, p["id"]
        assert str(p["locator"]).strip() and str(p["published"]).strip(), p["id"]


def test_coverage_meets_the_issue(points):
    """>= 20 points, >= 4 sources, >= 3 GPU types incl. H100 and A100, 16K..1M, both layout families."""
    assert len(points) >= 20
    assert len({p["source"] for p in points}) >= 4
    gpu_types = {p["gpu"] for p in points}
    assert len(gpu_types) >= 3
    assert any(g.startswith("H100") for g in gpu_types) and any(g.startswith("A100") for g in gpu_types)
    lengths = [p["seq_len"] for p in points]
    assert min(lengths) <= 16384 and max(lengths) >= 1_000_000
    assert all(s >= 16384 for s in lengths), "long-context evidence only: every point at >= 16K tokens"
    families = {p["layout"]["family"] for p in points}
    assert {"cp", "hp"} <= families


def test_every_source_key_resolves(published, points, sources, kernels, gpus):
    for p in points + published["excluded"]:
        assert p["source"] in sources, f"unknown source {p['source']!r}"
    for e in kernels["entries"]:
        assert e["source"] in sources, f"kernels {e['id']}: unknown source {e['source']!r}"
    for name, extra in published["extra_gpus"].items():
        for field, key in extra.get("sources", {}).items():
            assert key in sources, f"extra_gpus {name}.{field}: unknown source {key!r}"
    for name, g in gpus.items():
        for field, key in g.get("sources", {}).items():
            assert key in sources, f"gpus.yaml {name}.{field}: unknown source {key!r}"
    for key, s in sources.items():
        assert s.get("where") and s.get("used"), f"sources.yaml {key}: needs 'where' and 'used'"


def test_catalog_cites_every_datasheet_number(gpus):
    for name, g in gpus.items():
        cited = g.get("sources", {})
        missing = [f for f in CITED_GPU_FIELDS if f in g and f not in cited]
        assert not missing, f"gpus.yaml {name}: no citation for {missing}"


def test_gpu_and_model_keys_exist(published, points, gpus, models):
    known_gpus = set(gpus) | set(published["extra_gpus"])
    for p in points:
        assert p["gpu"] in known_gpus, f"{p['id']}: GPU {p['gpu']!r} is neither in data/gpus.yaml nor in extra_gpus"
        a = _arch(p, models)
        missing = [k for k in ARCH_KEYS if k not in a]
        assert not missing, f"{p['id']}: model lacks {missing}"
        assert a["heads"] % a["kv_heads"] == 0, p["id"]


def test_layout_degrees_multiply_to_the_gpu_count(points):
    for p in points:
        lay = p["layout"]
        degrees = [lay.get(k) for k in ("cp", "hp", "tp", "dp", "pp")]
        if all(isinstance(d, int) for d in degrees):
            assert math.prod(degrees) == p["num_gpus"], f"{p['id']}: {degrees} vs {p['num_gpus']} GPUs"
        assert p["nodes"] * p["gpus_per_node"] == p["num_gpus"], p["id"]


def test_conversions_can_be_redone(points, models):
    """tokens/s/GPU = measured FLOP rate / FLOPs per token under the stated convention (or published directly)."""
    for p in points:
        conv = p["conversion"]
        if conv["formula"] == "direct":
            assert p["tokens_per_s_per_gpu"] == pytest.approx(float(p["measured"]["value"])), p["id"]
            continue
        if conv["formula"] == "elapsed":  # seconds over timed steps: tokens x steps / (seconds x GPUs)
            assert conv["args"]["gpus"] == p["num_gpus"], p["id"]
            for value, c in ((p["tokens_per_s_per_gpu"], conv), (p.get("tokens_per_s_per_gpu_alt"), conv.get("alt"))):
                if c is None:
                    continue
                a = c["args"]
                want = a["tokens_per_step"] * a["timed_steps"] / (p["measured"]["value"] * a["gpus"])
                assert value == pytest.approx(want, rel=1e-4), p["id"]
            assert conv["args"]["tokens_per_step"] == p["batch"]["global_tokens"], p["id"]
            continue
        args = conv.get("args") or _arch(p, models)
        f = _flops_per_token(conv["formula"], args, p["seq_len"])
        assert f == pytest.approx(conv["flops_per_token"], rel=1e-4), f"{p['id']}: flops_per_token"
        assert _measured_flops_per_s(p) / f == pytest.approx(p["tokens_per_s_per_gpu"], rel=5e-3), p["id"]
        if "alt" in conv:
            fa = _flops_per_token(conv["alt"]["formula"], args, p["seq_len"])
            assert _measured_flops_per_s(p) / fa == pytest.approx(p["tokens_per_s_per_gpu_alt"], rel=5e-3), p["id"]


def test_megatron_convention_reproduces_nemo_summary(models):
    """The convention used for the NeMo long-sequence tables, checked on rows that publish both
    tokens/s/GPU and TFLOP/s/GPU (NeMo 24.07 performance_summary.md, nemo_perf_summary)."""
    rows = [
        ("llama2-7b", 4096, 16847, 776),
        ("llama3-8b", 8192, 12036, 697),
        ("llama2-13b", 4096, 8646, 754),
        ("llama2-70b", 4096, 1707, 759),
        ("llama3-70b", 8192, 1533, 738),
    ]
    for key, s, tokens, tflops in rows:
        assert tflops * 1e12 / _megatron_noncausal(models[key], s) == pytest.approx(tokens, rel=2e-3), key


def _model_name(p):
    return p["model"] if isinstance(p["model"], str) else p["model"]["name"]


def test_split_follows_the_stated_rule(published, points):
    unseen = set(published.get("unseen_sources", []))
    for p in points:  # a source the fit never sees: every point unseen, and only those
        assert (p["split"] == "unseen") == (p["source"] in unseen), f"{p['id']}: split {p['split']}"
    cases = defaultdict(dict)  # source -> case key -> points
    for p in points:
        if p["source"] in unseen:
            continue
        cases[p["source"]].setdefault((_model_name(p), p["seq_len"], p.get("pair", p["id"])), []).append(p)
    for by_case in cases.values():
        ordered = sorted(by_case.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        n = len(ordered)
        for i, (_, pts) in enumerate(ordered):
            expected = "holdout" if (i % 3 == 1 or (n >= 2 and i == n - 1)) else "fit"
            for p in pts:
                assert p["split"] == expected, f"{p['id']}: split {p['split']} but the rule says {expected}"


def test_split_proportions_and_holdout_coverage(published, points):
    unseen = set(published.get("unseen_sources", []))
    assert unseen <= {p["source"] for p in points}
    points = [p for p in points if p["source"] not in unseen]  # the rule's split, without the never-fitted sources
    fit = [p for p in points if p["split"] == "fit"]
    hold = [p for p in points if p["split"] == "holdout"]
    assert len(fit) <= 2 * len(points) / 3
    assert any(p["gpu"].startswith("H100") for p in hold) and any(p["gpu"].startswith("A100") for p in hold)
    assert {"cp", "hp"} <= {p["layout"]["family"] for p in hold}
    multi = {p["source"] for p in points} - {
        s for s in {p["source"] for p in points} if sum(q["source"] == s for q in points) == 1
    }
    for s in multi:  # every source with more than one case appears in both splits
        assert {p["split"] for p in points if p["source"] == s} == {"fit", "holdout"}, s


def test_matched_pairs_differ_only_in_the_gpu(points):
    pairs = defaultdict(list)
    for p in points:
        if "pair" in p:
            pairs[p["pair"]].append(p)
    assert len(pairs) >= 3, "matched H100/A100 configurations are needed for the ratio check"
    for name, (a, b) in ((k, v) for k, v in pairs.items() if len(v) == 2):
        assert {a["gpu"], b["gpu"]} == {"H100-SXM", "A100-80GB"}, name
        for key in ("model", "seq_len", "batch", "layout", "recompute", "precision", "num_gpus", "split"):
            assert a[key] == b[key], f"pair {name}: {key} differs"
    assert all(len(v) == 2 for v in pairs.values())


# --------------------------------------------------------------------------- kernels


def test_kernel_entries_and_priors(kernels):
    ids = [e["id"] for e in kernels["entries"]]
    assert len(ids) == len(set(ids))
    for e in kernels["entries"]:
        for k in ("kind", "gpu", "source", "locator", "value"):
            assert k in e, f"kernels {e['id']}: missing {k}"

    def refs(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from (v if k == "from" else refs(v))

    for ref in refs(kernels["recommended_priors"]):
        assert ref in ids, f"recommended_priors cites unknown entry {ref!r}"


def test_kernel_fractions_match_values_and_catalog_peaks(kernels, gpus):
    """Where a single catalog GPU, a list of values and a list of fractions are given, fraction = value / peak."""
    for e in kernels["entries"]:
        frac, val, gpu = e.get("fraction_of_peak"), e["value"], e["gpu"]
        if isinstance(frac, list) and isinstance(val, list) and gpu in gpus and e["kind"] == "attention":
            peak = gpus[gpu]["peak_bf16_tflops"]
            for v, f in zip(val, frac):
                assert v / peak == pytest.approx(f, abs=2e-3), e["id"]
