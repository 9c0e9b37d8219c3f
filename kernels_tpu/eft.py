"""Error-free transformations in float32 on the VPU: a product or a sum as its rounded value plus its exact error.

The TPU's vector unit has no fused f32 multiply-add: Mosaic compiles ``a * b + c`` to ``vmul.f32`` then
``vadd.f32`` on v5e, v6e and v7x (reports/ptx, read in libtpu's final bundles), two roundings where a GPU kernel
compiled with its multiply-adds contracted (fla's ``fma.rn.f32``) rounds once. A recurrence that updates its state
with such a product every token pays that extra rounding on every state element, every token. These functions
close the gap with float32 adds and multiplies alone (Dekker; Knuth; Ogita, Rump and Oishi's ``TwoProduct``):

- :func:`split`: ``x = hi + lo`` exactly, each part with at most 12 significant bits, so the product of any two
  parts has at most 24 and is exact in float32. The split masks the low 12 of the 23 stored significand bits
  (``hi``), and ``lo = x - hi`` is exact (Sterbenz: ``hi`` and ``x`` agree in sign, exponent and top bits). No
  multiply, so no compiler can contract it.
- :func:`two_product`: ``p = fl(a b)`` and ``e = a b - p`` exactly (Dekker's product from the parts).
- :func:`two_sum`: ``s = fl(a + b)`` and ``e = a + b - s`` exactly (Knuth; no ordering of |a|, |b| needed).
- :func:`fma`: ``a b + c`` rounded as one operation rounds it (``s + (t + e)`` from the two above: the exact
  result is ``s + t + e`` and its only rounding that matters is the last; it differs from a correctly rounded
  fused multiply-add only in rare double-rounding ties). With ``c`` itself an exact product ``p' + e'``, the
  whole ``a b + p' + e'`` is rounded once.

Why they stay exact under any compiler: every product of parts is exact, so contracting it into the add that
receives it (XLA on CPU does, for a product with one use: Pallas interpret mode) gives the same bits; and the
products that round (``p``) have more than one use, which stops the contraction. So interpret mode and the
hardware compute the same values here, which is what lets an interpret-mode row stand for a TPU's.

Range: exact for normal float32 operands whose products neither overflow nor fall below 2^-126 (where the TPU
flushes subnormals to zero, the error term is lost, as any float32 product's would be).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
_HI_MASK = -(1 << 12)  # 0xFFFFF000 as int32: sign, exponent and the top 11 stored significand bits


def split(x):
    """``(hi, lo)`` with ``hi + lo == x`` exactly, each with at most 12 significant bits (x float32)."""
    hi = lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.int32) & _HI_MASK, F32)
    return hi, x - hi


def two_product(a, b, a_parts=None, b_parts=None):
    """``(p, e)``: ``p = fl(a * b)``, ``e = a * b - p`` exactly (a, b float32, broadcasting). Pass the
    operands' :func:`split` where it is shared by many products (a row or a column of an outer product)."""
    ah, al = split(a) if a_parts is None else a_parts
    bh, bl = split(b) if b_parts is None else b_parts
    p = a * b
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def two_sum(a, b):
    """``(s, e)``: ``s = fl(a + b)``, ``e = a + b - s`` exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fma(a, b, c, a_parts=None, b_parts=None, c_err=None):
    """``a * b + c`` with one rounding (up to rare double-rounding ties), float32 adds and multiplies only.
    ``c_err``: an exact correction of ``c`` (``c + c_err`` is the value meant, as :func:`two_product` returns
    it), folded in before that one rounding."""
    p, e = two_product(a, b, a_parts, b_parts)
    s, t = two_sum(c, p)
    return s + (t + (e if c_err is None else e + c_err))


def halving_sum(x, axis: int):
    """``sum(x, axis)`` (kept as a length-1 axis) in one fixed order: the axis padded with zeros to a power of two,
    then its halves added elementwise, ``x[:n/2] + x[n/2:]``, until one element is left. That is the shape of a
    TPU's reduction across lanes or sublanes (rotate by half, add, repeat). ``jnp.sum`` would leave the order to
    the compiler: in interpret mode XLA:CPU picks it, and its pick changed between jax 0.9.2 (near-sequential) and
    0.10.2, which moved the decode kernels' dq and dk by 1.5x (docs/precision.md)."""
    n = x.shape[axis]
    width = 1 << (n - 1).bit_length()
    if width != n:
        x = jnp.pad(x, [(0, width - n) if a == axis else (0, 0) for a in range(x.ndim)])
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        x = lax.slice_in_dim(x, 0, half, axis=axis) + lax.slice_in_dim(x, half, 2 * half, axis=axis)
    return x


def dot_rows(x, y, axis: int, y_parts=None):
    """``sum(x * y, axis)`` with every product exact: the rounded products summed, plus their exact errors
    summed, each sum in :func:`halving_sum`'s order. The sums' own roundings remain (a tree's, as a GPU's
    ``tl.sum`` and a TPU's lane reduction round); the products' do not."""
    p, e = two_product(x, y, None, y_parts)
    return halving_sum(p, axis) + halving_sum(e, axis)
