"""The matmul core on Mosaic TPU: the K loop as a grid axis, an inner `emit_pipeline`, or a
VMEM-resident panel (the k_strategy knob; see `kernels.matmul_core`)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call
from kernels.matmul_config import Epilogue, Problem, TpuMatmulConfig
from kernels.matmul_core import as_rows
from kernels.tpu_mesh import traced_for_tpu, vmem_limit


def _store_epilogue(acc_ref: Any, vec_refs: tuple[Any, ...], o_ref: Any, epilogue: Epilogue,
                    epi_m: int, epi_n: int) -> None:
    """Apply the epilogue to acc_ref one (epi_m, epi_n) sub-tile at a time and store it."""
    bm, bn = acc_ref.shape
    for r in range(bm // epi_m):
        for c in range(bn // epi_n):
            rows, cols = pl.ds(r * epi_m, epi_m), pl.ds(c * epi_n, epi_n)
            vecs = [jnp.broadcast_to(v[:, cols].astype(jnp.float32), (epi_m, epi_n)) for v in vec_refs]
            o_ref[rows, cols] = epilogue.fn(acc_ref[rows, cols], *vecs).astype(o_ref.dtype)


def build(problem: Problem, config: TpuMatmulConfig, dtype: Any, platform: Platform) -> Callable[..., jax.Array]:
    """The TPU kernel for a checked config: a function of (a, b, *vectors), traced for TPU."""
    from jax.experimental.pallas import tpu as pltpu

    bm, bn, bk = config.block_m, config.block_n, config.block_k
    m, n, k = problem.m, problem.n, problem.k
    strategy, buffers = config.k_strategy, config.buffers
    epi_m, epi_n = config.epilogue_tile()
    mode = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    nb = 1 if problem.batch else 0
    sq = (pl.squeezed,) * nb
    sqb = (pl.squeezed,) if problem.batched_b else ()
    epilogue, n_vec = problem.epilogue, problem.epilogue.vectors

    def a_batch(g):  # the batch index of A and C (and B unless shared)
        return tuple(g[:nb])

    def b_batch(g):
        return tuple(g[:nb]) if problem.batched_b else ()

    grid = (problem.batch,) * nb + (m // bm, n // bn)
    semantics = ("parallel",) * len(grid)
    if strategy == "grid":
        grid += (k // bk,)
        semantics += ("arbitrary",)
        in_specs = [
            pl.BlockSpec(sq + (bm, bk), lambda *g: a_batch(g) + (g[nb], g[-1]), **mode),
            pl.BlockSpec(sqb + (bk, bn), lambda *g: b_batch(g) + (g[-1], g[nb + 1]), **mode),
        ]
    elif strategy == "resident":
        in_specs = [
            pl.BlockSpec(sq + (bm, k), lambda *g: a_batch(g) + (g[nb], 0), **mode),
            pl.BlockSpec(sqb + (k, bn), lambda *g: b_batch(g) + (0, g[nb + 1]), **mode),
        ]
    else:
        in_specs = [pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)]
    in_specs += [pl.BlockSpec((1, bn), lambda *g: (0, g[nb + 1]))] * n_vec
    out_spec = pl.BlockSpec(sq + (bm, bn), lambda *g: a_batch(g) + (g[nb], g[nb + 1]))

    def body(a_ref, b_ref, *refs):
        vec_refs, o_ref, acc_ref = refs[:n_vec], refs[n_vec], refs[n_vec + 1]
        store = functools.partial(_store_epilogue, acc_ref, vec_refs, o_ref, epilogue, epi_m, epi_n)
        if strategy == "grid":
            kk = pl.program_id(len(grid) - 1)

            @pl.when(kk == 0)
            def _init():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
            pl.when(kk == pl.num_programs(len(grid) - 1) - 1)(store)
            return
        acc_ref[...] = jnp.zeros_like(acc_ref)
        if strategy == "resident":
            def step(s, carry):
                ks = pl.ds(pl.multiple_of(s * bk, bk), bk)
                acc_ref[...] += jnp.dot(a_ref[:, ks], b_ref[ks, :], preferred_element_type=jnp.float32)
                return carry

            lax.fori_loop(0, k // bk, step, 0)
        else:
            i, j = pl.program_id(nb), pl.program_id(nb + 1)
            a_view = a_ref.at[pl.program_id(0)] if nb else a_ref
            b_view = b_ref.at[pl.program_id(0)] if problem.batched_b else b_ref

            def inner(a_tile, b_tile):
                acc_ref[...] += jnp.dot(a_tile[...], b_tile[...], preferred_element_type=jnp.float32)

            pltpu.emit_pipeline(
                inner, grid=(k // bk,),
                in_specs=[pl.BlockSpec((bm, bk), lambda s: (0, s), **mode),
                          pl.BlockSpec((bk, bn), lambda s: (s, 0), **mode)],
            )(a_view.at[pl.ds(i * bm, bm), :], b_view.at[:, pl.ds(j * bn, bn)])
        store()

    call = pallas_call(
        body, platform=platform, config=config.to_dict(), out_shape=problem.out_shape(dtype), grid=grid,
        in_specs=in_specs, out_specs=out_spec, scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        tpu_params={"dimension_semantics": semantics,
                    "vmem_limit_bytes": vmem_limit(config.footprint(problem, dtype))},
        name=f"matmul_{strategy}",
    )
    return traced_for_tpu(lambda a, b, *vectors: call(a, b, *as_rows(vectors)))
