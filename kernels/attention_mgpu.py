"""Flash attention on Mosaic GPU (Hopper): the FA3-style warp-specialized kernel, or one
pipelined warpgroup per Q block (the mgpu_pipeline knob; see `kernels.attention_core`)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.attention_config import MGPU_ROW_UNIT, MosaicGpuAttentionConfig
from kernels.attention_core import key_mask, kv_blocks, q_block_order, ragged_keys
from kernels.lowering import Platform


def build(config: MosaicGpuAttentionConfig, shape: tuple[int, ...], dtype: Any, platform: Platform,
          causal: bool, kv_len: int, head_dim: int) -> Callable[..., jax.Array]:
    """The Mosaic GPU kernel for a checked config: a function of (q, k, v) of `shape`, whose first
    kv_len keys are real, scaled by 1 / sqrt(head_dim) (the real head dim: `padded_dim`). The
    sequence need not be whole blocks: the last Q and K/V blocks run past its end, where TMA reads
    zeros and drops the writes (see `padded_seq`); nor whole 8-row groups, where the config copies
    single rows (`copies_single_rows`)."""
    if config.warp_specialized:
        return _warp_specialized(config, shape, dtype, platform, causal, kv_len, head_dim)
    return _pipelined(config, shape, dtype, platform, causal, kv_len, head_dim)


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


def _online_softmax(qk: jax.Array, m_i: jax.Array, l_i: jax.Array, scale_log2: float, dtype: Any,
                    causal_origin: tuple[Any, Any] | None, mask_on: Any = True,
                    limit: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One online-softmax step in base 2: P (in `dtype`), the accumulator's rescale factor, the new
    max and sum.

    causal_origin: (first query row, first key) of the block, to mask keys after each row (when
    the traced `mask_on` holds), or, given `limit` (`ragged_keys`: not causal), keys from limit
    on. Row maxima stay finite: key block 0 is processed first, and every row keeps its first key.
    """
    if causal_origin is not None:
        q_start, kv_start = causal_origin
        rows = None if limit is not None else q_start + lax.broadcasted_iota(jnp.int32, qk.shape, 0)
        keep = key_mask(kv_start + lax.broadcasted_iota(jnp.int32, qk.shape, 1), rows, limit)
        qk = jnp.where(keep | jnp.logical_not(mask_on), qk, -jnp.inf)
    m_next = jnp.maximum(m_i, qk.max(axis=1) * scale_log2)
    alpha = jnp.exp2(m_i - m_next)
    p = jnp.exp2(qk * scale_log2 - lax.broadcast_in_dim(m_next, qk.shape, [0]))
    return p.astype(dtype), alpha, m_next, l_i * alpha + p.sum(axis=1)


def _rescale(acc: jax.Array, alpha: jax.Array) -> jax.Array:
    return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])


def _softmax_step(qk: jax.Array, acc: jax.Array, m_i: jax.Array, l_i: jax.Array, scale_log2: float,
                  dtype: Any, causal_origin: tuple[Any, Any] | None,
                  limit: int | None = None) -> tuple[jax.Array, ...]:
    """`_online_softmax` with the accumulator rescaled: P, acc, the new max and sum."""
    p, alpha, m_next, l_next = _online_softmax(qk, m_i, l_i, scale_log2, dtype, causal_origin, limit=limit)
    return p, _rescale(acc, alpha), m_next, l_next


def _intra_overlap_loop(qo_smem: Any, k_smem: Any, v_smem: Any, barriers: tuple[Any, ...], kv_steps: Any,
                        steps: int, bq: int, bkv: int, dim: int, scale_log2: float, dtype: Any,
                        q_base: Any, causal: bool, interpret: bool,
                        limit: int | None = None, ring_base: Any = 0,
                        scores_done: Callable[[], None] | None = None) -> tuple[jax.Array, jax.Array]:
    """FlashAttention-3's intra-warpgroup pipelining over one warpgroup's K/V blocks 0..kv_steps-1.

    Step j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back, waits for S_j only, runs
    block j's softmax while P V is still on the tensor cores, then waits for it and rescales O.
    Returns (O unnormalised, l). Interpret mode runs the same schedule with `jnp.dot`s. `limit`
    (`ragged_keys`, not causal): every block masks the keys from limit on. ring_base: the K/V ring
    slot block 0 is in, less one per slot (blocks the block's earlier tiles streamed: persistent).
    scores_done: called once Q is no longer read (before the last P V).
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    k_loaded, v_loaded, k_consumed, v_consumed = barriers
    # blocks before this are below the diagonal for every row (rows past the sequence's end may
    # have fewer blocks than that: kv_steps is clamped to the blocks holding keys)
    unmasked = jnp.minimum(lax.div(q_base, bkv), kv_steps)

    def slot(j):
        j = jnp.asarray(j, jnp.int32) + ring_base
        return lax.rem(j, jnp.array(steps, jnp.int32))

    def softmax(j, qk, m_i, l_i, masked):
        # masked: True, False, or traced (block 0); only blocks from `unmasked` on cross the diagonal
        if limit is not None:
            return _online_softmax(qk, m_i, l_i, scale_log2, dtype, (q_base, j * bkv), limit=limit)
        origin = (q_base, j * bkv) if causal and masked is not False else None
        return _online_softmax(qk, m_i, l_i, scale_log2, dtype, origin,
                               mask_on=True if masked is True else j >= unmasked)

    def run(s_ref, o_ref):
        def scores(j):  # issue S_j (after its K block landed)
            plgpu.barrier_wait(k_loaded.at[slot(j)])
            if interpret:
                return jnp.dot(qo_smem[...], k_smem.at[slot(j)][...].T, preferred_element_type=jnp.float32)
            s_ref[...] = jnp.zeros((bq, bkv), jnp.float32)
            plgpu.wgmma(s_ref, qo_smem, plgpu.transpose_ref(k_smem.at[slot(j)], (1, 0)))
            return None

        def pv(j, p, o):  # issue O += P_j V_j (after its V block landed)
            plgpu.barrier_wait(v_loaded.at[slot(j)])
            if interpret:
                return o + jnp.dot(p, v_smem.at[slot(j)][...], preferred_element_type=jnp.float32)
            plgpu.wgmma(o_ref, p, v_smem.at[slot(j)])
            return None

        zero = lax.convert_element_type(0, jnp.int32)
        qk = scores(zero)
        if not interpret:
            qk = plgpu.wgmma_accumulator_load(s_ref, wait_n=0)
        plgpu.barrier_arrive(k_consumed.at[slot(zero)])
        p, _, m_i, l_i = softmax(zero, qk, jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
                                 masked=None)
        o = jnp.zeros((bq, dim), jnp.float32)

        def step(j, carry, masked=False):
            p, o, m_i, l_i = carry
            qk = scores(j)
            o_next = pv(j - 1, p, o)
            if not interpret:  # S_j was issued first: wait for it alone, P V stays in flight
                qk = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            plgpu.barrier_arrive(k_consumed.at[slot(j)])
            p, alpha, m_i, l_i = softmax(j, qk, m_i, l_i, masked)
            if not interpret:
                o_next = plgpu.wgmma_accumulator_load(o_ref, wait_n=0)
            plgpu.barrier_arrive(v_consumed.at[slot(j - 1)])
            o_next = _rescale(o_next, alpha)
            if not interpret:
                o_ref[...] = o_next
            return p, o_next, m_i, l_i

        carry = (p, o, m_i, l_i)
        if causal:  # blocks 1 .. unmasked - 1 need no mask, the rest do
            first_masked = jnp.maximum(unmasked, 1)
            carry = lax.fori_loop(1, first_masked, step, carry)
            carry = lax.fori_loop(first_masked, kv_steps, functools.partial(step, masked=True), carry)
        else:
            carry = lax.fori_loop(1, kv_steps, step, carry)
        p, o, _, l_i = carry
        if scores_done is not None:
            scores_done()
        last = kv_steps - 1
        o = pv(last, p, o)
        if not interpret:
            o = plgpu.wgmma_accumulator_load(o_ref, wait_n=0)
        plgpu.barrier_arrive(v_consumed.at[slot(last)])
        return o, l_i

    if interpret:
        return run(None, None)
    return pl.run_scoped(run, plgpu.ACC((bq, bkv), jnp.float32), plgpu.ACC((bq, dim), jnp.float32))


def _smem_transforms(swizzle: int, dtype: Any, rows: int = MGPU_ROW_UNIT) -> tuple[Any, ...]:
    """Q, K, V and O tiles in shared memory: 8 rows (what WGMMA reads) by one swizzle's bytes of
    columns. rows=1: the same bytes when the tile is one swizzle wide, in a view whose copies
    take any number of rows in global memory (`MosaicGpuAttentionConfig.copies_single_rows`)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.TilingTransform((rows, swizzle // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle)


def _tiles(shapes: tuple[tuple[int, ...], ...], swizzle: int, dtype: Any, single_rows: bool) -> Any:
    """Shared memory tiles of `shapes` (count, rows, dim) for WGMMA and TMA: the tiles themselves,
    or, single_rows (a head dim one swizzle wide), the tiles aliased (`plgpu.RefUnion`) with the
    same bytes viewed as tiled by single rows, which the copies use: TMA then takes any number of
    rows in global memory. Both views start at the union's start."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    tiled = tuple(plgpu.SMEM(shape, dtype, transforms=_smem_transforms(swizzle, dtype)) for shape in shapes)
    if not single_rows:
        return tiled
    rows = tuple(plgpu.SMEM(shape, dtype, transforms=_smem_transforms(swizzle, dtype, rows=1)) for shape in shapes)
    return plgpu.RefUnion(tiled, rows)


def _warp_specialized(config: MosaicGpuAttentionConfig, shape: tuple[int, ...], dtype: Any,
                      platform: Platform, causal: bool, kv_len: int, head_dim: int) -> Callable[..., jax.Array]:
    """Two compute warpgroups of block_q rows each and a memory warpgroup streaming K/V through a
    ring of `steps` slots. ws_grid "blocks": a block per 2 * block_q rows of a head; "persistent":
    a block per SM, looping over those tiles in `tile_order`, the ring and its barriers running
    on from tile to tile, so that the next tile's K/V load while this one ends;
    "persistent_q_ahead": O staged apart from Q, and the memory warpgroup loading each tile's Q
    once the compute warpgroup has read the last (a `q_free` barrier)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel, num_sms

    batch, heads, seq, dim = shape
    bq, bkv = config.block_q, config.block_kv
    steps = config.steps(seq)
    dtype = jnp.dtype(dtype)
    scale_log2 = math.log2(math.e) / math.sqrt(head_dim)  # softmax in base 2, scale folded in
    compute_wgs = 2
    intra_overlap = config.ws_schedule == "intra_overlap"
    persistent = config.persistent
    q_ahead = config.ws_grid == "persistent_q_ahead"  # O staged apart; the memory warpgroup loads Q
    q_tiles = pl.cdiv(seq, 2 * bq)
    tiles = heads * q_tiles * batch
    kv_whole = pl.cdiv(kv_len, bkv)  # K/V blocks holding keys
    limit = ragged_keys(kv_len, bkv, causal)
    single_rows = seq % MGPU_ROW_UNIT != 0  # copied through the tiles' single-row view (`padded_seq`)
    if single_rows and (platform.interpret or not config.copies_single_rows(dim)):
        raise ValueError(f"a sequence of {seq} rows needs padding to 8-row groups (`padded_seq`)")

    def ring(g: Any) -> Any:
        """The slot of the g-th K/V block a block streams."""
        return g % steps if isinstance(g, int) else lax.rem(g, jnp.array(steps, g.dtype))

    def kernel(q_ref, k_ref, v_ref, out_ref, smem, loaded, consumed, schedule_barrier):
        wg = lax.axis_index("wg")
        tiled, rows = smem if single_rows else (smem, smem)
        (qo_smem2, k_smem, v_smem), (qo_rows2, k_rows, v_rows) = tiled[:3], rows[:3]
        o_smem2, o_rows2 = (tiled[3], rows[3]) if q_ahead else (qo_smem2, qo_rows2)
        k_loaded, v_loaded, q_loaded = loaded
        k_consumed, v_consumed, q_free = consumed

        def schedule():
            # Lets the two compute warpgroups take turns on the tensor cores.
            plgpu.barrier_arrive(schedule_barrier)
            plgpu.barrier_wait(schedule_barrier)

        def release(base, j, _, twice=True):
            # A K/V block this warpgroup does not need: observe its arrival, release it, and
            # (ping-pong) keep the schedule barrier's phases in step with the other warpgroup.
            slot = ring(base + j)
            plgpu.barrier_wait(k_loaded.at[slot])
            plgpu.barrier_wait(v_loaded.at[slot])
            plgpu.barrier_arrive(k_consumed.at[slot])
            plgpu.barrier_arrive(v_consumed.at[slot])
            if twice:
                schedule()
                schedule()

        def store(acc, l_i, b, h, q_base):
            acc = acc / lax.broadcast_in_dim(l_i, (bq, dim), [0])
            o_smem2.at[wg][...] = acc.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_rows2.at[wg], out_ref.at[b, h, pl.ds(q_base, bq)])
            # persistent: the next tile's Q or O may overwrite these bytes once the copy has read them
            plgpu.wait_smem_to_gmem(0, wait_read_only=persistent)

        def q_read():  # q_ahead: Q is read no more, the memory warpgroup may load the next tile's
            if q_ahead:
                plgpu.barrier_arrive(q_free.at[wg])

        def compute_tile(b, h, q_tile, base):
            """One warpgroup's block_q rows of a tile, whose first K/V block is the ring's base-th."""
            qo_smem = qo_smem2.at[wg]
            # K/V blocks the tile's 2 * block_q rows need; each compute warpgroup may need fewer.
            cta_kv_steps = kv_blocks(q_tile, 2 * bq, bkv, kv_len, causal)
            q_base = q_tile * (2 * bq) + wg * bq
            kv_steps = jnp.minimum(lax.div(q_base + bq + bkv - 1, bkv), kv_whole) if causal else cta_kv_steps
            if not q_ahead:
                plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, bq)], qo_rows2.at[wg], q_loaded.at[wg])
            plgpu.barrier_wait(q_loaded.at[wg])
            if intra_overlap:
                acc, l_i = _intra_overlap_loop(
                    qo_smem, k_smem, v_smem, (k_loaded, v_loaded, k_consumed, v_consumed), kv_steps, steps,
                    bq, bkv, dim, scale_log2, dtype, q_base, causal, platform.interpret, limit, ring_base=base,
                    scores_done=q_read)
                if causal:  # release the blocks the other warpgroup still needs, unread
                    lax.fori_loop(kv_steps, cta_kv_steps, functools.partial(release, base, twice=False), None)
                store(acc, l_i, b, h, q_base)
                return base + cta_kv_steps
            carry = (jnp.zeros((bq, dim), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
                     jnp.zeros((bq,), jnp.float32))
            plgpu.barrier_wait(k_loaded.at[ring(base)])
            pl.when(wg == 1)(schedule)

            def kv_step(j, carry, masked=False):
                acc, m_i, l_i = carry
                slot = ring(base + j)

                qk = _qk(qo_smem, k_smem.at[slot], platform.interpret, while_running=schedule)
                plgpu.barrier_arrive(k_consumed.at[slot])
                p, acc, m_next, l_i = _softmax_step(qk, acc, m_i, l_i, scale_log2, dtype,
                                                    (q_base, j * bkv) if masked else None, limit)
                plgpu.barrier_arrive(schedule_barrier)
                plgpu.barrier_wait(v_loaded.at[slot])
                plgpu.barrier_wait(schedule_barrier)

                def wait_next():
                    nxt = j + 1

                    @pl.when(nxt < kv_steps)
                    def _wait_next():
                        plgpu.barrier_wait(k_loaded.at[ring(base + nxt)])

                acc = _pv(acc, p, v_smem.at[slot], platform.interpret, while_running=wait_next)
                plgpu.barrier_arrive(v_consumed.at[slot])
                return acc, m_next, l_i

            if not causal:  # every block masks the keys past the sequence's end when its last block holds some
                acc, _, l_i = lax.fori_loop(0, kv_steps, functools.partial(kv_step, masked=limit is not None), carry)
            else:
                # Blocks wholly at or below the diagonal need no mask; the rest are masked; then
                # the blocks the other warpgroup still needs are released unread.
                unmasked = jnp.minimum(lax.div(q_base, bkv), kv_steps)
                carry = lax.fori_loop(0, unmasked, kv_step, carry)
                acc, _, l_i = lax.fori_loop(unmasked, kv_steps, functools.partial(kv_step, masked=True),
                                            carry)
                q_read()
                lax.fori_loop(kv_steps, cta_kv_steps, functools.partial(release, base), None)
            if not causal:
                q_read()
            pl.when(wg == 0)(schedule)
            store(acc, l_i, b, h, q_base)
            return base + cta_kv_steps

        def memory_tile(b, h, q_tile):
            """A tile's K/V blocks into a fresh ring (one tile a block)."""
            cta_kv_steps = kv_blocks(q_tile, 2 * bq, bkv, kv_len, causal)
            for i in range(steps):
                @pl.when(i < cta_kv_steps)
                def _prefetch():
                    # A traced start (i, as i < cta_kv_steps here): at sequences shorter than the
                    # slots' blocks (197 tokens in two 128-row blocks) a static window past the
                    # sequence's end is refused while tracing; TMA reads zeros there.
                    kv = (b, h, pl.ds(jnp.minimum(i, cta_kv_steps) * bkv, bkv))
                    plgpu.copy_gmem_to_smem(k_ref.at[kv], k_rows.at[i], k_loaded.at[i])
                    plgpu.copy_gmem_to_smem(v_ref.at[kv], v_rows.at[i], v_loaded.at[i])

            @pl.loop(0, cta_kv_steps - steps)
            def _stream(j):
                slot = ring(j)
                kv = (b, h, pl.ds((j + steps) * bkv, bkv))
                plgpu.barrier_wait(k_consumed.at[slot])
                plgpu.copy_gmem_to_smem(k_ref.at[kv], k_rows.at[slot], k_loaded.at[slot])
                plgpu.barrier_wait(v_consumed.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[kv], v_rows.at[slot], v_loaded.at[slot])

            drain(cta_kv_steps)

        def memory_tiles(b, h, q_tile, base, first):
            """A tile's K/V blocks into the ring from its base-th slot on, each once released, and
            (q_ahead) after its first, its Q once the previous tile's is read (not `first`)."""
            cta_kv_steps = kv_blocks(q_tile, 2 * bq, bkv, kv_len, causal)

            @pl.loop(0, cta_kv_steps)
            def _stream(j):
                g = base + j
                slot = ring(g)
                kv = (b, h, pl.ds(j * bkv, bkv))

                @pl.when(g >= steps)
                def _k_free():
                    plgpu.barrier_wait(k_consumed.at[slot])

                plgpu.copy_gmem_to_smem(k_ref.at[kv], k_rows.at[slot], k_loaded.at[slot])

                @pl.when(g >= steps)
                def _v_free():
                    plgpu.barrier_wait(v_consumed.at[slot])

                plgpu.copy_gmem_to_smem(v_ref.at[kv], v_rows.at[slot], v_loaded.at[slot])

                if q_ahead:
                    @pl.when(j == 0)
                    def _q():
                        for w in range(compute_wgs):
                            @pl.when(jnp.logical_not(first))
                            def _q_free():
                                plgpu.barrier_wait(q_free.at[w])

                            rows = pl.ds(q_tile * (2 * bq) + w * bq, bq)
                            plgpu.copy_gmem_to_smem(q_ref.at[b, h, rows], qo_rows2.at[w], q_loaded.at[w])

            return base + cta_kv_steps

        def drain(streamed):
            # Observe the last releases too, so that no barrier phase goes unobserved.
            @pl.loop(jnp.maximum(streamed - steps, 0), streamed)
            def _drain(g):
                plgpu.barrier_wait(k_consumed.at[ring(g)])
                plgpu.barrier_wait(v_consumed.at[ring(g)])

        def each_tile(per_tile):
            """per_tile(b, h, q_tile, base, first) over this block's tiles (first: whether it is the
            block's first); returns the K/V blocks streamed."""
            if not persistent:
                q_tile = q_block_order(lax.axis_index("q_seq"), q_tiles, causal)
                return per_tile(lax.axis_index("batch"), lax.axis_index("heads"), q_tile, 0, True)

            # by_head: a head's Q tiles one after another, taken by neighbouring SMs at once, so
            # that its K/V are read from HBM about once and from L2 after; causal, every other head
            # the other way round (lightest first), or a static stride of SMs takes its tiles'
            # weights unevenly ((2, 32, 1024, 128): 1.38x the mean K/V blocks on the busiest SM,
            # 1.03x so). by_q: every head's first (causal: heaviest) Q tile, then every head's
            # second, ..., each head's K/V read once a rank once they outgrow L2.
            by_head = config.tile_order == "by_head"
            order = (batch, heads, q_tiles) if by_head else (q_tiles, batch, heads)

            @plgpu.nd_loop(order, collective_axes="sm", init_carry=jnp.int32(0))
            def streamed(info, carry):
                b, h, q_rank = info.index if by_head else (info.index[1], info.index[2], info.index[0])
                q_tile = q_block_order(q_rank, q_tiles, causal)
                if by_head and causal:
                    q_tile = jnp.where((b * heads + h) % 2 == 0, q_tile, q_rank)
                return per_tile(b, h, q_tile, carry, info.local_index == 0)

            return streamed

        @pl.when(wg < compute_wgs)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            each_tile(lambda b, h, q_tile, base, _: compute_tile(b, h, q_tile, base))
            if persistent:
                plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == compute_wgs)
        def _memory():
            plgpu.set_max_registers(40, action="decrease")
            if persistent:
                drain(each_tile(memory_tiles))
                if q_ahead:  # the last tile's Q reads (every block runs a tile: the grid is at most the tiles)
                    for w in range(compute_wgs):
                        plgpu.barrier_wait(q_free.at[w])
            else:
                each_tile(lambda b, h, q_tile, *_: memory_tile(b, h, q_tile))

    def entry(q_ref, k_ref, v_ref, out_ref):
        o_tiles = ((compute_wgs, bq, dim),) if q_ahead else ()
        smem = _tiles(((compute_wgs, bq, dim), (steps, bkv, dim), (steps, bkv, dim)) + o_tiles, config.swizzle,
                      dtype, single_rows)
        loaded = (plgpu.Barrier(num_barriers=steps), plgpu.Barrier(num_barriers=steps),
                  plgpu.Barrier(num_barriers=compute_wgs))
        consumed = ((plgpu.Barrier(num_arrivals=compute_wgs, num_barriers=steps),) * 2
                    + (plgpu.Barrier(num_barriers=compute_wgs) if q_ahead else None,))
        pl.run_scoped(lambda *scoped: kernel(q_ref, k_ref, v_ref, out_ref, *scoped), smem, loaded,
                      consumed, plgpu.Barrier(num_arrivals=compute_wgs), collective_axes="wg")

    if persistent:
        grid, grid_names = (min(num_sms(), tiles),), ("sm",)
    else:
        grid, grid_names = (heads, q_tiles, batch), ("heads", "q_seq", "batch")
    call = mosaic_kernel(
        entry, platform=platform, out_shape=(jax.ShapeDtypeStruct(shape, dtype),),
        grid=grid, grid_names=grid_names, num_threads=compute_wgs + 1, thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        name="flash_attention_mgpu_persistent" if persistent else "flash_attention_mgpu_ws")
    return lambda q, k, v: call(q, k, v)[0]


def _pipelined(config: MosaicGpuAttentionConfig, shape: tuple[int, ...], dtype: Any, platform: Platform,
               causal: bool, kv_len: int, head_dim: int) -> Callable[..., jax.Array]:
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel

    batch, heads, seq, dim = shape
    bq, bkv = config.block_q, config.block_kv
    steps = config.steps(seq)
    dtype = jnp.dtype(dtype)
    scale_log2 = math.log2(math.e) / math.sqrt(head_dim)
    q_blocks = pl.cdiv(seq, bq)
    limit = ragged_keys(kv_len, bkv, causal)
    tf = _smem_transforms(config.swizzle, dtype)

    def kernel(q_ref, k_ref, v_ref, out_ref):
        b, h = lax.axis_index("batch"), lax.axis_index("heads")
        qi = q_block_order(lax.axis_index("q_seq"), q_blocks, causal)
        q_base = qi * bq

        def scoped(qo_smem, q_loaded):
            plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, bq)], qo_smem, q_loaded)
            plgpu.barrier_wait(q_loaded)

            def step(idx, k_smem, v_smem, carry):
                acc, m_i, l_i = carry
                (j,) = idx

                qk = _qk(qo_smem, k_smem, platform.interpret)
                p, acc, m_next, l_i = _softmax_step(qk, acc, m_i, l_i, scale_log2, dtype,
                                                    (q_base, j * bkv) if causal or limit else None, limit)
                acc = _pv(acc, p, v_smem, platform.interpret)
                return acc, m_next, l_i

            init = (jnp.zeros((bq, dim), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
                    jnp.zeros((bq,), jnp.float32))
            kv_spec = plgpu.BlockSpec((bkv, dim), lambda j: (j, 0), transforms=tf)
            acc, _, l_i = plgpu.emit_pipeline(
                step, grid=(pl.cdiv(kv_len, bkv),), in_specs=[kv_spec, kv_spec], max_concurrent_steps=steps,
                init_carry=init)(k_ref.at[b, h], v_ref.at[b, h])
            acc = acc / lax.broadcast_in_dim(l_i, (bq, dim), [0])
            qo_smem[...] = acc.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[b, h, pl.ds(q_base, bq)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped, plgpu.SMEM((bq, dim), dtype, transforms=tf), plgpu.Barrier())

    call = mosaic_kernel(
        kernel, platform=platform, out_shape=(jax.ShapeDtypeStruct(shape, dtype),),
        grid=(heads, q_blocks, batch), grid_names=("heads", "q_seq", "batch"),
        compiler_params=plgpu.CompilerParams(
            approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        name="flash_attention_mgpu_pipelined")
    return lambda q, k, v: call(q, k, v)[0]
