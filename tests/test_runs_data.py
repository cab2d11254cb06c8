"""Training data (issue #12): text tokenized byte-level or with a tokenizer.json and joined with EOS,
token files memory-mapped, sequences packed to the plan's length with next-token labels, each rank
reading only its own positions; given sequences with Hugging Face labels (-100 masking) and
padding to the plan's alignment — and the distributed loss on them equals transformers' loss on the
same tokens and labels (a single-process reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _numerics import FP32

from hexiseq.errors import HexiSeqError, SpecError
from hexiseq.plan import random_plan
from hexiseq.runs.data import (
    BYTE_EOS,
    IGNORE_INDEX,
    DataSpec,
    GivenSequences,
    PackedStream,
    Sampler,
    fit_plan,
    prepare_data,
    save_sequences,
)


def test_text_is_tokenized_byte_level_and_joined_with_eos(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("héllo")
    (docs / "b.md").write_text("ok")
    (docs / "skip.bin").write_bytes(b"\x00")  # not text: not a document
    spec = prepare_data(docs, tmp_path / "work")
    ids = np.fromfile(spec.path, dtype=spec.dtype)
    assert ids.tolist() == list("héllo".encode()) + [BYTE_EOS] + list(b"ok") + [BYTE_EOS]
    assert (spec.kind, spec.vocab, spec.eos_id, spec.tokens, spec.tokenizer) == ("stream", 257, BYTE_EOS, 10, "bytes")


def test_a_tokenizer_json_tokenizes_text(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "to": 2, "be": 3, "or": 4, "not": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "t.txt").write_text("to be or not to be")
    spec = prepare_data(tmp_path / "t.txt", tmp_path / "work", tokenizer=tmp_path)
    assert np.fromfile(spec.path, dtype=spec.dtype).tolist() == [2, 3, 4, 5, 2, 3, 1]
    assert spec.vocab == 6 and spec.eos_id == 1


def test_packed_stream_each_rank_reads_its_own_positions(tmp_path):
    stream = np.arange(1000, dtype=np.uint16)
    stream.tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", stream.astype(np.int32))
    plan = random_plan(3, 64, 8, 4, seed=3, block_size=4)
    for path in ("t.bin", "t.npy"):
        spec = prepare_data(tmp_path / path, tmp_path / "work")
        data = PackedStream(spec, plan.seq_len)
        assert data.samples == 999 // 64
        seen = []
        for lay in plan.layout():  # every rank reads only its own rows; together they are the whole sequence
            pos = np.asarray(lay.token_indices())
            tok, lab = data.read(5, pos)
            assert tok.tolist() == (5 * 64 + pos).tolist() and lab.tolist() == (5 * 64 + pos + 1).tolist()
            seen += pos.tolist()
        assert sorted(seen) == list(range(64))


def test_sampler_is_a_seeded_permutation_per_epoch():
    s = Sampler(37, seed=4, shuffle=True)
    first = [s(k) for k in range(37)]
    assert sorted(first) == list(range(37)) and first != list(range(37))
    assert sorted(s(37 + k) for k in range(37)) == list(range(37)) and [s(37 + k) for k in range(37)] != first
    assert [Sampler(37, seed=4, shuffle=True)(k) for k in range(37)] == first
    assert [Sampler(5, seed=4, shuffle=False)(k) for k in range(7)] == [0, 1, 2, 3, 4, 0, 1]


def test_given_sequences_padding_and_hugging_face_labels(tmp_path):
    tokens = np.arange(10, 20)[None]  # [1, S]: a Hugging Face shaped batch of one
    labels = tokens.copy()
    labels[0, :4] = IGNORE_INDEX  # a masked prompt
    t, lab = save_sequences(torch.from_numpy(tokens), labels, tmp_path)
    spec = DataSpec("sequences", str(t), "int64", str(lab), "given", seq_len=10, sequences=1)
    data = GivenSequences(spec, seq_len=16)
    tok, target = data.read(0, np.arange(16))
    assert tok.tolist() == list(range(10, 20)) + [0] * 6  # padded to the plan's length
    # position t is trained on labels[t + 1]; the prompt's labels and every padding position are ignored
    assert target.tolist() == [IGNORE_INDEX] * 3 + list(range(14, 20)) + [IGNORE_INDEX] * 7
    with pytest.raises(SpecError, match=r"labels have shape \(2, 10\), tokens \(1, 10\)"):
        save_sequences(tokens, np.zeros((2, 10), dtype=int), tmp_path)
    with pytest.raises(SpecError, match=r"\[S\], \[1, S\] or \[N, S\], got \(1, 2, 3\)"):
        save_sequences(np.zeros((1, 2, 3), dtype=int), None, tmp_path)


def test_lengths_are_aligned_to_the_plan():
    plan = random_plan(3, 256, 8, 4, seed=3, block_size=8)
    fitted, notes = fit_plan(plan, 300)
    assert fitted.seq_len == 304 and fitted.group_sizes == plan.group_sizes and "4 padding positions" in notes[0]
    assert fit_plan(plan, 256) == (plan, [])


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: p.write_bytes(b"\xff\xfe bad"), "not UTF-8 text"),
        (lambda p: np.save(p.with_suffix(".npy"), np.array([1, -3])), "negative token id (-3)"),
        (
            lambda p: np.save(p.with_suffix(".npy"), np.zeros((2, 2, 2), dtype=int)),
            "expected 1-D tokens (a stream) or 2-D",
        ),
        (lambda p: np.save(p.with_suffix(".npy"), np.array([0.5, 1.0])), "token ids must be integers"),
    ],
)
def test_bad_data_is_refused_with_the_file(tmp_path, make, words):
    src = tmp_path / "d.txt"
    make(src)
    path = src if src.exists() else src.with_suffix(".npy")
    with pytest.raises(HexiSeqError) as e:
        prepare_data(path, tmp_path / "work")
    assert words in str(e.value) and str(path.name) in str(e.value)


@pytest.mark.slow
@pytest.mark.numerics
def test_masked_padded_sequences_give_transformers_loss(tmp_path, within):
    """Two given sequences of 300 tokens (not a multiple of the plan's alignment) with masked labels,
    one step on a 3-rank uneven plan from a Hugging Face checkpoint: the logged loss (the first
    step's, before the update) equals transformers' loss of the same batch."""
    transformers = pytest.importorskip("transformers")
    from hexiseq.runs import launch

    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        rope_theta=1000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 512, (2, 300), generator=g)
    labels = tokens.clone()
    labels[0, :50] = -100  # a prompt not to learn
    labels[1, 120:180] = -100
    plan = random_plan(3, 256, 8, 4, seed=3, block_size=8)
    h = launch(
        plan,
        data=tokens,
        labels=labels,
        steps=1,
        global_batch=2,
        init_from=tmp_path / "hf",
        out=tmp_path / "run",
        background=False,
    )
    got = float(h.metrics["loss"].iloc[0])
    with torch.no_grad():
        ref = float(hf(tokens, labels=labels).loss)
    within(abs(got - ref) / ref, FP32, "3 ranks, padded + masked sequences vs transformers: loss")
    assert h.summary["seq_len"] == 304 and "padding" in (tmp_path / "run" / "console.log").read_text()
