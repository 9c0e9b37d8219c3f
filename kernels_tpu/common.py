"""What every op's kernels share: the TPU tile constants, the causal masks, the safe masked exp and
the sequential state pass.

Dimension numbers and the precision policy live in :mod:`kernels_tpu.mxu`.
"""

from __future__ import annotations

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
