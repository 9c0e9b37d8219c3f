"""What the emulated GPU leg assumes a real GPU's compile of fla's kernels does: the one declaration the PTX check
(``harness.emulation.ptx``) tests against Triton's own sm_80 / sm_90 output.

Each fact is **measured from the emulation itself**, not restated by hand: :func:`emulation_facts` installs the
emulation's own patches (``dots.install_dot_numerics``, ``bf16_arith.install_bf16_arithmetic``,
``ptx_arith.install_ptx_arithmetic``, with the defaults ``triton_emulation()`` gives the GPU leg) on the Triton
interpreter's builder for the length of a probe, feeds it values whose results tell the rounding apart, and
restores everything. A change to the emulation (or a fault a test patches into it) changes the facts, and so what
the PTX must show. The facts that are statements rather than behaviour (the GPU's ``ex2.approx``) quote
``triton_interpreter``'s documented model.

Facts (``EmulationFacts`` fields) and the PTX each predicts:

- ``tf32_rounding``: how an f32 ``tl.dot`` at input precision tf32 reduces its operands: "truncate" (raw f32 bits
  handed to the tensor core, which ignores the low 13 mantissa bits), "rna" / "rne" (a ``cvt.rna`` / ``cvt.rn``
  ``.tf32.f32`` before the mma) or "none" (full f32 products). PTX: tf32 ``mma.sync`` / ``wgmma``, with no
  ``cvt.*.tf32.f32`` (truncate) or with one (rna, rne).
- ``low_precision_dot``: bf16/fp16 ``tl.dot``: which tensor core computes it, read from three probes of a bf16 dot
  (the ``tensor_core`` module's model): the block size (1 - 1 + 2^-30 loses the 2^-30 while all three share a
  block), the extra alignment bits (1 - 1 + 2^-(23+n) keeps 2^-(23+n) for n up to that many) and the final
  rounding (1 + 1.5 * 2^-23: 1 + 2^-23 toward zero, 1 + 2^-22 to nearest even), matched to the generation with
  those parameters: "tensor-core sm_90: bf16 16-product blocks, 2 extra alignment bits, rz"; "exact-products-f32-acc"
  for exact products rounded once; else "unrecognised ..." (sm_100's bf16 parameters are sm_90's: behaviour names
  the first, sm_90). PTX: on the generation's own target, bf16/f16 mma with
  an f32 accumulator whose k is a multiple of the block (``wgmma ... k16`` or ``mma.sync ... m16n8k16`` on sm_90;
  ``m16n8k16`` on sm_80); other targets' rows are n/a (the emulation does not model their tensor core).
- ``contraction``: whether ``a * b + c`` written as two operations rounds once (fused) or twice, per type:
  "fused f32, bf16" (``ptx_arith``: a product fused into the add that receives it) or "none". PTX: the ``fma``
  that exist only because the compiler contracted are of those types (or ptxas is left to fuse unpinned
  ``mul``/``add``); with "none", no such ``fma`` and every ``mul``/``add`` pinned ``.rn``.
- ``bf16_rounding`` / ``f16_rounding``: f32 -> bf16 / f16 casts: "rne". PTX: ``cvt.rn.bf16.f32`` / ``cvt.rn.f16.f32``
  (``cvt.rz`` only where the kernel asks ``fp_downcast_rounding="rtz"``, which the emulation honours).
- ``float_to_int``: "truncate" (``cvt.rzi``); ``int_to_float``: "rne" (``cvt.rn``).
- ``f32_divide``: f32 ``/``: "rcp" (``ptx_arith``: the dividend times the correctly rounded reciprocal, two
  roundings) -> ``div.full.f32``, or "ieee" (correctly rounded, numpy) -> ``div.rn.f32``. ``f32_sqrt``:
  "ieee-ftz" (correctly rounded, a subnormal operand read as zero) -> ``sqrt.approx.ftz.f32``, or "ieee" ->
  ``sqrt.rn.f32``. ``tl.div_rn`` / ``tl.sqrt_rn`` stay IEEE in both (their TTIR ops are the precise ones).
- ``subnormals``: f32 arithmetic's, "kept" (numpy never flushes) -> no ``.ftz`` on f32 add/mul/fma the kernel
  writes itself. ``exp2_subnormals``: "flushed" (``ptx_arith``: 2^x below 2^-126 is +0) -> ``ex2.approx.ftz.f32``.
- ``exp_lowering``: the documented GPU lowering of ``exp`` / ``exp2``, "ex2.approx" (the emulation itself uses
  numpy's float32 exp: a stated, unmodelled difference). PTX: ``ex2.approx[.ftz].f32``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Dict, Tuple

import numpy as np

from .autotune import LOCK
from .bf16_arith import install_bf16_arithmetic
from .dots import install_dot_numerics
from .patcher import Patcher
from .ptx_arith import install_ptx_arithmetic
from .tensor_core import MODELS
from .triton_interpreter import triton_emulation

# the documented lowering of exp and exp2 on the GPU (triton_interpreter's "Numerical model": "Transcendentals
# (exp, log, ...) use numpy's float32 versions, not the GPU's approximate ``ex2.approx``")
DOCUMENTED_EXP_LOWERING = "ex2.approx"


@dataclasses.dataclass(frozen=True)
class EmulationFacts:
    tf32_rounding: str
    low_precision_dot: str
    contraction: str
    bf16_rounding: str
    f16_rounding: str
    float_to_int: str
    int_to_float: str
    f32_divide: str
    f32_sqrt: str
    subnormals: str
    exp2_subnormals: str
    exp_lowering: str

    def as_dict(self) -> Dict[str, str]:
        return dataclasses.asdict(self)


def leg_defaults() -> Tuple[str, bool, bool, str]:
    """(tf32_rounding, dots, ptx_arith, tensor_core) as the GPU leg's ``triton_emulation(dot_precision=...)`` call
    gets them."""
    params = inspect.signature(triton_emulation).parameters
    return (params["tf32_rounding"].default, params["dots"].default, params["ptx_arith"].default,
            params["tensor_core"].default)


def _f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# f32 values whose TF32 reductions differ by mode (TF32 keeps 10 of 23 mantissa bits):
# 1 + 2^-11 (an exact tie, kept bit even), 1 + 2^-10 + 2^-11 (a tie, kept bit odd), 1 + 2^-11 + 2^-20 (above half)
_TF32_PROBE = (1 + 2.0**-11, 1 + 2.0**-10 + 2.0**-11, 1 + 2.0**-11 + 2.0**-20)
_TF32_CLASSES = {
    "truncate": (1.0, 1 + 2.0**-10, 1.0),
    "rna": (1 + 2.0**-10, 1 + 2.0**-9, 1 + 2.0**-10),
    "rne": (1.0, 1 + 2.0**-9, 1 + 2.0**-10),
    "none": _TF32_PROBE,
}
# f32 values whose bf16 / f16 roundings differ by mode: an exact tie with the kept bit even, one with it odd,
# and one just above half
_BF16_PROBE = (1 + 2.0**-8, 1 + 2.0**-7 + 2.0**-8, 1 + 2.0**-8 + 2.0**-20)
_BF16_CLASSES = {"rne": (1.0, 1 + 2.0**-6, 1 + 2.0**-7), "rna": (1 + 2.0**-7, 1 + 2.0**-6, 1 + 2.0**-7),
                 "truncate": (1.0, 1 + 2.0**-7, 1.0)}
_F16_PROBE = (1 + 2.0**-11, 1 + 2.0**-10 + 2.0**-11, 1 + 2.0**-11 + 2.0**-20)
_F16_CLASSES = {"rne": (1.0, 1 + 2.0**-9, 1 + 2.0**-10), "rna": (1 + 2.0**-10, 1 + 2.0**-9, 1 + 2.0**-10),
                "truncate": (1.0, 1 + 2.0**-10, 1.0)}


def _low_precision_dot(dot) -> str:
    """Name the tensor core behind ``dot(a_rows, k)`` (bf16 rows [R, K] against a column of ones -> [R] f32 values)
    from the three probes of the module doc."""
    tiny = 2.0**-30
    K = 64
    rows = np.zeros((K - 2, K))
    rows[:, 0], rows[:, 1] = 1.0, -1.0
    rows[np.arange(K - 2), np.arange(2, K)] = tiny  # row p - 2: 1 - 1 + 2^-30 at index p
    kept = dot(rows) != 0
    block = next((p for p, keep in zip(range(2, K), kept) if keep), None)  # the first index outside block 0
    extra = np.zeros((6, 3))
    extra[:, 0], extra[:, 1] = 1.0, -1.0
    extra[:, 2] = [2.0**-(23 + n) for n in range(1, 7)]
    survived = dot(extra) != 0
    n_extra = int(np.argmin(np.append(survived, False)))  # how many of n = 1, 2, ... survive before one does not
    last = float(dot(np.array([[1.0, 1.5 * 2.0**-23]]))[0])
    rounding = {1 + 2.0**-23: "rz", 1 + 2.0**-22: "rne"}.get(last, f"unrecognised {last.hex()}")
    if block == 2 and n_extra == 6 and rounding == "rne":
        return "exact-products-f32-acc"
    for (arch, fmt), m in MODELS.items():
        if fmt == "bf16" and (m.block, m.extra_bits, rounding) == (block, n_extra, "rz"):
            return (f"tensor-core {arch}: bf16 {block}-product blocks, {n_extra} extra alignment bits, "
                    f"{rounding}")
    return f"unrecognised: bf16 blocks of {block or 'more than ' + str(K)}, {n_extra} extra bits, {rounding}"


def _classify(values, classes: Dict[str, tuple]) -> str:
    got = tuple(float(v) for v in np.asarray(values, dtype=np.float64).ravel())
    for name, want in classes.items():
        if got == tuple(want):
            return name
    return "unrecognised " + ", ".join(float(v).hex() for v in got)


def emulation_facts() -> EmulationFacts:
    """Probe the emulation's patched Triton interpreter builder (see the module doc). Thread-safe with the
    emulation itself (its lock); leaves the builder as it found it."""
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir

    from .bits import f32_to_bf16_bits
    from .handles import encode, real

    TH = interp.TensorHandle
    tf32_rounding, dots, ptx_arith, tensor_core = leg_defaults()
    with LOCK:
        patcher = Patcher()
        try:
            install_bf16_arithmetic(patcher)
            if ptx_arith:
                install_ptx_arithmetic(patcher)
            if dots:
                install_dot_numerics(patcher, force_dot_precision=None, tf32_rounding=tf32_rounding,
                                      tensor_core=tensor_core)
            b = interp.interpreter_builder
            P = ir.INPUT_PRECISION

            # f32 dot at TF32: [3,1] @ [1,1] of ones: each output is its operand as the tensor core sees it
            a = TH(_f32(*_TF32_PROBE).reshape(3, 1), tl.float32)
            one = TH(_f32(1.0).reshape(1, 1), tl.float32)
            acc = TH(np.zeros((3, 1), np.float32), tl.float32)
            tf32 = _classify(real(b.create_dot(a, one, acc, P.TF32, 0)), _TF32_CLASSES)

            # bf16 dots: rows [R, K] of exact bf16 values against a column of ones
            def bf16_dot(rows):
                x = TH(f32_to_bf16_bits(np.asarray(rows, np.float32)), tl.bfloat16)
                ones = TH(f32_to_bf16_bits(np.ones((rows.shape[1], 1), np.float32)), tl.bfloat16)
                zero = TH(np.zeros((rows.shape[0], 1), np.float32), tl.float32)
                return real(b.create_dot(x, ones, zero, P.TF32, 0)).astype(np.float64).ravel()

            low = _low_precision_dot(bf16_dot)

            # a * b + c: in f32, (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 fused, 0 when the product rounds first; in
            # bf16 (products and sums rounded to bf16), (1 + 2^-7)^2 - (1 + 2^-6) is 2^-14 fused, 0 otherwise
            def rounding(v, c, t, exact):
                x = TH(np.asarray(encode(_f32(v), t)), t)
                r = float(real(b.create_fadd(b.create_fmul(x, x), TH(np.asarray(encode(_f32(c), t)), t))).ravel()[0])
                return {exact: "fused", 0.0: "twice"}.get(r, f"unrecognised {r.hex()}")
            per_type = {name: rounding(v, c, t, exact) for name, v, c, t, exact in (
                ("f32", 1 + 2.0**-12, -(1 + 2.0**-11), tl.float32, 2.0**-24),
                ("bf16", 1 + 2.0**-7, -(1 + 2.0**-6), tl.bfloat16, 2.0**-14))}
            odd = [f"{name} {r}" for name, r in per_type.items() if r.startswith("unrecognised")]
            fused = [name for name, r in per_type.items() if r == "fused"]
            contraction = ("; ".join(odd) if odd else "fused " + ", ".join(fused) if fused else "none")

            def cast(values, to):
                h = b.cast_impl(TH(_f32(*values), tl.float32), to)
                return real(h)

            bf16 = _classify(cast(_BF16_PROBE, tl.bfloat16), _BF16_CLASSES)
            f16 = _classify(cast(_F16_PROBE, tl.float16), _F16_CLASSES)
            to_int = real(b.cast_impl(TH(_f32(2.75, -2.75), tl.float32), tl.int32))
            float_to_int = {(2, -2): "truncate", (3, -3): "nearest"}.get(tuple(int(v) for v in to_int),
                                                                         f"unrecognised {to_int.tolist()}")
            big = (1 << 24) + 1  # not an f32: the nearest are 2^24 and 2^24 + 2 (a tie: even is 2^24)
            from_int = real(b.cast_impl(TH(np.array([big, big + 2], np.int32), tl.int32), tl.float32))
            int_to_float = "rne" if from_int.tolist() == [2.0**24, 2.0**24 + 4] else \
                f"unrecognised {from_int.tolist()}"

            def f32_op(fn, *values):
                return float(real(fn(*(TH(_f32(v), tl.float32) for v in values))).ravel()[0])

            # 3 / 7: correctly rounded, or 3 times the correctly rounded 1/7 (two roundings, another f32)
            q = f32_op(b.create_fdiv, 3.0, 7.0)
            divide = {float(np.float32(3) / np.float32(7)): "ieee",
                      float(np.float32(3) * (np.float32(1) / np.float32(7))): "rcp"}.get(q, f"unrecognised {q.hex()}")
            # sqrt(2) correctly rounded; sqrt(2^-130) (an f32 subnormal) 2^-65, or 0 when the operand is flushed
            s2, s_tiny = f32_op(b.create_sqrt, 2.0), f32_op(b.create_sqrt, 2.0**-130)
            sqrt = (("ieee" if s2 == float(np.float32(np.sqrt(2.0))) else f"unrecognised {s2.hex()}")
                    + {2.0**-65: "", 0.0: "-ftz"}.get(s_tiny, f" unrecognised {s_tiny.hex()}"))

            # 2^-130 (an f32 subnormal) through the f32 multiply, and as exp2(-130)
            t = f32_op(b.create_fmul, 2.0**-65, 2.0**-65)
            subnormals = {2.0**-130: "kept", 0.0: "flushed"}.get(t, f"unrecognised {t.hex()}")
            e = f32_op(b.create_exp2, -130.0)
            exp2_subnormals = {2.0**-130: "kept", 0.0: "flushed"}.get(e, f"unrecognised {e.hex()}")
        finally:
            patcher.restore()
    return EmulationFacts(tf32_rounding=tf32, low_precision_dot=low, contraction=contraction, bf16_rounding=bf16,
                          f16_rounding=f16, float_to_int=float_to_int, int_to_float=int_to_float, f32_divide=divide,
                          f32_sqrt=sqrt, subnormals=subnormals, exp2_subnormals=exp2_subnormals,
                          exp_lowering=DOCUMENTED_EXP_LOWERING)
