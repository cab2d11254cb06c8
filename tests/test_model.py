"""The one-device Llama: attention, RoPE from explicit positions, chunked loss, checkpointing, configs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _numerics import FP32, rel_err

from hexiseq.errors import SpecError
from hexiseq.runtime.hf_checkpoint import (
    config_from_hf,
    inspect_checkpoint,
    load_hf_checkpoint,
    model_spec_from_checkpoint,
    save_hf_checkpoint,
)
from hexiseq.runtime.llama import (
    IGNORE_INDEX,
    Llama,
    LlamaConfig,
    chunked_loss_sum,
    dense_causal_attention,
    reference_loss,
    shift_labels,
)
from hexiseq.runtime.parallel import ParallelOptions
from hexiseq.specs import DEFAULT_NORM_EPS, ModelSpec, RecomputePolicy, get_model, model_catalog, model_from_hf_config

pytestmark = pytest.mark.numerics

CFG = LlamaConfig(vocab=97, hidden=64, layers=2, heads=8, kv_heads=2, ffn=96, rope_theta=1000.0)


def _model(cfg: LlamaConfig = CFG, seed: int = 0) -> Llama:
    return Llama(cfg).init_weights(seed, std=0.1)


def test_dense_attention_is_causal_gqa(within):
    torch.manual_seed(0)
    S, H, Hkv, d = 11, 6, 2, 8
    q, k, v = torch.randn(S, H, d), torch.randn(S, Hkv, d), torch.randn(S, Hkv, d)
    out = dense_causal_attention(q, k, v)
    kk, vv = (
        k.repeat_interleave(H // Hkv, dim=1),
        v.repeat_interleave(H // Hkv, dim=1),
    )  # query head h -> kv head h // 3
    scores = torch.einsum("qhd,khd->hqk", q, kk) / d**0.5
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)
    within(rel_err(out, ref), FP32, "dense attention vs explicit softmax (fp32)")


def test_shards_with_global_positions_match_the_whole_sequence(within):
    """A zigzag-permuted sequence with its global positions (and attention masked by position)
    gives exactly the rows of the in-order run: RoPE and the model follow positions, not order."""
    model = _model()
    S = 24
    tokens = torch.randint(0, CFG.vocab, (S,), generator=torch.Generator().manual_seed(1))
    ref = model(tokens)
    perm = torch.tensor(list(range(0, 4)) + list(range(20, 24)) + list(range(4, 12)) + list(range(12, 20)))

    def by_position(q, k, v):
        mask = perm[:, None] >= perm[None, :]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
        )
        return o.transpose(0, 1)

    model.set_attention(by_position)
    out = model(tokens[perm], perm)
    within(rel_err(out, ref[perm]), FP32, "permuted shard vs in-order rows (fp32)")
    # positions matter: the same permuted tokens at in-order positions give other values
    model.set_attention(dense_causal_attention)
    assert (model(tokens[perm]) - ref[perm]).abs().max() > 1e-2


def test_rope_is_relative(within):
    """Shifting every position by a constant leaves attention (hence the output) unchanged."""
    model = _model()
    tokens = torch.randint(0, CFG.vocab, (16,), generator=torch.Generator().manual_seed(2))
    a = model(tokens, torch.arange(16))
    b = model(tokens, torch.arange(16) + 1000)
    within(rel_err(a, b), FP32, "output at positions +1000 vs +0 (fp32 angles)")


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_loss_equals_plain_cross_entropy(chunk, within):
    torch.manual_seed(3)
    h = torch.randn(20, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    labels = torch.randint(0, 50, (20,))
    labels[[3, 19]] = IGNORE_INDEX
    got = chunked_loss_sum(h, w, labels, chunk)
    gh, gw = torch.autograd.grad(got, (h, w))
    ref = F.cross_entropy(h @ w.T, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    rh, rw = torch.autograd.grad(ref, (h, w))
    within(
        max(rel_err(got, ref), rel_err(gh, rh), rel_err(gw, rw)), FP32, f"chunked loss and its gradients, chunk {chunk}"
    )


def test_empty_shard_loss_keeps_the_graph():
    """A rank with no tokens must still backpropagate through the layers (their collectives)."""
    h = torch.randn(0, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    loss = chunked_loss_sum(h, w, torch.zeros(0, dtype=torch.long))
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.count_nonzero(w.grad) == 0


def test_labels_and_reference_loss(within):
    tokens = torch.tensor([5, 6, 7, 8])
    assert shift_labels(tokens).tolist() == [6, 7, 8, IGNORE_INDEX]
    model = _model()
    tokens = torch.randint(0, CFG.vocab, (30,), generator=torch.Generator().manual_seed(4))
    logits = model.logits(model(tokens))
    ref = F.cross_entropy(logits[:-1], tokens[1:])
    within(rel_err(reference_loss(model, tokens, loss_chunk=8), ref), FP32, "reference loss vs cross_entropy")


def test_activation_checkpointing_gives_the_same_gradients(within):
    tokens = torch.randint(0, CFG.vocab, (32,), generator=torch.Generator().manual_seed(5))
    grads = []
    for ac in ("none", "selective", "full"):
        model = _model()
        model.recompute = ac
        reference_loss(model, tokens).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    worst = max(rel_err(g[n], grads[0][n]) for g in grads[1:] for n in grads[0])
    within(worst, FP32 / 100, "gradients under selective / full recompute vs none")


def test_tied_embeddings_share_one_parameter():
    cfg = LlamaConfig(vocab=97, hidden=64, layers=1, heads=4, kv_heads=4, ffn=96, tie_embeddings=True)
    model = _model(cfg)
    assert model.lm_head.weight is model.embed_tokens.weight
    names = [n for n, _ in model.named_parameters()]
    assert "embed_tokens.weight" in names and "lm_head.weight" not in names
    reference_loss(model, torch.randint(0, 97, (12,))).backward()
    assert model.embed_tokens.weight.grad is not None


def test_config_from_catalog_and_refusals():
    tiny = LlamaConfig.from_spec(get_model("tiny"))
    assert (tiny.heads, tiny.kv_heads, tiny.head_dim, tiny.vocab) == (8, 4, 16, 512)
    with pytest.raises(SpecError, match="Llama-family"):
        LlamaConfig.from_spec(get_model("gpt-3b"))
    with pytest.raises(SpecError, match="divisible"):
        LlamaConfig(vocab=10, hidden=64, layers=1, heads=6, kv_heads=4, ffn=8)
    with pytest.raises(SpecError, match="not supported"):
        LlamaConfig(vocab=10, hidden=64, layers=1, heads=4, kv_heads=4, ffn=8, rope_scaling={"rope_type": "yarn"})


def test_init_is_deterministic():
    a, b, c = _model(seed=7), _model(seed=7), _model(seed=8)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if p.ndim == 2:
            assert not torch.equal(p, r), n


def test_selective_checkpointing_never_recomputes_the_attention():
    """With checkpointing only the linear parts are recomputed: the attention function runs once per
    layer in forward and never again in backward (its collectives are not replayed), while the
    checkpointed projections do run again."""
    tokens = torch.randint(0, CFG.vocab, (32,), generator=torch.Generator().manual_seed(6))
    for ac in ("none", "selective", "full"):
        model = _model()
        model.recompute = ac
        attn_calls, qkv_calls = [], []

        def counting(q, k, v, calls=attn_calls):
            calls.append(torch.is_grad_enabled())
            return dense_causal_attention(q, k, v)

        model.set_attention(counting)
        for layer in model.layers:
            layer.self_attn.q_proj.register_forward_hook(lambda *_, calls=qkv_calls: calls.append(1))
        loss = reference_loss(model, tokens)
        assert len(attn_calls) == len(qkv_calls) == CFG.layers
        loss.backward()
        if ac == "full":  # the whole block runs again in backward, the attention (with grad) included
            assert attn_calls == [True] * (2 * CFG.layers) and len(qkv_calls) == 2 * CFG.layers
            continue
        assert len(attn_calls) == CFG.layers  # backward does not run the attention forward again
        assert len(qkv_calls) == CFG.layers * (2 if ac == "selective" else 1)  # the projections are recomputed


def test_recompute_policy_values():
    """The model and ParallelOptions take the workload's concrete policy names, as RecomputePolicy
    members; "auto" (a planner request) and booleans are refused."""
    model = _model()
    for value in ("none", "selective", "full", RecomputePolicy.FULL):
        model.recompute = value
        assert model.recompute == value and type(model.recompute) is RecomputePolicy
        options = ParallelOptions(activation_checkpointing=value)
        assert options.activation_checkpointing == value and type(options.activation_checkpointing) is RecomputePolicy
    for bad in ("auto", "yes", 1, True, False):
        with pytest.raises(SpecError, match="recompute policy"):
            model.recompute = bad
        with pytest.raises(SpecError, match="recompute policy"):
            ParallelOptions(activation_checkpointing=bad)


def test_hf_config_without_rms_norm_eps_reads_transformers_default_on_every_path(tmp_path):
    """A config.json without rms_norm_eps runs with 1e-6 (transformers' LlamaConfig default) whichever
    way it is read: planner spec, catalog lookup, checkpoint spec, runtime config, checkpoint load."""
    save_hf_checkpoint(Llama(CFG).init_weights(0), tmp_path)
    cfg_file = tmp_path / "config.json"
    raw = json.loads(cfg_file.read_text())
    del raw["rms_norm_eps"]
    cfg_file.write_text(json.dumps(raw))
    specs = [model_from_hf_config(cfg_file), model_from_hf_config(raw), get_model(str(cfg_file))]
    specs.append(model_spec_from_checkpoint(tmp_path))
    assert [s.norm_eps for s in specs] == [1e-6] * 4
    configs = [config_from_hf(raw), inspect_checkpoint(tmp_path), load_hf_checkpoint(tmp_path).cfg]
    configs += [LlamaConfig.from_spec(s) for s in specs]
    assert [c.norm_eps for c in configs] == [1e-6] * 7
    assert config_from_hf({**raw, "rms_norm_eps": 1e-5}).norm_eps == 1e-5  # a stated value is kept
    assert LlamaConfig.from_spec(get_model("tiny")).norm_eps == DEFAULT_NORM_EPS == 1e-5  # the catalog's


def test_spec_to_runtime_config_round_trip():
    """ModelSpec -> LlamaConfig -> ModelSpec gives the spec back (less the catalog's published count),
    and LlamaConfig -> ModelSpec -> LlamaConfig the config, RoPE scaling and epsilon included."""
    llamas = [m for m in model_catalog().values() if m.mlp == "swiglu" and m.norm == "rmsnorm"]
    scaled = ModelSpec(
        name="scaled",
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=96,
        vocab=128,
        rope_theta=500000.0,
        norm_eps=1e-6,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert len(llamas) >= 3
    for spec in [*llamas, scaled]:
        cfg = LlamaConfig.from_spec(spec)
        assert cfg.to_spec(spec.name) == replace(spec, published_params=None)
        assert LlamaConfig.from_spec(cfg.to_spec("x")) == cfg
    assert LlamaConfig.from_spec(scaled).rope_scaling == scaled.rope_scaling
