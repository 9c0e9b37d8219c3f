"""tl.dot numerics per input precision in the Triton interpreter.

The interpreter ignores ``input_precision`` and matmuls full float32 inputs; a GPU feeds bf16/fp16 operands, TF32
(or a TF32x3 / BF16x3 / BF16x6 split) to the tensor cores, or runs an FMA chain for IEEE (see triton_interpreter's
module docstring). Every dot that runs on a tensor core is computed by ``tensor_core.mma_chain``: the published
bit-accurate model of the target generation's tensor core (``tensor_core=`` arch, default
``tensor_core.DEFAULT_ARCH``).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from .bits import round_bf16_f32, round_to_tf32
from .handles import encode, real
from .patcher import Patcher
from .tensor_core import mma_chain, model_for

# the passes of Triton's BF16x3 / BF16x6 decompositions (triton 3.9, TritonGPU F32DotTC, as its TTGIR for sm_90
# shows): (i, j) = piece i of A times piece j of B, bf16 pieces largest first; every pass but the last chained from
# a zero accumulator, NaN replaced by 0, then big x big, then the dot's own C added in f32.
_BF16_SPLIT_PASSES = {"BF16x3": (2, ((1, 0), (0, 1), (0, 0))),
                      "BF16x6": (3, ((1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)))}


def install_dot_numerics(patcher: Patcher, *, force_dot_precision: Optional[str], tf32_rounding: str,
                          tensor_core: str) -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir as _ir

    TensorHandle = interp.TensorHandle
    builder = interp.interpreter_builder

    orig_dot = builder.create_dot
    P = _ir.INPUT_PRECISION
    forced = None if force_dot_precision is None else getattr(
        P, {"tf32": "TF32", "tf32x3": "TF32x3", "ieee": "IEEE"}[force_dot_precision])
    tc = {fmt: model_for(tensor_core, fmt) for fmt in ("fp16", "bf16", "tf32")}  # fails early on an unknown arch
    formats = {tl.float16: "fp16", tl.bfloat16: "bf16"}

    def tf32(x):
        return round_to_tf32(x, tf32_rounding)

    def chain(fmt, a, b, c):
        return mma_chain(a, b, c, tc[fmt])

    def plus_acc(d, acc):
        # an f32 add of the dot's C after the split passes (arith.addf: one rounding to nearest)
        return (d.astype(np.float64) + acc).astype(np.float32)

    def nan_to_zero(x):
        return np.where(np.isnan(x), np.float32(0), x)

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        at, bt = a.dtype.scalar, b.dtype.scalar
        if not (at.is_floating() and bt.is_floating()):
            return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)  # integer dots are exact
        dt = d.dtype.scalar
        acc = real(d).astype(np.float64)
        A, B = real(a), real(b)
        zero = np.zeros(acc.shape, np.float32)
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
                # Triton F32DotTC: big = cvt.rna(x), small = x - big (exact in f32), each pass a TF32 mma chain
                a_big, b_big = round_to_tf32(A, "rna"), round_to_tf32(B, "rna")
                a_small, b_small = (A - a_big).astype(np.float32), (B - b_big).astype(np.float32)
                p1 = chain("tf32", tf32(a_small), b_big, zero)
                p2 = nan_to_zero(chain("tf32", a_big, tf32(b_small), p1))
                out = plus_acc(chain("tf32", a_big, b_big, p2), acc)
                return TensorHandle(encode(out, dt), dt)
            if prec == P.TF32:
                out = chain("tf32", tf32(A), tf32(B), acc)
                return TensorHandle(encode(out, dt), dt)
            split = {P.BF16x3: "BF16x3", P.BF16x6: "BF16x6"}.get(prec)
            if split is not None:
                n, passes = _BF16_SPLIT_PASSES[split]
                pa, pb = _bf16_pieces(A, n), _bf16_pieces(B, n)
                out = zero
                for i, j in passes[:-1]:
                    out = chain("bf16", pa[i], pb[j], out)
                out = chain("bf16", pa[0], pb[0], nan_to_zero(out))
                return TensorHandle(encode(plus_acc(out, acc), dt), dt)
            return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)
        fmt = formats.get(at) if at == bt else None
        if fmt is not None and dt == tl.float32:
            return TensorHandle(encode(chain(fmt, A, B, acc), dt), dt)
        # not modelled (fp8 operands, an f16 accumulator): exact products, the K-sum in float64 rounded once
        out = np.matmul(A.astype(np.float64), B.astype(np.float64)) + acc
        return TensorHandle(encode(out, dt), dt)

    patcher.set_attr(builder, "create_dot", create_dot)
    # the NVIDIA backend also accepts bf16x3 / bf16x6 (fla's kda safe-gate path asks for them)
    patcher.set_attr(builder, "options", dataclasses.replace(
        builder.options, allowed_dot_input_precisions=("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")))


def _bf16_pieces(x: np.ndarray, n: int) -> List[np.ndarray]:
    """f32 ``x`` as ``n`` bf16 pieces (each rounded to nearest even) whose sum approximates it."""
    out, rest = [], x.astype(np.float32)
    for _ in range(n):
        piece = round_bf16_f32(rest)
        out.append(piece)
        rest = (rest - piece).astype(np.float32)
    return out
