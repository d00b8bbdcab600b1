"""A row kernel's protocol functions from its math: validation, footprint, default and build.

`RowKernel(math, shape_names)` is what a kernel module declares; its methods are the module's
`check_config`, `footprint`, `default_config`, `build` and `shape_of`. Every one of them goes
through `plan`, the one validation path: dict -> typed config (`from_dict`) -> `check(shape)`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tpu_mesh
from kernels.lowering import Platform
from kernels.rows import footprint as footprint_
from kernels.rows.blocked import build_blocked, vector_layout
from kernels.rows.config import (
    CONFIG_TYPES,
    MAX_SPANS,
    STRATEGIES,
    SUBLANES,
    Plan,
    RowConfig,
    from_dict,
    split_shape,
)
from kernels.rows.contract import RowMath
from kernels.rows.triton import build_triton

# Whole rows are streamed by default once one block of them needs more VMEM than this (half of
# the 16 MiB scoped-VMEM default of the smaller TPUs; the default knows no dtype: float32).
STREAM_ABOVE = 8 * 2**20
# Triton holds the padded row in registers by default up to this width, then loops.
REGISTER_ROW = 8192
# ... or, with at most FEW_ROWS rows, spreads each row's chunks of SPLIT_CHUNK columns over
# programs of SPLIT_WARPS warps (split_cols). Device time on the H200, bf16 (bench/results/h200/
# few_rows/): softmax 3x50257 19.2 us looped, 3.1 split (chunks of 1024 or 2048); rms norm
# 2x32768 9.0 us (the tuned loop), 2.1 split; layer norm 4x16384 5.2 (the tuned loop), 5.1 split
# in chunks of 1024 with 2 warps but 11.1 in chunks of 2048 with 4 (its map kernel is slow there).
FEW_ROWS = 64
SPLIT_CHUNK, SPLIT_WARPS = 1024, 2


@dataclasses.dataclass(frozen=True, eq=False)
class RowKernel:
    """A row-wise kernel: its math, the names of its shape's axes and the strategies it takes.

    strategies: per target, the strategies this kernel allows (the first is the default when a
    config names none); a target with one strategy has no strategy knob.
    hint: added to the refusal of a shape of another rank.

        KERNEL = RowKernel(softmax.MATH, ("rows", "cols"))
        KERNEL.check_config({"block_rows": 3}, (64, 256), "float32", "tpu")   # -> the reason
        y = KERNEL.build(KERNEL.default_config((64, 256), "tpu"), (64, 256), jnp.float32,
                         Platform("tpu", interpret=True))(x)
    """

    math: RowMath
    shape_names: tuple[str, ...]
    strategies: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: dict(STRATEGIES))
    hint: str = ""

    def plan(self, config: Mapping[str, Any], shape: tuple[int, ...], target: str) -> Plan:
        """The checked plan of `config` for `shape` on `target`; raises with a plain message."""
        name = self.math.name
        if len(shape) != len(self.shape_names):
            raise NotImplementedError(f"{name} takes ({', '.join(self.shape_names)}){self.hint}, "
                                      f"got {tuple(shape)}")
        if target not in CONFIG_TYPES:
            raise NotImplementedError(f"{name} does not support target {target!r}; expected one "
                                      f"of {list(CONFIG_TYPES)}")
        allowed = self.strategies[target]
        typed = from_dict(CONFIG_TYPES[target], {"strategy": allowed[0], **config},
                          f"{name} on {target}")
        if typed.strategy not in allowed:
            raise ValueError(f"{name} takes strategy in {allowed} on {target}, got "
                             f"{typed.strategy!r}")
        return typed.check(tuple(shape), self.math)

    def knobs(self, rank: int, target: str) -> tuple[str, ...]:
        """The knobs this kernel's search spaces tune on `target` (a default config has exactly these).

        block_batch for 3-D shapes; stats_layout on TPU when the kernel has per-row vectors;
        rows_per_program on Triton unless it writes per-row results (one block of rows per
        program: a result needs no partial sum to amortise); unroll on Triton with fori_loop,
        and fold when the math has a `LaneFold` too; prefetch on Triton when the math has
        column outputs (its programs loop over many rows to keep the partial sums few);
        strategy when there is a choice."""
        names = ["block_rows", "block_cols"]
        if len(self.strategies[target]) > 1:
            names.insert(1, "strategy")
        if rank == 3 and target != "gpu-triton":
            names.append("block_batch")
        if target == "tpu":
            names += ["buffers", "stats_layout"] if self.math.has_vectors else ["buffers"]
        if target == "gpu-triton":
            if not self.math.results:
                names.append("rows_per_program")
            names += ["num_warps", "num_stages"]
            if "fori_loop" in self.strategies[target]:
                names += ["unroll", "fold"] if self.math.lanes is not None else ["unroll"]
            if self.math.col_outputs:
                names.append("prefetch")
        return tuple(names)

    def check_config(self, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
                     target: str) -> str | None:
        """None if `config` can run on `shape` and `target`, else a short reason."""
        del dtype  # the row engine's rules need no dtype
        try:
            self.plan(config, shape, target)
        except (ValueError, NotImplementedError) as err:
            return str(err)
        return None

    def footprint(self, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
                  target: str) -> int:
        """On-chip bytes of one program (see `kernels.rows.footprint.footprint`)."""
        return footprint_.footprint(self.math, self.plan(config, shape, target), dtype)

    def default(self, shape: tuple[int, ...], target: str) -> RowConfig:
        """The typed default: small row blocks; streamed (TPU) or looped (Triton) when rows are
        long; on Triton a few long rows spread over programs (split_cols) when the math combines spans."""
        batch, rows, cols = split_shape(shape)
        if target == "gpu-triton":
            width = pl.next_power_of_2(cols)
            cls = CONFIG_TYPES[target]
            if width <= REGISTER_ROW:
                return cls(block_rows=1, rows_per_program=1, num_warps=4 if width <= 4096 else 8,
                           num_stages=1)
            if (batch * rows <= FEW_ROWS and self.math.span_combine is not None
                    and "split_cols" in self.strategies[target] and pl.cdiv(cols, SPLIT_CHUNK) <= MAX_SPANS):
                return cls(block_rows=1, rows_per_program=1, num_warps=SPLIT_WARPS, num_stages=1,
                           strategy="split_cols", block_cols=SPLIT_CHUNK)
            return cls(block_rows=1, rows_per_program=1, num_warps=8, num_stages=2,
                       strategy="fori_loop", block_cols=4096)
        if target != "tpu":
            return CONFIG_TYPES[target](block_rows=SUBLANES if rows % SUBLANES == 0 else rows)
        # TPU: 16 rows make whole (16, 128) tiles of 16-bit types too; 8 where 16 do not divide
        # the rows; else all rows in one block (as the power of two at or past them, which
        # `RowConfig.check` takes whole). Where whole rows would not be small, rows longer than a
        # chunk stream in column chunks (emit_pipeline), a row no chunk divides padded to whole
        # chunks of 512 by a copy (`Plan.pad_cols`), the rows as `tpu_rows` takes them: whole rows
        # of 13 x 151937 in padded 16-row blocks ran out of v4's 16 MiB of VMEM.
        fit = tpu_row_block(rows)
        config = CONFIG_TYPES[target](block_rows=fit or pl.next_power_of_2(rows))
        if self._tpu_footprint(config, shape) <= STREAM_ABOVE:
            return config
        block_cols = max((c for c in (128, 256, 512, 1024) if cols % c == 0), default=512)
        if block_cols < cols:
            config = dataclasses.replace(config, strategy="emit_pipeline", block_cols=block_cols)
        return self.tpu_rows(config, shape)

    def tpu_rows(self, config: RowConfig, shape: tuple[int, ...]) -> RowConfig:
        """A TPU `config` with a default's block of rows: 16 or 8 where they divide the rows; else
        all of them (as the power of two past them) where that block's footprint in float32 is
        at most STREAM_ABOVE; else 16 (8 of up to 16 rows), the rows padded to them by a copy
        (`Plan.pad_rows`), where that block's footprint is at most STREAM_ABOVE; else all of them."""
        rows = split_shape(tuple(shape))[1]
        fit = tpu_row_block(rows)
        if fit is not None:
            return dataclasses.replace(config, block_rows=fit)
        whole = dataclasses.replace(config, block_rows=pl.next_power_of_2(rows))
        if self._tpu_footprint(whole, shape) <= STREAM_ABOVE:
            return whole
        # a smaller block than all the rows: 16, or 8 of 9 to 16 rows; 8 rows or fewer stay whole.
        # Where the smaller block is no small block either, the column vectors fill VMEM (rms norm
        # backward's dweight at 13 x 151937): fewer rows save nothing and pad as many, stay whole.
        smaller = [dataclasses.replace(config, block_rows=block)
                   for block in TPU_ROW_BLOCKS if block < whole.block_rows]
        if smaller and self._tpu_footprint(smaller[0], shape) <= STREAM_ABOVE:
            return smaller[0]
        return whole

    def _tpu_footprint(self, config: RowConfig, shape: tuple[int, ...]) -> int:
        """`config`'s on-chip bytes at `shape` in float32 (the default knows no dtype)."""
        return footprint_.footprint(self.math, config.check(tuple(shape), self.math), jnp.float32)

    def default_config(self, shape: tuple[int, ...], target: str) -> dict[str, Any]:
        """A safe config for any shape, with exactly the knobs of the target (see `default`)."""
        return self.default(shape, target).to_dict(self.knobs(len(shape), target))

    def default_gpu_targets(self, shape: tuple[int, ...], dtype: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
        """`targets` with gpu-triton first where its default spreads a few long rows over programs
        (split_cols): a decode step's sampling softmax over a vocabulary. On the H200 the Triton
        default ran softmax (1, 151936) in 3.4 us against Mosaic GPU's 7.0, cross entropy (7,
        151936) 3.8 against 15.3 (bench/results/h200/users_odd_defaults/second_after); elsewhere
        the order given (the kernels.protocol hook)."""
        del dtype
        if "gpu-triton" in targets and self.default(shape, "gpu-triton").strategy == "split_cols":
            return ("gpu-triton", *(t for t in targets if t != "gpu-triton"))
        return targets

    def shape_of(self, *inputs: jax.Array) -> tuple[int, ...]:
        """The kernel's shape for these inputs (the inverse of `make_inputs`): the first input's."""
        shape = tuple(inputs[0].shape)
        if len(shape) != len(self.shape_names):
            raise ValueError(f"{self.math.name} takes a ({', '.join(self.shape_names)}) first "
                             f"input, got shape {shape}")
        return shape

    def build(self, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
              platform: Platform) -> Callable[..., Any]:
        """The Pallas kernel for `config`: a function of (row inputs, column inputs, vector inputs)."""
        return build(self.math, self.plan(config, shape, platform.target), tuple(shape), dtype,
                     platform)


# TPU row blocks a default takes: 16 rows make whole (16, 128) tiles of 16-bit types too, 8 of 32-bit.
TPU_ROW_BLOCKS = (2 * SUBLANES, SUBLANES)


def tpu_row_block(rows: int) -> int | None:
    """The first of TPU_ROW_BLOCKS that divides `rows`, or None (then a default takes all the
    rows as one block, or pads them to whole blocks: `Plan.pad_rows`)."""
    return next((block for block in TPU_ROW_BLOCKS if rows % block == 0), None)


def build(math_: RowMath, p: Plan, shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas kernel of `math_` for a checked plan; returns the outputs in the math's order
    (one array alone), column outputs summed over the partials, results float32 shape[:-1]."""
    dtype = jnp.dtype(dtype)
    triton = platform.target == "gpu-triton"
    if triton:
        call = build_triton(math_, p, dtype, platform)
        col_shape, vec_shape = (1, p.cols), (p.batch, p.rows)
    else:
        call = build_blocked(math_, p, dtype, platform)
        col_shape, vec_shape = (1, 1, p.cols), vector_layout(p)[0]
        if platform.target == "tpu":  # Mosaic reads the chip's facts while tracing
            call = tpu_mesh.traced_for_tpu(call)
    n_row, n_col = math_.row_inputs, math_.col_inputs
    n_out = math_.row_outputs + math_.col_outputs
    cols, pad_cols = p.row_cols, p.pad_cols
    expected = [shape] * n_row + [(cols,)] * n_col + [shape[:-1]] * math_.vector_inputs

    rows, pad = p.rows - p.pad_rows, p.pad_rows
    lane = len(vec_shape) == 1  # per-row vectors as (rows,), else (batch, rows[, 1])

    def padded(x: jax.Array, vector: bool = False) -> jax.Array:
        """x with `pad` rows of zeros appended (TPU blocks are whole: `Plan.pad_rows`) and, a row
        tensor, `pad_cols` columns of the math's pad (`Plan.pad_cols`)."""
        widths = [(0, 0)] * x.ndim
        widths[0 if vector and lane else 1] = (0, pad)
        x = jnp.pad(x, widths) if pad else x
        if vector or not pad_cols:
            return x
        return jnp.pad(x, ((0, 0), (0, 0), (0, pad_cols)), constant_values=math_.pad)

    def unpadded(x: jax.Array, vector: bool = False) -> jax.Array:
        x = x if not pad else x[:rows] if vector and lane else x[:, :rows]
        return x if vector or not pad_cols else x[..., :cols]

    def run(*inputs: jax.Array) -> Any:
        got = [tuple(x.shape) for x in inputs]
        if got != expected:
            raise ValueError(f"{math_.name} was built for input shapes {expected}, got {got}")
        row_ins = [padded(x.reshape(p.batch, rows, cols)) for x in inputs[:n_row]]
        col_ins = [jnp.pad(v, (0, pad_cols)).reshape(col_shape) for v in inputs[n_row:n_row + n_col]]
        vec_ins = [padded(v.reshape((rows,) if lane else (p.batch, rows) + vec_shape[2:]), vector=True)
                   for v in inputs[n_row + n_col:]]
        outs = call(*row_ins, *col_ins, *vec_ins)
        row_outs = [unpadded(o).reshape(shape) for o in outs[:math_.row_outputs]]
        col_outs = [jnp.sum(o, axis=0).reshape(p.cols)[:cols].astype(dtype)
                    for o in outs[math_.row_outputs:n_out]]
        results = [unpadded(o, vector=True).reshape(shape[:-1]) for o in outs[n_out:]]
        everything = (*row_outs, *col_outs, *results)
        return everything[0] if len(everything) == 1 else everything

    return run
