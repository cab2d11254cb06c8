"""The kernel-time model: one home for how long each kind of work takes on a device.

Everything that times compute or device-memory traffic — the step replay (simulate.py), the
per-rank estimate, the compute bound (bound.py) and the planner's optimization model — reads the
coefficients computed here, so the four can never disagree.

Units: FLOP/s, bytes/s, seconds; "per token" means one token of one layer's forward unless a name
says otherwise. A multiply-add is 2 FLOPs; activations are bf16 (2 bytes).

Rates (per device), on the software stack `CostOptions.stack` (data/stacks.yaml; its factors
apply here and nowhere else; the default, fa2-bf16, scales attention to the flash-attention 2
kernel measurements)
    matmul     peak × eff_matmul × stack.matmul      the LM head's GEMM
    layer      matmul × stack.layer_gemm             large GEMMs of the linear layers (FP8 stacks)
    attention  peak × eff_attention × stack.attention   flash attention on long full blocks, this head_dim
    hbm        hbm_bandwidth × eff_hbm               memory-bound kernels (norms, RoPE, activations,
                                                     residual adds, the loss, the optimizer)
Work (per layer, forward; backward as stated)
    linear     QKV: 2·h·(H + 2·H_kv)·d per token ("pre", with norm 1 and RoPE); O + MLP:
               2·(H·d·h + m·h·f) per token ("post", with the residual adds, norm 2 and the MLP
               activation), m = 3 (SwiGLU) or 2 (GELU). Backward: 2× the matmul FLOPs.
    memory     bytes each elementwise kernel reads and writes (bf16), counted per op (`memory_bytes`);
               backward ops are counted separately (they read the saved input and the gradient).
    attention  a block of Lq query rows against Lk keys, η heads, costs
                   η · (pairs + waste) · 4d / attention  +  η · Lq · block_rows_s
               pairs: visible (query, key) pairs (exact, flops.py); waste: a causal block on the
               diagonal computes its diagonal tiles whole, Lq·tile/2 extra pairs; block_rows_s =
               attn_block_half_keys · 4d / attention: a per-row cost that makes a block of
               attn_block_half_keys keys run at half the long-block rate (short ring-round blocks
               are slower). Backward: attn_bwd_factor × the forward (flash attention recomputes
               QK^T: 5 matmuls of the forward's 2).
    LM head    2·h·V FLOPs per token, 3× for forward + backward, plus V·loss_bytes_per_logit of
               device-memory traffic per token for softmax + cross entropy.
    optimizer  optimizer_bytes_per_param per local parameter, memory-bound.
    overlap    a transfer that overlaps compute slows it: every second of link time overlapped
               (bytes in + bytes out over the link bandwidth) adds overlap_slowdown seconds to the
               compute it overlaps (device-memory and SM contention of the DMA / NCCL kernels).

Where the numbers come from: the efficiencies are per GPU in data/gpus.yaml (fitted to published
training throughputs, data/validation/), a stack's factors per (stack, GPU) in data/stacks.yaml,
each with its source; the other knobs are CostOptions fields with their source
in the field's comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from ..specs import GPUType, ModelSpec
from ..specs.stacks import Stack, default_stack

BF16 = 2.0
FP32 = 4.0


@dataclass(frozen=True)
class CostOptions:
    """Knobs of the time and memory model that are not per-GPU catalog numbers."""

    # FlashAttention-2 backward runs 5 matmuls per block against the forward's 2 (it recomputes
    # QK^T): 2.5x the forward FLOPs (Dao 2023, FlashAttention-2, section 3.1.2).
    attn_bwd_factor: float = 2.5
    # FlashAttention-2 tiles of 128 query rows; a causal diagonal block computes its diagonal tiles whole.
    attn_tile: int = 128
    reserved_fraction: float = 0.10  # of capacity, for the framework (CUDA context, allocator slack)
    large_vocab: int = 65536  # vocabularies at least this large use a chunked loss
    loss_chunk_tokens: int = 2048  # tokens per loss chunk when chunked (logits of 2048 x 128K vocab: 1.5 GiB)
    loss_bytes_per_logit: float = 12.0  # HBM traffic of softmax + cross entropy fwd+bwd per logit
    optimizer_bytes_per_param: float = 28.0  # AdamW: read grad, master, m, v; write master, m, v, bf16 weight
    ignore_comm: bool = False  # every transfer free: the pure compute schedule (tests, what-ifs)
    # > 0: the sharded model states of a plan split over at least this many devices, not only its
    # own ranks (the joint planner plans a replica whose states are sharded with other replicas')
    state_shards: int = 0
    # the software stack whose kernel factors scale the catalog's rates (`rates`); explicit default
    stack: Stack = field(default_factory=default_stack)

    def shards(self, ranks: int) -> int:
        """The devices a plan of `ranks` ranks splits its sharded model states over."""
        return max(ranks, self.state_shards)


@dataclass(frozen=True)
class Rates:
    """Per-device (or per-rank) effective rates: arrays of one entry per device."""

    matmul: np.ndarray  # FLOP/s, the LM head's GEMM
    layer_matmul: np.ndarray  # FLOP/s, the transformer layers' GEMMs
    attention: np.ndarray  # FLOP/s
    hbm: np.ndarray  # bytes/s
    block_half_keys: np.ndarray  # keys at which an attention block runs at half rate
    overlap_slowdown: np.ndarray  # seconds of compute lost per second of overlapped link time
    operator: np.ndarray  # seconds of device time per executed operator beyond its work (operators.py)


def rates(gpus: list[GPUType] | tuple[GPUType, ...], stack: Stack | None = None) -> Rates:
    """Effective rates of a list of GPUs (one entry each) on a software stack: the one place where
    efficiencies and a stack's factors become rates. Each distinct GPU object is rated once (a list
    holds a cluster's few types over and over: the planner rates lists of 1,024)."""
    stack = stack if stack is not None else default_stack()
    first: dict[int, int] = {}
    index = np.array([first.setdefault(id(g), len(first)) for g in gpus], dtype=np.int64)
    if len(first) == len(gpus):
        return _rates(gpus, stack)
    kinds = list({id(g): g for g in gpus}.values())  # in order of first appearance, as `first` numbers them
    one = _rates(kinds, stack)
    return Rates(*(getattr(one, f.name)[index] for f in fields(Rates)))


def _rates(gpus: list[GPUType] | tuple[GPUType, ...], stack: Stack) -> Rates:
    peak = np.array([g.peak_bf16_tflops * 1e12 for g in gpus])
    # A rate measured on the user's machine (a profile) already ran the user's stack: no factor on it.
    f = np.array(
        [
            [
                1.0 if g.is_measured("eff_matmul") else m,
                1.0 if g.is_measured("eff_matmul") else lg,
                1.0 if g.is_measured("eff_attention") else a,
            ]
            for g in gpus
            for m, lg, a in [stack.factors(g.name)]
        ]
    ).reshape(len(gpus), 3)
    matmul = peak * np.array([g.eff_matmul for g in gpus]) * f[:, 0]
    return Rates(
        matmul=matmul,
        layer_matmul=matmul * f[:, 1],
        attention=peak * np.array([g.eff_attention for g in gpus]) * f[:, 2],
        hbm=np.array([g.hbm_bandwidth_gbps * 1e9 * g.eff_hbm for g in gpus]),
        block_half_keys=np.array([g.attn_block_half_keys for g in gpus]),
        overlap_slowdown=np.array([g.overlap_slowdown for g in gpus]),
        operator=np.array([g.op_overhead_us * 1e-6 for g in gpus]),
    )


# ------------------------------------------------------------------------------ work of a model


@dataclass(frozen=True)
class LayerWork:
    """What one layer does per token (FLOPs and bytes), forward and backward; model-only numbers."""

    pre_flops: float  # QKV projection
    post_flops: float  # O projection + MLP
    pre_bytes: float  # norm 1 + RoPE on q, k (forward)
    post_bytes: float  # residual adds, norm 2, MLP activation (forward)
    pre_bytes_bwd: float
    post_bytes_bwd: float
    pair_flops: float  # per (query, key) pair per head, forward


def memory_bytes(model: ModelSpec) -> dict[str, float]:
    """Device-memory bytes per token of one layer's elementwise kernels (bf16), by op and direction.

    norm: forward reads x, writes y (2h); backward reads x and dy, writes dx (3h). RoPE on q and k:
    reads and writes (H + H_kv)·d each way. residual add: reads two, writes one (3h), and its
    backward adds the branch gradient (3h). SwiGLU: reads gate and up, writes their product (3f);
    backward reads gate, up and dy, writes dgate and dup (5f). GELU: 2f forward, 3f backward."""
    h, f, qk = model.hidden, model.ffn, (model.heads + model.kv_heads) * model.head_dim
    act_f, act_b = (3 * f, 5 * f) if model.mlp == "swiglu" else (2 * f, 3 * f)
    return {
        "pre": BF16 * (2 * h + 2 * qk),
        "post": BF16 * (3 * h + 2 * h + act_f + 3 * h),
        "pre_bwd": BF16 * (3 * h + 2 * qk),
        "post_bwd": BF16 * (3 * h + 3 * h + act_b + 3 * h),
    }


def layer_work(model: ModelSpec) -> LayerWork:
    """Per-token work of one layer (module doc)."""
    qkv = 2.0 * model.hidden * (model.heads + 2 * model.kv_heads) * model.head_dim
    mem = memory_bytes(model)
    return LayerWork(
        pre_flops=qkv,
        post_flops=model.linear_flops_per_token_per_layer - qkv,
        pre_bytes=mem["pre"],
        post_bytes=mem["post"],
        pre_bytes_bwd=mem["pre_bwd"],
        post_bytes_bwd=mem["post_bwd"],
        pair_flops=model.attention_flops_per_pair,
    )


@dataclass(frozen=True)
class WorkTimes:
    """Seconds per unit of work on each device (arrays, one entry per device): the coefficients every
    consumer multiplies by the plan's quantities (tokens s, head-pairs η·pairs, head-rows η·rows)."""

    pre_matmul: np.ndarray  # forward QKV matmul, per token
    pre_memory: np.ndarray  # forward norm 1 + RoPE, per token
    post_matmul: np.ndarray
    post_memory: np.ndarray
    pre_memory_bwd: np.ndarray  # backward elementwise kernels, per token (matmul backward = 2x forward)
    post_memory_bwd: np.ndarray
    pair: np.ndarray  # forward attention per (query, key) pair per head
    row: np.ndarray  # forward attention per query row per head per block (the short-block cost)
    head: np.ndarray  # LM head forward + backward + loss traffic, per token (once per sequence, not per layer)
    optimizer: np.ndarray  # the optimizer step, per local parameter
    overlap_slowdown: np.ndarray
    operator: np.ndarray  # seconds per executed operator (costmodel/operators.py)
    attn_bwd_factor: float
    tile: int

    @property
    def pre_fwd(self) -> np.ndarray:
        return self.pre_matmul + self.pre_memory

    @property
    def post_fwd(self) -> np.ndarray:
        return self.post_matmul + self.post_memory

    @property
    def pre_bwd(self) -> np.ndarray:
        return 2.0 * self.pre_matmul + self.pre_memory_bwd

    @property
    def post_bwd(self) -> np.ndarray:
        return 2.0 * self.post_matmul + self.post_memory_bwd

    @property
    def token_fwd_bwd(self) -> np.ndarray:
        """Seconds per token of one layer's forward + backward outside attention."""
        return self.pre_fwd + self.post_fwd + self.pre_bwd + self.post_bwd


def work_times(
    gpus: list[GPUType] | tuple[GPUType, ...], model: ModelSpec, options: CostOptions = CostOptions()
) -> WorkTimes:
    """The per-unit seconds of every kind of work on each of `gpus` (module doc)."""
    r = rates(gpus, options.stack)
    w = layer_work(model)
    pair = w.pair_flops / r.attention
    return WorkTimes(
        pre_matmul=w.pre_flops / r.layer_matmul,
        pre_memory=w.pre_bytes / r.hbm,
        post_matmul=w.post_flops / r.layer_matmul,
        post_memory=w.post_bytes / r.hbm,
        pre_memory_bwd=w.pre_bytes_bwd / r.hbm,
        post_memory_bwd=w.post_bytes_bwd / r.hbm,
        pair=pair,
        row=r.block_half_keys * pair,
        head=3.0 * model.lm_head_flops_per_token / r.matmul + model.vocab * options.loss_bytes_per_logit / r.hbm,
        optimizer=options.optimizer_bytes_per_param / r.hbm,
        overlap_slowdown=r.overlap_slowdown,
        operator=r.operator,
        attn_bwd_factor=options.attn_bwd_factor,
        tile=options.attn_tile,
    )


# ------------------------------------------------------------------------------ attention blocks of the zigzag layout


def attention_rows(L_g, k: int):
    """Query rows × blocks per head a group of chunk length L_g runs in each round: round 0 (its own
    chunks) has three blocks (front·front causal, back·front full, back·back causal: 3·L_g rows);
    every later round two blocks of the group's 2·L_g or L_g·2 rows (an earlier source's front chunk
    against both own chunks, or a later source's two chunks against the own back chunk): 2·L_g.
    Works on numbers, numpy arrays and optimization-model expressions."""
    return [3 * L_g] + [2 * L_g] * (k - 1)


def attention_waste(L_g, k: int, tile: int):
    """Extra pairs the kernels compute on causal diagonal blocks (tile/2 per query row of each of the
    two causal blocks of round 0; later rounds are full blocks)."""
    return [L_g * tile] + [0 * L_g] * (k - 1)
