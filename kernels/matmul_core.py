"""The tiled matmul the matmul-family kernels share: C = epilogue(A @ B), per target and strategy.

A problem is A (m, k) or (batch, m, k) times B (k, n) or (batch, k, n), accumulated in float32,
then an epilogue over each f32 accumulator tile (bias + activation, layer norm, ...) that may
read row vectors of length n (bias, gamma, beta). Kernel modules (matmul, bmm,
broadcast_matmul, matmul_layernorm, matmul_subtiled_epilogue) describe a `Problem` and call
`build`; the code-generation strategy is a config knob, so the tuner chooses between them.

Targets and their knobs (all: block_m, block_n, block_k; epi_n splits the epilogue into
sub-tiles of epi_n output columns, each loaded, transformed, cast and stored on its own):
  tpu         k_strategy  "grid": K is the innermost ("arbitrary") grid axis; Pallas pipelines
                          the (block_m, block_k) and (block_k, block_n) tiles into VMEM and the
                          sum lives in a VMEM f32 scratch.
                          "emit_pipeline": grid (m, n) only; A and B stay in HBM and an inner
                          `pltpu.emit_pipeline` over K streams their tiles through VMEM.
                          "resident": grid (m, n); the whole (block_m, k) and (k, block_n)
                          panels sit in VMEM and a `fori_loop` slices them with `pl.ds`.
              buffers     tile buffers (`pl.Buffered`): 1 or 2 for grid/resident (Mosaic's own
                          pipeline allows no more), 2 or 3 for emit_pipeline.
              epi_m       epilogue sub-tile rows (divides block_m).
  gpu-triton  num_warps, num_stages; group_m (program order: group_m row tiles per column
              sweep, for L2 reuse); epi_n gives each sub-tile its own accumulator.
  interpret   as gpu-triton, without compiler params.
  gpu-mosaic  mgpu_pipeline  "warp_specialized": a persistent kernel (one block per SM) in
                             which a memory warpgroup issues TMA copies and two compute
                             warpgroups run WGMMA (`plgpu.emit_pipeline_warp_specialized`),
                             after JAX's ops/gpu/hopper_matmul_mgpu.py. block_m x block_n is
                             one compute warpgroup's tile; wg_split ("m" | "n") says along
                             which dimension the two tiles of a block lie.
                             "pipelined": one warpgroup per block of a (batch, m, n) grid,
                             `plgpu.emit_pipeline` over K with WGMMA released one step late.
              max_concurrent_steps (pipeline depth), epi_m (64), grid_minor ("m" | "n") and
              grid_tile_width: the persistent kernel's tile order (`plgpu.planar_snake`).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call, triton_dot_buffers

MIB = 1 << 20


def _identity(acc: jax.Array) -> jax.Array:
    return acc


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What happens to an f32 accumulator tile before it is cast and stored.

    fn(acc, *vectors): acc is an (r, c) f32 tile; each vector is an input of length n, sliced to
    the tile's columns and broadcast to (r, c) f32. full_rows: fn needs whole rows (c == n).
    """

    fn: Callable[..., jax.Array] = _identity
    vectors: int = 0
    full_rows: bool = False


@dataclasses.dataclass(frozen=True)
class Problem:
    """C = epilogue(A @ B): A (m, k) or (batch, m, k); B (k, n), or (batch, k, n) unless shared_b."""

    m: int
    n: int
    k: int
    batch: int = 0
    shared_b: bool = False
    epilogue: Epilogue = Epilogue()
    out_dtype: Any = None  # None: the input dtype

    @property
    def batched_b(self) -> bool:
        """Whether B has a batch dimension."""
        return self.batch > 0 and not self.shared_b

    def out_shape(self, dtype: Any) -> jax.ShapeDtypeStruct:
        """The output's shape and dtype."""
        lead = (self.batch,) if self.batch else ()
        return jax.ShapeDtypeStruct(lead + (self.m, self.n), jnp.dtype(self.out_dtype or dtype))


def _blocks(config: dict[str, Any]) -> tuple[int, int, int]:
    return int(config["block_m"]), int(config["block_n"]), int(config["block_k"])


def check_blocks(problem: Problem, config: dict[str, Any], target: str) -> None:
    """Refuse blocks that do not tile the problem (or an epilogue needing whole rows)."""
    bm, bn, bk = _blocks(config)
    if target == "gpu-mosaic" and config.get("mgpu_pipeline", "warp_specialized") == "warp_specialized":
        split = config.get("wg_split", "n")
        bm, bn = bm * (2 if split == "m" else 1), bn * (2 if split == "n" else 1)
    if problem.m % bm or problem.n % bn or problem.k % bk:
        raise ValueError(f"blocks ({bm}, {bn}, {bk}) must divide (m, n, k) = "
                         f"({problem.m}, {problem.n}, {problem.k})")
    if problem.epilogue.full_rows and bn != problem.n:
        raise ValueError(f"this epilogue needs whole rows: block_n must be n = {problem.n}, got {bn}")
    epi_n = int(config.get("epi_n", bn))
    if bn % epi_n:
        raise ValueError(f"epi_n = {epi_n} must divide block_n = {bn}")
    if problem.epilogue.full_rows and epi_n != bn:
        raise ValueError("this epilogue needs whole rows: epi_n must equal block_n")


def footprint(problem: Problem, config: dict[str, Any], dtype: Any, target: str) -> int:
    """On-chip bytes of one program: VMEM on TPU, shared memory on GPU (see each branch)."""
    bm, bn, bk = _blocks(config)
    item = jnp.dtype(dtype).itemsize
    out_item = jnp.dtype(problem.out_dtype or dtype).itemsize
    vectors = problem.epilogue.vectors
    if target == "tpu":
        # Input tiles x buffers, the output tile double-buffered, the f32 accumulator, the
        # epilogue's f32 temporaries (two sub-tiles) and the vectors ((8, block_n) f32 tiles).
        strategy = config.get("k_strategy", "grid")
        buffers = int(config.get("buffers", 2))
        depth = problem.k if strategy == "resident" else bk
        epi_m, epi_n = int(config.get("epi_m", bm)), int(config.get("epi_n", bn))
        return (buffers * (bm * depth + depth * bn) * item + 2 * bm * bn * out_item + bm * bn * 4
                + 2 * epi_m * epi_n * 4 + 2 * vectors * 8 * bn * 4)
    if target == "gpu-mosaic":
        return _mgpu_smem_bytes(problem, config, item, out_item)
    if target == "gpu-triton":  # Triton stages each K step's operand tiles in shared memory
        return triton_dot_buffers(config, bm) * (bm * bk + bk * bn) * item
    return (bm * problem.k + problem.k * bn) * item + bm * bn * 4


def fit(dim: int, preferred: int, align: int) -> int:
    """The largest of preferred, preferred/2, ... (at least align) dividing dim, else dim itself."""
    block = preferred
    while block >= align:
        if dim % block == 0:
            return block
        block //= 2
    return dim


def default_config(problem: Problem, target: str) -> dict[str, Any]:
    """A safe config: the plainest strategy with tiles that divide the problem."""
    m, n, k = problem.m, problem.n, problem.k
    full = problem.epilogue.full_rows
    if target == "tpu":
        return {"block_m": fit(m, 256, 8), "block_n": n if full else fit(n, 256, 128),
                "block_k": fit(k, 512, 128), "k_strategy": "grid", "buffers": 2}
    if target == "gpu-mosaic":   # the warp-specialized knobs at the values the kernel assumes
        return {"block_m": fit(m, 128, 64), "block_n": fit(n, 128, 64), "block_k": 64,
                "mgpu_pipeline": "pipelined", "max_concurrent_steps": 4, "wg_split": "n",
                "grid_minor": "n", "grid_tile_width": 1}
    config = {"block_m": fit(m, 64, 16), "block_n": n if full else fit(n, 64, 16),
              "block_k": fit(k, 32, 16), "group_m": 1}
    if target == "gpu-triton":
        config |= {"num_warps": 4, "num_stages": 3}
    return config


def vmem_limit(footprint_bytes: int) -> int:
    """The scoped-VMEM limit to ask Mosaic for: the footprint with headroom, within the chip."""
    from kernels.tpu_mesh import vmem_capacity_bytes

    return min(vmem_capacity_bytes(), max(32 * MIB, int(footprint_bytes * 1.5) + 4 * MIB))


def build(problem: Problem, config: dict[str, Any], dtype: Any, platform: Platform) -> Callable[..., jax.Array]:
    """The kernel for `problem` on `platform`: a function of (a, b, *vectors)."""
    check_blocks(problem, config, platform.target)
    if platform.target == "tpu":
        from kernels.tpu_mesh import traced_for_tpu

        return traced_for_tpu(_tpu_matmul(problem, config, dtype, platform))
    if platform.target == "gpu-mosaic":
        return _mgpu_matmul(problem, config, dtype, platform)
    return _generic_matmul(problem, config, dtype, platform)


def _as_rows(vectors: tuple[jax.Array, ...]) -> list[jax.Array]:
    return [v.reshape(1, -1) for v in vectors]


def _store_epilogue(acc_ref: Any, vec_refs: tuple[Any, ...], o_ref: Any, epilogue: Epilogue,
                    epi_m: int, epi_n: int) -> None:
    """Apply the epilogue to acc_ref one (epi_m, epi_n) sub-tile at a time and store it."""
    bm, bn = acc_ref.shape
    for r in range(bm // epi_m):
        for c in range(bn // epi_n):
            rows, cols = pl.ds(r * epi_m, epi_m), pl.ds(c * epi_n, epi_n)
            vecs = [jnp.broadcast_to(v[:, cols].astype(jnp.float32), (epi_m, epi_n)) for v in vec_refs]
            o_ref[rows, cols] = epilogue.fn(acc_ref[rows, cols], *vecs).astype(o_ref.dtype)


# ---------------------------------------------------------------------------------------- TPU


def _tpu_matmul(problem: Problem, config: dict[str, Any], dtype: Any, platform: Platform):
    from jax.experimental.pallas import tpu as pltpu

    bm, bn, bk = _blocks(config)
    m, n, k = problem.m, problem.n, problem.k
    strategy = config.get("k_strategy", "grid")
    buffers = int(config.get("buffers", 2))
    epi_m, epi_n = int(config.get("epi_m", bm)), int(config.get("epi_n", bn))
    if bm % epi_m:
        raise ValueError(f"epi_m = {epi_m} must divide block_m = {bm}")
    limits = {"grid": (1, 2), "resident": (1, 2), "emit_pipeline": (2, 3)}
    if strategy not in limits:
        raise ValueError(f"unknown k_strategy {strategy!r}; expected one of {sorted(limits)}")
    if not limits[strategy][0] <= buffers <= limits[strategy][1]:
        raise NotImplementedError(f"k_strategy {strategy!r} takes buffers in {limits[strategy]}, got {buffers}")
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

    fp = footprint(problem, config, dtype, "tpu")
    call = pallas_call(
        body, platform=platform, config=config, out_shape=problem.out_shape(dtype), grid=grid,
        in_specs=in_specs, out_specs=out_spec, scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        tpu_params={"dimension_semantics": semantics, "vmem_limit_bytes": vmem_limit(fp)},
        name=f"matmul_{strategy}",
    )
    return lambda a, b, *vectors: call(a, b, *_as_rows(vectors))


# ------------------------------------------------------------------ Triton and plain interpret


def tile_order(l: jax.Array, tiles_m: int, tiles_n: int, group_m: int) -> tuple[jax.Array, jax.Array]:
    """Row and column tile of program `l` when group_m row tiles share each column sweep."""
    width = group_m * tiles_n
    group, within = l // width, l % width
    return group * group_m + within % group_m, within // group_m


def _generic_matmul(problem: Problem, config: dict[str, Any], dtype: Any, platform: Platform):
    bm, bn, bk = _blocks(config)
    m, n, k = problem.m, problem.n, problem.k
    epi_n = int(config.get("epi_n", bn))
    group_m = int(config.get("group_m", 1))
    tiles_m, tiles_n = m // bm, n // bn
    if tiles_m % group_m:
        raise ValueError(f"group_m = {group_m} must divide the {tiles_m} row tiles")
    nb = 1 if problem.batch else 0
    sq = (pl.squeezed,) * nb
    sqb = (pl.squeezed,) if problem.batched_b else ()
    epilogue, n_vec = problem.epilogue, problem.epilogue.vectors

    def ij(g):
        return tile_order(g[-1], tiles_m, tiles_n, group_m)

    def a_map(*g):
        return tuple(g[:nb]) + (ij(g)[0], 0)

    def b_map(*g):
        return (tuple(g[:nb]) if problem.batched_b else ()) + (0, ij(g)[1])

    def vec_map(*g):
        return 0, ij(g)[1]

    def out_map(*g):
        return tuple(g[:nb]) + ij(g)

    def body(a_ref, b_ref, *refs):
        vec_refs, o_ref = refs[:n_vec], refs[n_vec]
        subs = bn // epi_n

        def step(s, accs):
            ks = pl.ds(s * bk, bk)
            a = a_ref[:, ks]
            return tuple(acc + jnp.dot(a, b_ref[ks, pl.ds(t * epi_n, epi_n)],
                                       preferred_element_type=jnp.float32)
                         for t, acc in enumerate(accs))

        accs = tuple(jnp.zeros((bm, epi_n), jnp.float32) for _ in range(subs))
        accs = lax.fori_loop(0, k // bk, step, accs)
        for t, acc in enumerate(accs):
            cols = pl.ds(t * epi_n, epi_n)
            vecs = [jnp.broadcast_to(v[:, cols].astype(jnp.float32), (bm, epi_n)) for v in vec_refs]
            o_ref[:, cols] = epilogue.fn(acc, *vecs).astype(o_ref.dtype)

    grid = (problem.batch,) * nb + (tiles_m * tiles_n,)
    call = pallas_call(
        body, platform=platform, config=config, out_shape=problem.out_shape(dtype), grid=grid,
        in_specs=[pl.BlockSpec(sq + (bm, k), a_map), pl.BlockSpec(sqb + (k, bn), b_map),
                  *[pl.BlockSpec((1, bn), vec_map)] * n_vec],
        out_specs=pl.BlockSpec(sq + (bm, bn), out_map), name="matmul",
    )
    return lambda a, b, *vectors: call(a, b, *_as_rows(vectors))


# ----------------------------------------------------------------------------- Mosaic GPU


def _mgpu_tiles(problem: Problem, config: dict[str, Any]) -> dict[str, int]:
    bm, bn, bk = _blocks(config)
    ws = config.get("mgpu_pipeline", "warp_specialized") == "warp_specialized"
    split = config.get("wg_split", "n") if ws else None
    cta_m, cta_n = bm * (2 if split == "m" else 1), bn * (2 if split == "n" else 1)
    epi_m, epi_n = min(int(config.get("epi_m", 64)), bm), min(int(config.get("epi_n", 64)), bn)
    return dict(bm=bm, bn=bn, bk=bk, cta_m=cta_m, cta_n=cta_n, epi_m=epi_m, epi_n=epi_n,
                wgs=2 if ws else 1, slots=min(2, (bm * bn) // (epi_m * epi_n)),
                steps=int(config.get("max_concurrent_steps", 4)))


def _mgpu_smem_bytes(problem: Problem, config: dict[str, Any], item: int, out_item: int) -> int:
    # The pipeline's operand slots, each compute warpgroup's output staging slots and vector
    # tiles (one is allocated even without vectors), plus 1 KiB for barriers and alignment:
    # at most 1 KiB above what Mosaic GPU itself counts (tests/test_kernels_matmul_family.py).
    t = _mgpu_tiles(problem, config)
    operands = t["steps"] * (t["cta_m"] * t["bk"] + t["bk"] * t["cta_n"]) * item
    staging = t["wgs"] * t["slots"] * t["epi_m"] * t["epi_n"] * out_item
    vectors = t["wgs"] * max(problem.epilogue.vectors, 1) * t["bn"] * item
    return operands + staging + vectors + 1024


def _mgpu_matmul(problem: Problem, config: dict[str, Any], dtype: Any, platform: Platform):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernels.mgpu_launch import mosaic_kernel, num_sms

    if problem.epilogue.full_rows:
        raise NotImplementedError("gpu-mosaic: epilogues over whole rows are not implemented")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise NotImplementedError(f"gpu-mosaic matmul takes bfloat16 or float16, not {jnp.dtype(dtype)}")
    t = _mgpu_tiles(problem, config)
    bm, bn, bk, epi_m, epi_n, steps = (t[x] for x in ("bm", "bn", "bk", "epi_m", "epi_n", "steps"))
    pipeline_kind = config.get("mgpu_pipeline", "warp_specialized")
    if pipeline_kind not in ("warp_specialized", "pipelined"):
        raise ValueError(f"unknown mgpu_pipeline {pipeline_kind!r}")
    if bm % 64 or bn % 64 or bk % 64 or bn > 256:
        raise NotImplementedError("gpu-mosaic: block_m, block_n, block_k must be multiples of 64, block_n <= 256")
    if bm % epi_m or bn % epi_n or epi_m % 64:
        raise NotImplementedError("gpu-mosaic: epi_m (a multiple of 64) and epi_n must divide the tile")
    if steps < 2:
        raise NotImplementedError("gpu-mosaic: max_concurrent_steps must be at least 2")
    item = jnp.dtype(dtype).itemsize
    out_dtype = jnp.dtype(problem.out_dtype or dtype)
    m_iters, n_iters, k_iters = problem.m // t["cta_m"], problem.n // t["cta_n"], problem.k // bk
    batches, n_vec, epilogue = max(problem.batch, 1), problem.epilogue.vectors, problem.epilogue

    def transforms(minor_elems: int, itemsize: int) -> tuple[Any, ...]:
        swizzle = plgpu.find_swizzle(minor_elems * itemsize * 8)
        return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)

    in_transforms = transforms(bk, item)
    out_transforms = transforms(epi_n, out_dtype.itemsize)

    def views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx):
        if problem.batch:
            a_gmem, out_gmem = a_gmem.at[bi], out_gmem.at[bi]
        if problem.batched_b:
            b_gmem = b_gmem.at[bi]
        rows, cols = pl.ds(m_idx * t["cta_m"], t["cta_m"]), pl.ds(n_idx * t["cta_n"], t["cta_n"])
        return a_gmem.at[rows, :], b_gmem.at[:, cols], out_gmem.at[rows, cols], cols

    def epilogue_store(acc, vec_smem, out_smem, out_tile):
        # acc: this warpgroup's (bm, bn) f32 tile; stored one (epi_m, epi_n) sub-tile at a time
        # through two SMEM slots, so the TMA store of one overlaps the math of the next.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        per_row = bn // epi_n
        for r in range(bm // epi_m):
            for c in range(per_row):
                sub = acc[r * epi_m:(r + 1) * epi_m, c * epi_n:(c + 1) * epi_n]
                vecs = [lax.broadcast_in_dim(vec_smem[v, pl.ds(c * epi_n, epi_n)].astype(jnp.float32),
                                             (epi_m, epi_n), [1]) for v in range(n_vec)]
                slot = (r * per_row + c) % t["slots"]
                plgpu.wait_smem_to_gmem(t["slots"] - 1, wait_read_only=True)
                out_smem[slot] = epilogue.fn(sub, *vecs).astype(out_dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_smem.at[slot], out_tile.at[pl.ds(r * epi_m, epi_m),
                                                                      pl.ds(c * epi_n, epi_n)])

    def load_vectors(vec_gmem, vec_smem, vec_barrier, cols):
        for v, ref in enumerate(vec_gmem):
            plgpu.copy_gmem_to_smem(ref.at[cols], vec_smem.at[v], vec_barrier)

    out_shape = (problem.out_shape(dtype),)
    vec_scratch = plgpu.SMEM((max(n_vec, 1), bn), dtype)

    if pipeline_kind == "pipelined":
        def body(a_gmem, b_gmem, *refs):
            vec_gmem, out_gmem = refs[:n_vec], refs[n_vec]
            bi, m_idx, n_idx = (lax.axis_index(a) for a in ("b", "m", "n"))
            a_view, b_view, out_tile, cols = views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx)

            def scoped(out_smem, vec_smem, vec_barrier):
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
                    epilogue_store(acc_ref[...], vec_smem, out_smem, out_tile)

                pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))
                plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(scoped, plgpu.SMEM((t["slots"], epi_m, epi_n), out_dtype, transforms=out_transforms),
                          vec_scratch, plgpu.Barrier(num_arrivals=max(n_vec, 1)))

        call = mosaic_kernel(
            body, platform=platform, out_shape=out_shape, grid=(batches, m_iters, n_iters),
            grid_names=("b", "m", "n"),
            compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
            name="matmul_mgpu_pipelined")
        return lambda a, b, *vectors: call(a, b, *vectors)[0]

    split = config.get("wg_split", "n")
    grid_minor = {"m": 0, "n": 1}[config.get("grid_minor", "n")]
    tile_width = int(config.get("grid_tile_width", 1))
    tiles = batches * m_iters * n_iters

    def ws_body(a_gmem, b_gmem, *refs):
        vec_gmem, out_gmem = refs[:n_vec], refs[n_vec]

        def pipeline(mma_body, compute_context):
            spec = functools.partial(plgpu.BlockSpec, transforms=in_transforms, memory_space=plgpu.SMEM)
            return plgpu.emit_pipeline_warp_specialized(
                mma_body, grid=(k_iters,), memory_registers=40, wg_axis="wg", num_compute_wgs=2,
                max_concurrent_steps=steps, compute_context=compute_context,
                in_specs=[spec((t["cta_m"], bk), lambda kk: (0, kk)), spec((bk, t["cta_n"]), lambda kk: (kk, 0))],
            )

        ignore = lambda *_, **__: None  # noqa: E731 - allocations do not depend on the bodies
        a0, b0, _, _ = views(a_gmem, b_gmem, out_gmem, 0, 0, 0)

        @functools.partial(
            pl.run_scoped,
            allocations=pipeline(ignore, ignore).get_allocations(a0, b0),
            out_smem=plgpu.SMEM((2, t["slots"], epi_m, epi_n), out_dtype, transforms=out_transforms),
            vec_smem=plgpu.SMEM((2, max(n_vec, 1), bn), dtype),
            vec_barriers=plgpu.Barrier(num_arrivals=max(n_vec, 1), num_barriers=2),
            collective_axes="wg",
        )
        def _scope(allocations, out_smem, vec_smem, vec_barriers):
            wg = lax.axis_index("wg")

            @plgpu.nd_loop((tiles,), collective_axes="sm")
            def _tile_loop(info):
                (lin,) = info.index
                bi = lax.div(lin, m_iters * n_iters)
                m_idx, n_idx = plgpu.planar_snake(lax.rem(lin, m_iters * n_iters), (m_iters, n_iters),
                                                  grid_minor, tile_width)
                a_view, b_view, out_tile, cols = views(a_gmem, b_gmem, out_gmem, bi, m_idx, n_idx)
                if split == "m":
                    wg_rows, wg_cols = pl.ds(wg * bm, bm), slice(None)
                    wg_out = out_tile.at[wg_rows, :]
                    wg_vec_cols = cols
                else:
                    wg_rows, wg_cols = slice(None), pl.ds(wg * bn, bn)
                    wg_out = out_tile.at[:, wg_cols]
                    wg_vec_cols = pl.ds(n_idx * t["cta_n"] + wg * bn, bn)

                def compute_context(eval_pipeline):
                    if n_vec:
                        load_vectors(vec_gmem, vec_smem.at[wg], vec_barriers.at[wg], wg_vec_cols)

                    def with_acc(acc_ref):
                        eval_pipeline(acc_ref)
                        acc = acc_ref[...]
                        if n_vec:
                            plgpu.barrier_wait(vec_barriers.at[wg])
                        epilogue_store(acc, vec_smem.at[wg], out_smem.at[wg], wg_out)

                    pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

                def mma(_, a_smem, b_smem, acc_ref):
                    plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_smem.at[:, wg_cols])
                    plgpu.wgmma_wait(0)
                    return acc_ref

                pipeline(mma, compute_context)(a_view, b_view, allocations=allocations)

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    def launch(*args):
        call = mosaic_kernel(
            ws_body, platform=platform, out_shape=out_shape, grid=(min(num_sms(), tiles),),
            grid_names=("sm",), num_threads=3, thread_name="wg",
            compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
            name="matmul_mgpu_warp_specialized")
        return call(*args)[0]

    return launch
