"""Comparison results are int1 handles, as compiled Triton's ``arith.cmpi`` / ``arith.cmpf`` results are ``i1``.

The Triton 3.9 interpreter evaluates every ``create_icmp*`` / ``create_fcmp*`` through
``InterpreterBuilder.binary_op``, which tags its result ``TensorHandle(output, lhs.dtype.scalar)``: the
*operand's* type. The data is a numpy bool array and the ``tl.tensor`` wrapping it says int1 (semantic's
``_bool_like``), but the handle says int64 (for ``t < seq_len`` with an int64 ``seq_len``), int32, bf16, ...
Everything that reads ``handle.dtype`` then converts the bools to that type:

- ``create_splat`` / ``create_unsplat`` build ``np.full(shape, data, dtype=_get_np_dtype(arg.dtype))``. A scalar
  comparison combined with a block (``(t < seq_len) & m_d`` in fla's ``compute_dh0_kernel``: the scalar side is
  splatted by ``broadcast_impl_value``) becomes int64 0/1 data; ``&`` with the bool block keeps int64 and
  ``tl.load(..., mask=...)`` raises ``ValueError('mask has unsupported dtype')`` (the C++ ``_interpreter.load``
  accepts bool masks only).
- ``cast_impl`` picks its conversion from the handle's type: ``(x < y).to(tl.float32)`` on bf16 ``x, y`` decodes
  the bools as bf16 bit patterns (1 -> 9.18e-41 instead of 1.0; the stock interpreter fails on the size).

On a GPU the comparison is an ``i1`` value whatever its operands were, and splat, ``&``, select, load masks and
``uitofp`` see exactly that. Re-tagging the comparison's handle as ``tl.int1`` (its data are already bools) makes
the handle agree with its tensor type, so every consumer behaves as the compiled kernel does.
"""

from __future__ import annotations

from .patcher import Patcher


def install_int1_comparisons(patcher: Patcher) -> None:
    """Wrap every ``create_icmp*`` / ``create_fcmp*`` of the interpreter's builder so its handle is int1 (see the
    module doc). The wrapped call still goes through ``binary_op`` (bf16_arith's, when installed)."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    builder = interp.interpreter_builder
    names = sorted(n for n in dir(type(builder)) if n.startswith(("create_icmp", "create_fcmp")))

    def wrap(orig):

        def compare(lhs, rhs):
            out = orig(lhs, rhs)
            return interp.TensorHandle(np.asarray(out.data, dtype=np.bool_), tl.int1)

        return compare

    for name in names:
        patcher.set_attr(builder, name, wrap(getattr(builder, name)))
