"""bf16 arithmetic rounded to nearest even in the Triton interpreter.

The interpreter keeps bf16 as uint16 bits and applies numpy ops, reductions and
casts to those bits (or truncates); on the GPU each bf16 op is evaluated in
float32 and rounded to nearest even (see triton_interpreter's module docstring).
"""

from __future__ import annotations

import numpy as np

from .bits import f64_to_bf16_bits, round_bf16_f32, bf16_bits_to_f32, f32_to_bf16_bits
from .handles import encode, real
from .patcher import Patcher


def install_bf16_arithmetic(patcher: Patcher) -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir as _ir

    TensorHandle = interp.TensorHandle
    builder = interp.interpreter_builder
    BF16 = tl.bfloat16

    def is_bf16(h) -> bool:
        return h.dtype.scalar == BF16

    orig_binary = builder.binary_op

    def binary_op(lhs, rhs, op):
        # bf16 lives as uint16 bits; numpy would add/compare the bits.
        # Evaluate on the float32 values and round back (RNE) once.
        if is_bf16(lhs) and is_bf16(rhs):
            out = op(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data))
            if out.dtype != np.bool_:
                out = f32_to_bf16_bits(out)
            return TensorHandle(out, lhs.dtype.scalar)
        return orig_binary(lhs, rhs, op)

    orig_unary = builder.unary_op

    def unary_op(arg, op):
        # neg/exp/log/sqrt/floor/... on bf16: compute in float32, round RNE
        # (Triton upcasts bf16 math to f32 and truncs back with cvt.rn).
        if is_bf16(arg):
            return TensorHandle(f32_to_bf16_bits(op(bf16_bits_to_f32(arg.data))), arg.dtype.scalar)
        return orig_unary(arg, op)

    orig_ternary = builder.ternary_op

    def ternary_op(lhs, rhs, other, op):
        # clamp on bf16 bits would order negative numbers wrongly.
        # (np.where/select only moves bits and needs no fix.)
        if op is np.clip and is_bf16(other):
            out = np.clip(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data), bf16_bits_to_f32(other.data))
            return TensorHandle(f32_to_bf16_bits(out), other.dtype.scalar)
        return orig_ternary(lhs, rhs, other, op)

    orig_fma = builder.create_fma

    def create_fma(x, y, z):
        # bf16 fma: exact product+sum in float64, one rounding to bf16.
        if is_bf16(z):
            xs, ys, zs = np.broadcast_arrays(real(x), real(y), real(z))
            out = xs.astype(np.float64) * ys + zs
            return TensorHandle(f64_to_bf16_bits(out), z.dtype.scalar)
        return orig_fma(x, y, z)

    def _wrap_f32(name):
        orig = getattr(builder, name)

        def fn(arg):
            # Ops that bypass unary_op (rsqrt, erf) would see bf16 bits.
            if is_bf16(arg):
                res = orig(TensorHandle(bf16_bits_to_f32(arg.data), tl.float32))
                return TensorHandle(f32_to_bf16_bits(res.data), arg.dtype.scalar)
            return orig(arg)

        return fn

    orig_cast = builder.cast_impl

    def cast_impl(src, dst_type):
        # The stock cast truncates f32->bf16 and applies numpy astype to the
        # raw bits for every other bf16 pair (bf16<->f64/f16/int).  GPU
        # casts to bf16 round to nearest even.
        st, dt = src.dtype.scalar, dst_type.scalar
        if st == BF16 and dt == BF16:
            return TensorHandle(src.data.copy(), dt)
        if st == BF16:
            vals = bf16_bits_to_f32(src.data)
            if dt.is_int():  # fptosi/fptoui truncate toward zero
                with np.errstate(invalid="ignore"):
                    return TensorHandle(vals.astype(interp._get_np_dtype(dt)), dt)
            return TensorHandle(encode(vals, dt), dt)
        if dt == BF16:
            return TensorHandle(encode(np.asarray(src.data), dt), dt)
        return orig_cast(src, dst_type)

    orig_fp_to_fp = builder.create_fp_to_fp

    def create_fp_to_fp(src, dst_type, rounding_mode):
        # Explicit-rounding casts: the interpreter's RTNE rounds ties up.
        st, dt = src.dtype.scalar, dst_type.scalar
        plain = (tl.float16, tl.float32, tl.float64, BF16)
        if (st == BF16 or dt == BF16) and st in plain and dt in plain:
            mode = "rtz" if rounding_mode == _ir.ROUNDING_MODE.RTZ else "rne"
            vals = real(src) if st == BF16 else np.asarray(src.data)
            if dt == BF16:
                return TensorHandle(encode(vals, dt, mode), dt)
            return TensorHandle(vals.astype(interp._get_np_dtype(dt)), dt)
        return orig_fp_to_fp(src, dst_type, rounding_mode)

    for name, fn in (("binary_op", binary_op), ("unary_op", unary_op), ("ternary_op", ternary_op),
                     ("create_fma", create_fma), ("cast_impl", cast_impl), ("create_fp_to_fp", create_fp_to_fp),
                     ("create_rsqrt", _wrap_f32("create_rsqrt")), ("create_erf", _wrap_f32("create_erf"))):
        patcher.set_attr(builder, name, fn)

    # Reductions/scans: the interpreter calls np.sum/np.cumsum/nanmax on
    # the bf16 bits.  Swap the module-level classes its tl.reduce /
    # tl.associative_scan replacements instantiate.
    base_reduce, base_scan = interp.ReduceOps, interp.ScanOps

    class _BF16ReduceOps(base_reduce):

        def sum(self, input):
            if input.dtype != BF16:
                return super().sum(input)
            x = bf16_bits_to_f32(input.handle.data)
            axis = self.axis
            if axis is None:
                x, ax = x.ravel(), 0
            else:
                ax = axis
            x = np.moveaxis(x, ax, -1)
            while x.shape[-1] > 1:  # pairwise tree, RNE after each add
                n = x.shape[-1]
                h = n // 2
                s = round_bf16_f32(x[..., :h] + x[..., h:2 * h])
                x = np.concatenate([s, x[..., 2 * h:]], axis=-1) if n % 2 else s
            res = x[..., 0]
            if self.keep_dims:
                if axis is None:
                    res = np.reshape(res, (1, ) * input.handle.data.ndim)
                else:
                    res = np.expand_dims(res, axis)
            elif axis is None:
                res = res.reshape(())
            bits = f32_to_bf16_bits(res)
            return self.to_tensor(bits if bits.ndim else bits.item(), input.dtype)

        def min_max(self, input, val_reduce_op, idx_reduce_op=None):
            inp = input[0] if isinstance(input, tuple) else input
            if inp.dtype != BF16 or val_reduce_op is None:
                return super().min_max(input, val_reduce_op, idx_reduce_op)
            x = bf16_bits_to_f32(inp.handle.data)
            vals = f32_to_bf16_bits(np.asarray(val_reduce_op(x, axis=self.axis, keepdims=self.keep_dims)))
            val = self.to_tensor(vals if vals.ndim else vals.item(), inp.dtype)
            if idx_reduce_op is None:
                return val
            idx = self.to_tensor(idx_reduce_op(x, axis=self.axis, keepdims=self.keep_dims), tl.int32)
            return val, idx

    class _BF16ScanOps(base_scan):

        def _seq(self, input, op):
            x = np.moveaxis(bf16_bits_to_f32(input.handle.data), self.axis, 0).copy()
            for i in range(1, x.shape[0]):  # sequential, RNE after each step
                x[i] = round_bf16_f32(op(x[i - 1], x[i]))
            return [self.to_tensor(f32_to_bf16_bits(np.moveaxis(x, 0, self.axis)), input.dtype)]

        def cumsum(self, input):
            return self._seq(input, np.add) if input.dtype == BF16 else super().cumsum(input)

        def cumprod(self, input):
            return self._seq(input, np.multiply) if input.dtype == BF16 else super().cumprod(input)

    patcher.set_attr(interp, "ReduceOps", _BF16ReduceOps)
    patcher.set_attr(interp, "ScanOps", _BF16ScanOps)
