"""Bit-level bf16 and TF32 helpers (exported: the tests use them as references)."""

from __future__ import annotations

import numpy as np


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode bfloat16 bit patterns (uint16) to float32 values (exact)."""
    u = np.asarray(bits)
    out = u.astype(np.uint32) if u.dtype == np.uint16 else u.astype(np.uint16).astype(np.uint32)
    out <<= np.uint32(16)
    return out.view(np.float32)


def f32_to_bf16_bits(x: np.ndarray, rounding: str = "rne") -> np.ndarray:
    """Encode float32 values as bfloat16 bits; ``rounding`` is "rne" or "rtz".

    NaNs stay NaN (quiet bit forced), infinities stay infinite, overflow in RNE
    rounds to infinity as on the GPU.
    """
    f = np.asarray(x, dtype=np.float32)
    if f.ndim == 0:  # (numpy's operators turn a 0-d array into a scalar; keep the array)
        return f32_to_bf16_bits(f.reshape(1), rounding).reshape(())
    bits = f.view(np.uint32)
    if rounding == "rne":
        out = bits >> np.uint32(16)  # in place from here: each step one pass, no temporaries
        out &= np.uint32(1)  # the lsb kept, for ties to even
        out += np.uint32(0x7FFF)
        out += bits
        out >>= np.uint32(16)
    elif rounding == "rtz":
        out = bits >> np.uint32(16)
    else:
        raise ValueError(f"unknown bf16 rounding {rounding!r}")
    nan = np.isnan(f)
    if nan.any():
        out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), out)
    return out.astype(np.uint16)


def f64_to_bf16_bits(x: np.ndarray, rounding: str = "rne") -> np.ndarray:
    """Round float64 values straight to bf16 (no double rounding via f32).

    The rounding is done on the float64 bit pattern (keep 7 of 52 fraction
    bits); the result then converts to float32 exactly.  In the float32
    subnormal range (|x| < 2**-126) we go through float32 instead, accepting a
    possible double rounding there.
    """
    x = np.asarray(x, dtype=np.float64)
    bits = x.copy().view(np.uint64)  # copy(): C-contiguous, keeps 0-d shape
    if rounding == "rne":
        lsb = (bits >> np.uint64(45)) & np.uint64(1)
        rb = (bits + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    else:
        rb = bits & ~np.uint64((1 << 45) - 1)
    finite = np.isfinite(x)
    rounded = np.where(finite, rb, bits).view(np.float64)
    with np.errstate(over="ignore"):
        as32 = rounded.astype(np.float32)
    tiny = np.abs(x) < 2.0**-126
    direct = f32_to_bf16_bits(as32, "rtz")  # exact: as32 has <= 8 significant bits
    via32 = f32_to_bf16_bits(x.astype(np.float32), rounding)
    return np.where(tiny | ~finite, via32, direct).astype(np.uint16)


def round_bf16_f32(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def round_to_tf32(x: np.ndarray, mode: str = "truncate") -> np.ndarray:
    """Reduce float32 values to TF32 (1+8+10 bits), returned as float32.

    mode: "truncate" (what the tensor core does with raw fp32 registers),
    "rne" (nearest, ties to even) or "rna" (nearest, ties away from zero, =
    ``cvt.rna.tf32.f32``).  Inf/NaN pass through unchanged.
    """
    bits = np.array(x, dtype=np.float32, copy=True).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    mask = np.uint32(0xFFFFE000)
    if mode == "truncate":
        out = bits & mask
    elif mode == "rne":
        out = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & mask
    elif mode == "rna":
        out = (bits + np.uint32(0x1000)) & mask
    else:
        raise ValueError(f"unknown tf32 rounding {mode!r}")
    return np.where(special, bits, out).view(np.float32)
