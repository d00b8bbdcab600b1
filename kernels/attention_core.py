"""The attention core: flash attention forward, O = softmax(Q K^T / sqrt(D)) V, causal or not.

Q, K, V and O are (batch, heads, seq, head_dim); the softmax runs online over blocks of
block_kv keys in float32 (running max m, running sum l, f32 accumulator). Every function here
takes `causal` (key j attends to query i only when j <= i); `kernels.flash_attention` and
`kernels.flash_attention_causal` are the two registered kernels, thin modules over this one:
causality changes the reference, so it is a kernel of its own rather than a knob. Causal
kernels skip the key blocks after a query block's last row, and on a GPU take their query
blocks heaviest first (`q_block_order`).

Any sequence length (a prompt of 4000 tokens) and head dim (80): the Triton and plain interpret
kernel loads its tiles masked at the sequence's end and the head's last column and stores O
masked, with no copies; the TPU and Mosaic GPU kernels run `padded_seq(seq, dim)` rows, the
inputs padded with zeros to it by `build` (none on Mosaic GPU when seq is whole 8-row groups, or
any length at least a block in the warp-specialized kernel at head dims of one swizzle: its last
blocks run past the end, where TMA reads zeros and drops the writes). The keys past seq are
masked (`key_mask`, `ragged_keys`) where no causal mask hides them, and the K/V loops stop at
the last block holding keys (`kv_blocks`).

Files by job: `kernels.attention_config` (one typed config per target: knob defaults,
legality, footprint, default config), `kernels.attention_tpu` and `kernels.attention_mgpu`
(the TPU and Mosaic GPU kernels); this module holds the reference, the dispatch and the
Triton/interpret kernel.

Strategies and knobs (all targets: block_q, block_kv):
  tpu         attn_strategy "emit_pipeline": grid (batch, heads, q blocks); the Q tile sits in
                  VMEM while an inner `pltpu.emit_pipeline` streams (block_kv, head_dim) K and V
                  tiles from HBM; buffers (2 or 3) is the depth of that stream.
              attn_strategy "unroll": K and V of the (batch, head) are blocks of the grid, loaded
                  whole into VMEM; a `fori_loop` slices them with `pl.ds`. No inner DMA waits,
                  but VMEM grows with seq (see `footprint`).
  gpu-triton  num_warps, num_stages: one program per Q block looping over K/V blocks (default:
              128-row Q and 64-row K/V blocks, 8 warps, 3 stages; `TritonAttentionConfig.default`).
  interpret   the gpu-triton kernel without compiler params.
  gpu-mosaic  mgpu_pipeline "warp_specialized" (the default): FlashAttention-3 structure after JAX's
                  ops/gpu/attention_mgpu.py (two compute warpgroups of block_q rows each, one
                  TMA warpgroup, K/V slots guarded by barriers); here with any of bf16/f16 (JAX's
                  version allocates its SMEM as f16 and so fails on bf16), a 1/sqrt(D) scale and
                  the (batch, heads, seq, head_dim) layout.
              mgpu_pipeline "pipelined": one warpgroup per block_q rows, `plgpu.emit_pipeline`
                  over K/V blocks carrying (acc, m, l); causal masks every block (no skipping).
              max_concurrent_steps: K/V pipeline depth (>= 2).
              ws_schedule (warp-specialized only; by default pingpong when causal, intra_overlap
                  otherwise, with 128-row K/V blocks: `MosaicGpuAttentionConfig.default`):
                  "pingpong": the two compute warpgroups take turns on the tensor cores (a
                  schedule barrier), each waiting for its own QK^T before its softmax;
                  "intra_overlap" (FlashAttention-3's intra-warpgroup pipelining): each
                  warpgroup issues QK^T of block j and P V of block j - 1 together and runs
                  block j's softmax while P V is in flight.
              ws_grid (warp-specialized only): "blocks", a block per tile of 2 * block_q rows
                  of a head; "persistent", a block per SM looping over the tiles (the heaviest
                  causal ones first), its K/V ring and barriers running on from tile to tile, so
                  that the memory warpgroup loads the next tile's K/V while this one ends;
                  "persistent_q_ahead", the same with O staged apart from Q (one more tile a
                  warpgroup in shared memory), so that the memory warpgroup loads the next
                  tile's Q too, once this one's last Q K^T has read it.
              tile_order (persistent ws_grid only): "by_head", a head's Q tiles one after another
                  (neighbouring SMs share its K/V through L2; causal, every other head's lightest
                  first); "by_q", every head's first Q tile (causal: its heaviest), then every
                  head's second, ... (K/V read once a rank where all heads' outgrow L2).

TPU VMEM model (`TpuAttentionConfig.footprint`, bytes; it = dtype bytes, 128 = lanes of the m/l scratch):
  Q and O tiles, double-buffered:   2 * 2 * block_q * head_dim * it
  m, l scratch and f32 accumulator: 2 * block_q * 128 * 4 + block_q * head_dim * 4
  scores and probabilities (f32):   2 * block_q * block_kv * 4
  emit_pipeline K, V tiles:         buffers * 2 * block_kv * head_dim * it
  unroll K, V (whole sequence, double-buffered across heads): 2 * 2 * seq * head_dim * it
At head_dim 256 in bf16, unroll's K/V alone are 16 MiB at seq 8k and 64 MiB at seq 32k: over a
64 MiB VMEM (v7x), while emit_pipeline's footprint does not depend on seq. (At head_dim 128,
seq 32k needs 32 MiB and still fits.)
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kernels.attention_config import CONFIGS, AttentionConfig, as_config
from kernels.knobs import refusal
from kernels.lowering import Platform, pallas_call
from kernels.members import Members

SHAPE_NAMES = ("batch", "heads", "seq", "head_dim")
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

AnyConfig = Mapping[str, Any] | AttentionConfig


# Heads whose f32 score matrices together stay under this many bytes are computed at once; the
# reference maps over the rest, so that (8, 32, 8192, 256) needs 2 GiB, not 64 GiB, of scores.
_REFERENCE_SCORE_BYTES = 1 << 31


def _attention_head(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    d = q.shape[-1]
    s = jnp.einsum("qd,kd->qk", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(d)
    if causal:
        seq = q.shape[-2]
        s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("qk,kd->qd", p, v.astype(jnp.float32)).astype(q.dtype)


def attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    """softmax(Q K^T / sqrt(D)) V in plain jax.numpy, computed in float32, a group of heads at a time."""
    batch, heads, seq, dim = q.shape
    flat = [x.reshape(batch * heads, seq, x.shape[-1]) for x in (q, k, v)]
    group = max(1, min(batch * heads, _REFERENCE_SCORE_BYTES // (seq * seq * 4)))
    one = lambda qkv: _attention_head(*qkv, causal)  # noqa: E731
    out = jax.vmap(one)(tuple(flat)) if group >= batch * heads else jax.lax.map(one, tuple(flat), batch_size=group)
    return out.reshape(batch, heads, seq, v.shape[-1])


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random Q, K, V of shape (batch, heads, seq, head_dim), normal with unit scale."""
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in jax.random.split(key, 3))


def shape_of(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[int, ...]:
    """(batch, heads, seq, head_dim) of Q."""
    return tuple(q.shape)


def attention_flops(shape: tuple[int, ...], causal: bool) -> int:
    """4 b h s^2 d for Q K^T and P V; half of that when causal."""
    batch, heads, seq, dim = shape
    full = 4 * batch * heads * seq * seq * dim
    return full // 2 if causal else full


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: Q, K, V read once, O written once."""
    return 4 * math.prod(shape) * jnp.dtype(dtype).itemsize


def check(config: AnyConfig, shape: tuple[int, ...], dtype: Any, target: str) -> AttentionConfig:
    """The typed config, checked against the shape; raises ConfigError when `build` would refuse it."""
    typed = as_config(config, target)
    typed.check(shape, dtype)
    return typed


def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
    """None when `build` accepts the config, else why not."""
    return refusal(lambda: check(config, shape, dtype, target))


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program: the TPU VMEM model above, or GPU shared memory."""
    return as_config(config, target).footprint(shape, dtype)


def default_config(shape: tuple[int, ...], target: str, causal: bool = False, dtype: Any = None) -> dict[str, Any]:
    """The target's default (`AttentionConfig.default`), valid at any supported shape, within
    on-chip memory at the inputs' dtype (None: bfloat16)."""
    return CONFIGS[target].default(shape, causal, jnp.bfloat16 if dtype is None else dtype).to_dict()


def build(config: AnyConfig, shape: tuple[int, ...], dtype: Any, platform: Platform,
          causal: bool) -> Callable[..., jax.Array]:
    """The Pallas attention for `config` on `platform`, causal or not: a function of (q, k, v).

    Any sequence length and head dim. Triton (and the plain interpreter) load Q, K and V masked
    at the sequence's end and the head's last column (zeros past them) and store O masked: no
    copies. The TPU and Mosaic GPU kernels run `padded_seq` rows and `padded_dim` columns, Q, K
    and V padded with zeros to them by copies where those exceed the shape (on Mosaic GPU rarely:
    see `MosaicGpuAttentionConfig.padded_seq`). Every kernel masks the keys from seq on
    (`kv_len`) and scales by 1 / sqrt(dim)."""
    typed = check(config, shape, dtype, platform.target)
    if platform.target in ("gpu-triton", "interpret"):
        return _generic_attention(typed, shape, dtype, platform, causal)
    seq, dim = shape[2], shape[3]
    # Pallas's GPU interpreter cannot read past an array's end as TMA does: it runs whole 8-row groups
    runs = shape[:2] + (typed.padded_seq(seq, None if platform.interpret else dim), typed.padded_dim(dim))
    if platform.target == "tpu":
        from kernels import attention_tpu

        kernel = attention_tpu.build(typed, runs, dtype, platform, causal, kv_len=seq, head_dim=dim)
    else:
        from kernels import attention_mgpu

        kernel = attention_mgpu.build(typed, runs, dtype, platform, causal, kv_len=seq, head_dim=dim)
    if runs == shape:
        return kernel
    pad = [(0, 0), (0, 0), (0, runs[2] - seq), (0, runs[3] - dim)]

    def padded(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return kernel(*(jnp.pad(x, pad) for x in (q, k, v)))[:, :, :seq, :dim]

    return padded


def q_block_order(launched: Any, count: int, causal: bool) -> Any:
    """The Q block a program launched `launched`-th along the Q axis computes: the same one, or,
    causal, the other way round, so that the blocks with the most K/V blocks start first and the
    last wave of programs holds the lightest ones (FlashAttention-3 schedules causal tiles so)."""
    return count - 1 - launched if causal else launched


def kv_blocks(q_block: Any, bq: int, bkv: int, kv_len: int, causal: bool) -> Any:
    """How many K/V blocks the Q block number `q_block` needs: those holding the kv_len keys (a
    part block last), and, causal, none after its last row."""
    whole = -(-kv_len // bkv)
    if not causal:
        return whole
    return jnp.minimum(lax.div((q_block + 1) * bq + bkv - 1, bkv), whole)


def key_mask(cols: jax.Array, rows: jax.Array | None, kv_len: int | None) -> jax.Array | None:
    """Which scores to keep: keys up to each row (`rows`, causal) and before kv_len (given when
    the last K/V block runs past the sequence); None when every score counts."""
    keep = None if rows is None else cols <= rows
    if kv_len is not None:
        keep = cols < kv_len if keep is None else keep & (cols < kv_len)
    return keep


def ragged_keys(kv_len: int, bkv: int, causal: bool) -> int | None:
    """kv_len when keys past it share the last K/V block and no causal mask hides them, else None.
    (Causal masks every key after a real query's row, and the rows past kv_len are dropped.)"""
    return kv_len if kv_len % bkv and not causal else None


# ------------------------------------------------------------------ Triton and plain interpret


def _generic_attention(config: AttentionConfig, shape: tuple[int, ...], dtype: Any, platform: Platform,
                       causal: bool) -> Callable[..., jax.Array]:
    """The Triton (and plain interpret) kernel for a checked config, at any shape: a function of
    (q, k, v). A program holds a Q block; its tiles are `padded_dim(dim)` columns wide (Triton's
    are powers of two). Loads past the sequence's end or the head's last column read zeros and
    stores there are dropped (masks, only where the shape needs them), so nothing is copied."""
    from jax.experimental.pallas import triton as pltriton  # masked loads and stores (interpret mode too)

    batch, heads, seq, dim = shape
    bq, bkv, width = config.block_q, config.block_kv, config.padded_dim(dim)
    limit = ragged_keys(seq, bkv, causal)
    scale = 1.0 / math.sqrt(dim)
    sq = pl.squeezed
    q_blocks = -(-seq // bq)

    def tile(start: Any, rows: int) -> tuple[tuple[Any, Any], jax.Array | None]:
        """The window of `rows` rows from `start`, and which of its elements are in the array."""
        window = (pl.ds(start, rows), pl.ds(0, width))
        keep = None
        if seq % rows:
            keep = (start + lax.broadcasted_iota(jnp.int32, (rows, width), 0)) < seq
        if width != dim:
            cols = lax.broadcasted_iota(jnp.int32, (rows, width), 1) < dim
            keep = cols if keep is None else keep & cols
        return window, keep

    def load(ref: Any, start: Any, rows: int) -> jax.Array:
        window, keep = tile(start, rows)
        return ref[window] if keep is None else pltriton.load(ref.at[window], mask=keep, other=0)

    def body(q_ref, k_ref, v_ref, o_ref):
        qi = q_block_order(pl.program_id(2), q_blocks, causal)
        q = load(q_ref, qi * bq, bq)
        rows = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, bkv), 0)

        def step(j, carry):
            m, l, acc = carry
            k, v = load(k_ref, j * bkv, bkv), load(v_ref, j * bkv, bkv)
            s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * scale
            keep = key_mask(j * bkv + lax.broadcasted_iota(jnp.int32, (bq, bkv), 1), rows if causal else None,
                            limit)
            if keep is not None:
                s = jnp.where(keep, s, MASK_VALUE)
            m_next = jnp.maximum(m, jnp.max(s, axis=1))
            alpha = jnp.exp(m - m_next)
            p = jnp.exp(s - m_next[:, None])
            acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            return m_next, l * alpha + jnp.sum(p, axis=1), acc

        init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
                jnp.zeros((bq, width), jnp.float32))
        _, l, acc = lax.fori_loop(0, kv_blocks(qi, bq, bkv, seq, causal), step, init)
        out = (acc / l[:, None]).astype(o_ref.dtype)
        window, keep = tile(qi * bq, bq)
        if keep is None:
            o_ref[window] = out
        else:
            pltriton.store(o_ref.at[window], out, mask=keep)

    # Whole (seq, dim) heads as blocks: each program reads and writes its rows through `tile`
    spec = pl.BlockSpec((sq, sq, seq, dim), lambda b, h, i: (b, h, 0, 0))
    return pallas_call(
        body, platform=platform, config=config.to_dict(),
        out_shape=jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)), grid=(batch, heads, q_blocks),
        in_specs=[spec, spec, spec], out_specs=spec, name="flash_attention",
    )


def variant(causal: bool) -> Members:
    """The protocol members of the causal or the non-causal kernel module (all but NAME); only
    `reference`, `flops` and `build` differ between the two."""
    kind = "causal" if causal else "non-causal"

    def reference_(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attention_reference(q, k, v, causal=causal)

    def flops_(shape: tuple[int, ...]) -> int:
        return attention_flops(shape, causal=causal)

    def default_config_(shape: tuple[int, ...], target: str, dtype: Any = None) -> dict[str, Any]:
        return default_config(shape, target, causal, dtype)

    def build_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
        return build(config, shape, dtype, platform, causal=causal)

    reference_.__doc__ = f"{kind.capitalize()} attention in plain jax.numpy, computed in float32."
    flops_.__doc__ = "2 b h s^2 d: half of the non-causal count." if causal else "4 b h s^2 d for Q K^T and P V."
    build_.__doc__ = f"The Pallas {kind} attention for `config`: a function of (q, k, v)."
    default_config_.__doc__ = f"The target's default for the {kind} kernel (`AttentionConfig.default`)."
    return Members(SHAPE_NAMES, TARGETS, reference_, make_inputs, shape_of, flops_, bytes_moved, footprint,
                   default_config_, check_config, build_)
