"""Matrix-unit dots with an explicit precision, and a model of TPU MXU rounding.

Every dot in ``kernels_tpu`` goes through :func:`dot`, which states its
precision and ``preferred_element_type``. On a TPU the hardware decides the
rounding. In Pallas interpret mode on CPU, XLA:CPU ignores ``precision`` and
computes float32 dots exactly, which would make a kernel look more accurate
than it is on TPU. With ``mxu_model=True`` the dot is instead decomposed the
way the MXU evaluates it:

- bf16 operands, f32 accumulation: products of bf16 values are exact in f32,
  so an f32 dot of the upcast operands is the MXU result.
- fp16 operands: the MXU has no fp16 mode; they are treated as f32 operands
  (exact upcast) at the stated precision, so ``DEFAULT`` rounds them to bf16
  and ``HIGH`` keeps them whole (an fp16 value is exactly two bf16 pieces).
- f32 operands at ``Precision.DEFAULT``: one bf16 pass, operands rounded to
  bf16 (round to nearest even) first.
- ``Precision.HIGH``: bf16x3, ``a = a_hi + a_lo`` split in bf16 and
  ``a_hi b_hi + a_hi b_lo + a_lo b_hi`` accumulated in f32.
- ``Precision.HIGHEST``: bf16x6, three bf16 pieces per operand and the six
  products of combined order <= 2, accumulated in f32 (about f32 accuracy).

The model is the same code on every backend; it is only switched on for
interpret mode, never on a TPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Precision = lax.Precision

_NT = (((1,), (0,)), ((), ()))  # a[M,K] @ b[K,N]


def split_bf16(x: jax.Array, pieces: int) -> list[jax.Array]:
    """Split f32 ``x`` into ``pieces`` bf16 terms whose f32 sum approximates x."""
    out, rest = [], x.astype(jnp.float32)
    for _ in range(pieces):
        hi = rest.astype(jnp.bfloat16)
        out.append(hi)
        rest = rest - hi.astype(jnp.float32)
    return out


# (i, j) pairs of bf16 pieces multiplied per precision: order i + j <= passes budget
_PASSES = {
    Precision.DEFAULT: (1, ((0, 0),)),
    Precision.HIGH: (2, ((0, 0), (0, 1), (1, 0))),
    Precision.HIGHEST: (3, ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))),
}


def dot(
    a: jax.Array,
    b: jax.Array,
    *,
    precision: lax.Precision,
    preferred_element_type=jnp.float32,
    dimension_numbers=_NT,
    mxu_model: bool = False,
) -> jax.Array:
    """``lax.dot_general`` with a stated precision; MXU rounding modelled when asked.

    Default dimension numbers are a plain ``a[M,K] @ b[K,N]``. Use
    ``dimension_numbers=TN`` for ``a.T @ b`` and ``NT_T`` for ``a @ b.T``.
    """
    if precision is None:
        raise ValueError("every kernel dot must state its precision")
    if not mxu_model:
        return lax.dot_general(
            a, b, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
        )
    f32 = jnp.float32
    if a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16:
        # products of 8-bit significands are exact in f32: one exact pass
        out = lax.dot_general(a.astype(f32), b.astype(f32), dimension_numbers, preferred_element_type=f32,
                              precision=Precision.HIGHEST)
        return out.astype(preferred_element_type)
    pieces, pairs = _PASSES[Precision(precision)]
    a_parts = split_bf16(a, pieces)
    b_parts = split_bf16(b, pieces)
    out = None
    # small terms first so the f32 accumulation rounds as little as possible
    for i, j in reversed(pairs):
        term = lax.dot_general(a_parts[i].astype(f32), b_parts[j].astype(f32), dimension_numbers,
                               preferred_element_type=f32, precision=Precision.HIGHEST)
        out = term if out is None else out + term
    return out.astype(preferred_element_type)


TN = (((0,), (0,)), ((), ()))  # a[K,M], b[K,N] -> a.T @ b
NT_T = (((1,), (1,)), ((), ()))  # a[M,K], b[N,K] -> a @ b.T
