"""Gated linear units, elementwise: out = act(a) * b for a, b of shape (batch, seq, hidden).

Shared by `swiglu` and `geglu`, which supply `act` (float32 -> float32) to `gated_unit`, which
makes every protocol member of their modules. Inputs are read once,
the output written once, the math done in float32 and rounded to the input dtype.

Not on the row engine (`kernels.rows`): a gated unit reduces nothing, so none of the engine's
strategies (whole rows, a loop over column chunks with per-row statistics, streamed chunks
with a statistics phase) has a job here; what is tuned is a plain 2-D tiling of the
(seq, hidden) plane (TPU) or a 1-D / row tiling of the flattened arrays (Triton). It shares
the engine's typed-config helpers (`from_dict`) and Triton defaults (num_warps 4, num_stages 3,
always passed explicitly), and the TPU kernels' VMEM rule (`vmem_limit`).

Config knobs (typed below, each default once):
  TPU and interpret: block_rows x block_cols tiles of the (seq, hidden) plane of one batch
    entry (TPU: block_cols dividing hidden, block_rows a multiple of 8 or all of seq, block_cols
    a multiple of 128 or all of hidden, a block past either being all of it; a seq that
    block_rows does not divide is padded to whole blocks by a copy: `GluConfigTPU.padded_seq`;
    interpret: edge tiles may be partial); buffers (TPU: 1 or 2 pipeline buffers per operand).
  gpu-triton: block_size elements per step, blocks_per_program steps per program (a loop
    when > 1); tiling "flat" — the arrays as one vector in masked 1-D blocks; or tiling "rows"
    — (batch * seq, hidden) as a 2-D array in masked (block_size / block_cols) x block_cols
    tiles, a program walking blocks_per_program tiles down the rows. Powers of two; any shape;
    num_warps, num_stages.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call
from kernels.members import Members
from kernels.rows.config import from_dict, is_pow2
from kernels.tpu_mesh import vmem_limit

SHAPE_NAMES = ("batch", "seq", "hidden")
TARGETS = ("interpret", "tpu", "gpu-triton")
TILINGS = ("flat", "rows")
# The knobs that grow on-chip memory (see farm.pruning).
MEMORY_PARAMS = ("block_rows", "block_cols", "buffers", "block_size", "num_stages")
Activation = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class GluConfigInterpret:
    """Tiles of block_rows x block_cols of the (seq, hidden) plane; edge tiles may be partial."""

    block_rows: int
    block_cols: int

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.block_cols < 1:
            raise ValueError(f"block_rows and block_cols must be positive, got {self.block_rows} "
                             f"and {self.block_cols}")

    def tile(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The tile on `shape`: a block past seq or hidden is all of it (a full-dimension block,
        which TPU takes at any size: 197 tokens in block_rows 256)."""
        return min(self.block_rows, shape[1]), min(self.block_cols, shape[2])

    def check(self, shape: tuple[int, ...]) -> None:
        """Raise if the config cannot run on `shape` (interpret: any positive tile)."""


@dataclasses.dataclass(frozen=True)
class GluConfigTPU(GluConfigInterpret):
    """Tiles dividing (seq, hidden) in (8, 128) units; buffers: 1 or 2 per operand."""

    buffers: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.buffers not in (1, 2):
            raise ValueError(f"buffers must be 1 or 2 on TPU, got {self.buffers}")

    def padded_seq(self, shape: tuple[int, ...]) -> int:
        """seq rounded up to whole row blocks. Partial edge tiles are not used on TPU: TPU
        interpret mode (JAX 0.10) fails on them when outputs are aliased, as validation's
        poisoned outputs are, so the tiled path could not be proven on a CPU. So a seq that
        block_rows does not divide (4097 tokens in blocks of 256) is padded with zeros by a
        copy and the output sliced: the copies move about twice the kernel's own bytes (a and
        b padded, the output sliced), where the alternative, one block of all of seq, outgrows
        VMEM at long sequences (50257 x 512 tiles: 514 MB)."""
        br, _ = self.tile(shape)
        return -(-shape[1] // br) * br

    def check(self, shape: tuple[int, ...]) -> None:
        _, seq, hidden = shape
        br, bc = self.tile(shape)
        if hidden % bc:
            raise ValueError(f"block_cols={bc} must divide hidden ({hidden}) on TPU")
        if br % 8 and br != seq:
            raise ValueError(f"block_rows={br} must be a multiple of 8 or all of seq ({seq})")
        if bc % 128 and bc != hidden:
            raise ValueError(f"block_cols={bc} must be a multiple of 128 or all of hidden ({hidden})")


@dataclasses.dataclass(frozen=True)
class GluConfigTriton:
    """block_size elements per step (a power of two), blocks_per_program steps per program,
    tiling "flat" or "rows" (block_cols: the rows tiles' width; flat ignores it, the spaces pin
    it at 64), num_warps and num_stages."""

    block_size: int
    tiling: str = "flat"
    blocks_per_program: int = 1
    block_cols: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        if self.tiling not in TILINGS:
            raise ValueError(f"tiling must be one of {list(TILINGS)}, got {self.tiling!r}")
        size, per = self.block_size, self.blocks_per_program
        if not is_pow2(size) or per < 1:
            raise ValueError(f"block_size must be a power of two and blocks_per_program >= 1, "
                             f"got {size} and {per}")
        cols = self.block_cols
        if self.tiling == "rows" and not (is_pow2(cols) and cols <= size):
            raise ValueError(f"block_cols must be a power of two <= block_size ({size}), got {cols}")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"num_warps and num_stages must be positive, got {self.num_warps} "
                             f"and {self.num_stages}")

    def check(self, shape: tuple[int, ...]) -> None:
        """Raise if the config cannot run on `shape` (flat tiling indexes with int32)."""
        if self.tiling == "flat" and math.prod(shape) >= 2**31:
            raise NotImplementedError(f"flat tiling indexes with int32; {shape} has >= 2**31 elements "
                                      "(use tiling 'rows')")


CONFIG_TYPES = {"interpret": GluConfigInterpret, "tpu": GluConfigTPU, "gpu-triton": GluConfigTriton}
GluConfig = GluConfigInterpret | GluConfigTPU | GluConfigTriton


def typed_config(config: Mapping[str, Any], shape: tuple[int, ...], target: str,
                 name: str = "glu") -> GluConfig:
    """The typed config of `config`, checked against `shape` on `target`; raises with a reason."""
    if len(shape) != 3:
        raise NotImplementedError(f"{name} takes (batch, seq, hidden) inputs, got shape {shape}")
    if target not in CONFIG_TYPES:
        raise NotImplementedError(f"{name} does not support target {target!r}; expected one of "
                                  f"{list(CONFIG_TYPES)}")
    typed = from_dict(CONFIG_TYPES[target], config, f"{name} on {target}")
    typed.check(tuple(shape))
    return typed


def check_config(config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
                 target: str) -> str | None:
    """None if `config` can run on `shape` and `target`, else a short reason."""
    del dtype
    try:
        typed_config(config, shape, target)
    except (ValueError, NotImplementedError) as err:
        return str(err)
    return None


def shape_of(a: jax.Array, b: jax.Array) -> tuple[int, ...]:
    """The kernel's shape for inputs (a, b): their common (batch, seq, hidden) shape."""
    if a.shape != b.shape or a.ndim != 3:
        raise ValueError(f"a gated unit takes a and b of one (batch, seq, hidden) shape, got "
                         f"{a.shape} and {b.shape}")
    return tuple(a.shape)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random a and b of the given shape, normal with scale 2 (a) and 1 (b)."""
    k_a, k_b = jax.random.split(key)
    return ((2.0 * jax.random.normal(k_a, shape, jnp.float32)).astype(dtype),
            jax.random.normal(k_b, shape, jnp.float32).astype(dtype))


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: a and b read once, out written once."""
    return 3 * math.prod(shape) * jnp.dtype(dtype).itemsize


def footprint(config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program's tiles: three operand tiles.

    TPU: buffers x 3 tiles of block_rows x block_cols (a, b, out); Mosaic computes act(a) * b
    a vreg at a time, with no float32 tile in VMEM (libtpu's own count, deviceless: "Used 294.52M"
    and "Used 147.38M" of VMEM at the two tiles that ran out, the operand tiles' bytes alone; on v4
    tiles whose operands fit 16 MiB compiled where two f32 tiles more would not have: bench/
    results/cpu/oom_probe_tpu/). interpret: the same with one buffer. gpu-triton: shared memory
    only (register tiles spill, they do not fail): num_stages - 1 pipelined (a, b) steps when a
    program loops.
    """
    c = typed_config(config, shape, target)
    item = jnp.dtype(dtype).itemsize
    if isinstance(c, GluConfigTriton):
        stages = c.num_stages - 1 if c.blocks_per_program > 1 else 0
        return stages * 2 * c.block_size * item
    elements = math.prod(c.tile(shape))
    buffers = c.buffers if isinstance(c, GluConfigTPU) else 1
    return buffers * 3 * elements * item


# The most VMEM a default tile of all of seq may take (float32, two buffers), as the TPU spaces'
# budget: past it the default takes the widest row blocks within it and pads seq to whole blocks.
WHOLE_SEQ_VMEM = 32 * 2**20


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config: tiles up to 256 x 1024 dividing (seq, hidden), else all of seq or hidden (as
    the power of two at or past it, which the tile takes whole: `tile`), within WHOLE_SEQ_VMEM
    (a row of all of an odd hidden takes fewer rows); where a tile of all of seq would take more,
    the widest row blocks that fit (TPU: seq padded to whole blocks); 1024-element blocks on GPU."""
    _, seq, hidden = shape
    if target == "gpu-triton":
        config: GluConfig = GluConfigTriton(block_size=1024, num_stages=1)
    else:
        cols = next((c for c in (1024, 512, 256, 128) if hidden % c == 0), pl.next_power_of_2(hidden))
        row_bytes = (2 * 3 * 4 + 8) * min(cols, hidden)   # float32 a, b, out buffered; two f32 temporaries
        fits = [r for r in (256, 128, 64, 32, 16) if r * row_bytes <= WHOLE_SEQ_VMEM] + [8]
        rows = next((r for r in fits if seq % r == 0), None)
        if rows is None:   # all of seq where it fits, else the widest blocks that fit, seq padded
            rows = max(8, pl.next_power_of_2(seq)) if seq * row_bytes <= WHOLE_SEQ_VMEM else fits[0]
        config = CONFIG_TYPES[target](block_rows=rows, block_cols=cols)
    return dataclasses.asdict(config)


def _blocked_body(a_ref, b_ref, o_ref, *, act: Activation) -> None:
    a, b = a_ref[...].astype(jnp.float32), b_ref[...].astype(jnp.float32)
    o_ref[...] = (act(a) * b).astype(o_ref.dtype)


def _steps(body: Callable[[Any], None], count: int) -> None:
    if count == 1:
        body(0)
    else:
        jax.lax.fori_loop(0, count, lambda k, carry: body(k), None)


def _flat_body(a_ref, b_ref, o_ref, *, act: Activation, block_size: int,
               blocks_per_program: int) -> None:
    from jax.experimental.pallas import triton as pltriton

    first = pl.program_id(0) * blocks_per_program  # outside the loop: interpret mode needs it so

    def step(k: Any) -> None:
        start = (first + k) * block_size
        mask = start + jnp.arange(block_size) < a_ref.shape[0]
        window = pl.ds(start, block_size)
        a = pltriton.load(a_ref.at[window], mask=mask, other=0).astype(jnp.float32)
        b = pltriton.load(b_ref.at[window], mask=mask, other=0).astype(jnp.float32)
        pltriton.store(o_ref.at[window], (act(a) * b).astype(o_ref.dtype), mask=mask)

    _steps(step, blocks_per_program)


def _rows_body(a_ref, b_ref, o_ref, *, act: Activation, block_rows: int, block_cols: int,
               blocks_per_program: int) -> None:
    from jax.experimental.pallas import triton as pltriton

    rows, cols = a_ref.shape
    first, col0 = pl.program_id(0) * blocks_per_program, pl.program_id(1) * block_cols
    col_ok = (col0 + jnp.arange(block_cols) < cols)[None, :]

    def step(k: Any) -> None:
        row0 = (first + k) * block_rows
        mask = (row0 + jnp.arange(block_rows) < rows)[:, None] & col_ok
        window = (pl.ds(row0, block_rows), pl.ds(col0, block_cols))
        a = pltriton.load(a_ref.at[window], mask=mask, other=0).astype(jnp.float32)
        b = pltriton.load(b_ref.at[window], mask=mask, other=0).astype(jnp.float32)
        pltriton.store(o_ref.at[window], (act(a) * b).astype(o_ref.dtype), mask=mask)

    _steps(step, blocks_per_program)


def build(act: Activation, name: str, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The Pallas gated unit act(a) * b for `config` on `platform`: a function of (a, b)."""
    c = typed_config(config, shape, platform.target, name)
    batch, seq, hidden = shape
    dtype = jnp.dtype(dtype)

    if isinstance(c, GluConfigTriton):
        size, per = c.block_size, c.blocks_per_program
        if c.tiling == "flat":
            flat_shape = (math.prod(shape),)
            body = functools.partial(_flat_body, act=act, block_size=size, blocks_per_program=per)
            grid = (pl.cdiv(flat_shape[0], size * per),)
        else:
            bc = c.block_cols
            flat_shape = (batch * seq, hidden)
            body = functools.partial(_rows_body, act=act, block_rows=size // bc, block_cols=bc,
                                     blocks_per_program=per)
            grid = (pl.cdiv(batch * seq, size // bc * per), pl.cdiv(hidden, bc))
        call = pallas_call(body, platform=platform, grid=grid, name=name,
                           config={"num_warps": c.num_warps, "num_stages": c.num_stages},
                           out_shape=jax.ShapeDtypeStruct(flat_shape, dtype))

        def gated(a: jax.Array, b: jax.Array) -> jax.Array:
            return call(a.reshape(flat_shape), b.reshape(flat_shape)).reshape(shape)

        return gated

    br, bc = c.tile(shape)
    tpu = isinstance(c, GluConfigTPU)
    rows = c.padded_seq(shape) if tpu else seq
    spec = pl.BlockSpec((None, br, bc), lambda i, j, k: (i, j, k),
                        pipeline_mode=pl.Buffered(c.buffers) if tpu else None)
    tpu_params = None
    if tpu:
        tpu_params = {"dimension_semantics": ("parallel", "parallel", "parallel"),
                      "vmem_limit_bytes": vmem_limit(footprint(config, shape, dtype, "tpu"))}
    call = pallas_call(
        functools.partial(_blocked_body, act=act), platform=platform, config={},
        out_shape=jax.ShapeDtypeStruct((batch, rows, hidden), dtype),
        grid=(batch, pl.cdiv(rows, br), pl.cdiv(hidden, bc)), in_specs=[spec, spec], out_specs=spec,
        tpu_params=tpu_params, name=name,
    )
    if rows == seq:
        return call

    def padded(a: jax.Array, b: jax.Array) -> jax.Array:
        pad = ((0, 0), (0, rows - seq), (0, 0))
        return call(jnp.pad(a, pad), jnp.pad(b, pad))[:, :seq]

    return padded


def gated_unit(name: str, act: Activation, reference_act: Activation, flops_per_element: int,
               formula: str) -> Members:
    """The protocol members of the gated unit `name` (all but NAME): out = act(a) * b; only
    `reference`, `flops` and `build` depend on the activation.

    Args:
      name: the registered name (the kernel's name in `build`'s errors and traces).
      act: the activation as the kernel computes it, float32 -> float32, using only operations
        every backend lowers.
      reference_act: the same activation from `jax.nn`, the reference's.
      flops_per_element: floating-point operations of act(a) * b per element.
      formula: the math in words, for the docstrings (e.g. "silu(a) * b").
    """

    def reference_(a: jax.Array, b: jax.Array) -> jax.Array:
        return (reference_act(a.astype(jnp.float32)) * b.astype(jnp.float32)).astype(a.dtype)

    def flops_(shape: tuple[int, ...]) -> int:
        return flops_per_element * math.prod(shape)

    def build_(config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
               platform: Platform) -> Callable[[jax.Array, jax.Array], jax.Array]:
        return build(act, name, config, shape, dtype, platform)

    reference_.__doc__ = f"{formula} in plain jax.numpy, computed in float32."
    flops_.__doc__ = f"Approximate floating-point operations: {flops_per_element} per element."
    build_.__doc__ = f"The Pallas {formula} for `config` on `platform`: a function of (a, b)."
    return Members(SHAPE_NAMES, TARGETS, reference_, make_inputs, shape_of, flops_, bytes_moved, footprint,
                   default_config, check_config, build_)
