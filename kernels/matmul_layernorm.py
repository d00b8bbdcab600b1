"""Matmul with a layer-norm epilogue over each output row: C = LN(A @ B) * gamma + beta.

LN normalises each row of the f32 product over its n columns (eps 1e-5). Strategy knob
ln_strategy (default two_phase, which any tiles allow):
  "fused"      one program owns block_m whole rows (block_n must equal n): the (block_m, n) f32
               accumulator stays on chip and the epilogue normalises it before the only store.
               On TPU a (256, 4096) f32 accumulator is 4 MiB of VMEM, so this fits; on Triton
               the accumulator lives in registers and only small n fit (see the search space).
  "two_phase"  phase 1 is the plain tiled matmul writing A @ B (any block_n); phase 2 the row
               engine's layer norm (`kernels.layer_norm`, strategy one_pass, ln_rows rows per
               program; default 8, or m) normalising it: the product is written and read once
               more, with no constraint on the tiles. Any m and n on Triton (rows padded to a
               power of two and masked, ln_rows a power of two, default 8 or fewer for fewer
               rows or wide ones (TRITON_ROW_ELEMENTS), the last program masked; its warps
               follow its elements, `row_warps`); elsewhere ln_rows is what the engine's
               blocks take (TPU: a multiple of 8 or m, the rows padded to whole blocks).
  "tile_stats" (gpu-mosaic: WGMMA accumulators cannot hold whole 4096-wide rows) a split
               reduction: phase 1 is the Mosaic GPU matmul whose epilogue also stores, per row
               and per warpgroup tile, the f32 product's sum and squared deviations
               (`Epilogue.row_stats`); phase 2 combines them (`combine_row_stats`) and
               normalises the product, reading each stored element once and never reducing
               over a row: ln_phase2 "xla" (XLA's fusions: a small reduction, then one
               elementwise pass) or "triton" (one Triton kernel of ln_rows rows a program,
               combining and normalising in power-of-two chunks of the row, any n).
ln_store ("float32" | "input"): the dtype two_phase and tile_stats store the product in between
the phases: float32 (exact), or the input dtype (half the traffic; the statistics are still
taken from the f32 accumulator, so only the product's rounding reaches the output). Defaults:
float32, and on gpu-mosaic the input dtype with the Triton phase 2 (`default_config`: measured
faster at every shape tried but one, a tie).
Other knobs as in `kernels.matmul_core`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import layer_norm, matmul_core
from kernels.knobs import ConfigError, Knobs, Unsupported, refusal
from kernels.lowering import Platform, pallas_call

NAME = "matmul_layernorm"
SHAPE_NAMES = ("m", "n", "k")
PARALLEL_DIMS = ("m",)  # the layer norm takes whole rows of the output: n stays whole
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
EPS = 1e-5


def _layer_norm(x: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + EPS) * gamma + beta


FUSED = matmul_core.Epilogue(fn=_layer_norm, vectors=2, full_rows=True)


@dataclasses.dataclass(frozen=True)
class LayerNormKnobs(Knobs):
    """This kernel's own knobs: the strategy, two_phase's rows per program (None: 8 when they
    divide m, else m; also tile_stats' Triton phase 2), the dtype of the product stored between
    the phases, and what runs tile_stats' phase 2 (XLA, or one Triton kernel)."""

    ln_strategy: Literal["fused", "two_phase", "tile_stats"] = "two_phase"
    ln_rows: int | None = None
    ln_store: Literal["float32", "input"] = "float32"
    ln_phase2: Literal["xla", "triton"] = "xla"

    def rows(self, m: int) -> int:
        """ln_rows with its default resolved."""
        if self.ln_rows is not None:
            return self.ln_rows
        return 8 if m % 8 == 0 else m


TILE_STATS = matmul_core.Epilogue(row_stats=True)


def _typed(config: dict[str, Any], target: str) -> tuple[matmul_core.MatmulConfig, LayerNormKnobs]:
    if target not in TARGETS:
        raise Unsupported(f"{NAME} has no {target} version")
    return matmul_core.parse_config(config, target, LayerNormKnobs)


def _problem(own: LayerNormKnobs, shape: tuple[int, ...]) -> matmul_core.Problem:
    m, n, k = shape
    if own.ln_strategy == "fused":
        return matmul_core.Problem(m, n, k, epilogue=FUSED)
    store = jnp.float32 if own.ln_store == "float32" else None  # None: the input dtype
    if own.ln_strategy == "tile_stats":
        return matmul_core.Problem(m, n, k, epilogue=TILE_STATS, out_dtype=store)
    return matmul_core.Problem(m, n, k, out_dtype=store)


def reference(a: jax.Array, b: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    """LN(A @ B) * gamma + beta in plain jax.numpy, computed in float32."""
    x = jnp.dot(a, b, preferred_element_type=jnp.float32)
    return _layer_norm(x, gamma.astype(jnp.float32), beta.astype(jnp.float32)).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (m, k), B (k, n), gamma (n,) around 1 and beta (n,) around 0."""
    m, n, k = shape
    ka, kb, kg, kbeta = jax.random.split(key, 4)
    return (jax.random.normal(ka, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (k, n), jnp.float32).astype(dtype),
            (1.0 + 0.1 * jax.random.normal(kg, (n,), jnp.float32)).astype(dtype),
            (0.1 * jax.random.normal(kbeta, (n,), jnp.float32)).astype(dtype))


def shape_of(a: jax.Array, b: jax.Array, gamma: jax.Array, beta: jax.Array) -> tuple[int, ...]:
    """(m, n, k) of A (m, k) and B (k, n)."""
    return a.shape[0], b.shape[1], a.shape[1]


def flops(shape: tuple[int, ...]) -> int:
    """2 m n k multiply-adds plus the layer norm (about 8 per output)."""
    m, n, k = shape
    return 2 * m * n * k + 8 * m * n


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory (the fused strategy): inputs once, C written once."""
    m, n, k = shape
    return (m * k + k * n + 2 * n + m * n) * jnp.dtype(dtype).itemsize


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of the largest program: the matmul's, or with two_phase also the row kernel's."""
    m, n, _ = shape
    core, own = _typed(config, target)
    matmul_bytes = matmul_core.footprint(_problem(own, shape), core, dtype, target)
    if own.ln_strategy != "two_phase":  # fused: one kernel; tile_stats: phase 2 keeps rows in registers
        return matmul_bytes
    # The row engine's footprint of phase 2, its rows in and out at the stored product's width
    # (float32 or the input dtype; the output is never wider).
    stored = jnp.float32 if own.ln_store == "float32" else dtype
    ln_bytes = layer_norm.KERNEL.footprint(_row_config(own.rows(m), n, target), (m, n), stored, target)
    return max(matmul_bytes, ln_bytes)


# The two_phase row kernel's elements a program on gpu-triton by default: 64 f32 values a thread in
# 8 warps. On the H200 (BENCHMARKS.md, thirty-third session; us of matmul + layer norm) 4 rows of
# 14336 ran 1101.5 against 387.5 for 1 row and 372.5 for 2 (the rows spilled); at 4096^3 4 rows
# 220.9, 1 row 221.3, 8 rows 225.5; at 4096 x 11008 x 4096 1, 2 and 4 rows within 0.3%.
TRITON_ROW_ELEMENTS = 16384


def default_config(shape: tuple[int, ...], target: str, dtype: Any = None) -> dict[str, Any]:
    """The two-phase scheme with the plain matmul's default tiles (any n works), the product stored
    in float32; on gpu-mosaic tile_stats, the product stored in bf16 and normalised by the Triton
    phase 2 (`phase2_rows` rows a program). On the H200 (BENCHMARKS.md, thirty-first session) that
    took 190.7 us against 209.2 for an f32 product and XLA's phase 2 at 4096^3 (XLA's unfused
    210.0), the fastest of the four pairs at all six power-of-two shapes measured, and 292.2 against
    298.3 for XLA's phase 2 over the bf16 product at 4096 x 5120 x 5120; relative error 0.0023
    against 0.0017 (the bf16 tolerance 0.02; torch's bf16 matmul then layer norm rounds the same).
    The tiles fit on-chip memory at the inputs' dtype (None: bfloat16)."""
    m, n = shape[0], shape[1]
    if target == "gpu-mosaic":
        own = LayerNormKnobs(ln_strategy="tile_stats", ln_rows=phase2_rows(m, n), ln_store="input",
                             ln_phase2="triton")
        return own.to_dict() | matmul_core.default_config(_problem(own, shape), target, dtype)
    own = LayerNormKnobs(ln_strategy="two_phase")
    # Triton's row kernel masks the rows past m, and its tiles are powers of two; at most 65536
    # elements a program, as the space asks (8 rows of 14336 were outside it, and a sweep on the
    # H200 answered such a default "invalid", thirty-second session)
    rows = min(8, pl.next_power_of_2(m)) if target == "gpu-triton" else own.rows(m)
    if target == "tpu" and m % 8:
        # the row engine pads m to whole blocks on TPU (or takes all of fewer rows): 16, a power
        # of two the space holds, rather than all 77 rows as one block
        rows = 16
    while target == "gpu-triton" and rows > 1 and rows * n > TRITON_ROW_ELEMENTS:
        rows //= 2
    knobs = dataclasses.replace(own, ln_rows=rows).to_dict()
    del knobs["ln_phase2"]  # only tile_stats has a phase 2 to choose
    return knobs | matmul_core.default_config(_problem(own, shape), target, dtype)


def phase2_rows(m: int, n: int) -> int:
    """Rows a program of tile_stats' Triton phase 2 by default: the fastest measured on the H200
    behind the tuned tiles with a bf16 product (BENCHMARKS.md, thirtieth to thirty-second
    sessions): 2 at n = 2048 and 4096 (16.9 us against 21.2 for 8 rows at 4096), 1 at n = 5120
    to 8192 (36.9 against 39.7 for 2 at 8192); 4 over rows wider than 8192 walked in chunks of at
    most 2048 (68.4 us against 76.4 for 1 and 70.6 for 2 at 4096 x 14336). Fewer where they do not
    divide m."""
    want = 2 if n <= 4096 else 4 if n > 8192 and phase2_chunk(n) <= 2048 else 1
    return next(rows for rows in (want, 2, 1) if rows <= want and m % rows == 0)


def _checked(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str):
    core, own = _typed(config, target)
    problem = _problem(own, shape)
    core = matmul_core.check(problem, core, dtype, target)
    m = shape[0]
    rows = own.rows(m)
    if own.ln_strategy == "two_phase" and target == "gpu-mosaic":
        raise Unsupported("gpu-mosaic: two_phase's row kernel is not a Mosaic GPU kernel; use tile_stats")
    if own.ln_strategy == "two_phase":
        why = layer_norm.KERNEL.check_config(_row_config(rows, shape[1], target), (m, shape[1]), dtype, target)
        if why:
            raise ConfigError(f"two_phase's row kernel (ln_rows = {rows}): {why}")
    if own.ln_strategy == "tile_stats" and own.ln_phase2 == "triton":
        rows = own.rows(m)
        if m % rows or rows & (rows - 1):
            raise Unsupported(f"tile_stats' Triton phase 2 takes ln_rows ({rows}) a power of two dividing m "
                              f"({m}); use ln_phase2 xla")
    return problem, core, own


def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
    """None when `build` accepts the config, else why not."""
    return refusal(lambda: _checked(config, shape, dtype, target))


def row_warps(elements: int) -> int:
    """Warps of a Triton program that holds `elements` of a row block in registers: 8 past 8192.
    On the H200 (BENCHMARKS.md, thirty-third session) two_phase's row kernel at 4 rows of 11008
    ran 947 us with 4 warps (32 registers a thread: the rows spilled) and 97 us with 8."""
    return 4 if elements <= 8192 else 8


def _row_config(rows: int, n: int, target: str) -> dict[str, Any]:
    """two_phase's phase 2 as a config of the row engine's layer norm: whole rows (one_pass),
    `rows` a program; on Triton with `row_warps` of its elements, the rows past m masked."""
    if target == "gpu-triton":
        return {"block_rows": rows, "rows_per_program": rows, "num_warps": row_warps(rows * n), "num_stages": 1}
    return {"block_rows": rows}


def _row_norm(rows: int, shape: tuple[int, ...], dtype: Any, platform: Platform):
    """two_phase's phase 2: the row engine's layer norm (`kernels.layer_norm`, the same eps) over
    the stored product, written in `dtype` (the engine reads any input dtype as float32)."""
    m, n, _ = shape
    return layer_norm.KERNEL.build(_row_config(rows, n, platform.target), (m, n), dtype, platform)


def _tile_stats(phase1, own: LayerNormKnobs, shape: tuple[int, ...], dtype: Any, platform: Platform):
    """Phase 2 of tile_stats: each row's mean and variance from phase 1's per-tile statistics,
    then one pass over the stored product: XLA's fusions, or one Triton row kernel."""
    m, n, _ = shape
    if own.ln_phase2 == "triton":
        normalise = _triton_normalise(own.rows(m), shape, dtype, platform)
    else:
        def normalise(product, stats, gamma, beta):
            mean, var = matmul_core.combine_row_stats(stats, n, m)
            scale = jax.lax.rsqrt(var + EPS)[:, None]
            centred = product.astype(jnp.float32) - mean[:, None]
            return (centred * scale * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(dtype)

    def tile_stats(a: jax.Array, b: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
        product, stats = phase1(a, b)
        return normalise(product, stats, gamma, beta)

    return tile_stats


UNROLL = 16  # tile_stats' Triton phase 2 unrolls rows of at most this many chunks


def phase2_chunk(n: int) -> int:
    """Columns tile_stats' Triton phase 2 normalises at a time: the largest power of two that
    divides n, at most 8192 (4096-wide rows whole, as measured; 5120 in 5 chunks of 1024); where
    that is under 512 (n = 64 x 65, say), chunks of up to 2048 with the last one masked."""
    chunk = min(n & -n, 8192)
    return chunk if chunk >= 512 else min(2048, pl.next_power_of_2(n))


def _triton_normalise(rows: int, shape: tuple[int, ...], dtype: Any, platform: Platform):
    """One Pallas Triton kernel for phase 2 of tile_stats: a program takes `rows` rows of the
    product and their per-tile statistics, combines those (`row_moments`, as
    `combine_row_stats` does) and normalises the rows in chunks of `phase2_chunk(n)` columns.
    Whole refs in global memory, read through power-of-two windows: the statistics' tiles are
    padded to a power of two and masked, and so are the columns past an odd width's last chunk;
    nothing is sliced or copied outside the kernel."""
    from jax.experimental.pallas import triton as pltriton

    m, n, _ = shape
    chunk = phase2_chunk(n)
    whole, rest = divmod(n, chunk)

    def normalise(product, stats, gamma, beta):
        tiles = stats.shape[1]
        padded = pl.next_power_of_2(tiles)

        def body(stats_ref, y_ref, gamma_ref, beta_ref, o_ref):
            r0 = pl.program_id(0) * rows
            tile_ok = (jnp.arange(padded) < tiles)[:, None] if padded != tiles else None

            def part(index: int, count: int, mask: jax.Array | None) -> jax.Array:  # (count, rows)
                # index as an int32 array: Pallas (JAX 0.10) rejects a Python int beside pl.ds windows here
                return pltriton.load(stats_ref.at[jnp.int32(index), pl.ds(0, count), pl.ds(r0, rows)], mask=mask,
                                     other=None if mask is None else 0.0)

            mean, var = matmul_core.row_moments(part(0, padded, tile_ok), part(1, padded, tile_ok),
                                                part(0, 1, None), n, keepdims=True, valid=tile_ok, tiles=tiles)
            mean, rstd = jnp.transpose(mean), jnp.transpose(jax.lax.rsqrt(var + EPS))  # (rows, 1)

            def columns(c0: Any, col_ok: jax.Array | None) -> None:
                window = (pl.ds(r0, rows), pl.ds(c0, chunk))
                vector = (pl.ds(0, 1), pl.ds(c0, chunk))
                other = None if col_ok is None else 0.0
                y = pltriton.load(y_ref.at[window], mask=col_ok, other=other).astype(jnp.float32)
                g = pltriton.load(gamma_ref.at[vector], mask=col_ok, other=other).astype(jnp.float32)
                b = pltriton.load(beta_ref.at[vector], mask=col_ok, other=other).astype(jnp.float32)
                pltriton.store(o_ref.at[window], ((y - mean) * rstd * g + b).astype(o_ref.dtype), mask=col_ok)

            if whole <= UNROLL:  # straight-line code: every chunk's loads issued without waiting on a loop
                for j in range(whole):
                    columns(j * chunk, None)
            else:
                jax.lax.fori_loop(0, whole, lambda j, carry: (columns(j * chunk, None), carry)[1], 0)
            if rest:  # a traced start: a static window past the row's end is refused while tracing
                tail = jnp.int32(whole * chunk)
                columns(tail, (tail + jnp.arange(chunk) < n)[None, :])

        call = pallas_call(
            body, platform=dataclasses.replace(platform, target="gpu-triton"),
            config={"num_warps": row_warps(rows * chunk), "num_stages": 1},
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(dtype)), grid=(m // rows,),
            name="tile_stats_layer_norm")
        return call(stats, product, gamma.reshape(1, n), beta.reshape(1, n))

    return normalise


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas matmul + layer norm for `config`: a function of (a, b, gamma, beta)."""
    problem, core, own = _checked(config, shape, dtype, platform.target)
    phase1 = matmul_core.build(problem, core, dtype, platform)
    if own.ln_strategy == "fused":
        return phase1
    if own.ln_strategy == "tile_stats":
        return _tile_stats(phase1, own, shape, dtype, platform)
    phase2 = _row_norm(own.rows(shape[0]), shape, dtype, platform)

    def two_phase(a: jax.Array, b: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
        return phase2(phase1(a, b), gamma, beta)

    return two_phase
