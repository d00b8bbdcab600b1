"""Flash attention's typed configs: one frozen dataclass per target (knobs in `kernels.attention_core`).

Each class holds its knobs' defaults, their legality (`validate` for the knobs alone,
`check(shape, dtype)` for the rest), its on-chip footprint and its default for a shape.
Shapes are (batch, heads, seq, head_dim). Causality changes neither legality nor footprint.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from kernels.knobs import ConfigError, Knobs, Unsupported, parse
from kernels.lowering import round_up, triton_dot_buffers
from kernels.mgpu_launch import defaults_shared_memory

LANES = 128  # TPU vector lanes: the m/l scratch is (block_q, LANES)
MGPU_ROW_UNIT = 8  # Mosaic GPU's swizzled TMA layouts address rows in groups of 8
MGPU_SWIZZLES = (128, 64, 32)  # the swizzles (bytes) of WGMMA's shared-memory operands


@dataclasses.dataclass(frozen=True)
class AttentionConfig(Knobs):
    """Knobs of every target (and all of the plain interpret kernel's): the Q and K/V blocks."""

    block_q: int
    block_kv: int

    def validate(self) -> None:
        """Blocks are positive."""
        if min(self.block_q, self.block_kv) < 1:
            raise ConfigError(f"blocks must be positive, got {self.to_dict()}")

    def padded_seq(self, seq: int, dim: int | None = None) -> int:
        """The sequence length `attention_core.build` pads Q, K and V to by copies: seq itself
        here. The Triton and plain interpret kernel masks its loads and stores at the end
        (`attention_core._generic_attention`); the keys past seq are masked in every kernel.
        dim: the head dim (the targets whose padding depends on it say so)."""
        return seq

    def padded_dim(self, dim: int) -> int:
        """The head dim this target's kernel computes with: dim itself here. Where it is wider, the
        extra columns are zeros (loaded masked on Triton, padded by copies on the other targets),
        which add nothing to Q K^T, and O's are dropped; the softmax scale stays 1 / sqrt(dim)."""
        return dim

    def check(self, shape: tuple[int, ...], dtype: Any) -> None:
        """Blocks need not divide the sequence (see `padded_seq`): nothing to refuse here."""

    def footprint(self, shape: tuple[int, ...], dtype: Any) -> int:
        """The Q, K and V tiles of a program, its f32 scores and accumulator."""
        dim, item = self.padded_dim(shape[3]), jnp.dtype(dtype).itemsize
        bq, bkv = self.block_q, self.block_kv
        return (bq + 2 * bkv) * dim * item + bq * (bkv + dim) * 4

    @classmethod
    def default(cls, shape: tuple[int, ...], causal: bool = False, dtype: Any = jnp.bfloat16) -> AttentionConfig:
        """Blocks of 64 (a sequence they do not divide is padded). dtype: the inputs' (the targets
        whose blocks it sizes say so)."""
        return cls(64, 64)


@dataclasses.dataclass(frozen=True)
class TpuAttentionConfig(AttentionConfig):
    """Mosaic TPU: K/V streamed by an inner emit_pipeline (buffers deep) or unrolled from VMEM."""

    attn_strategy: Literal["emit_pipeline", "unroll"] = "emit_pipeline"
    buffers: int = 2

    def validate(self) -> None:
        """emit_pipeline streams K/V 2 or 3 buffers deep."""
        super().validate()
        if self.attn_strategy == "emit_pipeline" and self.buffers not in (2, 3):
            raise Unsupported(f"emit_pipeline takes buffers 2 or 3, got {self.buffers}")

    def check(self, shape: tuple[int, ...], dtype: Any) -> None:
        """The common checks, and lane-aligned K/V blocks (the head dim is padded: `padded_dim`)."""
        super().check(shape, dtype)
        if self.block_kv % LANES:
            raise Unsupported(f"tpu: block_kv must be a multiple of {LANES}, got {self.block_kv}")

    def padded_dim(self, dim: int) -> int:
        """Whole lanes: head dims such as 64, 80 or 96 run as 128 columns (zeros past the head's
        last, padded by copies: `attention_core.build`), as Mosaic TPU's K/V tiles and Q K^T
        contract over whole lanes."""
        return round_up(dim, LANES)

    def padded_seq(self, seq: int, dim: int | None = None) -> int:
        """seq rounded up to whole Q and K/V blocks: `attention_core.build` pads Q, K and V with
        zeros to it and slices O back."""
        return round_up(seq, math.lcm(self.block_q, self.block_kv))

    def footprint(self, shape: tuple[int, ...], dtype: Any) -> int:
        """VMEM, by the model in `kernels.attention_core`."""
        _, _, seq, dim = shape[:3] + (self.padded_dim(shape[3]),)
        bq, bkv, item = self.block_q, self.block_kv, jnp.dtype(dtype).itemsize
        fixed = 2 * 2 * bq * dim * item + 2 * bq * LANES * 4 + bq * dim * 4 + 2 * bq * bkv * 4
        if self.attn_strategy == "unroll":
            return fixed + 2 * 2 * self.padded_seq(seq) * dim * item
        return fixed + self.buffers * 2 * bkv * dim * item

    @classmethod
    def default(cls, shape: tuple[int, ...], causal: bool = False, dtype: Any = jnp.bfloat16) -> TpuAttentionConfig:
        """The streaming strategy with blocks of 128 (lanes; a ragged sequence is padded)."""
        return cls(LANES, LANES)


@dataclasses.dataclass(frozen=True)
class TritonAttentionConfig(AttentionConfig):
    """Triton: the plain kernel's blocks and Triton's compiler params."""

    num_warps: int = 4
    num_stages: int = 2

    def padded_dim(self, dim: int) -> int:
        """Triton's arrays are powers of two (and its dots at least 16 deep): head dims such as 80
        or 96 run as 128, their extra columns loaded as zeros by masks (no copies). On the H200
        head_dim 80 failed to compile before (thirty-second session)."""
        return max(16, 1 << (dim - 1).bit_length())

    def footprint(self, shape: tuple[int, ...], dtype: Any) -> int:
        """Shared memory: the Q tile, and K and V tiles per pipeline buffer."""
        dim, item = self.padded_dim(shape[3]), jnp.dtype(dtype).itemsize
        bq, bkv = self.block_q, self.block_kv
        return bq * dim * item + triton_dot_buffers(self.num_stages, self.num_warps, bq) * 2 * bkv * dim * item

    @classmethod
    def default(cls, shape: tuple[int, ...], causal: bool = False,
                dtype: Any = jnp.bfloat16) -> TritonAttentionConfig:
        """128-row Q blocks, 64-row K/V blocks, 8 warps, 3 stages (2 where 3 overflow shared memory
        at wide heads; else 64-row blocks in 4 warps, 2 stages). On the H200 (BENCHMARKS.md,
        thirty-third session; us against 64 x 64 in 4 warps, 2 stages): (4, 32, 4096, 128) 2840.0 /
        3742.6, causal 1592.6 / 1829.9; (1, 32, 2048, 80) 227.0 / 255.2, causal 153.3 / 159.7.
        At head dim 128 that stages 128 KiB: within sm80's and sm90's shared memory (163 and 227
        KiB a block), not sm86's or sm89's 99 KiB, where the deployment's registry, which
        knows its GPU (`defaults_shared_memory`), gets the smaller candidates. Sized at
        the inputs' dtype: float32 blocks take twice the bytes (64-row blocks, or 32 at wide heads)."""
        candidates = (cls(128, 64, num_warps=8, num_stages=3), cls(128, 64, num_warps=8, num_stages=2),
                      cls(64, 64), cls(32, 32))
        return next((c for c in candidates if c.footprint(shape, dtype) <= defaults_shared_memory()), cls(64, 64))


@dataclasses.dataclass(frozen=True)
class MosaicGpuAttentionConfig(AttentionConfig):
    """Mosaic GPU (Hopper): the FA3-style warp-specialized kernel or a pipelined one, its depth, how
    the warp-specialized kernel overlaps softmax with the matmuls (ws_schedule), whether its
    blocks are one a tile or one a SM, looping over the tiles (ws_grid), and in what order the
    SMs take the tiles (tile_order: a head's Q tiles one after another, or each Q rank of every
    head in turn; a persistent grid's knob, which a block a tile, launched in the grid's order,
    does not read: so that `{**persistent_default, "ws_grid": "blocks"}` builds)."""

    mgpu_pipeline: Literal["warp_specialized", "pipelined"] = "warp_specialized"
    max_concurrent_steps: int = 2
    ws_schedule: Literal["pingpong", "intra_overlap"] = "pingpong"
    swizzle: Literal[128, 64, 32] = 128
    ws_grid: Literal["blocks", "persistent", "persistent_q_ahead"] = "blocks"
    tile_order: Literal["by_head", "by_q"] = "by_head"

    def validate(self) -> None:
        """A K/V pipeline at least two steps deep; ws_schedule and ws_grid only for the
        warp-specialized kernel; a swizzle WGMMA reads (128, 64 or 32 bytes)."""
        super().validate()
        if self.max_concurrent_steps < 2:
            raise Unsupported("gpu-mosaic: max_concurrent_steps must be at least 2")
        if self.swizzle not in MGPU_SWIZZLES:
            raise ConfigError(f"gpu-mosaic: swizzle must be one of {MGPU_SWIZZLES}, got {self.swizzle}")
        if self.ws_schedule != "pingpong" and not self.warp_specialized:
            raise Unsupported("gpu-mosaic: ws_schedule applies to the warp_specialized kernel only")
        if self.persistent and not self.warp_specialized:
            raise Unsupported("gpu-mosaic: ws_grid applies to the warp_specialized kernel only")

    @property
    def warp_specialized(self) -> bool:
        """Whether two compute warpgroups share a block (2 * block_q rows)."""
        return self.mgpu_pipeline == "warp_specialized"

    @property
    def persistent(self) -> bool:
        """Whether the warp-specialized kernel runs a block a SM, each looping over tiles of 2 *
        block_q rows, its K/V ring running on from one tile into the next; "persistent_q_ahead"
        stages O apart from Q, so that the next tile's Q loads while this one ends."""
        return self.ws_grid != "blocks"

    def steps(self, seq: int) -> int:
        """K/V pipeline slots: max_concurrent_steps, at most the number of K/V blocks."""
        return min(self.max_concurrent_steps, -(-seq // self.block_kv))

    def rows_per_block(self) -> int:
        """Query rows one block computes: block_q per compute warpgroup."""
        return (2 if self.warp_specialized else 1) * self.block_q

    def padded_seq(self, seq: int, dim: int | None = None) -> int:
        """The sequence length the kernel runs. TMA zero-fills reads past the sequence's end and
        drops writes past it, so part blocks at the end run as they are, with no copies, when
        the sequence is at least one block and either a whole number of 8-row groups (what the
        swizzled tiles' view of global memory addresses) or copied by single rows
        (`copies_single_rows(dim)`: ViT's 197 tokens at head dim 64); other lengths are padded."""
        block = max(self.rows_per_block(), self.block_kv)
        if seq >= block and dim is not None and self.copies_single_rows(dim):
            return seq
        return max(round_up(seq, MGPU_ROW_UNIT), block)

    def copies_single_rows(self, dim: int) -> bool:
        """Whether the kernel can copy Q, K, V and O through a view tiled by single rows, which
        takes any sequence length: the warp-specialized kernel, at a head dim of one whole swizzle
        (16, 32 or 64 2-byte columns), where its 8-row tiles, which WGMMA reads, hold the same bytes
        as that view: one copy a tile. Two swizzles wide (128 columns), one copy per 8-row slab
        and swizzle (32 a 128-row K block) was built and measured on the H200: (1, 32, 4001, 128)
        ran 759.1 us against 434.4 at 4000 rows, more than padding costs (thirty-sixth session),
        and was removed: such heads are padded."""
        return self.warp_specialized and dim == self.padded_dim(dim) and 2 * dim <= self.swizzle

    def padded_dim(self, dim: int) -> int:
        """The head dim in whole swizzled tiles of 2-byte elements: a 128-byte swizzle holds 64
        columns (80 and 96 run as 128), a 64-byte one 32 (80 and 96 run as 96), a 32-byte one 16
        (80 runs as 80)."""
        return round_up(dim, self.swizzle // 2)

    def check(self, shape: tuple[int, ...], dtype: Any) -> None:
        """The common checks, and what WGMMA and these kernels support (the head dim is padded)."""
        super().check(shape, dtype)
        if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise Unsupported(f"gpu-mosaic attention takes bfloat16 or float16, not {jnp.dtype(dtype)}")
        if self.block_q % 64 or self.block_kv % 64:
            raise Unsupported("gpu-mosaic: block_q and block_kv must be multiples of 64")

    def footprint(self, shape: tuple[int, ...], dtype: Any) -> int:
        """Shared memory: Q/O tiles per compute warpgroup (Q and O apart: persistent_q_ahead), the K
        and V slots, and 2.5 KiB for the reduction scratch Mosaic GPU reserves (2 KiB) and barriers:
        at most 1 KiB above its own count."""
        _, _, seq, dim = shape[:3] + (self.padded_dim(shape[3]),)
        item, wgs = jnp.dtype(dtype).itemsize, 2 if self.warp_specialized else 1
        qo = 2 if self.ws_grid == "persistent_q_ahead" else 1
        return qo * wgs * self.block_q * dim * item + 2 * self.steps(seq) * self.block_kv * dim * item + 2560

    @classmethod
    def default(cls, shape: tuple[int, ...], causal: bool = False,
                dtype: Any = jnp.bfloat16) -> MosaicGpuAttentionConfig:
        """The warp-specialized kernel with 64-row Q blocks and 128-row K/V blocks (64 where two
        slots of 128 overflow shared memory at wide heads), the softmax of one warpgroup beside the
        other's matmuls (pingpong) when causal, inside each warpgroup's own (intra_overlap)
        otherwise, and the head dim in the swizzle that pads it least (`least_padding_swizzle`).
        Not causal at head dims of at most 64 columns in 64- or 128-byte swizzles (32, 64): the
        pipelined kernel (one warpgroup a block, so more blocks a SM), 64-row Q and 128-row K/V
        blocks; not at 40 (48 columns in the 32-byte swizzle), where it lost, nor where the
        sequence is off the 8-row grid and the warp-specialized kernel runs it unpadded
        (`copies_single_rows`): the pipelined kernel's K/V pipeline copies through 8-row tiles.
        On the H200 (BENCHMARKS.md; us): (4, 32, 4096, 128) 1578.7 against 2043.3 for 64-row K/V
        blocks and pingpong (cuDNN 1638.4, torch SDPA 1602.5), causal 913.7 / 1065.7 (torch SDPA
        919.6; thirty-third session); head dim 64 (thirty-fourth session), (4, 32, 4096, 64) pipelined
        1080.7 against warp-specialized 1333.5 (cuDNN 1143.8, torch SDPA 1126.2), causal
        warp-specialized 644.6 against pipelined 1262.3 (torch SDPA 624.6); (16, 16, 1024, 32) pipelined
        119.9 against 158.9 (torch SDPA 157.9); (2, 8, 4096, 40) pipelined 214.3 against 179.3.
        Short sequences (PERSISTENT_SEQ, PERSISTENT_CAUSAL_SEQ): a block a SM looping over the
        tiles, the next tile's Q loaded ahead (ws_grid persistent_q_ahead), where a tile's few K/V
        blocks leave a block's start and end exposed; on the H200 (fortieth session) (32, 12, 197,
        64) 20.6 against 29.0 (torch SDPA 24.3), causal 20.4 against 29.2 (22.9); causal (2, 32,
        1024, 128) 42.5 against 51.8 (48.5); but (16, 32, 512, 128) 160.4 against 147.1 and (4, 32,
        4096, 128) 1964.6 against 1576.0. Those were measured in the by_q tile order, which the
        default keeps: at these sequences every head's K/V fit L2 whatever the order, and by_q
        spreads causal tiles' weights the more evenly over a static stride of SMs (by_head gives
        (2, 32, 1024, 128)'s SMs 7 to 24 K/V blocks, by_q 12 to 20)."""
        swizzle = least_padding_swizzle(shape[3])
        schedule = "pingpong" if causal else "intra_overlap"
        wide = cls(64, 128, ws_schedule=schedule, swizzle=swizzle)
        pipelined = cls(64, 128, mgpu_pipeline="pipelined", swizzle=swizzle)
        off_grid = wide.padded_seq(shape[2], shape[3]) != pipelined.padded_seq(shape[2], shape[3])
        if not causal and swizzle >= 64 and pipelined.padded_dim(shape[3]) <= 64 and not off_grid:
            return pipelined
        if shape[2] <= (PERSISTENT_CAUSAL_SEQ if causal else PERSISTENT_SEQ):
            ahead = dataclasses.replace(wide, ws_grid="persistent_q_ahead", tile_order="by_q")
            if ahead.footprint(shape, dtype) <= defaults_shared_memory():
                return ahead
        fits = wide.footprint(shape, dtype) <= defaults_shared_memory()
        return wide if fits else cls(64, 64, ws_schedule=schedule, swizzle=swizzle)


# Sequences up to which the Mosaic GPU default runs a block a SM (ws_grid persistent_q_ahead):
# tiles of two 64-row Q blocks over at most 2 (plain) or 8 (causal, 4 on average) K/V blocks of 128.
PERSISTENT_SEQ, PERSISTENT_CAUSAL_SEQ = 256, 1024


def least_padding_swizzle(dim: int, itemsize: int = 2) -> int:
    """The widest of `MGPU_SWIZZLES` whose tiles hold the head dim in the fewest columns: 128
    bytes at multiples of 64 (2-byte) columns, 64 at 96, 32 at 80 (run as 80, not as 128). On the
    H200 (BENCHMARKS.md, thirty-fourth session; us, the 128-byte swizzle's padding copies
    included): (4, 32, 4096, 80) 1330.7 against 1768.0 (cuDNN 1549.6), causal 720.8 against 1184.6;
    (1, 32, 2048, 96) 101.7 (64 bytes) against 148.9 (128)."""
    return min(MGPU_SWIZZLES, key=lambda swizzle: (round_up(dim, swizzle // itemsize), -swizzle))


CONFIGS: dict[str, type[AttentionConfig]] = {
    "tpu": TpuAttentionConfig, "gpu-triton": TritonAttentionConfig, "gpu-mosaic": MosaicGpuAttentionConfig,
    "interpret": AttentionConfig,
}


def as_config(config: Mapping[str, Any] | AttentionConfig, target: str) -> AttentionConfig:
    """`config` as the target's typed config (a dict is parsed, refusing unknown knobs)."""
    if target not in CONFIGS:
        raise ConfigError(f"unknown target {target!r}; expected one of {sorted(CONFIGS)}")
    if isinstance(config, AttentionConfig):
        if not isinstance(config, CONFIGS[target]):
            raise ConfigError(f"a {type(config).__name__} is no {target} config")
        return config
    return parse(config, CONFIGS[target])[0]
