"""Scalar float arithmetic as Triton 3.9 compiles it for sm_80 / sm_90, in the Triton interpreter.

The interpreter evaluates every operation with numpy, correctly rounded and keeping subnormals. Triton's own PTX
for fla's kernels says otherwise (``parity ptx``, docs/gpu-ptx-evidence.md), and this module follows it:

- **Contraction.** Triton 3.9 compiles with FP fusion on, and LLVM's NVPTX backend fuses a multiply into the
  add or subtract that uses it (``fma.rn.f32``; ``fma.rn.bf16x2`` on sm_90). Here a product remembers its
  operands, and an add or subtract that receives one computes ``fma(a, b, c)``, rounded once
  (:func:`fused_multiply_add`). When both operands are products, the left one is fused, as LLVM's DAG combiner
  does when they have the same number of uses. A product that passes through anything else first (a broadcast,
  a select, a reduction, a store) is not fused, in the emulation nor, mostly, in LLVM.
- **Division.** f32 ``/`` is ``div.full.f32``: a product with the reciprocal, both operands scaled by 1/4 when
  the divisor is beyond 2^126 so that the reciprocal stays normal (:func:`div_full`). The hardware's reciprocal
  (MUFU.RCP) is modelled as correctly rounded; PTX allows it 1 ulp more, so the quotient is within 2 ulp of the
  IEEE one either way. ``tl.div_rn`` stays ``div.rn.f32``.
- **Square root.** f32 ``tl.sqrt`` is ``sqrt.approx.ftz.f32``: a subnormal operand is read as zero
  (:func:`sqrt_approx_ftz`). The value is modelled as correctly rounded; the approximation's own error is not
  modelled (as ``ex2.approx``'s is not). ``tl.sqrt_rn`` stays ``sqrt.rn.f32``.
- **exp2.** ``tl.math.exp2`` (fla's ``exp2``) is ``ex2.approx.ftz.f32``: a result below 2^-126 is flushed to
  +0 (:func:`exp2_ftz`). ``tl.exp`` lowers to the non-ftz ``ex2.approx.f32`` and keeps numpy's value.

bf16 operations are evaluated in f32 and rounded to bf16 by ``bf16_arith`` (whose patched ``binary_op``,
``unary_op`` and ``create_fma`` these functions go through), so the rules apply to bf16 the same way.
"""

from __future__ import annotations

import numpy as np

from .patcher import Patcher

PRODUCT = "emulation.product"
"""The TensorHandle attribute under which a product keeps its operands, for the add that may fuse it."""

_TINY = np.float32(2.0**-126)  # the smallest normal f32
_HUGE = np.float32(2.0**126)  # beyond this a divisor's reciprocal is subnormal: div.full scales it first


def exp2_ftz(x: np.ndarray) -> np.ndarray:
    """``ex2.approx.ftz.f32``'s flush: numpy's exp2 of f32 values, with results below 2^-126 flushed to +0
    (2^x is never negative; a subnormal x is 2^0 = 1 either way). Other dtypes keep numpy's exp2."""
    out = np.exp2(x)
    if out.dtype != np.float32:
        return out
    return np.where(out < _TINY, np.float32(0), out).astype(np.float32)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """f32 subnormals read as zero of the same sign (the ``.ftz`` operand rule)."""
    return np.where(np.abs(x) < _TINY, np.copysign(np.float32(0), x), x).astype(x.dtype)


def sqrt_approx_ftz(x: np.ndarray) -> np.ndarray:
    """``sqrt.approx.ftz.f32``: a subnormal operand is zero; the root itself correctly rounded (see the module doc).
    Other dtypes keep numpy's sqrt."""
    if np.asarray(x).dtype != np.float32:
        return np.sqrt(x)
    return np.sqrt(flush_subnormals(np.asarray(x)))


def div_full(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``div.full.f32``: a · rcp(b), rounded twice, with a and b scaled by 1/4 when |b| > 2^126 (see the module doc).
    Other dtypes keep numpy's IEEE division."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32 or b.dtype != np.float32:
        return np.divide(a, b)
    scale = np.where(np.abs(b) > _HUGE, np.float32(0.25), np.float32(1)).astype(np.float32)
    rcp = np.float32(1) / (b * scale)
    return ((a * scale) * rcp).astype(np.float32)


def fused_multiply_add(builder, lhs, rhs, subtract: bool):
    """The fma that ``lhs + rhs`` (``lhs - rhs`` when ``subtract``) becomes when an operand is a product, the left
    one first; None when neither is. a·b - c is fma(a, b, -c), c - a·b is fma(-a, b, c)."""
    for prod, addend, first in ((lhs, rhs, True), (rhs, lhs, False)):
        operands = prod.attr.get(PRODUCT)
        if operands is None:
            continue
        a, b = operands
        if subtract and first:
            addend = builder.create_fneg(addend)
        elif subtract:
            a = builder.create_fneg(a)
        return builder.create_fma(a, b, addend)
    return None


def keep_product(src, dst):
    """``dst``, a handle whose data is ``src``'s reshaped without moving a value between threads (``tl.sum``'s
    flatten of a block), keeps ``src``'s product operands reshaped alike: the sum's first add can still contract
    the multiply (``reduce_order``)."""
    operands = getattr(src, "attr", {}).get(PRODUCT)
    if operands is not None:
        dst.attr[PRODUCT] = tuple(type(o)(np.asarray(o.data).reshape(dst.data.shape), o.dtype) for o in operands)
    return dst


def install_ptx_arithmetic(patcher: Patcher) -> None:
    """Patch the interpreter's builder as the module doc says (after ``bf16_arith``, whose patches these call)."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    builder = interp.interpreter_builder
    FUSED = (tl.float32, tl.bfloat16)  # the types fla's PTX contracts (f32 on both targets, bf16x2 on sm_90)
    orig_fmul, orig_fadd, orig_fsub = builder.create_fmul, builder.create_fadd, builder.create_fsub

    def create_fmul(lhs, rhs):
        out = orig_fmul(lhs, rhs)
        if out.dtype.scalar in FUSED and lhs.data.shape == rhs.data.shape == out.data.shape:
            # fresh handles: the product keeps its operands' values, not their own products (a loop's chain of
            # products would otherwise keep every step's state alive)
            out.attr[PRODUCT] = (interp.TensorHandle(lhs.data, lhs.dtype), interp.TensorHandle(rhs.data, rhs.dtype))
        return out

    def _fused(lhs, rhs, subtract: bool):
        if lhs.dtype.scalar not in FUSED or lhs.data.shape != rhs.data.shape:
            return None
        return fused_multiply_add(builder, lhs, rhs, subtract)

    def create_fadd(lhs, rhs):
        out = _fused(lhs, rhs, subtract=False)
        return orig_fadd(lhs, rhs) if out is None else out

    def create_fsub(lhs, rhs):
        out = _fused(lhs, rhs, subtract=True)
        return orig_fsub(lhs, rhs) if out is None else out

    for name, fn in (("create_fmul", create_fmul), ("create_fadd", create_fadd), ("create_fsub", create_fsub),
                     ("create_fdiv", lambda lhs, rhs: builder.binary_op(lhs, rhs, div_full)),
                     ("create_sqrt", lambda arg: builder.unary_op(arg, sqrt_approx_ftz)),
                     ("create_exp2", lambda arg: builder.unary_op(arg, exp2_ftz))):
        patcher.set_attr(builder, name, fn)
