"""Every float operation of an emulated TPU program rounds where the program writes it, with XLA:CPU's optimizer on.

Why. A TPU's vector unit has no fused multiply-add: v5e, v6e and v7x lower ``x * y + z`` (f32) to ``vmul.f32``
and ``vadd.f32`` in Mosaic's LLO (docs/precision.md), so the product rounds, then the sum. XLA:CPU lets LLVM
contract a product into the add that takes it (one rounding) wherever its optimizer runs, and no XLA option
turns that off: ``optimization_barrier`` and ``reduce_precision`` between the two do not survive XLA's passes
(``x * y + z`` still fused on 15297 of 65536 values at levels 1 and 3, as is an xor with a constant 0;
reports/bench/2026-11-29-rounding-fence). Level 0 stops it, and the leg compiled at level 0 until 2026-11-29, but
its code runs 3-4x slower and is not "as written" either: at level 0, ``tanh``, ``log1p``, ``expm1`` and ``rsqrt``
give other bits fused behind another operation than alone (10755, 224, 116 and 8951 of 65536 values), where at
levels 1 and 3 they give the same.

How. :func:`rounded` turns a primitive into one that computes the same value and then passes its bits through
an xor with ``replica-id``. That is 0 in every program the leg runs (one device, one replica), but XLA cannot
fold it: it is computed at run time, outside the fusion, and the fusion receives it as a parameter. So LLVM
sees an integer operation between the product and the add, and the product rounds on its own. The cost is one
vector xor per result. :func:`rounds` says which results are fenced: the products and every operation XLA
expands into several instructions (a transcendental's last step is a multiply that could fuse into the next
add); adds, data movement, comparisons and exact operations are not. A fence also keeps XLA's algebraic
simplifier from rewriting through a product, which Mosaic, compiling a kernel for a TPU, does not do either:
in simple_gla's kernels with a per-head ``g_gamma``, fencing only the chunk's ``b = g_gamma * position`` moved
``dg_gamma`` at level 0 (the report lists the rows).

:mod:`harness.emulation.pallas_batched` applies it to every equation of the programs it evaluates (the calls around
the kernels and the kernels, under both grid interpreters). The dots are not fenced: the MXU model
(:mod:`kernels_tpu.mxu`) feeds them exact bf16 pieces, whose products are exact, so contraction cannot move them,
and XLA:CPU calls the same matrix library at every level.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import batching
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

FENCED = frozenset({
    # products
    "mul", "square", "integer_pow", "div", "rem", "pow",
    # what XLA expands into a polynomial or an iteration
    "exp", "exp2", "expm1", "log", "log1p", "logistic", "tanh", "rsqrt", "sqrt", "cbrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erf", "erfc", "erf_inv", "lgamma", "digamma",
})
"""The primitives whose float result :func:`rounds` fences, by name (a name this jax lacks matches nothing)."""


def rounds(eqn) -> bool:
    """Whether ``eqn``'s result is fenced: a primitive of :data:`FENCED` with one floating result."""
    return (eqn.primitive.name in FENCED and not eqn.primitive.multiple_results
            and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating))


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _fence(ctx, value, aval):
    """``value`` through an xor of its bits with replica-id: the same bits, in a form nothing fuses into."""
    bits = np.dtype(_BITS[np.dtype(aval.dtype).itemsize])
    bits_type = mlir.dtype_to_ir_type(bits)
    zero = hlo.replica_id()  # ui32
    if bits.itemsize != 4:
        zero = hlo.convert(ir.RankedTensorType.get((), bits_type), zero)
    zero = mlir.broadcast_in_dim(ctx, zero, jax_core.ShapedArray(aval.shape, bits), broadcast_dimensions=[])
    as_bits = hlo.bitcast_convert(ir.RankedTensorType.get(aval.shape, bits_type), value)
    return hlo.bitcast_convert(value.type, hlo.xor(as_bits, zero))


@functools.cache
def rounded(prim: jax_core.Primitive) -> jax_core.Primitive:
    """``prim`` (elementwise, one result) with its result fenced (module doc); vmapped as an elementwise op."""
    fenced = jax_core.Primitive(f"{prim.name}_rounded")
    fenced.def_impl(prim.bind)
    fenced.def_abstract_eval(lambda *avals, **params: prim.abstract_eval(*avals, **params)[0])
    lower = mlir.lower_fun(prim.bind, multiple_results=False)

    def lowering(ctx, *args, **params):
        (value,) = lower(ctx, *args, **params)
        return [_fence(ctx, value, ctx.avals_out[0])]

    def batched(args, dims, **params):
        """Elementwise, so every operand with the batch axis first: the others broadcast along it, a batched
        scalar (an operand may be a scalar beside arrays) along the arrays' shape."""
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        shape = max((a.shape if d is None else a.shape[:d] + a.shape[d + 1:] for a, d in zip(args, dims)), key=len)
        moved = []
        for a, d in zip(args, dims):
            if d is None:
                moved.append(a if a.ndim == 0 else lax.broadcast(a, (size,)))
            else:
                a = batching.moveaxis(a, d, 0)
                moved.append(lax.broadcast_in_dim(a, (size, *shape), (0,)) if a.ndim == 1 else a)
        return fenced.bind(*moved, **params), 0

    mlir.register_lowering(fenced, lowering)
    batching.primitive_batchers[fenced] = batched
    return fenced
