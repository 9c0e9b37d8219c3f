"""What every op's kernels share: the TPU tile constants, the argument checks, the validated block sizes,
the causal masks, the safe masked exp and the sequential state pass.

Dimension numbers and the precision policy live in :mod:`kernels_tpu.mxu`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128  # vreg lane width and MXU tile: K and V must be multiples of it
SUBLANES = 8  # f32 rows per vreg: row offsets into VMEM blocks are multiples of it
SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))


# ------------------------------------------------------------------ argument checks
# Every op's public functions check their arguments from static shapes and dtypes, before
# tracing, with these helpers: invalid input is a ValueError, valid input the kernels do not
# implement is a NotImplementedError that says the fix. The messages are the same in every op.
@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes of one call: batch, time, heads, key and value head dims."""

    B: int
    T: int
    H: int
    K: int
    V: int

    def shape(self, layout: str) -> tuple:
        """``layout`` as letters, e.g. ``"BTHK"`` -> ``(B, T, H, K)``."""
        return tuple(getattr(self, axis) for axis in layout)


def _shape_of(x):
    return tuple(x.shape) if hasattr(x, "shape") and hasattr(x, "dtype") else None


def expect(name: str, x, layout: str, dims: Dims, *, floating: bool = True) -> None:
    """ValueError unless ``x`` (skipped when None) is an array of shape ``layout`` (letters of :class:`Dims`)."""
    if x is None:
        return
    want = dims.shape(layout)
    if _shape_of(x) != want:
        got = _shape_of(x) if _shape_of(x) is not None else type(x).__name__
        raise ValueError(f"{name} must be [{','.join(layout)}] = {want}, got {got}")
    if floating and not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be floating point, got {name}.dtype={x.dtype}")


def check_qkv(q, k, v, *, initial_state=None, do=None, dht=None) -> Dims:
    """q, k [B,T,H,K] and v [B,T,H,V]: one supported float dtype, K and V multiples of ``LANES``;
    and, when given, the state and cotangents every op shares: initial_state and dht [B,H,K,V], do [B,T,H,V]."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if _shape_of(x) is None or len(x.shape) != 4:
            raise ValueError(f"{name} must be a [B,T,H,*] array, got {_shape_of(x) or type(x).__name__}")
    B, T, H, K = q.shape
    dims = Dims(B, T, H, K, v.shape[-1])
    if tuple(k.shape) != dims.shape("BTHK") or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"need q, k [B,T,H,K] and v [B,T,H,V]: got {q.shape=} {k.shape=} {v.shape=}")
    if v.shape[2] != H:
        raise NotImplementedError(f"grouped value heads are not supported: v has {v.shape[2]} heads, q and k {H}; "
                                  "repeat q and k to the value heads (jnp.repeat(q, HV // H, axis=2))")
    if min(B, T, H, dims.K, dims.V) < 1:
        raise ValueError(f"empty input: {q.shape=} {v.shape=}")
    if not (q.dtype == k.dtype == v.dtype) or not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"q, k, v must share one floating dtype: {q.dtype=} {k.dtype=} {v.dtype=}")
    if jnp.dtype(q.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"supported dtypes are bfloat16, float16, float32; got {q.dtype=}; cast the inputs")
    for axis, n, fix in (("K", dims.K, f"q and k (pass scale={dims.K}**-0.5 explicitly)"), ("V", dims.V, "v")):
        if n % LANES:
            raise NotImplementedError(
                f"{axis}={n} must be a multiple of {LANES} (TPU lane width): zero-pad {fix} along {axis} to "
                f"{math.ceil(n / LANES) * LANES} (exact: padded channels contribute 0) and slice o back")
    expect("initial_state", initial_state, "BHKV", dims)
    expect("do", do, "BTHV", dims)
    expect("dht", dht, "BHKV", dims)
    return dims


def resolve_scale(scale, K: int) -> float:
    """``scale`` as a float: K**-0.5 when None, else a finite non-zero Python number (static)."""
    if scale is None:
        return float(K) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be None or a finite non-zero Python number, got {scale=}")
    return float(scale)


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


# ------------------------------------------------------------------ index maps
# Every grid walks time along its LAST axis; an index map takes the grid indices and returns block
# indices. The head-major layout [B, H, T, X] (simple_gla, kda; grid (B, H, NT)) has its maps here;
# gla's token-major layout [B, T, H*X] has its own (kernels_tpu.gla.common.index_maps).
def chunk_map(b, h, t):
    """[B, H, T, X] tiles (C, X): chunk t of head (b, h)."""
    return b, h, t, 0


def chunk_states_map(b, h, t):
    """[B, H, NT, K, V] per-chunk states, tiles (K, V)."""
    return b, h, t, 0, 0


def state_map(b, h, t):
    """[B, H, K, V] one state per head, resident in VMEM across the time axis."""
    del t
    return b, h, 0, 0


def reversed_in_time(index_map, NT: int):
    """``index_map`` walking the chunks from last to first: grid step t visits chunk NT-1-t (backward passes)."""
    def reverse(*grid):
        return index_map(*grid[:-1], NT - 1 - grid[-1])
    return reverse


def start_state(state_ref, init_ref, step) -> None:
    """At the first grid step along time the carried f32 state starts from ``init_ref``
    (h0 forward, dht backward), or from zero when there is none (``init_ref`` None)."""
    @pl.when(step == 0)
    def _start():
        state_ref[...] = (jnp.zeros(state_ref.shape, jnp.float32) if init_ref is None
                          else init_ref[...].astype(jnp.float32))


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
