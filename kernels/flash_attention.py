"""Flash attention forward: O = softmax(Q K^T / sqrt(D)) V, per batch entry and head.

Q, K, V and O are (batch, heads, seq, head_dim); the softmax runs online over blocks of
block_kv keys in float32 (running max m, running sum l, f32 accumulator). This module is the
non-causal kernel; `kernels.flash_attention_causal` is the causal one (key j attends to query i
only when j <= i), built by the same code: causality changes the reference, so it is a kernel
of its own rather than a knob. Causal kernels skip the key blocks after a query block's last row.

Strategies and knobs (all targets: block_q, block_kv):
  tpu         attn_strategy "emit_pipeline": grid (batch, heads, q blocks); the Q tile sits in
                  VMEM while an inner `pltpu.emit_pipeline` streams (block_kv, head_dim) K and V
                  tiles from HBM; buffers (2 or 3) is the depth of that stream.
              attn_strategy "unroll": K and V of the (batch, head) are blocks of the grid, loaded
                  whole into VMEM; a `fori_loop` slices them with `pl.ds`. No inner DMA waits,
                  but VMEM grows with seq (see `footprint`).
  gpu-triton  num_warps, num_stages: one program per Q block looping over K/V blocks.
  interpret   the gpu-triton kernel without compiler params.
  gpu-mosaic  mgpu_pipeline "warp_specialized": FlashAttention-3 structure after JAX's
                  ops/gpu/attention_mgpu.py (two compute warpgroups of block_q rows each, one
                  TMA warpgroup, K/V slots guarded by barriers); here with any of bf16/f16 (JAX's
                  version allocates its SMEM as f16 and so fails on bf16), a 1/sqrt(D) scale and
                  the (batch, heads, seq, head_dim) layout.
              mgpu_pipeline "pipelined": one warpgroup per block_q rows, `plgpu.emit_pipeline`
                  over K/V blocks carrying (acc, m, l); causal masks every block (no skipping).
              max_concurrent_steps: K/V pipeline depth (>= 2).

TPU VMEM model (`footprint`, bytes; it = dtype bytes, 128 = lanes of the m/l scratch):
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

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call, triton_dot_buffers

NAME = "flash_attention"
CAUSAL = False
SHAPE_NAMES = ("batch", "heads", "seq", "head_dim")
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")

LANES = 128
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


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


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Non-causal attention in plain jax.numpy, computed in float32."""
    return attention_reference(q, k, v, causal=False)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random Q, K, V of shape (batch, heads, seq, head_dim), normal with unit scale."""
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in jax.random.split(key, 3))


def attention_flops(shape: tuple[int, ...], causal: bool) -> int:
    """4 b h s^2 d for Q K^T and P V; half of that when causal."""
    batch, heads, seq, dim = shape
    full = 4 * batch * heads * seq * seq * dim
    return full // 2 if causal else full


def flops(shape: tuple[int, ...]) -> int:
    """4 b h s^2 d for Q K^T and P V."""
    return attention_flops(shape, causal=False)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: Q, K, V read once, O written once."""
    return 4 * math.prod(shape) * jnp.dtype(dtype).itemsize


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program: the TPU VMEM model above, or GPU shared memory."""
    _, _, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    item = jnp.dtype(dtype).itemsize
    if target == "tpu":
        fixed = 2 * 2 * bq * dim * item + 2 * bq * LANES * 4 + bq * dim * 4 + 2 * bq * bkv * 4
        if config.get("attn_strategy", "emit_pipeline") == "unroll":
            return fixed + 2 * 2 * seq * dim * item
        return fixed + int(config.get("buffers", 2)) * 2 * bkv * dim * item
    if target == "gpu-mosaic":
        steps = min(int(config.get("max_concurrent_steps", 2)), seq // bkv)
        wgs = 2 if config.get("mgpu_pipeline", "warp_specialized") == "warp_specialized" else 1
        # Q/O tiles per compute warpgroup, the K and V slots, and 2.5 KiB for the reduction
        # scratch Mosaic GPU reserves (2 KiB) and barriers: at most 1 KiB above its own count.
        return wgs * bq * dim * item + 2 * steps * bkv * dim * item + 2560
    if target == "gpu-triton":  # the Q tile, and K and V tiles per pipeline buffer
        return bq * dim * item + triton_dot_buffers({"num_stages": 2, **config}, bq) * 2 * bkv * dim * item
    return (bq + 2 * bkv) * dim * item + bq * (bkv + dim) * 4


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """Modest blocks and the streaming strategy, valid at any supported shape."""
    _, _, seq, dim = shape
    if target == "tpu":
        block = 128 if seq % 128 == 0 else seq
        return {"block_q": block, "block_kv": block, "attn_strategy": "emit_pipeline", "buffers": 2}
    if target == "gpu-mosaic":
        return {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "warp_specialized",
                "max_concurrent_steps": 2}
    config = {"block_q": min(seq, 64), "block_kv": min(seq, 64)}
    if target == "gpu-triton":
        config |= {"num_warps": 4, "num_stages": 2}
    return config


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas non-causal attention for `config`: a function of (q, k, v)."""
    return build_attention(config, shape, dtype, platform, causal=False)


def build_attention(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform,
                    causal: bool):
    """The Pallas attention for `config` on `platform`, causal or not: a function of (q, k, v)."""
    _, _, seq, _ = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    if seq % bq or seq % bkv:
        raise ValueError(f"block_q = {bq} and block_kv = {bkv} must divide seq = {seq}")
    if platform.target == "tpu":
        from kernels.tpu_mesh import traced_for_tpu

        return traced_for_tpu(_tpu_attention(config, shape, dtype, platform, causal))
    if platform.target == "gpu-mosaic":
        if config.get("mgpu_pipeline", "warp_specialized") == "warp_specialized":
            return _mgpu_warp_specialized(config, shape, dtype, platform, causal)
        return _mgpu_pipelined(config, shape, dtype, platform, causal)
    return _generic_attention(config, shape, dtype, platform, causal)


def _kv_blocks(q_block: Any, bq: int, bkv: int, seq: int, causal: bool) -> Any:
    """How many K/V blocks the Q block number `q_block` needs (all, or up to its last row)."""
    if not causal:
        return seq // bkv
    return lax.div((q_block + 1) * bq + bkv - 1, bkv)


# ---------------------------------------------------------------------------------------- TPU


def _tpu_attention(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform,
                   causal: bool):
    from jax.experimental.pallas import tpu as pltpu

    from kernels.matmul_core import vmem_limit

    batch, heads, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    strategy = config.get("attn_strategy", "emit_pipeline")
    buffers = int(config.get("buffers", 2))
    if strategy not in ("emit_pipeline", "unroll"):
        raise ValueError(f"unknown attn_strategy {strategy!r}; expected 'emit_pipeline' or 'unroll'")
    if bkv % LANES or dim % LANES:
        raise NotImplementedError(f"tpu: block_kv and head_dim must be multiples of {LANES}")
    if strategy == "emit_pipeline" and buffers not in (2, 3):
        raise NotImplementedError(f"emit_pipeline takes buffers 2 or 3, got {buffers}")
    scale = 1.0 / math.sqrt(dim)
    sq = pl.squeezed

    def update(q, k, v, q_start, kv_start, m_ref, l_ref, acc_ref):
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        if causal:
            rows = lax.broadcasted_iota(jnp.int32, s.shape, 0) + q_start
            cols = lax.broadcasted_iota(jnp.int32, s.shape, 1) + kv_start
            s = jnp.where(cols <= rows, s, MASK_VALUE)
        m_prev, l_prev = m_ref[...], l_ref[...]  # (bq, 128), replicated across lanes
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
        p = jnp.exp(s - jnp.tile(m_next, (1, bkv // LANES)))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_prev + jnp.sum(p, axis=1)[:, None]
        pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * jnp.tile(alpha, (1, dim // LANES)) + pv
        m_ref[...] = m_next

    def body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *step_ref):
        b, h, qi = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        q = q_ref[...]
        q_start = qi * bq
        steps = _kv_blocks(qi, bq, bkv, seq, causal)
        if strategy == "unroll":
            def step(j, carry):
                kv = pl.ds(pl.multiple_of(j * bkv, bkv), bkv)
                update(q, k_ref[kv, :], v_ref[kv, :], q_start, j * bkv, m_ref, l_ref, acc_ref)
                return carry

            lax.fori_loop(0, steps, step, 0)
        else:
            (counter,) = step_ref  # an SMEM scalar: which K/V block the pipeline body sees

            counter[0] = 0

            def inner(k_tile, v_tile):
                j = counter[0]
                update(q, k_tile[...], v_tile[...], q_start, j * bkv, m_ref, l_ref, acc_ref)
                counter[0] = j + 1

            mode = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
            kv_spec = pl.BlockSpec((bkv, dim), lambda j: (j, 0), **mode)
            pltpu.emit_pipeline(inner, grid=(steps,), in_specs=[kv_spec, kv_spec])(
                k_ref.at[b, h], v_ref.at[b, h])
        o_ref[...] = (acc_ref[...] / jnp.tile(l_ref[...], (1, dim // LANES))).astype(o_ref.dtype)

    q_spec = pl.BlockSpec((sq, sq, bq, dim), lambda b, h, i: (b, h, i, 0))
    if strategy == "unroll":
        kv_spec = pl.BlockSpec((sq, sq, seq, dim), lambda b, h, i: (b, h, 0, 0))
    else:
        kv_spec = pl.BlockSpec(memory_space=pl.ANY)
    scratch = [pltpu.VMEM((bq, LANES), jnp.float32), pltpu.VMEM((bq, LANES), jnp.float32),
               pltpu.VMEM((bq, dim), jnp.float32)]
    if strategy == "emit_pipeline":
        scratch.append(pltpu.SMEM((1,), jnp.int32))
    fp = footprint(config, shape[:4], dtype, "tpu")
    return pallas_call(
        body, platform=platform, config=config,
        out_shape=jax.ShapeDtypeStruct(shape[:4], jnp.dtype(dtype)), grid=(batch, heads, seq // bq),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec, scratch_shapes=scratch,
        tpu_params={"dimension_semantics": ("parallel",) * 3, "vmem_limit_bytes": vmem_limit(fp)},
        name=f"flash_attention_{strategy}",
    )


# ------------------------------------------------------------------ Triton and plain interpret


def _generic_attention(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform,
                       causal: bool):
    batch, heads, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    scale = 1.0 / math.sqrt(dim)
    sq = pl.squeezed

    def body(q_ref, k_ref, v_ref, o_ref):
        qi = pl.program_id(2)
        q = q_ref[...]
        rows = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, bkv), 0)

        def step(j, carry):
            m, l, acc = carry
            kv = pl.ds(j * bkv, bkv)
            k, v = k_ref[kv, :], v_ref[kv, :]
            s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * scale
            if causal:
                cols = j * bkv + lax.broadcasted_iota(jnp.int32, (bq, bkv), 1)
                s = jnp.where(cols <= rows, s, MASK_VALUE)
            m_next = jnp.maximum(m, jnp.max(s, axis=1))
            alpha = jnp.exp(m - m_next)
            p = jnp.exp(s - m_next[:, None])
            acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            return m_next, l * alpha + jnp.sum(p, axis=1), acc

        init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
                jnp.zeros((bq, dim), jnp.float32))
        _, l, acc = lax.fori_loop(0, _kv_blocks(qi, bq, bkv, seq, causal), step, init)
        o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)

    q_spec = pl.BlockSpec((sq, sq, bq, dim), lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((sq, sq, seq, dim), lambda b, h, i: (b, h, 0, 0))
    return pallas_call(
        body, platform=platform, config=config,
        out_shape=jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)), grid=(batch, heads, seq // bq),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec, name="flash_attention",
    )


# ----------------------------------------------------------------------------- Mosaic GPU


def _mgpu_checks(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, rows_per_block: int) -> int:
    _, _, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise NotImplementedError(f"gpu-mosaic attention takes bfloat16 or float16, not {jnp.dtype(dtype)}")
    if bq % 64 or bkv % 64 or dim % 64:
        raise NotImplementedError("gpu-mosaic: block_q, block_kv and head_dim must be multiples of 64")
    if seq % rows_per_block:
        raise NotImplementedError(f"gpu-mosaic: seq = {seq} must be a multiple of {rows_per_block}")
    steps = int(config.get("max_concurrent_steps", 2))
    if steps < 2:
        raise NotImplementedError("gpu-mosaic: max_concurrent_steps must be at least 2")
    return min(steps, seq // bkv)


def _qk(q_smem: Any, k_tile: Any, interpret: bool, while_running: Any = None) -> jax.Array:
    """Q K^T in float32 with WGMMA (K^T read through `transpose_ref`); see `_pv` on interpret."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if interpret:
        s = jnp.dot(q_smem[...], k_tile[...].T, preferred_element_type=jnp.float32)
        if while_running is not None:
            while_running()
        return s

    def mma(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, plgpu.transpose_ref(k_tile, (1, 0)))
        if while_running is not None:
            while_running()
        return acc_ref[...]

    return pl.run_scoped(mma, plgpu.ACC((q_smem.shape[0], k_tile.shape[0]), jnp.float32))


def _pv(acc: jax.Array, p: jax.Array, v_tile: Any, interpret: bool, while_running: Any = None) -> jax.Array:
    """acc + P V with WGMMA, P from registers, accumulating in place (`pl.run_state`).

    Pallas's GPU interpreter (JAX 0.10) supports neither transposed SMEM operands, nor
    register operands of WGMMA, nor `run_state`; in interpret mode the two matmuls of the kernel
    are `jnp.dot`s of the SMEM tiles instead, and everything else (TMA, barriers, warpgroups,
    pipelining, the online softmax and the causal masking and skipping) runs as on the GPU.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if interpret:
        acc = acc + jnp.dot(p, v_tile[...], preferred_element_type=jnp.float32)
        if while_running is not None:
            while_running()
        return acc

    def mma(acc_ref):
        plgpu.wgmma(acc_ref, p, v_tile)
        if while_running is not None:
            while_running()

    return pl.run_state(mma)(plgpu.ACC.init(acc))


def _softmax_step(qk: jax.Array, acc: jax.Array, m_i: jax.Array, l_i: jax.Array, scale_log2: float,
                  dtype: Any, causal_origin: tuple[Any, Any] | None) -> tuple[jax.Array, ...]:
    """One online-softmax step in base 2: P (in `dtype`), acc rescaled, the new max and sum.

    causal_origin: (first query row, first key) of the block, to mask keys after each row.
    Row maxima stay finite: key block 0 is unmasked for every row and is processed first.
    """
    if causal_origin is not None:
        q_start, kv_start = causal_origin
        rows = q_start + lax.broadcasted_iota(jnp.int32, qk.shape, 0)
        cols = kv_start + lax.broadcasted_iota(jnp.int32, qk.shape, 1)
        qk = jnp.where(cols <= rows, qk, -jnp.inf)
    m_next = jnp.maximum(m_i, qk.max(axis=1) * scale_log2)
    alpha = jnp.exp2(m_i - m_next)
    p = jnp.exp2(qk * scale_log2 - lax.broadcast_in_dim(m_next, qk.shape, [0]))
    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
    return p.astype(dtype), acc, m_next, l_i * alpha + p.sum(axis=1)


def _smem_transforms() -> tuple[Any, ...]:
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)


def _mgpu_warp_specialized(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
                           platform: Platform, causal: bool):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel

    batch, heads, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    steps = _mgpu_checks(config, shape, dtype, 2 * bq)
    dtype = jnp.dtype(dtype)
    scale_log2 = math.log2(math.e) / math.sqrt(dim)  # softmax in base 2, scale folded in
    compute_wgs = 2

    def kernel(q_ref, k_ref, v_ref, out_ref, smem, loaded, consumed, schedule_barrier):
        b, h = lax.axis_index("batch"), lax.axis_index("heads")
        wg = lax.axis_index("wg")
        qo_smem2, k_smem, v_smem = smem
        k_loaded, v_loaded, q_loaded = loaded
        k_consumed, v_consumed = consumed
        q_tile = lax.axis_index("q_seq")
        # K/V blocks this CTA's 2 * block_q rows need; each compute warpgroup may need fewer.
        cta_kv_steps = _kv_blocks(q_tile, 2 * bq, bkv, seq, causal)

        def schedule():
            # Lets the two compute warpgroups take turns on the tensor cores.
            plgpu.barrier_arrive(schedule_barrier)
            plgpu.barrier_wait(schedule_barrier)

        @pl.when(wg < compute_wgs)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            qo_smem = qo_smem2.at[wg]
            q_base = q_tile * (2 * bq) + wg * bq
            kv_steps = lax.div(q_base + bq + bkv - 1, bkv) if causal else cta_kv_steps
            plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, bq)], qo_smem, q_loaded.at[wg])
            plgpu.barrier_wait(q_loaded.at[wg])
            carry = (jnp.zeros((bq, dim), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
                     jnp.zeros((bq,), jnp.float32))
            plgpu.barrier_wait(k_loaded.at[0])
            pl.when(wg == 1)(schedule)

            def kv_step(j, carry, masked=False):
                acc, m_i, l_i = carry
                slot = lax.rem(j, jnp.array(steps, j.dtype))

                qk = _qk(qo_smem, k_smem.at[slot], platform.interpret, while_running=schedule)
                plgpu.barrier_arrive(k_consumed.at[slot])
                p, acc, m_next, l_i = _softmax_step(qk, acc, m_i, l_i, scale_log2, dtype,
                                                    (q_base, j * bkv) if masked else None)
                plgpu.barrier_arrive(schedule_barrier)
                plgpu.barrier_wait(v_loaded.at[slot])
                plgpu.barrier_wait(schedule_barrier)

                def wait_next():
                    nxt = j + 1

                    @pl.when(nxt < kv_steps)
                    def _wait_next():
                        plgpu.barrier_wait(k_loaded.at[lax.rem(nxt, jnp.array(steps, j.dtype))])

                acc = _pv(acc, p, v_smem.at[slot], platform.interpret, while_running=wait_next)
                plgpu.barrier_arrive(v_consumed.at[slot])
                return acc, m_next, l_i

            if not causal:
                acc, _, l_i = lax.fori_loop(0, kv_steps, kv_step, carry)
            else:
                # Blocks wholly at or below the diagonal need no mask; the rest are masked; then
                # the blocks the other warpgroup still needs are released unread.
                unmasked = lax.div(q_base, bkv)
                carry = lax.fori_loop(0, unmasked, kv_step, carry)
                acc, _, l_i = lax.fori_loop(unmasked, kv_steps, functools.partial(kv_step, masked=True),
                                            carry)

                def release(j, _):
                    slot = lax.rem(j, jnp.array(steps, j.dtype))
                    plgpu.barrier_wait(k_loaded.at[slot])
                    plgpu.barrier_wait(v_loaded.at[slot])
                    plgpu.barrier_arrive(k_consumed.at[slot])
                    plgpu.barrier_arrive(v_consumed.at[slot])
                    schedule()
                    schedule()

                lax.fori_loop(kv_steps, cta_kv_steps, release, None)
            pl.when(wg == 0)(schedule)
            acc = acc / lax.broadcast_in_dim(l_i, (bq, dim), [0])
            qo_smem[...] = acc.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[b, h, pl.ds(q_base, bq)])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == compute_wgs)
        def _memory():
            plgpu.set_max_registers(40, action="decrease")
            for i in range(steps):
                @pl.when(i < cta_kv_steps)
                def _prefetch():
                    kv = (b, h, pl.ds(i * bkv, bkv))
                    plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem.at[i], k_loaded.at[i])
                    plgpu.copy_gmem_to_smem(v_ref.at[kv], v_smem.at[i], v_loaded.at[i])

            @pl.loop(0, cta_kv_steps - steps)
            def _stream(j):
                slot = lax.rem(j, jnp.array(steps, j.dtype))
                kv = (b, h, pl.ds((j + steps) * bkv, bkv))
                plgpu.barrier_wait(k_consumed.at[slot])
                plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem.at[slot], k_loaded.at[slot])
                plgpu.barrier_wait(v_consumed.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[kv], v_smem.at[slot], v_loaded.at[slot])

            # Observe the last releases too, so that no barrier phase goes unobserved.
            @pl.loop(jnp.maximum(cta_kv_steps - steps, 0), cta_kv_steps)
            def _drain(j):
                slot = lax.rem(j, jnp.array(steps, j.dtype))
                plgpu.barrier_wait(k_consumed.at[slot])
                plgpu.barrier_wait(v_consumed.at[slot])

    def entry(q_ref, k_ref, v_ref, out_ref):
        tf = _smem_transforms()
        smem = (plgpu.SMEM((compute_wgs, bq, dim), dtype, transforms=tf),
                plgpu.SMEM((steps, bkv, dim), dtype, transforms=tf),
                plgpu.SMEM((steps, bkv, dim), dtype, transforms=tf))
        loaded = (plgpu.Barrier(num_barriers=steps), plgpu.Barrier(num_barriers=steps),
                  plgpu.Barrier(num_barriers=compute_wgs))
        consumed = (plgpu.Barrier(num_arrivals=compute_wgs, num_barriers=steps),) * 2
        pl.run_scoped(lambda *scoped: kernel(q_ref, k_ref, v_ref, out_ref, *scoped), smem, loaded,
                      consumed, plgpu.Barrier(num_arrivals=compute_wgs), collective_axes="wg")

    call = mosaic_kernel(
        entry, platform=platform, out_shape=(jax.ShapeDtypeStruct(shape, dtype),),
        grid=(heads, seq // (2 * bq), batch), grid_names=("heads", "q_seq", "batch"),
        num_threads=compute_wgs + 1, thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        name="flash_attention_mgpu_ws")
    return lambda q, k, v: call(q, k, v)[0]


def _mgpu_pipelined(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform,
                    causal: bool):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel

    batch, heads, seq, dim = shape
    bq, bkv = int(config["block_q"]), int(config["block_kv"])
    steps = _mgpu_checks(config, shape, dtype, bq)
    dtype = jnp.dtype(dtype)
    scale_log2 = math.log2(math.e) / math.sqrt(dim)

    def kernel(q_ref, k_ref, v_ref, out_ref):
        b, h, qi = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q_seq")
        q_base = qi * bq

        def scoped(qo_smem, q_loaded):
            plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, bq)], qo_smem, q_loaded)
            plgpu.barrier_wait(q_loaded)

            def step(idx, k_smem, v_smem, carry):
                acc, m_i, l_i = carry
                (j,) = idx

                qk = _qk(qo_smem, k_smem, platform.interpret)
                p, acc, m_next, l_i = _softmax_step(qk, acc, m_i, l_i, scale_log2, dtype,
                                                    (q_base, j * bkv) if causal else None)
                acc = _pv(acc, p, v_smem, platform.interpret)
                return acc, m_next, l_i

            init = (jnp.zeros((bq, dim), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
                    jnp.zeros((bq,), jnp.float32))
            kv_spec = plgpu.BlockSpec((bkv, dim), lambda j: (j, 0), transforms=_smem_transforms())
            acc, _, l_i = plgpu.emit_pipeline(
                step, grid=(seq // bkv,), in_specs=[kv_spec, kv_spec], max_concurrent_steps=steps,
                init_carry=init)(k_ref.at[b, h], v_ref.at[b, h])
            acc = acc / lax.broadcast_in_dim(l_i, (bq, dim), [0])
            qo_smem[...] = acc.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[b, h, pl.ds(q_base, bq)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped, plgpu.SMEM((bq, dim), dtype, transforms=_smem_transforms()), plgpu.Barrier())

    call = mosaic_kernel(
        kernel, platform=platform, out_shape=(jax.ShapeDtypeStruct(shape, dtype),),
        grid=(heads, seq // bq, batch), grid_names=("heads", "q_seq", "batch"),
        compiler_params=plgpu.CompilerParams(
            approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        name="flash_attention_mgpu_pipelined")
    return lambda q, k, v: call(q, k, v)[0]
