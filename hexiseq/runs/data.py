"""Training data: token streams and given sequences, in sequences of the plan's length, of which each
rank reads only its own tokens.

Sources (`prepare_data`, run once by the launcher, before any rank starts):

- **text**: a file or a folder of `*.txt` / `*.md` files, each file one document, tokenized with a
  Hugging Face tokenizer (`tokenizer.json`, through the `tokenizers` library) or byte-level (UTF-8
  bytes 0..255, end-of-text 256) when none is given; documents joined with the end-of-text token and
  written once as a token file in the run directory;
- **token files**: `.bin` (raw little-endian ids, nanoGPT's layout; uint16 unless told) or `.npy`,
  memory-mapped. A 1-D array is a stream; a 2-D `.npy` [N, S] holds N given sequences;
- **given sequences** (the Python API): token ids [S], [1, S] or [N, S] and optional labels of the
  same shape in Hugging Face's convention (`labels[t]` is the token at t, -100 where nothing is to be
  learnt; position t is trained to predict labels[t+1]).

A stream is packed (`PackedStream`): sample i is tokens [i·S, i·S + S) and its labels are the next
tokens [i·S + 1, i·S + S + 1) — every position has a label, across document boundaries (the EOS
token separates them). Given sequences shorter than S are padded with ignored labels, never
counted in the loss. Samples are taken in a seeded order (`Sampler`, a permutation per epoch for
streams, the given order for sequences), so a run's data position is one integer: the samples used.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HexiSeqError, PlanError, SpecError
from ..plan import Plan

IGNORE_INDEX = -100  # the label of a position with nothing to learn (as in runtime.llama)
BYTE_VOCAB, BYTE_EOS = 257, 256
TEXT_SUFFIXES = (".txt", ".md", ".text")
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")
MAX_VOCAB = 1 << 22  # 4,194,304 token ids: 16x the largest vocabulary of a released model
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")


@dataclass(frozen=True)
class DataSpec:
    """The resolved data of a run (stored in the run's config.json). `path`: the token file the ranks
    read (a memmap); `labels`: given labels (.npy, Hugging Face convention) for `sequences`."""

    kind: str  # "stream" | "sequences" | "synthetic"
    path: str = ""
    dtype: str = ""  # of a .bin file
    labels: str | None = None
    source: str = ""  # what the user gave
    tokenizer: str = ""  # "bytes", a tokenizer.json path, or "" (token files)
    vocab: int = 0  # every token id is below this
    eos_id: int | None = None
    tokens: int = 0  # tokens in the stream, or N * S of the given sequences
    sequences: int = 0
    seq_len: int = 0  # of the given sequences
    sha256: str = ""  # of the source text / token file (resume warns when it changed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSpec:
        return cls(**d)

    def describe(self) -> str:
        if self.kind == "synthetic":
            return "synthetic: one seeded random sequence"
        if self.kind == "sequences":
            return f"{self.sequences:,} given sequences of {self.seq_len:,} tokens ({self.source})"
        tok = f", tokenizer {self.tokenizer}" if self.tokenizer else ""
        return f"{self.tokens:,} tokens from {self.source}{tok}"


def _sha256(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def text_files(path: Path) -> list[Path]:
    """The documents of a text source: the file itself, or every text file under a folder (sorted)."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise SpecError(f"--data {path}: the folder holds no {'/'.join(TEXT_SUFFIXES)} files")
    return files


class Tokenizer:
    """Byte-level (no file) or a Hugging Face `tokenizer.json` through the `tokenizers` library."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.name = "bytes"
        self._tok = None
        if path is None:
            self.vocab, self.eos_id = BYTE_VOCAB, BYTE_EOS
            return
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise SpecError(f"--tokenizer {path}: no tokenizer.json there")
        try:
            from tokenizers import Tokenizer as HFTokenizer

            self._tok = HFTokenizer.from_file(str(p))
        except ImportError:
            raise SpecError("--tokenizer needs the `tokenizers` package: pip install tokenizers") from None
        except Exception as e:
            raise SpecError(
                f"--tokenizer {p}: not a readable tokenizer.json ({type(e).__name__}: {str(e)[:160]})"
            ) from None
        self.name = str(p)
        self.vocab = int(self._tok.get_vocab_size(with_added_tokens=True))
        ids = [self._tok.token_to_id(n) for n in _EOS_NAMES]
        eos = next((i for i in ids if i is not None), None)
        if eos is None:
            raise SpecError(
                f"--tokenizer {p}: defines none of the end-of-text tokens {', '.join(_EOS_NAMES)}; "
                "documents could not be separated"
            )
        self.eos_id = int(eos)

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            return list(text.encode("utf-8"))
        return self._tok.encode(text, add_special_tokens=False).ids


def _token_dtype(vocab: int) -> str:
    return "uint16" if vocab <= 2**16 else "uint32"


def tokenize_text(source: Path, out: Path, tokenizer: Tokenizer) -> tuple[int, str]:
    """Tokenize the documents of `source` into the raw token file `out` (EOS after each document).
    Returns (tokens written, dtype)."""
    dtype = _token_dtype(tokenizer.vocab)
    n = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")  # torchrun: every process writes the same tokens
    with open(tmp, "wb") as f:
        for doc in text_files(source):
            try:
                text = doc.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise SpecError(f"--data {doc}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            ids = np.asarray(tokenizer.encode(text) + [tokenizer.eos_id], dtype=dtype)
            f.write(ids.tobytes())
            n += ids.size
    tmp.replace(out)
    return n, dtype


def _open_array(path: Path, dtype: str = "") -> np.ndarray:
    """A token file memory-mapped: .npy (its own dtype) or raw .bin (`dtype`, default uint16)."""
    try:
        if path.suffix == ".npy":
            arr = np.load(path, mmap_mode="r")
        else:
            arr = np.memmap(path, dtype=dtype or "uint16", mode="r")
    except (OSError, ValueError) as e:
        raise SpecError(f"--data {path}: not a readable token file ({type(e).__name__}: {str(e)[:160]})") from None
    if arr.dtype.kind not in "iu":
        raise SpecError(f"--data {path}: token ids must be integers, the file holds {arr.dtype}")
    return arr


def _special_kind(path: Path) -> str:
    """What a path that is neither a regular file nor a directory is (the target of a link)."""
    mode = path.stat().st_mode
    for test, name in (
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name + (f" ({path.resolve()})" if path.is_symlink() else "")
    return "special file"


def _within_limit(hi: int, what: str) -> int:
    """`hi`, the largest token id of `what`, when below MAX_VOCAB; SpecError otherwise."""
    if hi >= MAX_VOCAB:
        raise SpecError(
            f"{what} holds token id {hi:,}, beyond any model's vocabulary (at most {MAX_VOCAB:,} here; the largest "
            "of known models is about 256K): the file is not token ids, or not of this dtype (--token-dtype)"
        )
    return hi


def _check_ids(arr: np.ndarray, vocab: int | None, what: str) -> int:
    """The largest token id + 1; refuses negative ids, ids beyond the model's vocabulary and ids
    beyond any sane vocabulary (MAX_VOCAB: without --model the proxy's vocabulary follows the data)."""
    if arr.size == 0:
        raise SpecError(f"{what} holds no tokens")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0:
        raise SpecError(f"{what} holds a negative token id ({lo})")
    _within_limit(hi, what)
    if vocab is not None and hi >= vocab:
        raise SpecError(
            f"{what} holds token id {hi}, but the model's vocabulary has {vocab} entries: use a model with a larger "
            "vocabulary (--model) or the tokenizer the ids came from"
        )
    return hi + 1


def prepare_data(
    source: str | Path,
    workdir: Path,
    tokenizer: str | Path | None = None,
    labels: str | Path | None = None,
    token_dtype: str | None = None,
) -> DataSpec:
    """Resolve `--data` (and `--tokenizer`, `--labels`, `--token-dtype`); text is tokenized into
    `workdir` once. Refuses unreadable or inconsistent input with the file named."""
    src = Path(source)
    if not src.exists():
        raise SpecError(f"--data {src}: no such file or folder")
    if not (src.is_file() or src.is_dir()):  # e.g. a link to /dev/zero: it would be read forever
        raise SpecError(f"--data {src}: is a {_special_kind(src)}, not a file or folder of data")
    if token_dtype is not None and token_dtype not in TOKEN_DTYPES:
        raise SpecError(f"--token-dtype must be one of {', '.join(TOKEN_DTYPES)}, got {token_dtype!r}")
    if src.is_dir() or src.suffix.lower() in TEXT_SUFFIXES:
        if labels is not None:
            raise SpecError("--labels goes with 2-D token arrays (.npy); text has next-token labels")
        tok = Tokenizer(tokenizer)
        out = workdir / f"tokens.{_token_dtype(tok.vocab)}.bin"
        n, dtype = tokenize_text(src, out, tok)
        if n < 2:
            raise SpecError(f"--data {src}: too little text ({n} tokens)")
        return DataSpec(
            "stream",
            str(out),
            dtype,
            None,
            str(src),
            tok.name,
            tok.vocab,
            tok.eos_id,
            n,
            0,
            0,
            _sha256(text_files(src)),
        )
    if src.suffix not in (".bin", ".npy"):
        raise SpecError(
            f"--data {src}: expected a text file or folder ({', '.join(TEXT_SUFFIXES)}), or tokens (.bin, .npy)"
        )
    if tokenizer is not None:
        raise SpecError("--tokenizer goes with text data; token files are already tokenized")
    arr = _open_array(src, token_dtype or "")
    vocab = _check_ids(arr, None, f"--data {src}")
    digest = _sha256([src])
    if arr.ndim == 1:
        if labels is not None:
            raise SpecError("--labels goes with 2-D token arrays [N, S]; a 1-D stream has next-token labels")
        return DataSpec(
            "stream", str(src.resolve()), str(arr.dtype), None, str(src), "", vocab, None, int(arr.size), 0, 0, digest
        )
    if arr.ndim != 2:
        raise SpecError(f"--data {src}: expected 1-D tokens (a stream) or 2-D [N, S] sequences, got shape {arr.shape}")
    lab = None
    if labels is not None:
        lab_arr = _open_array(Path(labels))
        if lab_arr.shape != arr.shape:
            raise SpecError(f"--labels {labels}: shape {lab_arr.shape} differs from the tokens' {arr.shape}")
        bad = np.asarray(lab_arr[(lab_arr < 0) & (lab_arr != IGNORE_INDEX)])
        if bad.size:
            raise SpecError(f"--labels {labels}: holds {int(bad[0])}; labels are token ids or {IGNORE_INDEX} (ignored)")
        vocab = max(vocab, _within_limit(int(lab_arr.max()), f"--labels {labels}") + 1)
        lab = str(Path(labels).resolve())
    n, s = arr.shape
    return DataSpec(
        "sequences",
        str(src.resolve()),
        str(arr.dtype),
        lab,
        str(src),
        "",
        vocab,
        None,
        int(n * s),
        int(n),
        int(s),
        digest,
    )


def save_sequences(tokens: Any, labels: Any, workdir: Path) -> tuple[Path, Path | None]:
    """Given sequences (Python API: [S], [1, S] or [N, S]; list / numpy / torch) written as .npy
    files for the ranks to memory-map. Refuses shapes that disagree, with the shapes."""
    t = _as_2d(tokens, "tokens")
    if t.dtype.kind not in "iu":
        raise SpecError(f"tokens must be integer ids, got {t.dtype}")
    workdir.mkdir(parents=True, exist_ok=True)
    np.save(workdir / "tokens.npy", t.astype(np.int64))
    if labels is None:
        return workdir / "tokens.npy", None
    lab = _as_2d(labels, "labels")
    if lab.shape != t.shape:
        raise SpecError(
            f"labels have shape {tuple(np.shape(labels))}, tokens {tuple(np.shape(tokens))}: they must match"
        )
    np.save(workdir / "labels.npy", lab.astype(np.int64))
    return workdir / "tokens.npy", workdir / "labels.npy"


def _as_2d(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] == 0:
        raise SpecError(f"{what} must have shape [S], [1, S] or [N, S], got {tuple(a.shape)}")
    return a


# ----------------------------------------------------------------------------- sequences and ranks


def alignment(plan: Plan) -> int:
    """The length unit of a plan: 2 · block_size (two zigzag chunks per group, whole blocks)."""
    return 2 * plan.block_size


def fit_plan(plan: Plan, length: int) -> tuple[Plan, list[str]]:
    """The plan for sequences of `length` tokens: itself when its length is the aligned length, else
    the same plan scaled (Plan.scaled) to `length` rounded up to the plan's alignment (the pad tokens
    get ignored labels). Returns the plan and a note when it changed."""
    unit = alignment(plan)
    target = max(unit * plan.num_groups, math.ceil(length / unit) * unit)
    if target == plan.seq_len:
        return plan, []
    fitted = plan.scaled(target, plan.block_size)
    pad = target - length
    return fitted, [
        f"sequence: the data's {length:,}-token sequences run under the plan scaled to {target:,} tokens"
        + (f" ({pad} padding position{'s' * (pad != 1)} per sequence, labels ignored)" if pad else "")
    ]


class PackedStream:
    """Samples of `seq_len` tokens cut from a 1-D token stream, with next-token labels."""

    def __init__(self, spec: DataSpec, seq_len: int) -> None:
        self.arr = _open_array(Path(spec.path), spec.dtype)
        self.seq_len = seq_len
        self.samples = (self.arr.size - 1) // seq_len
        if self.samples < 1:
            raise SpecError(
                f"--data {spec.source}: {self.arr.size:,} tokens make no sequence of {seq_len + 1:,} "
                "(a sequence and its last label); give more data or a shorter plan"
            )

    def read(self, index: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, labels) at the global `positions` of sample `index`: only those rows are read."""
        base = index * self.seq_len
        return np.asarray(self.arr[base + positions], dtype=np.int64), np.asarray(
            self.arr[base + positions + 1], dtype=np.int64
        )


class GivenSequences:
    """N given sequences of length L <= seq_len; positions past L are padding (ignored labels).
    Labels in Hugging Face's convention are shifted here: position t is trained on labels[t + 1]."""

    def __init__(self, spec: DataSpec, seq_len: int, pad_id: int = 0) -> None:
        self.arr = _open_array(Path(spec.path), spec.dtype)
        self.labels = _open_array(Path(spec.labels)) if spec.labels else None
        self.samples, self.length = self.arr.shape
        if self.length > seq_len:
            raise PlanError(
                f"the data's sequences have {self.length:,} tokens but the plan holds {seq_len:,}: plan for "
                f"at least {self.length:,} tokens, or give --seq-len"
            )
        self.seq_len, self.pad_id = seq_len, pad_id

    def read(self, index: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = positions < self.length
        nxt = positions + 1
        has_next = nxt < self.length
        tokens = np.full(positions.shape, self.pad_id, dtype=np.int64)
        tokens[inside] = self.arr[index, positions[inside]]
        labels = np.full(positions.shape, IGNORE_INDEX, dtype=np.int64)
        source = self.labels if self.labels is not None else self.arr
        labels[has_next] = source[index, nxt[has_next]]
        return tokens, labels


class Sampler:
    """Which sample the k-th sequence of a run is: streams in a seeded permutation per epoch (an
    affine bijection i -> (a·i + b) mod n: no memory, any n), given sequences in their order."""

    def __init__(self, samples: int, seed: int, shuffle: bool) -> None:
        self.samples, self.seed, self.shuffle = samples, seed, shuffle

    def __call__(self, k: int) -> int:
        n = self.samples
        epoch, i = divmod(k, n)
        if not self.shuffle or n == 1:
            return i
        rng = np.random.default_rng([self.seed, epoch])
        while True:
            a = int(rng.integers(1, n))
            if math.gcd(a, n) == 1:
                break
        return (a * i + int(rng.integers(0, n))) % n


def open_dataset(spec: DataSpec, seq_len: int) -> PackedStream | GivenSequences:
    if spec.kind == "stream":
        return PackedStream(spec, seq_len)
    if spec.kind == "sequences":
        return GivenSequences(spec, seq_len)
    raise HexiSeqError(f"data of kind {spec.kind!r} has no dataset")
