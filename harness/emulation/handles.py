"""Float values in and out of Triton interpreter TensorHandles.

The interpreter stores bf16 as uint16 bits and fp8 as raw bytes, so every patch
that computes on a handle decodes its data first and encodes the result back.
"""

from __future__ import annotations

import numpy as np

from .bits import f64_to_bf16_bits, bf16_bits_to_f32, f32_to_bf16_bits


def real(h) -> np.ndarray:
    """Handle data -> float values (bf16 decoded, fp8 via the interpreter's converter)."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    t = h.dtype.scalar
    if t == tl.bfloat16:
        return bf16_bits_to_f32(h.data)
    if t.is_floating() and t.primitive_bitwidth == 8:
        return interp._convert_float(h.data, t, tl.float16, None).view(np.float16).astype(np.float32)
    return h.data


def encode(values: np.ndarray, t, rounding: str = "rne") -> np.ndarray:
    """float values -> storage for scalar type t (bf16 bits, or numpy dtype)."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    if t == tl.bfloat16:
        if values.dtype == np.float64 or values.dtype.kind in "iu":
            return f64_to_bf16_bits(values.astype(np.float64), rounding)
        return f32_to_bf16_bits(values, rounding)  # (converts to float32 itself)
    return values.astype(interp._get_np_dtype(t))
