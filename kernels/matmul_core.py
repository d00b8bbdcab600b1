"""The tiled matmul the matmul-family kernels share: C = epilogue(A @ B), per target and strategy.

A problem is A (m, k) or (batch, m, k) times B (k, n) or (batch, k, n), accumulated in float32,
then an epilogue over each f32 accumulator tile (bias + activation, layer norm, ...) that may
read row vectors of length n (bias, gamma, beta). Kernel modules (matmul, bmm,
broadcast_matmul, matmul_layernorm, matmul_subtiled_epilogue) describe a `Problem` and call
`build`; the code-generation strategy is a config knob, so the tuner chooses between them.

Any m, n and k, whether or not a tile divides them (a prefill of 3000 tokens, a vocabulary of
50257): each target's config says what problem its kernel runs (`MatmulConfig.padded`), and
`build` pads the inputs with zeros to it and slices the product back. The Triton, plain and TPU
kernels run whole tiles, so every ragged dimension is padded; the Mosaic GPU kernels take part
tiles at the edges as they are (TMA fills reads past an edge with zeros and drops writes past it),
with no copies, for rows in groups of 8 and columns in 128-byte units; only operands off that
grid are padded, and a product off it is sliced back or (the store knob) stored by the threads
at its own size (`kernels.mgpu_store`). Epilogues that need whole rows keep n whole, and row
statistics refuse part tiles.

Files by job: `kernels.matmul_config` (the problem and one typed config per target: knob
defaults, legality, footprint, default config), `kernels.matmul_tpu` and `kernels.matmul_mgpu`
(the TPU and Mosaic GPU kernels); this module dispatches and holds the Triton/interpret kernel.

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
              sweep, for L2 reuse); epi_n gives each sub-tile its own accumulator; split_k
              (default 1): programs per output tile, each summing one run of K into a float32
              partial product, added up (and the epilogue applied) by XLA after the kernel: a
              decode step's few rows give too few output tiles to keep every SM reading B.
              The default is small tiles, but products of at least 512 rows and columns take
              128-row tiles of 256 columns in 8 warps, or 128 in 4 (`TritonMatmulConfig.default`).
  interpret   as gpu-triton, without compiler params.
  gpu-mosaic  mgpu_pipeline  "warp_specialized": a persistent kernel (one block per SM) in
                             which a memory warpgroup issues TMA copies and two compute
                             warpgroups run WGMMA (`plgpu.emit_pipeline_warp_specialized`),
                             after JAX's ops/gpu/hopper_matmul_mgpu.py. block_m x block_n is
                             one compute warpgroup's tile; wg_split ("m" | "n") says along
                             which dimension the two tiles of a block lie.
                             "pipelined": one warpgroup per block of a (batch, m, n) grid,
                             `plgpu.emit_pipeline` over K with WGMMA released one step late.
                             The default is pipelined, but products of at least 1024 rows
                             and columns take the tuned winners' warp-specialized tiles
                             (`matmul_config.LARGE_TILES`) where they apply and fit.
              max_concurrent_steps (pipeline depth), epi_m and epi_n (64), grid_minor ("m" | "n") and
              grid_tile_width: the persistent kernel's tile order (`plgpu.planar_snake`);
              cluster ("none" | "m" | "n", warp-specialized only): blocks run in 2-block
              clusters side by side along m or n, and TMA multicasts the operand both read;
              delay_release (0 | 1, warp-specialized only): WGMMAs left in flight per K step;
              store ("tma" | "threads"): a product off the TMA grid padded and sliced back, or
              stored by the threads from a shared-memory tile at its own size (`kernels.mgpu_store`);
              tail_split (warp-specialized only; 1: off): a stream-K of the tail: the last row
              bands' tiles run as tail_split runs of K each, dealt to the slots the whole tiles
              leave idle in their last wave, their partial products (each as two halves of the
              output dtype) summed, and the epilogue applied, by XLA after the kernel
              (`matmul_config.tail_plan` says which bands; refused where no split shortens the
              busiest slot, with row statistics, or with store "threads").
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.knobs import refusal
from kernels.lowering import Platform, pallas_call
from kernels.matmul_config import (  # noqa: F401 - the family's problem and configs, re-exported
    CONFIGS,
    Epilogue,
    InterpretMatmulConfig,
    MatmulConfig,
    MosaicGpuMatmulConfig,
    Problem,
    TpuMatmulConfig,
    TritonMatmulConfig,
    as_config,
    combine_row_stats,
    fit,
    parse_config,
    row_moments,
)

AnyConfig = Mapping[str, Any] | MatmulConfig


def as_rows(vectors: tuple[jax.Array, ...]) -> list[jax.Array]:
    """Length-n epilogue vectors as (1, n) rows, the layout the kernels' BlockSpecs take."""
    return [v.reshape(1, -1) for v in vectors]


def check(problem: Problem, config: AnyConfig, dtype: Any, target: str) -> MatmulConfig:
    """The typed config, checked against the problem; raises ConfigError when `build` would refuse it."""
    typed = as_config(config, target)
    typed.check(problem, dtype)
    return typed


def check_config(problem: Problem, config: AnyConfig, dtype: Any, target: str) -> str | None:
    """None when `build` accepts the config for `problem`, else why not."""
    return refusal(lambda: check(problem, config, dtype, target))


def footprint(problem: Problem, config: AnyConfig, dtype: Any, target: str) -> int:
    """On-chip bytes of one program: VMEM on TPU, shared memory on GPU (see each config class)."""
    return as_config(config, target).footprint(problem, dtype)


def default(problem: Problem, target: str, dtype: Any = None) -> MatmulConfig:
    """The target's safe config: the plainest strategy with tiles that divide the problem, within
    its on-chip memory at the inputs' dtype (None: bfloat16)."""
    return CONFIGS[target].default(problem, jnp.bfloat16 if dtype is None else dtype)


def default_config(problem: Problem, target: str, dtype: Any = None) -> dict[str, Any]:
    """`default` as a dict."""
    return default(problem, target, dtype).to_dict()


def build(problem: Problem, config: AnyConfig, dtype: Any, platform: Platform) -> Callable[..., jax.Array]:
    """The kernel for `problem` on `platform`: a function of (a, b, *vectors). Any m, n and k:
    the target's kernel runs `MatmulConfig.padded(problem)`, and inputs are padded to it."""
    typed = check(problem, config, dtype, platform.target)
    runs = typed.padded(problem, dtype)
    if platform.target == "tpu":
        from kernels import matmul_tpu

        kernel = matmul_tpu.build(runs, typed, dtype, platform)
    elif platform.target == "gpu-mosaic":
        from kernels import matmul_mgpu

        # Pallas's GPU interpreter cannot run the register stores (inlined Mosaic GPU code): it
        # writes the padded product, which is sliced back.
        writes = runs if platform.interpret else typed.writes(problem, dtype)
        kernel = matmul_mgpu.build(runs, typed, dtype, platform, writes=writes)
    else:
        kernel = _generic_matmul(runs, typed, dtype, platform)
    return kernel if runs == problem else padded_to(problem, runs, kernel)


def padded_to(problem: Problem, runs: Problem, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel` (of the larger problem `runs`) as a function of `problem`'s inputs: A, B and the
    vectors padded with zeros to `runs`, the product (and any row statistics) sliced back unless
    the kernel wrote it at `problem`'s own size (`MosaicGpuMatmulConfig.writes`)."""
    def pad(x: jax.Array, *sizes: int) -> jax.Array:  # the last len(sizes) axes to `sizes`
        lead = x.ndim - len(sizes)
        widths = [(0, 0)] * lead + [(0, size - have) for size, have in zip(sizes, x.shape[lead:])]
        return jnp.pad(x, widths) if any(w for _, w in widths) else x

    def run(a: jax.Array, b: jax.Array, *vectors: jax.Array) -> Any:
        out = kernel(pad(a, runs.m, runs.k), pad(b, runs.k, runs.n), *(pad(v, runs.n) for v in vectors))
        if problem.epilogue.row_stats:  # (product, (2, tiles, m') statistics); n is never padded
            product, stats = out  # consumers read the statistics' first m rows (Epilogue.row_stats)
            return product[..., :problem.m, :problem.n], stats
        if out.shape[-2:] == (problem.m, problem.n):
            return out
        return out[..., :problem.m, :problem.n]

    return run


class EntryPoints(NamedTuple):
    """A matmul-family kernel module's config entry points, for a problem read off its shape."""

    footprint: Callable[..., int]
    default_config: Callable[..., dict[str, Any]]
    check_config: Callable[..., str | None]
    build: Callable[..., Callable[..., jax.Array]]


def entry_points(problem_of: Callable[[tuple[int, ...]], Problem], what: str) -> EntryPoints:
    """`footprint`, `default_config`, `check_config` and `build` of a kernel whose task shape maps
    to a `Problem` by `problem_of` (`what` names the product in `build`'s docstring)."""

    def footprint_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
        """On-chip bytes of one program (VMEM on TPU, shared memory on GPU); see matmul_core."""
        return footprint(problem_of(shape), config, dtype, target)

    def default_config_(shape: tuple[int, ...], target: str, dtype: Any = None) -> dict[str, Any]:
        """Tiles that divide the matrices and fit every target's on-chip memory at the inputs'
        dtype (None: bfloat16)."""
        return default_config(problem_of(shape), target, dtype)

    def check_config_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
        """None when `build` accepts the config, else why not."""
        return check_config(problem_of(shape), config, dtype, target)

    def build_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
        return build(problem_of(shape), config, dtype, platform)

    build_.__doc__ = f"The Pallas {what} for `config` on `platform`: a function of (a, b)."
    return EntryPoints(footprint_, default_config_, check_config_, build_)


# ------------------------------------------------------------------ Triton and plain interpret


def tile_order(l: jax.Array, tiles_m: int, tiles_n: int, group_m: int) -> tuple[jax.Array, jax.Array]:
    """Row and column tile of program `l` when group_m row tiles share each column sweep."""
    width = group_m * tiles_n
    group, within = l // width, l % width
    return group * group_m + within % group_m, within // group_m


def _generic_matmul(problem: Problem, config: InterpretMatmulConfig, dtype: Any,
                    platform: Platform) -> Callable[..., jax.Array]:
    """The Triton (and plain interpret) kernel for a checked config: a function of (a, b, *vectors).

    With split_k S > 1 the grid gains an axis of S runs of K: each program writes its run's f32
    sum of one output tile into an (S, [batch,] m, n) array, and XLA adds the runs and applies the
    epilogue (one fusion: the partials are S x m x n x 4 bytes, small beside B where splitting
    pays, few rows and long K). Atomic adds into one zeroed product instead ran 3-11 us slower on
    the H200 at every decode shape measured (BENCHMARKS.md)."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    m, n, k = problem.m, problem.n, problem.k
    epi_n = bn if config.epi_n is None else config.epi_n
    group_m = config.group_m
    splits = config.split_k
    run_k = k // splits  # each program's run of K (padded: whole block_k steps)
    tiles_m, tiles_n = m // bm, n // bn
    nb = 1 if problem.batch else 0
    ns = 1 if splits > 1 else 0  # a grid axis of runs of K, an output axis of partial products
    sq = (pl.squeezed,) * nb
    sqb = (pl.squeezed,) if problem.batched_b else ()
    epilogue = problem.epilogue
    n_vec = 0 if splits > 1 else epilogue.vectors  # split: the epilogue runs after the sum

    def ij(g):
        return tile_order(g[-1], tiles_m, tiles_n, group_m)

    def run_of(g):
        return g[nb] if ns else 0

    def a_map(*g):
        return tuple(g[:nb]) + (ij(g)[0], run_of(g))

    def b_map(*g):
        return (tuple(g[:nb]) if problem.batched_b else ()) + (run_of(g), ij(g)[1])

    def vec_map(*g):
        return 0, ij(g)[1]

    def out_map(*g):
        return tuple(g[nb:nb + ns]) + tuple(g[:nb]) + ij(g)

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
        accs = lax.fori_loop(0, run_k // bk, step, accs)
        for t, acc in enumerate(accs):
            cols = pl.ds(t * epi_n, epi_n)
            if splits > 1:  # a partial sum: the epilogue waits for the whole of K
                o_ref[:, cols] = acc
                continue
            vecs = [jnp.broadcast_to(v[:, cols].astype(jnp.float32), (bm, epi_n)) for v in vec_refs]
            o_ref[:, cols] = epilogue.fn(acc, *vecs).astype(o_ref.dtype)

    out = problem.out_shape(dtype)
    if splits > 1:
        out = jax.ShapeDtypeStruct((splits,) + out.shape, jnp.float32)
    grid = (problem.batch,) * nb + (splits,) * ns + (tiles_m * tiles_n,)
    call = pallas_call(
        body, platform=platform, config=config.to_dict(), out_shape=out, grid=grid,
        in_specs=[pl.BlockSpec(sq + (bm, run_k), a_map), pl.BlockSpec(sqb + (run_k, bn), b_map),
                  *[pl.BlockSpec((1, bn), vec_map)] * n_vec],
        out_specs=pl.BlockSpec((pl.squeezed,) * ns + sq + (bm, bn), out_map), name="matmul",
    )
    if splits == 1:
        return lambda a, b, *vectors: call(a, b, *as_rows(vectors))

    out_dtype = problem.out_shape(dtype).dtype

    def summed(a: jax.Array, b: jax.Array, *vectors: jax.Array) -> jax.Array:
        total = jnp.sum(call(a, b), axis=0)
        return epilogue.fn(total, *(jnp.broadcast_to(v.astype(jnp.float32), total.shape) for v in vectors)
                           ).astype(out_dtype)

    return summed
