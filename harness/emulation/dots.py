"""tl.dot numerics per input precision in the Triton interpreter.

The interpreter ignores ``input_precision`` and matmuls full float32 inputs; an
H100 feeds TF32 (or a TF32x3 / BF16x3 / BF16x6 split) to the tensor cores, or
runs an FMA chain for IEEE (see triton_interpreter's module docstring).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from .bits import _round_bf16_f32, round_to_tf32
from .handles import encode, real
from .patcher import Patcher


def _install_dot_numerics(patcher: Patcher, *, force_dot_precision: Optional[str], tf32_rounding: str) -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir as _ir

    TensorHandle = interp.TensorHandle
    builder = interp.interpreter_builder

    orig_dot = builder.create_dot
    P = _ir.INPUT_PRECISION
    forced = None if force_dot_precision is None else getattr(
        P, {"tf32": "TF32", "tf32x3": "TF32x3", "ieee": "IEEE"}[force_dot_precision])

    def tf32(x):
        return round_to_tf32(x, tf32_rounding).astype(np.float64)

    def mm(a, b):
        # float64 matmul of values with <= 24-bit significands: products are
        # exact; the K-sum carries 53 bits, far below the f32 rounding below.
        return np.matmul(a, b)

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        at, bt = a.dtype.scalar, b.dtype.scalar
        if not (at.is_floating() and bt.is_floating()):
            return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)  # integer dots are exact
        dt = d.dtype.scalar
        acc = real(d).astype(np.float64)
        A, B = real(a), real(b)
        if at == tl.float32 and bt == tl.float32:
            prec = forced if forced is not None else input_precision
            if prec == P.IEEE:
                # FMA chain over k in float32, like the non-tensor-core lowering.
                out = acc.astype(np.float32)
                A64, B64 = A.astype(np.float64), B.astype(np.float64)
                for k in range(A.shape[-1]):
                    out = (A64[..., :, k:k + 1] * B64[..., k:k + 1, :] + out).astype(np.float32)
                return TensorHandle(encode(out, dt), dt)
            if prec == P.TF32x3:
                # Triton F32DotTC: big = cvt.rna(x), small = x - big (exact in f32).
                a_big, b_big = round_to_tf32(A, "rna"), round_to_tf32(B, "rna")
                a_small, b_small = (A - a_big).astype(np.float32), (B - b_big).astype(np.float32)
                p1 = mm(tf32(a_small), b_big.astype(np.float64)).astype(np.float32)
                p2 = (mm(a_big.astype(np.float64), tf32(b_small)) + p1).astype(np.float32)
                p2 = np.where(np.isnan(p2), np.float32(0), p2)
                out = mm(a_big.astype(np.float64), b_big.astype(np.float64)) + p2 + acc
                return TensorHandle(encode(out, dt), dt)
            if prec == P.TF32:
                out = mm(tf32(A), tf32(B)) + acc
                return TensorHandle(encode(out, dt), dt)
            if prec in (P.BF16x3, P.BF16x6):
                # split each operand into bf16 pieces (round to nearest even) and sum the
                # cross products of low total order, smallest first, each pass f32-accumulated
                n, pairs = (2, ((1, 0), (0, 1), (0, 0))) if prec == P.BF16x3 else \
                    (3, ((2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)))
                pa, pb = _bf16_pieces(A, n), _bf16_pieces(B, n)
                out = acc.astype(np.float32)
                for i, j in pairs:
                    out = (mm(pa[i], pb[j]) + out).astype(np.float32)
                return TensorHandle(encode(out, dt), dt)
            return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)
        # bf16 / fp16 / fp8 inputs: exact products, float32 (output-type) accumulation.
        out = mm(A.astype(np.float64), B.astype(np.float64)) + acc
        return TensorHandle(encode(out, dt), dt)

    patcher.set_attr(builder, "create_dot", create_dot)
    # the NVIDIA backend also accepts bf16x3 / bf16x6 (fla's kda safe-gate path asks for them)
    patcher.set_attr(builder, "options", dataclasses.replace(
        builder.options, allowed_dot_input_precisions=("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")))


def _bf16_pieces(x: np.ndarray, n: int) -> List[np.ndarray]:
    """f32 ``x`` as ``n`` bf16 pieces (each rounded to nearest even) whose sum approximates it."""
    out, rest = [], x.astype(np.float32)
    for _ in range(n):
        piece = _round_bf16_f32(rest)
        out.append(piece.astype(np.float64))
        rest = (rest - piece).astype(np.float32)
    return out
