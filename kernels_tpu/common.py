"""What every op's kernels share: the TPU tile constants, the validated block sizes, the causal masks,
the safe masked exp and the sequential state pass.

Dimension numbers and the precision policy live in :mod:`kernels_tpu.mxu`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128  # vreg lane width and MXU tile: K and V must be multiples of it
SUBLANES = 8  # f32 rows per vreg: row offsets into VMEM blocks are multiples of it


def iota(shape, dim):
    """int32 indices along ``dim`` of ``shape``."""
    return lax.broadcasted_iota(jnp.int32, shape, dim)


def causal_mask(n: int, *, strict: bool = False, trailing: int = 0):
    """``[n, n] + [1] * trailing`` bool: True where column j <= row i (j < i when ``strict``).

    Built by comparing iotas of the final shape: Mosaic cannot reshape a bool
    ``[n, n]`` mask to 3-D ("unsupported shape cast"), so a mask that must
    broadcast over a trailing axis is made at that shape.
    """
    shape = (n, n) + (1,) * trailing
    rows, cols = iota(shape, 0), iota(shape, 1)
    return cols < rows if strict else cols <= rows


def masked_exp(x, mask):
    """exp(x) where mask, else 0. The exponent is zeroed BEFORE exp, so a masked
    entry never overflows (no 0 * inf = NaN, whatever the compiler fuses)."""
    return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def state_pass(kernel, *, grid, in_specs, out_specs, out_shape, state, interpret, name, scratch=()):
    """A ``pallas_call`` that walks time along the LAST grid axis, carrying an f32 state in VMEM.

    The recurrence makes that axis sequential: it is "arbitrary" and last, every other axis
    "parallel". ``state`` is the scratch's shape (e.g. ``(K, V)``), first in the kernel's scratch
    refs, followed by ``scratch``.
    """
    semantics = ("parallel",) * (len(grid) - 1) + ("arbitrary",)
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM(state, jnp.float32), *scratch],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=interpret, name=name)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The tiling of every op's kernels, validated on construction.

    - ``chunk_size`` (C, fla's BT): tokens per chunk, one grid step along time.
      A multiple of ``sub_chunk``; other sizes are valid but not implemented
      (NotImplementedError).
    - ``sub_chunk`` (BC): rows per diagonal block of the per-channel decay
      products (gla, kda), a multiple of 8 sublanes; 16 also keeps every chunk a
      whole number of bf16 (16, 128) tiles, which simple_gla needs.
    - ``block_v`` (BV): the V tile of gla's kernels, a multiple of ``LANES``.
    - ``num_steps``: chunks per grid step of simple_gla's fused_chunk forward.
    """

    chunk_size: int = 64
    sub_chunk: int = 16
    block_v: int = LANES
    num_steps: int = 1

    def __post_init__(self):
        for name in ("chunk_size", "sub_chunk", "block_v", "num_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.sub_chunk % SUBLANES:
            raise ValueError(f"sub_chunk={self.sub_chunk} must be a multiple of {SUBLANES} (TPU sublanes)")
        if self.block_v % LANES:
            raise ValueError(f"block_v={self.block_v} must be a multiple of {LANES} (lane width)")
        if self.chunk_size % self.sub_chunk:
            raise NotImplementedError(
                f"the Pallas TPU kernels need chunk_size to be a multiple of {self.sub_chunk} (sub_chunk; one bf16 "
                f"(16, 128) tile), got chunk_size={self.chunk_size}; use chunk_size=64 or 128")

    def for_chunks(self, NT: int) -> "BlockSizes":
        """``num_steps`` for ``NT`` chunks: the largest divisor of NT that is <= num_steps (1 always divides)."""
        steps = min(self.num_steps, NT)
        while NT % steps:
            steps -= 1
        return dataclasses.replace(self, num_steps=steps)

    def block_v_for(self, V: int) -> int:
        """The V tile for a given V: block_v when it divides V, else LANES."""
        return self.block_v if V % self.block_v == 0 else LANES
