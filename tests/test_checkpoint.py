"""Hugging Face checkpoints in and out; our logits equal transformers' LlamaForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch
from _numerics import FP32, rel_err

from hexiseq.errors import SpecError
from hexiseq.runtime.hf_checkpoint import (
    config_from_hf,
    load_hf_checkpoint,
    model_spec_from_checkpoint,
    save_hf_checkpoint,
)
from hexiseq.runtime.llama import Llama, LlamaConfig

transformers = pytest.importorskip("transformers")  # declared in the `dev` extra

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def _hf_model(tie: bool, scaling: dict | None = None, seed: int = 0):
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=5000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_scaling=scaling,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains too, so a mis-mapped norm would show
        for p in model.parameters():
            p.normal_(0, 0.05) if p.ndim > 1 else p.uniform_(0.5, 1.5)
    return model


def _tokens(n: int = 80, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(11))


@pytest.mark.parametrize("tie,scaling", [(False, None), (True, None), (False, LLAMA3_SCALING)])
@pytest.mark.numerics
def test_logits_equal_transformers(tmp_path, tie, scaling, within):
    hf = _hf_model(tie, scaling)
    hf.save_pretrained(tmp_path)
    ours = load_hf_checkpoint(tmp_path)
    assert ours.cfg.tie_embeddings == tie
    tokens = _tokens()  # 80 tokens: beyond the 32 original positions, so llama3 scaling matters
    with torch.no_grad():
        ref = hf(tokens[None]).logits[0]
        got = ours.logits(ours(tokens))
    within(rel_err(got, ref), FP32, f"logits vs transformers (tie {tie}, rope scaling {scaling is not None})")


@pytest.mark.numerics
def test_save_round_trip_and_transformers_reads_ours(tmp_path, within):
    cfg = LlamaConfig(vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, rope_theta=5000.0, norm_eps=1e-5)
    ours = Llama(cfg).init_weights(3, std=0.05)
    save_hf_checkpoint(ours, tmp_path / "one")
    back = load_hf_checkpoint(tmp_path / "one")
    assert back.cfg == cfg
    for (n, p), (m, q) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert n == m and torch.equal(p, q), n
    # sharded: several files and an index, read back the same
    save_hf_checkpoint(ours, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    from safetensors.torch import save_file

    save_file(
        {"tok_embeddings.weight": torch.zeros(2, 2)}, str(tmp_path / "sharded" / "consolidated.safetensors")
    )  # not in the index
    again = load_hf_checkpoint(tmp_path / "sharded")
    for n, p in ours.state_dict().items():
        assert torch.equal(p, again.state_dict()[n]), n
    # transformers loads what we wrote and computes the same logits
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "one").eval()
    tokens = _tokens()
    with torch.no_grad():
        within(
            rel_err(ours.logits(ours(tokens)), hf(tokens[None]).logits[0]),
            FP32,
            "transformers reads our checkpoint: logits",
        )


def test_torch_state_dict_checkpoint(tmp_path):
    hf = _hf_model(tie=True)
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # tied: HF still lists lm_head.weight
    ours = load_hf_checkpoint(tmp_path, dtype=torch.float64)
    assert ours.lm_head.weight is ours.embed_tokens.weight and ours.embed_tokens.weight.dtype == torch.float64
    torch.testing.assert_close(ours.embed_tokens.weight.float(), hf.model.embed_tokens.weight)


def test_pickled_code_is_refused(tmp_path):
    _hf_model(tie=False).config.save_pretrained(tmp_path)
    torch.save({"weights": Exploit()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        load_hf_checkpoint(tmp_path)


class Exploit:
    """Stands for an object whose unpickling would run code."""


def test_mismatched_checkpoints_are_refused(tmp_path):
    hf = _hf_model(tie=False)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="missing.*layers.2"):
        load_hf_checkpoint(tmp_path)
    cfg["num_hidden_layers"], cfg["intermediate_size"] = 2, 100
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="shape"):
        load_hf_checkpoint(tmp_path)
    with pytest.raises(SpecError, match="not found"):
        load_hf_checkpoint(tmp_path / "nowhere")


def test_configs_and_model_spec(tmp_path):
    _hf_model(tie=True).config.save_pretrained(tmp_path)
    spec = model_spec_from_checkpoint(tmp_path, name="mini")
    assert (spec.name, spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.vocab) == ("mini", 2, 64, 4, 2, 128)
    assert spec.tie_embeddings and spec.rope_theta == 5000.0  # transformers 5 nests it in rope_parameters
    base = json.loads((tmp_path / "config.json").read_text())
    for bad, match in [
        ({"attention_bias": True}, "biases"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"model_type": "gpt2"}, "Llama-family"),
    ]:
        with pytest.raises(SpecError, match=match):
            config_from_hf({**base, **bad})
    with pytest.raises(SpecError, match="lacks"):
        config_from_hf({k: v for k, v in base.items() if k != "hidden_size"})
