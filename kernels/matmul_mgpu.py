"""The matmul core on Mosaic GPU (Hopper): a persistent warp-specialized kernel, or one singly
pipelined warpgroup per block (the mgpu_pipeline knob; see `kernels.matmul_core`). The persistent
kernel can split its last row bands' tiles along K (tail_split: `matmul_config.TailPlan`), each
slot then running its whole tiles and its pieces in one loop through one pipeline.

A ping-pong schedule (each compute warpgroup its own tile, in turn, one ring of operand slots
each) was built and measured 18% to 2.2x slower than the warp-specialized kernel on bmm 64 x 2048³
(H200; BENCHMARKS.md, twenty-first session; its patch is kept beside the results): two rings
halve the slots the active warpgroup has, and one shared ring needs per-warpgroup barrier
phases that `plgpu.barrier_wait` does not take.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform
from kernels.matmul_config import MosaicGpuMatmulConfig, Problem


def build(problem: Problem, config: MosaicGpuMatmulConfig, dtype: Any,
          platform: Platform, writes: Problem | None = None) -> Callable[..., jax.Array]:
    """The Mosaic GPU kernel for a checked config: a function of (a, b, *vectors) of `problem`'s
    shapes. writes: the product's (m, n) when smaller than `problem`'s (operands padded to whole
    TMA units, product not): it is then stored by the threads (`kernels.mgpu_store`), not by TMA."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel
    from kernels.mgpu_store import store_tile

    t = config.tiles()
    bm, bn, bk, epi_m, epi_n, steps = t.bm, t.bn, t.bk, t.epi_m, t.epi_n, t.steps
    item = jnp.dtype(dtype).itemsize
    out_dtype = jnp.dtype(problem.out_dtype or dtype)
    # Ragged edge tiles are read and written as they are: TMA fills what lies past an operand's
    # edge with zeros and skips the output's (see MosaicGpuMatmulConfig.padded).
    m_iters, n_iters, k_iters = pl.cdiv(problem.m, t.cta_m), pl.cdiv(problem.n, t.cta_n), pl.cdiv(problem.k, bk)
    batches, n_vec, epilogue = max(problem.batch, 1), problem.epilogue.vectors, problem.epilogue
    writes = writes or problem
    direct = (writes.m, writes.n) != (problem.m, problem.n)
    if direct and epilogue.row_stats:
        raise ValueError("row statistics are stored by TMA: the product must be written whole tiles")

    def transforms(minor_elems: int, itemsize: int) -> tuple[Any, ...]:
        swizzle = plgpu.find_swizzle(minor_elems * itemsize * 8)
        return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)

    in_transforms = transforms(bk, item)
    out_transforms = transforms(epi_n, out_dtype.itemsize)

    class OutTile(NamedTuple):
        """Where a tile of the product goes: a TMA view of it, or (direct) the whole 2-D output
        and the tile's first row and column."""
        ref: Any
        row0: Any = 0
        col0: Any = 0

        def part(self, rows: Any, cols: Any, row_off: Any, col_off: Any) -> OutTile:
            if direct:
                return OutTile(self.ref, self.row0 + row_off, self.col0 + col_off)
            return OutTile(self.ref.at[rows, cols])

    def views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx):
        if problem.batch:
            a_gmem, out_gmem = a_gmem.at[bi], out_gmem.at[bi]
        if problem.batched_b:
            b_gmem = b_gmem.at[bi]
        rows, cols = pl.ds(m_idx * t.cta_m, t.cta_m), pl.ds(n_idx * t.cta_n, t.cta_n)
        out = OutTile(out_gmem, m_idx * t.cta_m, n_idx * t.cta_n) if direct else OutTile(out_gmem.at[rows, cols])
        return a_gmem.at[rows, :], b_gmem.at[:, cols], out, cols

    row_stats = epilogue.row_stats

    def store_row_stats(acc, stats_smem, stats_gmem, rows, col_tile):
        # Each row's sum over this warpgroup's bn columns and its squared deviations from their
        # mean (see Epilogue.row_stats): two (bm,) f32 vectors, stored by 1-D TMA copies.
        sums = jnp.sum(acc, axis=1)
        centred = acc - lax.broadcast_in_dim(sums * (1.0 / bn), (bm, bn), [0])
        stats_smem[0] = sums
        stats_smem[1] = jnp.sum(centred * centred, axis=1)
        plgpu.commit_smem()
        for i in range(2):
            plgpu.copy_smem_to_gmem(stats_smem.at[i], stats_gmem.at[i, col_tile, rows])

    def epilogue_store(acc, vec_smem, out_smem, out_tile: OutTile, transform=None):
        # acc: this warpgroup's (bm, bn) f32 tile; stored one (epi_m, epi_n) sub-tile at a time
        # through two SMEM slots, so the TMA store of one overlaps the math of the next; or, when
        # TMA cannot address the output, through one plain SMEM tile by the threads' own stores
        # (store_tile). transform: what to store of each f32 sub-tile instead of the epilogue's
        # value (a split tile's partial product).
        if not direct:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        per_row = bn // epi_n
        for r in range(bm // epi_m):
            for c in range(per_row):
                sub = acc[r * epi_m:(r + 1) * epi_m, c * epi_n:(c + 1) * epi_n]
                vecs = [lax.broadcast_in_dim(vec_smem[v, pl.ds(c * epi_n, epi_n)].astype(jnp.float32),
                                             (epi_m, epi_n), [1]) for v in range(n_vec if transform is None else 0)]
                value = epilogue.fn(sub, *vecs).astype(out_dtype) if transform is None else transform(sub)
                if direct:  # out_smem: one plain (epi_m, epi_n) tile
                    out_smem[...] = value
                    store_tile(out_smem, out_tile.ref, out_tile.row0 + r * epi_m, out_tile.col0 + c * epi_n)
                    continue
                slot = (r * per_row + c) % t.slots
                plgpu.wait_smem_to_gmem(t.slots - 1, wait_read_only=True)
                out_smem[slot] = value
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_smem.at[slot], out_tile.ref.at[pl.ds(r * epi_m, epi_m),
                                                                          pl.ds(c * epi_n, epi_n)])

    def load_vectors(vec_gmem, vec_smem, vec_barrier, cols):
        for v, ref in enumerate(vec_gmem):
            plgpu.copy_gmem_to_smem(ref.at[cols], vec_smem.at[v], vec_barrier)

    out_shape = (writes.out_shape(dtype),)
    if row_stats:
        # whole row tiles: a 1-D TMA store of a ragged tile's statistics is not cut at m
        # (Epilogue.row_stats)
        out_shape += (jax.ShapeDtypeStruct((2, problem.n // bn, m_iters * t.cta_m), jnp.float32),)
    # Shared memory only for what the epilogue uses: at the largest tiles and depths, 512 bytes of
    # unused vector tile are the difference between fitting and not.
    vec_scratch = plgpu.SMEM((n_vec, bn), dtype) if n_vec else None
    vec_barrier = plgpu.Barrier(num_arrivals=n_vec) if n_vec else None
    stats_scratch = plgpu.SMEM((2, bm), jnp.float32) if row_stats else None

    if not config.warp_specialized:
        def body(a_gmem, b_gmem, *refs):
            vec_gmem, out_gmem = refs[:n_vec], refs[n_vec]
            bi, m_idx, n_idx = (lax.axis_index(a) for a in ("b", "m", "n"))
            a_view, b_view, out_tile, cols = views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx)

            def scoped(out_smem, vec_smem, vec_barrier, stats_smem):
                if n_vec:
                    load_vectors(vec_gmem, vec_smem, vec_barrier, cols)

                def with_acc(acc_ref):
                    def mma(_, a_smem, b_smem):
                        plgpu.wgmma(acc_ref, a_smem, b_smem)
                        plgpu.wgmma_wait(1)  # keep one WGMMA in flight; its tiles are released late

                    spec = functools.partial(plgpu.BlockSpec, transforms=in_transforms, delay_release=1)
                    plgpu.emit_pipeline(
                        mma, grid=(k_iters,), max_concurrent_steps=steps,
                        in_specs=[spec((bm, bk), lambda kk: (0, kk)), spec((bk, bn), lambda kk: (kk, 0))],
                    )(a_view, b_view)
                    plgpu.wgmma_wait(0)
                    if n_vec:
                        plgpu.barrier_wait(vec_barrier)
                    acc = acc_ref[...]
                    epilogue_store(acc, vec_smem, out_smem, out_tile)
                    if row_stats:
                        store_row_stats(acc, stats_smem, refs[n_vec + 1], pl.ds(m_idx * bm, bm), n_idx)

                pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))
                if not direct:
                    plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(scoped, plgpu.SMEM((epi_m, epi_n), out_dtype) if direct else plgpu.SMEM(
                              (t.slots, epi_m, epi_n), out_dtype, transforms=out_transforms),
                          vec_scratch, vec_barrier, stats_scratch)

        call = mosaic_kernel(
            body, platform=platform, out_shape=out_shape, grid=(batches, m_iters, n_iters),
            grid_names=("b", "m", "n"),
            compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
            name="matmul_mgpu_pipelined")
        return lambda a, b, *vectors: _outputs(call(a, b, *vectors), row_stats)

    split = config.wg_split
    grid_minor = {"m": 0, "n": 1}[config.grid_minor]
    tile_width = config.grid_tile_width
    # Clusters of two blocks side by side along m or n; the operand both share is multicast.
    cluster_blocks = config.cluster_size
    cl_m, cl_n = (cluster_blocks if config.cluster == d else 1 for d in ("m", "n"))
    m_clusters, n_clusters = m_iters // cl_m, n_iters // cl_n
    share_a = ("cluster",) if config.cluster == "n" else ()  # both blocks read the same rows of A
    share_b = ("cluster",) if config.cluster == "m" else ()  # ... or the same columns of B
    delay = config.delay_release  # WGMMAs in flight at a step's end; its slots are released this late
    # tail_split: the last entry's last plan.bands cluster row bands run as pieces, runs of K of
    # k_run steps, after the whole tiles; each piece stores its f32 partial product as two halves
    # of the output dtype (high, and the rest), summed after the kernel (MosaicGpuMatmulConfig.tail).
    plan = config.tail(problem, dtype)
    tiles = plan.head_tiles
    head_bands = m_clusters - plan.bands  # of the last batch entry
    head_rows = head_bands * cl_m * t.cta_m
    tail_tiles = plan.bands * n_clusters
    k_run = k_iters // plan.splits
    if plan.bands:
        out_shape += (jax.ShapeDtypeStruct((plan.splits, 2, problem.m - head_rows, writes.n), out_dtype),)

    def halves(sub):  # an f32 partial as (its value in out_dtype, what that leaves) of out_dtype
        high = sub.astype(out_dtype)
        return high, (sub - high.astype(jnp.float32)).astype(out_dtype)

    def snake(within, rows: int, cols: int):
        if rows * cols == 1:   # one tile: planar_snake would take a rem by 0 (SIGFPE on CPU)
            return jnp.int32(0), jnp.int32(0)
        return plgpu.planar_snake(within, (rows, cols), grid_minor, tile_width)

    def head_tile(lin):
        # (batch entry, cluster row, cluster column) of whole tile `lin`; the last entry's tiles
        # lie in its head bands when the tail is split.
        per_entry = m_clusters * n_clusters
        bi, within = lax.div(lin, per_entry), lax.rem(lin, per_entry)
        if not plan.bands:
            return (bi, *snake(within, m_clusters, n_clusters))
        if batches == 1:
            return (bi, *snake(within, head_bands, n_clusters))
        m_c, n_c = snake(within, m_clusters, n_clusters)
        if head_bands:
            last = bi == batches - 1
            head_m, head_n = snake(within, head_bands, n_clusters)
            m_c, n_c = jnp.where(last, head_m, m_c), jnp.where(last, head_n, n_c)
        return bi, m_c, n_c

    def ws_body(a_gmem, b_gmem, *refs):
        vec_gmem, out_gmem = refs[:n_vec], refs[n_vec]
        partial_gmem = refs[n_vec + 1] if plan.bands else None

        def pipeline(mma_body, compute_context, k_steps=k_iters, k0=0):
            spec = functools.partial(plgpu.BlockSpec, transforms=in_transforms, memory_space=plgpu.SMEM)
            return plgpu.emit_pipeline_warp_specialized(
                mma_body, grid=(k_steps,), memory_registers=40, wg_axis="wg", num_compute_wgs=2,
                max_concurrent_steps=steps, compute_context=compute_context,
                in_specs=[spec((t.cta_m, bk), lambda kk: (0, kk + k0), delay_release=delay, **_collective(share_a)),
                          spec((bk, t.cta_n), lambda kk: (kk + k0, 0), delay_release=delay, **_collective(share_b))],
            )

        ignore = lambda *_, **__: None  # noqa: E731 - allocations do not depend on the bodies
        a0, b0, _, _ = views(a_gmem, b_gmem, out_gmem, 0, 0, 0)

        @functools.partial(
            pl.run_scoped,
            allocations=pipeline(ignore, ignore).get_allocations(a0, b0),
            out_smem=plgpu.SMEM((2, epi_m, epi_n), out_dtype) if direct else plgpu.SMEM(
                (2, t.slots, epi_m, epi_n), out_dtype, transforms=out_transforms),
            vec_smem=plgpu.SMEM((2, n_vec, bn), dtype) if n_vec else None,
            vec_barriers=plgpu.Barrier(num_arrivals=n_vec, num_barriers=2) if n_vec else None,
            stats_smem=plgpu.SMEM((2, 2, bm), jnp.float32) if row_stats else None,
            collective_axes="wg",
        )
        def _scope(allocations, out_smem, vec_smem, vec_barriers, stats_smem):
            wg = lax.axis_index("wg")
            block = lax.axis_index("cluster") if cluster_blocks > 1 else 0

            def run_tile(bi, m_c, n_c, piece=None):
                # One cluster tile: whole (the epilogue, then the product) or, where `piece` (a
                # traced bool and the run of K) says so, one run of K of it (its partial
                # product's two halves).
                m_idx, n_idx = m_c * cl_m + block * (cl_m - 1), n_c * cl_n + block * (cl_n - 1)
                a_view, b_view, out_tile, cols = views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx)
                if split == "m":
                    wg_rows, wg_cols = pl.ds(wg * bm, bm), slice(None)
                    wg_part = lambda tile: tile.part(wg_rows, slice(None), wg * bm, 0)  # noqa: E731
                    wg_vec_cols = cols
                    stats_rows, stats_tile = pl.ds(m_idx * t.cta_m + wg * bm, bm), n_idx
                else:
                    wg_rows, wg_cols = slice(None), pl.ds(wg * bn, bn)
                    wg_part = lambda tile: tile.part(slice(None), wg_cols, 0, wg * bn)  # noqa: E731
                    wg_vec_cols = pl.ds(n_idx * t.cta_n + wg * bn, bn)
                    stats_rows, stats_tile = pl.ds(m_idx * t.cta_m, bm), n_idx * 2 + wg
                is_piece, run = piece if piece is not None else (False, 0)

                def store_whole(acc):
                    if n_vec:
                        plgpu.barrier_wait(vec_barriers.at[wg])
                    epilogue_store(acc, vec_smem.at[wg] if n_vec else None, out_smem.at[wg], wg_part(out_tile))
                    if row_stats:
                        store_row_stats(acc, stats_smem.at[wg], refs[n_vec + 1], stats_rows, stats_tile)

                def store_piece(acc):
                    rows = pl.ds(m_idx * t.cta_m - head_rows, t.cta_m)
                    for half in range(2):
                        part = OutTile(partial_gmem.at[run, half].at[rows, cols])
                        epilogue_store(acc, None, out_smem.at[wg], wg_part(part),
                                       transform=lambda sub, h=half: halves(sub)[h])

                def compute_context(eval_pipeline):
                    def load():
                        load_vectors(vec_gmem, vec_smem.at[wg], vec_barriers.at[wg], wg_vec_cols)

                    if n_vec:
                        load() if piece is None else pl.when(jnp.logical_not(is_piece))(load)

                    def with_acc(acc_ref):
                        eval_pipeline(acc_ref)
                        acc = acc_ref[...]
                        if piece is None:
                            store_whole(acc)
                            return
                        pl.when(is_piece)(lambda: store_piece(acc))
                        pl.when(jnp.logical_not(is_piece))(lambda: store_whole(acc))

                    pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

                def mma(_, a_smem, b_smem, acc_ref):
                    plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_smem.at[:, wg_cols])
                    plgpu.wgmma_wait(delay)
                    return acc_ref

                k_steps, k0 = (k_iters, 0) if piece is None else (
                    jnp.where(is_piece, k_run, k_iters), jnp.where(is_piece, run * k_run, 0))
                pipeline(mma, compute_context, k_steps, k0)(a_view, b_view, allocations=allocations)

            if not plan.bands:
                @plgpu.nd_loop((tiles,), collective_axes="sm")
                def _tile_loop(info):
                    (lin,) = info.index
                    run_tile(*head_tile(lin))
                return

            # With a split tail, one loop over this slot's work: its whole tiles (dealt
            # round-robin, as nd_loop deals them), then its pieces (TailPlan). One pipeline, of a
            # traced number of K steps: Pallas's GPU interpreter hung on a second pipeline loop
            # after the first.
            slot = lax.axis_index("sm")
            whole = plan.head_tiles // plan.blocks + (slot < plan.head_tiles % plan.blocks).astype(jnp.int32)
            first = plan.first_piece(slot).astype(jnp.int32)

            @pl.loop(0, whole + plan.pieces_of(slot).astype(jnp.int32))
            def _work_loop(i):
                is_piece = i >= whole
                p = first + i - whole
                run, tile = lax.div(p, tail_tiles), lax.rem(p, tail_tiles)
                bi, m_c, n_c = head_tile(i * plan.blocks + slot) if tiles else (0, 0, 0)
                run_tile(jnp.where(is_piece, batches - 1, bi),
                         jnp.where(is_piece, head_bands + lax.div(tile, n_clusters), m_c),
                         jnp.where(is_piece, lax.rem(tile, n_clusters), n_c), (is_piece, run))

        if not direct:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    def launch(*args):
        call = mosaic_kernel(
            ws_body, platform=platform, out_shape=out_shape,
            grid=(plan.blocks,), grid_names=("sm",),
            cluster=(cluster_blocks,) if cluster_blocks > 1 else (), cluster_names=("cluster",),
            num_threads=3, thread_name="wg",
            compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
            name="matmul_mgpu_warp_specialized")
        results = call(*args)
        if not plan.bands:
            return _outputs(results, row_stats)
        product, partials = results
        total = jnp.sum(partials.astype(jnp.float32), axis=(0, 1))
        vectors = [jnp.broadcast_to(v.astype(jnp.float32), total.shape) for v in args[2:]]
        value = epilogue.fn(total, *vectors).astype(out_dtype)
        if problem.batch:  # the last entry's tail rows
            return lax.dynamic_update_slice(product, value[None], (batches - 1, head_rows, 0))
        return lax.dynamic_update_slice(product, value, (head_rows, 0))

    return launch


def _outputs(results: tuple[jax.Array, ...], row_stats: bool) -> Any:
    """The product, or (product, row statistics) when the epilogue keeps them."""
    return tuple(results) if row_stats else results[0]


def _collective(axes: tuple[str, ...]) -> dict[str, Any]:
    """BlockSpec keywords multicasting a tile over `axes` (none when unclustered)."""
    return {"collective_axes": axes} if axes else {}
