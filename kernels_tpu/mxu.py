"""Matrix-unit dots with an explicit precision, and a model of TPU MXU rounding.

Every dot in ``kernels_tpu`` goes through :func:`dot`, which states its
precision and accumulates in f32. Only what the Mosaic compiler lowers exists
here, and the model is what Mosaic emits: :data:`MXU_PASSES` lists, per
precision, the bf16 passes one dot runs and the operand piece each pass feeds
the MXU, read from Mosaic's own LLO (one ``llo.vmatmul*`` per MXU instruction,
with its ``matmul_mode``, after the weights latched with their
``gain_latch_mode``) for v5e, v6e and v7x under jax 0.9.2, 0.10.2 and 0.12
(``harness/compile/mosaic_dump.py`` re-reads it for every kernel ``parity compile``
compiles):

- ``Precision.DEFAULT``: one MXU pass. bf16 operands give exact products
  with f32 accumulation; f32 operands are rounded to bf16 (nearest even) first.
- ``Precision.HIGHEST``: f32 operands split by truncation into three bf16
  pieces each (the high, middle and low 8 significand bits), the six products
  of combined order <= 2, summed in f32 in Mosaic's order: about f32 accuracy.
- ``Precision.HIGH``: where this jax's Pallas lowers it (jax 0.12:
  ``contract_precision<bf16x3>``; 0.9.2 and 0.10.2 refuse it), three passes of
  the same truncation split: ``hi·hi + hi·mid + mid·hi``.
- :data:`BF16X3`: an explicit three-pass product, written in the kernel: both
  operands are split into ``hi + lo`` bf16 pieces by rounding and
  ``hi·hi + hi·lo + lo·hi`` run as three ``DEFAULT`` bf16 dots. It runs under
  every jax (Mosaic in jax 0.9.2 and 0.10.2 refuses ``Precision.HIGH``).
- :data:`BF16X4`: the same split with the fourth product ``lo·lo`` too. Two bf16 pieces hold
  any value of at most 16 significant bits exactly (fp16 data has 11), and bf16 products are
  exact in f32, so every product of two fp16 values is exact, as on fla's fp16 tensor cores.
- fp16 operands do not exist: Mosaic can neither load nor store fp16 in a
  kernel ("Invalid vector type for load"). Public functions widen fp16
  inputs to f32 before the ``pallas_call`` (exact) with :func:`widen_fp16`
  and round results back outside it.

In Pallas interpret mode on CPU, XLA:CPU ignores ``precision`` and computes
f32 dots exactly, which would make a kernel look more accurate than on a TPU.
With ``mxu_model=True`` each MXU pass is evaluated as the hardware rounds it
(bf16 operand pieces, products exact in f32, f32 accumulation). The model is only
switched on for interpret mode, never on a TPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Precision = lax.Precision
F32 = jnp.float32

BF16X3 = "bf16x3"
"""Three bf16 passes, split explicitly in the kernel (Mosaic has no ``Precision.HIGH``)."""

BF16X4 = "bf16x4"
"""Four bf16 passes: all products of two-piece splits, exact for two fp16 operands (see the module doc)."""

PRECISIONS = (Precision.DEFAULT, BF16X3, BF16X4, Precision.HIGHEST)

NN = (((1,), (0,)), ((), ()))  # a[M,K] @ b[K,N]
TN = (((0,), (0,)), ((), ()))  # a[K,M], b[K,N] -> a.T @ b
NT_T = (((1,), (1,)), ((), ()))  # a[M,K], b[N,K] -> a @ b.T


def round_bf16(x: jax.Array) -> jax.Array:
    """f32 -> bf16, rounded to nearest (ties to even), computed on the bits with integer operations: add
    ``0x7FFF`` plus the lowest kept bit, then drop the low 16 bits (an overflow carries into the exponent, which
    is the right rounding up to the next binade or to infinity). NaN stays NaN (quieted by the cast).

    The same rounding as ``x.astype(bfloat16)`` by definition, but it leaves XLA:CPU no float conversion to
    compile: in interpret mode the model's operand split ``x - bf16(x)``, as a float conversion, did not give
    the same bits for the same values once the pallas_calls' programs were batched (gla's fp32 chunk output
    kernel: 7399 of 16384 elements of ``o``, up to 17 ulp; tests/test_mxu.py, tests/test_pallas_batched.py)."""
    bits = lax.bitcast_convert_type(x.astype(F32), jnp.uint32)
    bits = (bits + (jnp.uint32(0x7FFF) + ((bits >> 16) & jnp.uint32(1)))) & jnp.uint32(0xFFFF0000)
    rounded = lax.bitcast_convert_type(bits, F32)
    return jnp.where(jnp.isnan(x), x, rounded).astype(jnp.bfloat16)  # exact: the low 16 bits are zero


def split_bf16(x: jax.Array, pieces: int, on_bits: bool = False) -> list[jax.Array]:
    """Split f32 ``x`` into ``pieces`` bf16 terms whose f32 sum approximates x (each the residual rounded to
    nearest even). ``on_bits``: each rounding by :func:`round_bf16` (the interpret-mode model), else as a cast
    (the kernel as Mosaic compiles it; the same values)."""
    out, rest = [], x.astype(F32)
    for _ in range(pieces):
        hi = round_bf16(rest) if on_bits else rest.astype(jnp.bfloat16)
        out.append(hi)
        rest = rest - hi.astype(F32)
    return out


def widen_fp16(*xs):
    """fp16 arrays -> f32 (exact); anything else unchanged. Mosaic cannot load or store fp16."""
    return tuple(x.astype(F32) if x is not None and x.dtype == jnp.float16 else x for x in xs)


# ------------------------------------------------------------ the MXU's passes, as Mosaic emits them
BF16, NEAREST, HI8, MID8, LO8 = "bf16", "rne", "t0", "t1", "t2"
"""The operand pieces one MXU pass multiplies: a bf16 operand as it is (exact); an f32 operand rounded to
bf16, nearest even; or one of the three bf16 pieces an f32 operand is split into by truncation: its high,
middle and low 8 significand bits (``x = t0 + t1 + t2`` exactly for normal f32 values)."""

_SPLIT_HIGHEST = ((LO8, HI8), (HI8, LO8), (MID8, MID8), (MID8, HI8), (HI8, MID8), (HI8, HI8))
_SPLIT_HIGH = ((MID8, HI8), (HI8, MID8), (HI8, HI8))

PASSES = {Precision.DEFAULT: 1, BF16X3: 3, BF16X4: 4, Precision.HIGHEST: len(_SPLIT_HIGHEST)}
"""MXU passes per dot of f32 operands at the precisions of :data:`PRECISIONS` (bf16 operands take one)."""


def truncate_bf16(x: jax.Array) -> jax.Array:
    """f32 -> bf16 by dropping the low 16 bits (truncation toward zero), exactly."""
    bits = lax.bitcast_convert_type(x.astype(F32), jnp.uint32) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(bits, F32).astype(jnp.bfloat16)  # exact: the low bits are zero


def piece(x: jax.Array, name: str) -> jax.Array:
    """The bf16 piece ``name`` (one of :data:`BF16`, ... :data:`LO8`) of ``x``, as the MXU is fed it."""
    if name == BF16:
        if x.dtype != jnp.bfloat16:
            raise ValueError(f"the {BF16} piece is a bf16 operand itself, got {x.dtype}")
        return x
    if name == NEAREST:
        return round_bf16(x)  # the model's (interpret mode only): the same rounding as a cast
    rest, order = x.astype(F32), (HI8, MID8, LO8).index(name)
    for _ in range(order):  # each residual is exact in f32
        rest = rest - truncate_bf16(rest).astype(F32)
    return truncate_bf16(rest)


@functools.cache
def pallas_lowers(precision) -> bool:
    """Whether this jax's Pallas TPU lowering takes ``precision`` for an f32 dot: asked of jax itself, by
    lowering one small kernel for TPU (no TPU or libtpu needed). jax 0.9.2 and 0.10.2 refuse
    ``Precision.HIGH`` ("Unsupported dot precision"); jax 0.12 lowers it."""
    from jax.experimental import pallas as pl

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = lax.dot_general(a_ref[...], b_ref[...], NN, precision=precision, preferred_element_type=F32)

    a, b = jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((128, 128), F32)
    call = pl.pallas_call(kernel, out_shape=a)
    try:
        jax.jit(call).trace(a, b).lower(lowering_platforms=("tpu",))
    except NotImplementedError:
        return False
    return True


def mxu_passes(precision, a_dtype, b_dtype, *, pallas: bool = True) -> tuple[tuple[str, str], ...]:
    """The MXU passes of one ``dot_general`` at ``precision`` (None is DEFAULT) with operands of these dtypes,
    as ``(lhs piece, rhs piece)`` pairs in the order Mosaic accumulates them (its LLO order).

    DEFAULT feeds a bf16 operand as it is and rounds an f32 one (one pass). HIGHEST and HIGH take f32
    operands only (Mosaic refuses a bf16 operand: "Bad lhs type"), and, in a Pallas kernel (``pallas``),
    HIGH only where this jax lowers it. Outside a kernel XLA:TPU lowers HIGH itself; the model gives it
    Mosaic's three passes there too (XLA's own split is not read from its output)."""
    precision = Precision.DEFAULT if precision is None else precision
    bf16 = (jnp.dtype(a_dtype) == jnp.bfloat16, jnp.dtype(b_dtype) == jnp.bfloat16)
    if precision == Precision.DEFAULT:
        return ((BF16 if bf16[0] else NEAREST, BF16 if bf16[1] else NEAREST),)
    if precision not in (Precision.HIGH, Precision.HIGHEST):
        raise ValueError(f"no MXU passes for precision {precision!r}")
    if any(bf16):
        raise ValueError(f"Mosaic takes {precision} for two f32 operands only (bf16 operand: 'Bad lhs type')")
    if pallas and precision == Precision.HIGH and not pallas_lowers(Precision.HIGH):
        raise ValueError(f"this jax ({jax.__version__}) does not lower Precision.HIGH in a Pallas TPU kernel; "
                         "use kernels_tpu.mxu.BF16X3 (explicit 3-pass split)")
    return _SPLIT_HIGH if precision == Precision.HIGH else _SPLIT_HIGHEST


# ------------------------------------------------------------ a dot Mosaic runs on the vector unit
def on_vector_unit(a_shape, a_dtype, b_shape, b_dtype, dims) -> bool:
    """Whether Mosaic computes this kernel ``dot_general`` on the VPU rather than the MXU.

    Its canonicalisation (``canonicalize-mosaic``, jax's ``canonicalize_mosaic.cc``: ``is_matrix_vector_dot``)
    rewrites an f32 matrix-vector dot, ``lhs[..., M, K]`` contracted on its last axis with a vector-like
    ``rhs[..., K]`` or ``rhs[..., 1, K]`` contracted on its last axis, into a broadcast ``arith.mulf`` and a
    ``vector.multi_reduction <add>`` over K: f32 products, an f32 sum, no MXU pass and no bf16 rounding,
    whatever its precision says. Read in the dumps of ejkernel 0.0.72's kernels (docs/precision.md):
    ``lax.dot(lower_mask[C,C], decay[C], precision=HIGHEST)`` is a ``tpu.matmul`` up to
    ``post-pre-canon-optimization`` and a multiply and a reduction from ``post-canonicalize-mosaic`` on."""
    (ca, cb), (ba, bb) = dims
    if jnp.dtype(a_dtype) != F32 or jnp.dtype(b_dtype) != F32:
        return False
    a_free = [i for i in range(len(a_shape)) if i not in ca and i not in ba]
    b_free = [i for i in range(len(b_shape)) if i not in cb and i not in bb]
    return (tuple(ca) == (len(a_shape) - 1,) and tuple(cb) == (len(b_shape) - 1,) and len(a_free) == 1
            and (not b_free or (len(b_free) == 1 and b_shape[b_free[0]] == 1)))


def vector_unit_dot(a: jax.Array, b: jax.Array, dims) -> jax.Array:
    """A dot :func:`on_vector_unit` holds, as the VPU computes it: each product rounded to f32, the products of
    one output summed in f32 over K (``jnp.sum``'s order here; the chip's lane reduction, ``vadd.xlane``, has
    an inner order its dumps do not show: docs/precision.md). Its result has ``lax.dot_general``'s layout."""
    (ca, cb), (ba, bb) = dims
    a_free = [i for i in range(a.ndim) if i not in ca and i not in ba]
    b_free = [i for i in range(b.ndim) if i not in cb and i not in bb]
    lhs = jnp.transpose(a, (*ba, *a_free, *ca))  # [batch..., M, K]
    rhs = jnp.transpose(b, (*bb, *b_free, *cb)).reshape(*(b.shape[i] for i in bb), 1, b.shape[cb[0]])
    out = jnp.sum(lhs.astype(F32) * rhs.astype(F32), axis=-1)  # [batch..., M]
    return out.reshape(*out.shape, *(1 for _ in b_free))


# ------------------------------------------------------------ the precision policy
F32_DOT_PRECISION = {"bfloat16": BF16X3, "float16": BF16X4, "float32": BF16X3}
"""The one table: per input dtype, the precision of every kernel dot with an f32 operand (two bf16
operands always take one exact pass). Chosen by measurement as the cheapest that keeps
eps_TPU <= eps_GPU on every tensor (docs/precision.md): one pass (DEFAULT) fails in every dtype,
by up to 6.9x (bf16), 11x (fp16) and 5.4x (fp32). BF16X3 passes bf16 and fp32 everywhere at half
the cost of HIGHEST. fp16 needs BF16X4: fla multiplies fp16 data exactly, and BF16X3 drops the
lo·lo term (up to 2^-16 of each product), which is the whole error of a state that is one outer
product, as under a strong decay (ht = k_T v_T^T + e^{g_T}(...): 2.5x fla's error at normalizer 0.1)."""


@dataclass(frozen=True)
class Policy:
    """How every kernel of ``kernels_tpu`` feeds the MXU for one input dtype (hashable, static).

    - :meth:`dot`: a dot of the recurrence. Two bf16 operands: one pass
      (``DEFAULT``: exact products, f32 accumulation); otherwise both operands in
      f32 at ``F32_DOT_PRECISION[input_dtype]``.
    - :meth:`exact`: an f32-accurate dot (``HIGHEST``) for what must not be
      rounded whatever the input dtype: cumulative sums of log gates and the
      gate-gradient reductions (fla keeps those in f32 too).
    - ``operand_dtype``: the input dtype's own MXU operand type (bf16 for bf16
      inputs, f32 otherwise), for kernels that round an intermediate to it
      before a dot, as fla does.
    """

    input_dtype: str
    mxu_model: bool
    f32_precision: Any = None  # overrides F32_DOT_PRECISION[input_dtype] for a path that needs it (one of PRECISIONS)

    @property
    def operand_dtype(self):
        return jnp.dtype(jnp.bfloat16) if self.input_dtype == "bfloat16" else jnp.dtype(F32)

    def precision(self, a, b):
        both_bf16 = a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
        if both_bf16:
            return Precision.DEFAULT
        return F32_DOT_PRECISION[self.input_dtype] if self.f32_precision is None else self.f32_precision

    def dot(self, a, b, dims=None):
        precision = self.precision(a, b)
        if precision != Precision.DEFAULT:
            a, b = a.astype(F32), b.astype(F32)
        return dot(a, b, precision=precision, dimension_numbers=NN if dims is None else dims,
                   mxu_model=self.mxu_model)

    def exact(self, a, b, dims=None):
        return dot(a.astype(F32), b.astype(F32), precision=Precision.HIGHEST,
                   dimension_numbers=NN if dims is None else dims, mxu_model=self.mxu_model)


def policy_for(dtype, mxu_model: bool, f32_precision=None) -> Policy:
    """The policy for inputs of ``dtype`` (bfloat16, float16 or float32); ``f32_precision`` (one of
    :data:`PRECISIONS`) replaces the table's precision of f32-operand dots."""
    name = jnp.dtype(dtype).name
    if name not in F32_DOT_PRECISION:
        raise ValueError(f"no MXU policy for {name}; kernels take bfloat16, float16 or float32")
    if f32_precision is not None and f32_precision not in PRECISIONS:
        raise ValueError(f"f32_precision={f32_precision!r} must be one of {PRECISIONS}")
    return Policy(name, bool(mxu_model), f32_precision)


# ------------------------------------------------------------ modeled MXU work
class MxuTally:
    """Modeled MXU work of the dots executed while the tally is active, per phase.

    ``macs``: multiply-adds of every dot as written (one pass each);
    ``pass_macs``: bf16-pass multiply-adds, i.e. ``macs`` times the passes the
    dot's precision costs (:data:`PASSES`; bf16 operands always 1). Counted
    only in interpret mode with the MXU model: a model of the work, not a timing.
    """

    def __init__(self, phase: str = "forward"):
        self.macs: dict[str, int] = {}
        self.pass_macs: dict[str, int] = {}
        self.phase = phase

    def add(self, macs: int, passes: int) -> None:
        self.macs[self.phase] = self.macs.get(self.phase, 0) + macs
        self.pass_macs[self.phase] = self.pass_macs.get(self.phase, 0) + macs * passes

    @property
    def ratio(self) -> float:
        """All bf16-pass multiply-adds over all multiply-adds: 1.0 when every dot is one pass."""
        total = sum(self.macs.values())
        return sum(self.pass_macs.values()) / total if total else float("nan")


_ACTIVE: list[MxuTally] = []


@contextlib.contextmanager
def tally_mxu_work(tally: MxuTally | None = None):
    """Count the modeled MXU work of the interpret-mode dots executed inside the block."""
    tally = MxuTally() if tally is None else tally
    _ACTIVE.append(tally)
    try:
        yield tally
    finally:
        jax.effects_barrier()  # every callback of the block has landed
        _ACTIVE.remove(tally)


def _record(macs: int, passes: int):
    for tally in _ACTIVE:
        tally.add(macs, passes)


def dot_macs(a_shape, b_shape, dims) -> int:
    """Multiply-adds of ``lax.dot_general``: the output size times the contracted size."""
    (ca, cb), (ba, bb) = dims
    batch = math.prod(a_shape[i] for i in ba)
    free_a = math.prod(n for i, n in enumerate(a_shape) if i not in ca and i not in ba)
    free_b = math.prod(n for i, n in enumerate(b_shape) if i not in cb and i not in bb)
    return batch * free_a * free_b * math.prod(a_shape[i] for i in ca)


def record_dot(a_shape, b_shape, dims, passes: int) -> None:
    """Report one executed dot's modeled work to the active tallies (interpret mode: a debug callback)."""
    jax.debug.callback(functools.partial(_record, dot_macs(a_shape, b_shape, dims), passes))


def _one_pass(a, b, dims, mxu_model: bool):
    """One MXU pass of two bf16 operands: exact products, f32 accumulation."""
    if mxu_model:
        return lax.dot_general(a.astype(F32), b.astype(F32), dims, precision=Precision.HIGHEST,
                               preferred_element_type=F32)
    return lax.dot_general(a, b, dims, precision=Precision.DEFAULT, preferred_element_type=F32)


def dot(a: jax.Array, b: jax.Array, *, precision, preferred_element_type=F32, dimension_numbers=NN,
        mxu_model: bool = False) -> jax.Array:
    """``a·b`` with a stated precision (one of :data:`PRECISIONS`, or ``Precision.HIGH`` where this jax
    lowers it) and f32 accumulation.

    Without ``dimension_numbers`` it is a plain ``a[M,K] @ b[K,N]``; ``TN`` gives
    ``a.T @ b`` and ``NT_T`` gives ``a @ b.T``. With ``mxu_model`` (interpret mode only) every pass is
    evaluated as the MXU rounds it: :func:`mxu_passes` for jax's own precisions, the explicit splits
    for :data:`BF16X3` and :data:`BF16X4`.
    """
    if precision is None:
        raise ValueError("every kernel dot must state its precision")
    if precision == Precision.HIGH and not pallas_lowers(Precision.HIGH):
        raise ValueError("Mosaic does not lower Precision.HIGH under this jax; use kernels_tpu.mxu.BF16X3 "
                         "(explicit 3-pass split)")
    if precision not in PRECISIONS + (Precision.HIGH,):
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if jnp.float16 in (a.dtype, b.dtype):
        raise ValueError("fp16 cannot enter a Mosaic kernel: widen it to f32 with kernels_tpu.mxu.widen_fp16")
    dims = dimension_numbers
    bf16 = jnp.bfloat16
    both_bf16 = a.dtype == bf16 and b.dtype == bf16
    if precision in (BF16X3, BF16X4) and not both_bf16:  # the explicit split: bf16 dots in the kernel itself
        if mxu_model:
            record_dot(a.shape, b.shape, dims, PASSES[precision])
        (a_hi, a_lo), (b_hi, b_lo) = split_bf16(a, 2, on_bits=mxu_model), split_bf16(b, 2, on_bits=mxu_model)
        # small terms first so the f32 accumulation rounds as little as possible
        out = _one_pass(a_lo, b_hi, dims, mxu_model) + _one_pass(a_hi, b_lo, dims, mxu_model)
        if precision == BF16X4:
            out = _one_pass(a_lo, b_lo, dims, mxu_model) + out
        out = out + _one_pass(a_hi, b_hi, dims, mxu_model)
        return out.astype(preferred_element_type)
    lax_precision = Precision.DEFAULT if precision in (BF16X3, BF16X4) else precision  # two bf16 operands
    passes = mxu_passes(lax_precision, a.dtype, b.dtype)
    if mxu_model and on_vector_unit(a.shape, a.dtype, b.shape, b.dtype, dims):  # Mosaic's VPU, not the MXU
        return vector_unit_dot(a, b, dims).astype(preferred_element_type)
    if not mxu_model:
        return lax.dot_general(a, b, dims, precision=lax_precision,
                               preferred_element_type=F32).astype(preferred_element_type)
    return modeled_dot(a, b, passes, dims).astype(preferred_element_type)


def modeled_dot(a: jax.Array, b: jax.Array, passes, dims, *, record: bool = True) -> jax.Array:
    """The MXU's result of ``passes`` (:func:`mxu_passes`): each pass's bf16 pieces multiplied exactly and
    accumulated in f32, the passes summed in f32 in their order; reports the work to active tallies (unless
    ``record`` is off: a caller that reports it itself)."""
    if record:
        record_dot(a.shape, b.shape, dims, len(passes))
    out = None
    for lhs, rhs in passes:
        term = _one_pass(piece(a, lhs), piece(b, rhs), dims, mxu_model=True)
        out = term if out is None else out + term
    return out
