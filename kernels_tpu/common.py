"""What every op's kernels share: the TPU tile constants, the kernels' limits on top of the op contract
(:mod:`op_contract`), the lane padding of the head dims, the validated block sizes, the index maps, the causal
masks, the safe masked exp and the sequential state pass.

Dimension numbers and the precision policy live in :mod:`kernels_tpu.mxu`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_tpu.varlen import ChunkWalk
from op_contract import Dims, positive_int

LANES = 128  # vreg lane width and MXU tile: the kernels see K and V as multiples of it (HeadPadding)
SUBLANES = 8  # f32 rows per vreg: row offsets into VMEM blocks are multiples of it
SUPPORTED_DTYPES = tuple(jnp.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))


# ------------------------------------------------------------------ argument checks
# Every op's public functions first check the op contract (:mod:`op_contract`, shared with the
# float64 references: invalid input is a ValueError, the same message in both), then the kernels'
# own limits with :func:`check_limits` and :class:`BlockSizes`: valid input the kernels do not
# implement is a NotImplementedError that says the fix. All from static shapes and dtypes, before
# tracing; only a concrete gate's sign needs its values (a traced gate is not checked).
def final_state(ht, initial_state):
    """The final state as the caller's state cache holds it: in the initial state's dtype, so a serving engine's
    bf16 (fp16) cache goes in and comes out in bf16 (fp16), and float32 without an initial state (None stays None).

    Inside a call every kernel carries the state in float32 (its VMEM scratch and the chunk states it passes
    between grid steps): the initial state is widened once on the way in (exact) and the final one rounded once, to
    nearest even, on the way out. A float32 initial state comes back as the kernel left it."""
    if ht is None or initial_state is None:
        return ht
    return ht.astype(initial_state.dtype)


def check_limits(q, dims: Dims) -> None:
    """NotImplementedError unless q's dtype is one of ``SUPPORTED_DTYPES``. Any K and V run: the
    public functions pad them to lane multiples (:class:`HeadPadding`)."""
    del dims  # every head dim runs, through HeadPadding
    if jnp.dtype(q.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"supported dtypes are bfloat16, float16, float32; got {q.dtype=}; cast the inputs")


def check_one_gate(g, g_gamma) -> None:
    """NotImplementedError when both gates are given: the op contract lets simple_gla and gla take g and g_gamma
    at once (their log decays add), and these kernels take one. Only which is present is looked at."""
    if g is not None and g_gamma is not None:
        raise NotImplementedError("the kernels take one gate, g or g_gamma, not both at once: pass their sum as "
                                  "one, g=g + g_gamma broadcast over g's shape (exact up to one float32 rounding "
                                  "per element)")


def check_per_head_gamma(g_gamma) -> None:
    """NotImplementedError for a g_gamma other than one per head, [H]: the contract's [] and gla's [H,K] forms."""
    if g_gamma is not None and len(g_gamma.shape) != 1:
        raise NotImplementedError(f"the kernels take g_gamma per head, [H]; got shape {tuple(g_gamma.shape)}: "
                                  f"broadcast a scalar to [H] (exact); an [H,K] g_gamma is a per-channel g constant "
                                  f"over the tokens: pass g = g_gamma broadcast to [B,T,H,K] (exact)")


# ------------------------------------------------------------------ grouped value heads
def value_heads(x, v):
    """q or k [B,T,H,K] repeated to v's HV heads (fla's grouped value attention: value head j reads q/k head
    j // (HV // H)). Exact. Its gradient sums each group's HV // H per-value-head gradients in float32 and
    rounds once to x's dtype (fla sums per-head gradients already rounded to it: ``dq.view(B,T,H,G,K).sum(3)``)."""
    H, HV = x.shape[2], v.shape[2]
    return x if HV == H else _repeat_heads(x, HV // H)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _repeat_heads(x, group: int):
    return jnp.repeat(x, group, axis=2)


def _repeat_heads_fwd(x, group):
    return _repeat_heads(x, group), None


def _repeat_heads_bwd(group, _, dx):
    B, T, HV, K = dx.shape
    summed = dx.astype(jnp.float32).reshape(B, T, HV // group, group, K).sum(axis=3)
    return (summed.astype(dx.dtype),)


_repeat_heads.defvjp(_repeat_heads_fwd, _repeat_heads_bwd)


# ------------------------------------------------------------------ head dims
def lane_multiple(n: int) -> int:
    """``n`` rounded up to a multiple of ``LANES``."""
    return -(-n // LANES) * LANES


@dataclasses.dataclass(frozen=True)
class HeadPadding:
    """K and V zero-padded to lane multiples, so every kernel block is whole (8, 128) tiles.

    Exact, whatever the dtype and dot precision, because every padded entry is an exact zero:

    - q and k channels K..Kp are 0: they add exact zeros to every dot over K (q k^T, q S), and the
      state rows they write, ``k_c v^T``, are 0;
    - per-channel log gates (gla's g, kda's g after its in-kernel preprocessing) are 0 there: decay
      1, so a zero state row stays zero (it is never amplified or made NaN);
    - v channels V..Vp are 0, so state columns V..Vp, o's and dv's padded columns are 0;
    - initial_state and dht are zero-padded, so the padded state rows and columns are 0 at every
      step, forward and backward, and contribute 0 to every gate gradient.

    The public functions resolve ``scale`` (``K**-0.5`` from the true K, in the op contract) before
    padding, pad on the way in and slice every output (o, ht, dq, dk, dv, dg, dh0) back to the true
    K and V. kda's l2norm of q and k is taken before padding (zeros would not change its sum of
    squares, nor where its epsilon goes: ``rsqrt(sum(x*x) + eps)``; it stays the op's own reduction
    over the true K).

    Mosaic would also accept a block spanning a whole array dimension narrower than 128, which would
    serve the head-major layouts of simple_gla and kda [B, H, T, 64], but not gla's token-major
    blocks of [B, T, H*K]; padding keeps one layout for every op, at up to 2x the lanes at K = 64.
    """

    K: int
    V: int

    @classmethod
    def of(cls, q, v) -> "HeadPadding":
        """The padding of q [..., K] and v [..., V] (any leading dims)."""
        return cls(int(q.shape[-1]), int(v.shape[-1]))

    @property
    def Kp(self) -> int:
        return lane_multiple(self.K)

    @property
    def Vp(self) -> int:
        return lane_multiple(self.V)

    @staticmethod
    def _pad(x, *widths):
        """x zero-padded at the end of its last ``len(widths)`` dims; None stays None."""
        if x is None or not any(widths):
            return x
        return jnp.pad(x, [(0, 0)] * (x.ndim - len(widths)) + [(0, w) for w in widths])

    def keys(self, x):
        """q, k or a per-channel log gate [..., K] -> [..., Kp] (zeros: no score, decay 1)."""
        return self._pad(x, self.Kp - self.K)

    def values(self, x):
        """v or do [..., V] -> [..., Vp]."""
        return self._pad(x, self.Vp - self.V)

    def state(self, x):
        """initial_state or dht [..., K, V] -> [..., Kp, Vp]."""
        return self._pad(x, self.Kp - self.K, self.Vp - self.V)

    def unpad_keys(self, x):
        """dq, dk, dg [..., Kp] -> [..., K]."""
        return x if x is None or self.Kp == self.K else x[..., :self.K]

    def unpad_values(self, x):
        """o, dv [..., Vp] -> [..., V]."""
        return x if x is None or self.Vp == self.V else x[..., :self.V]

    def unpad_state(self, x):
        """ht, dh0 [..., Kp, Vp] -> [..., K, V]."""
        return x if x is None or (self.Kp, self.Vp) == (self.K, self.V) else x[..., :self.K, :self.V]


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


# ------------------------------------------------------------------ per-token scalars
# A per-token scalar (kda's beta and dbeta, simple_gla's gate) stored as a column [.., T, 1] fills a (8, 128) tile
# row per token in HBM: 128x its size (65.5 MiB for 0.5 MiB of f32 at T 8192, H 16). The kernels take them as
# chunk rows [R, H, NT, 1, C] instead, (1, C) blocks whose dims are the array's own, and turn a row into the
# column their maths uses, and back, in VMEM.
def chunk_rows(x, C: int):
    """Head-major per-token scalars [R, H, NT * C] -> chunk rows [R, H, NT, 1, C] (a reshape)."""
    R, H, T = x.shape
    return x.reshape(R, H, T // C, 1, C)


def _on_diagonal(x, C: int):
    """[C, C] int32: the bits of x (a row or a column of f32, broadcast) on the diagonal, 0 elsewhere."""
    return jnp.where(iota((C, C), 0) == iota((C, C), 1), lax.bitcast_convert_type(x, jnp.int32), 0)


def row_to_column(row):
    """[1, C] f32 -> [C, 1], bit for bit: each entry's bits are summed, as integers, with zeros. No float
    op touches the values, so -0.0, NaN payloads and subnormals come through as they are."""
    return lax.bitcast_convert_type(jnp.sum(_on_diagonal(row, row.shape[1]), axis=1, keepdims=True), jnp.float32)


def column_to_row(col):
    """[C, 1] f32 -> [1, C], bit for bit (as :func:`row_to_column`)."""
    return lax.bitcast_convert_type(jnp.sum(_on_diagonal(col, col.shape[0]), axis=0, keepdims=True), jnp.float32)


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


def start_state(state_ref, init_ref, begins) -> None:
    """Where ``begins`` (a traced bool: the first grid step along time, or the first chunk of a sequence
    that :class:`Walk` visits) the carried f32 state starts from ``init_ref`` (h0 forward, dht backward),
    or from zero when there is none (``init_ref`` None)."""
    @pl.when(begins)
    def _start():
        state_ref[...] = (jnp.zeros(state_ref.shape, jnp.float32) if init_ref is None
                          else init_ref[...].astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class Walk:
    """A grid ``(row, h, ..., step)`` walking the chunks of a :class:`kernels_tpu.varlen.ChunkWalk` along its last
    axis, ``steps`` chunks per grid step, forward (step t visits block t) or in reverse (block NT/steps-1-t).
    Its index maps and the kernel's view of the walk's tables, which arrive first in every index map's and
    the kernel's arguments (scalar prefetch: ``slot_ref, edge_ref``). With ``steps`` > 1 a sequence must
    start and end on a step's edges (one batch row per sequence: unpacked)."""

    NT: int  # chunks per row
    reverse: bool = False
    steps: int = 1
    time_axis: int = 2  # the grid's last axis (gla's grids are (row, h, v tile, step): 3)

    def block(self, t):
        """The block (of ``steps`` chunks) grid step t visits."""
        return self.NT // self.steps - 1 - t if self.reverse else t

    def chunk_map(self, b, h, t, *tables):
        """[rows, H, T, X] tiles (steps * C, X): the chunks this step visits."""
        return b, h, self.block(t), 0

    def chunk_states_map(self, b, h, t, *tables):
        """[rows, H, NT, K, V] per-chunk states, tiles (steps, K, V)."""
        return b, h, self.block(t), 0, 0

    def slot_map(self, b, h, t, slot_ref, edge_ref):
        """[N, H, K, V] one state per sequence (h0, ht, dht, dh0): the visited chunk's sequence. Consecutive
        chunks of a sequence keep the block resident, so an output written at the sequence's edge is
        written back once the walk moves on."""
        return self.slot(b, t, slot_ref), h, 0, 0

    def slot(self, b, t, slot_ref):
        """The sequence (state slot) of the chunks grid step t of row b visits."""
        return slot_ref[b * self.NT + self.block(t) * self.steps]

    def edges(self, edge_ref):
        """In a kernel: ``(begins, ends)`` traced bools. The walk's carried state starts at ``begins`` (a
        sequence's first chunk forward, its last in reverse) and leaves at ``ends``."""
        first_chunk = pl.program_id(0) * self.NT + self.block(pl.program_id(self.time_axis)) * self.steps
        first = (edge_ref[first_chunk] & ChunkWalk.FIRST) != 0
        last = (edge_ref[first_chunk + self.steps - 1] & ChunkWalk.LAST) != 0
        return (last, first) if self.reverse else (first, last)


def walk_pass(kernel, *, tables, grid, in_specs, out_specs, out_shape, state, interpret, name, scratch=(),
              aliases=None):
    """A ``pallas_call`` that walks the chunks of a :class:`Walk` along the LAST grid axis, carrying an
    f32 state in VMEM.

    The recurrence makes that axis sequential: it is "arbitrary" and last, every other axis
    "parallel". ``tables`` (a ChunkWalk's ``(slot, edge)``) are scalar-prefetched, so index maps and
    the kernel take them first. ``state`` is the scratch's shape (e.g. ``(K, V)``), first in the
    kernel's scratch refs, followed by ``scratch``.

    ``aliases`` maps an input's position (among ``in_specs``, the tables not counted) to the output that
    overwrites it in place, as a backward writes each chunk's gradient over that chunk's input: sound when
    both have the same block index map, so every block is read before the step that writes it.
    """
    semantics = ("parallel",) * (len(grid) - 1) + ("arbitrary",)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables), grid=grid, in_specs=in_specs, out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM(state, jnp.float32), *scratch])
    return functools.partial(pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape,
        input_output_aliases={len(tables) + i: o for i, o in (aliases or {}).items()},
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=interpret, name=name), *tables)


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
            positive_int(name, getattr(self, name))
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
