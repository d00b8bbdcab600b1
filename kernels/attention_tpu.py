"""Flash attention on Mosaic TPU: K/V streamed by an inner `emit_pipeline`, or whole in VMEM and
unrolled (the attn_strategy knob; see `kernels.attention_core`)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.attention_config import LANES, TpuAttentionConfig
from kernels.attention_core import MASK_VALUE, key_mask, kv_blocks, ragged_keys
from kernels.lowering import Platform, pallas_call
from kernels.tpu_mesh import traced_for_tpu, vmem_limit


def build(config: TpuAttentionConfig, shape: tuple[int, ...], dtype: Any, platform: Platform,
          causal: bool, kv_len: int, head_dim: int) -> Callable[..., jax.Array]:
    """The TPU kernel for a checked config and a shape of whole blocks whose first kv_len keys
    (and first head_dim columns: the scale's) are real: a function of (q, k, v), traced for TPU."""
    from jax.experimental.pallas import tpu as pltpu

    batch, heads, seq, dim = shape
    bq, bkv = config.block_q, config.block_kv
    strategy, buffers = config.attn_strategy, config.buffers
    scale = 1.0 / math.sqrt(head_dim)
    sq = pl.squeezed
    limit = ragged_keys(kv_len, bkv, causal)

    def update(q, k, v, q_start, kv_start, m_ref, l_ref, acc_ref):
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        rows = lax.broadcasted_iota(jnp.int32, s.shape, 0) + q_start if causal else None
        keep = key_mask(lax.broadcasted_iota(jnp.int32, s.shape, 1) + kv_start, rows, limit)
        if keep is not None:
            s = jnp.where(keep, s, MASK_VALUE)
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
        steps = kv_blocks(qi, bq, bkv, kv_len, causal)
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
    fp = config.footprint(shape, dtype)
    return traced_for_tpu(pallas_call(
        body, platform=platform, config=config.to_dict(),
        out_shape=jax.ShapeDtypeStruct(shape[:4], jnp.dtype(dtype)), grid=(batch, heads, seq // bq),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec, scratch_shapes=scratch,
        tpu_params={"dimension_semantics": ("parallel",) * 3, "vmem_limit_bytes": vmem_limit(fp)},
        name=f"flash_attention_{strategy}",
    ))
