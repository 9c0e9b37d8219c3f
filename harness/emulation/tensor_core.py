"""tl.dot as an NVIDIA tensor core computes it: the bit-accurate block-FMA model of Khattak and Mikaitis.

Reference: F. A. Khattak and M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004 (2025), ACM
TACO; its models and GPU-measured validation data are published as north-numerical-computing/MATLAB-tensor-core
(BSD-2-Clause): ``models/{V100,A100,H100,B200}TC.m`` hold the per-GPU parameters, ``models/tools/GEMM.m`` the
chaining of blocks and ``models/tools/Generic_BFMA_TC.m`` one block. This module is our own numpy statement of that
model for the formats fla's kernels feed the tensor cores (fp16, bf16, TF32 inputs; binary32 accumulator and output).

The model (one output element; every element of ``D = C + A @ B`` is independent)
--------------------------------------------------------------------------------
K is cut into consecutive blocks of ``block`` products (the paper's "FMA size": the number of products a tensor
core adds before it normalises). Block after block, with ``c`` the running binary32 accumulator (the caller's C
first)::

    d = block_fma(a[k0:k0+block], b[k0:k0+block], c);  c = d

``block_fma``:

1. **Products are exact** and not normalised: ``a = sa * 2^ea`` with ``ea = max(floor(log2|a|), emin_in)``
   (``emin_in`` the input format's least normal exponent: fp16 -14, bf16/TF32 -126, so subnormals keep their
   exponent and a significand below 1), likewise ``b``; the product's alignment exponent is ``ea + eb`` and its
   significand ``sa * sb`` lies in [1, 4) (two integer bits: the paper's carry bits). A zero product takes no
   part (it sets no exponent). ``c``'s exponent is ``max(floor(log2|c|), -126)``; ``c = 0`` takes no part.
2. **One alignment to the largest exponent** ``E`` of the block's products and ``c`` (never below
   ``min_align_exponent``: the MATLAB models' ``min_exp_limit``). Every term is cut to the grid
   ``2^(E - 23 - extra_bits)``: 23 fraction bits of the binary32 output plus the paper's extra alignment bits
   (``neab``), **truncated** (magnitude rounded toward zero, no guard or sticky bit): a term far below ``E`` loses
   bits, or vanishes, even where its exact sum with the others is representable.
3. **The aligned terms are added exactly** (a fixed-point sum: no rounding inside the block).
4. **Normalised once and rounded toward zero** to binary32 (``frmode = 'rz'`` for a binary32 output; subnormal
   results are kept, truncated on the 2^-149 grid). A sum of exactly zero is +0. A result of magnitude 2^128 or
   more is +-Inf.

Special values follow ``GEMM.m``, over the whole K and the initial C: a NaN operand or product (``0 * Inf``) gives
NaN; +Inf and -Inf among the products and C give NaN; else an infinite product or C gives that infinity. A finite
chain that overflows in one block carries the infinity on as IEEE addition does (the MATLAB model feeds the bits of
Inf back as a number there; the GPU data does not cover it).

Parameters per GPU generation and input format (``MODELS``; ``models/*TC.m`` for binary32 output)
------------------------------------------------------------------------------------------------
=======  ======  ==============================  =====  ==========  ===================
arch     GPU     formats                         block  extra bits  min align exponent
=======  ======  ==============================  =====  ==========  ===================
sm_70    V100    fp16                            4      0           (none: -1024)
sm_80    A100    fp16, bf16 / TF32               8 / 4  1           -132
sm_90    H100    fp16, bf16 / TF32               16 / 8 2           -133
sm_100   B200    fp16, bf16 / TF32               16 / 8 2           -133
=======  ======  ==============================  =====  ==========  ===================

How Triton issues the products (what the PTX check holds the model to): on sm_90 a bf16/fp16 ``tl.dot`` becomes
``wgmma.mma_async ... k16`` (one 16-product block per instruction) where the tile allows it and otherwise
``mma.sync.aligned.m16n8k16`` (128 of the 136 smoke kernels with a bf16 dot: reports/tensor-core), a TF32 one
``wgmma ... k8`` or ``mma.sync ... m16n8k8``; on sm_80 ``m16n8k16`` (two 8-product blocks) and ``m16n8k8`` for TF32
(two 4-product blocks). Instructions follow K in order, each taking the previous one's D as its C, so the chain
above is the instruction sequence whatever the instruction's k, as long as it is a multiple of the block. The paper
measured A100/H100/B200 through ``wmma`` (``mma.sync``) and, for fp8 on Hopper, ``wgmma``; that bf16/fp16/TF32
``wgmma`` adds its 16 (8) products as ``mma.sync`` does is this module's assumption. The validation data does not
exercise the alignment exponent's floor (held by a hand-computed test) nor, its vectors having K = 4, the TF32
block of sm_90/sm_100.

Not modelled: binary16 outputs (the RNE final rounding of ``*TC.m`` with fp16 C/D; fla's dots accumulate in
binary32) and fp8 inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import numpy as np

FORMATS = ("fp16", "bf16", "tf32")
# the least normal exponent of each input format (binary16: 1 - 15; bfloat16 and TF32 share binary32's 8 exponent
# bits: 1 - 127), and its number of fraction bits
_EMIN_IN = {"fp16": -14, "bf16": -126, "tf32": -126}
_FRACTION_BITS = {"fp16": 10, "bf16": 7, "tf32": 10}
_EMIN_OUT = -126  # binary32
_OUT_FRACTION_BITS = 23  # binary32
_NO_EXPONENT = -(1 << 20)  # a zero operand's exponent: below every real one, so it never sets E


@dataclasses.dataclass(frozen=True)
class TensorCoreModel:
    """One generation's tensor core for one input format, binary32 accumulator (see the module doc's table)."""

    arch: str  # "sm_90"
    gpu: str  # the GPU the paper measured: "H100"
    in_format: str  # "fp16" | "bf16" | "tf32"
    block: int  # products added per normalisation (the paper's FMA size; MATLAB ``fma``)
    extra_bits: int  # alignment bits kept below binary32's 23 fraction bits (the paper's n_eab; MATLAB ``neab``)
    min_align_exponent: int  # the alignment exponent E is never below this (MATLAB ``min_exp_limit``)
    instruction: str  # the PTX instruction Triton issues for such a dot on this arch (what ``parity ptx`` expects)
    instruction_k: int  # its k: a multiple of ``block``

    def __post_init__(self):
        if self.in_format not in FORMATS:
            raise ValueError(f"in_format={self.in_format!r} must be one of {FORMATS}")
        if self.block <= 0 or self.instruction_k % self.block:
            raise ValueError(f"block={self.block} must divide instruction_k={self.instruction_k}")
        if self.extra_bits < 0:
            raise ValueError(f"extra_bits={self.extra_bits} must be >= 0 for a binary32 output")

    def describe(self) -> str:
        """One line naming the model: what ``gpu_model``'s fact reports and the PTX rows print."""
        return (f"{self.arch} ({self.gpu}) {self.in_format}: {self.block}-product blocks, "
                f"{self.extra_bits} extra alignment bits, truncated, binary32 RZ; {self.instruction} "
                f"k{self.instruction_k}")


def _models() -> Dict[Tuple[str, str], TensorCoreModel]:
    rows = (
        # arch, gpu, format, block, extra bits, min align exponent, instruction, its k
        ("sm_70", "V100", "fp16", 4, 0, -1024, "mma.sync.aligned.m8n8k4", 4),
        ("sm_80", "A100", "fp16", 8, 1, -132, "mma.sync.aligned.m16n8k16", 16),
        ("sm_80", "A100", "bf16", 8, 1, -132, "mma.sync.aligned.m16n8k16", 16),
        ("sm_80", "A100", "tf32", 4, 1, -132, "mma.sync.aligned.m16n8k8", 8),
        ("sm_90", "H100", "fp16", 16, 2, -133, "wgmma.mma_async", 16),
        ("sm_90", "H100", "bf16", 16, 2, -133, "wgmma.mma_async", 16),
        ("sm_90", "H100", "tf32", 8, 2, -133, "wgmma.mma_async", 8),
        ("sm_100", "B200", "fp16", 16, 2, -133, "tcgen05.mma", 16),
        ("sm_100", "B200", "bf16", 16, 2, -133, "tcgen05.mma", 16),
        ("sm_100", "B200", "tf32", 8, 2, -133, "tcgen05.mma", 8),
    )
    return {(r[0], r[2]): TensorCoreModel(*r) for r in rows}


MODELS: Dict[Tuple[str, str], TensorCoreModel] = _models()
ARCHS = tuple(dict.fromkeys(arch for arch, _ in MODELS))
EMULATED_ARCHS = tuple(arch for arch in ARCHS if all((arch, f) in MODELS for f in FORMATS))
"""The generations the emulated GPU leg can model: those with every input format (V100 has fp16 only)."""
DEFAULT_ARCH = "sm_90"
"""The generation the emulated GPU leg models unless told otherwise (``triton_emulation(tensor_core=...)``)."""


def model_for(arch: str, in_format: str) -> TensorCoreModel:
    try:
        return MODELS[(arch, in_format)]
    except KeyError:
        have = sorted({f for a, f in MODELS if a == arch})
        raise ValueError(f"no tensor-core model for arch={arch!r} in_format={in_format!r}"
                         + (f" (that arch has {have})" if have else f" (archs: {ARCHS})")) from None


def _exponents(x: np.ndarray, emin: int) -> np.ndarray:
    """``max(floor(log2|x|), emin)`` per element as int32; zeros get an exponent below every real one."""
    _, e = np.frexp(x)  # |x| = m * 2^e, m in [0.5, 1)
    e = np.maximum(e.astype(np.int32) - 1, np.int32(emin))
    e[x == 0] = _NO_EXPONENT
    return e


def round_toward_zero_f32(v: np.ndarray) -> np.ndarray:
    """float64 values -> binary32, rounded toward zero (subnormals kept); ``|v| >= 2^128`` -> +-Inf as in the
    paper's model (a carry out of the largest binade)."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    # binary32 keeps 23 of binary64's 52 fraction bits: clearing the other 29 truncates (the conversion is then
    # exact); below 2^-126 binary32's grid is the fixed 2^-149
    r = (v.view(np.uint64) & np.uint64(~((1 << 29) - 1) & (2**64 - 1))).view(np.float64)
    tiny = np.abs(v) < 2.0**-126
    if tiny.any():
        r = np.where(tiny, np.trunc(v * 2.0**149) * 2.0**-149, r)
    with np.errstate(over="ignore"):
        return r.astype(np.float32)


def _block_fma(a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray, c: np.ndarray,
               model: TensorCoreModel) -> np.ndarray:
    """One block: ``a`` [..., M, kb], ``b`` [..., kb, N] (float64, finite), ``c`` [..., M, N] (float64 holding
    binary32 values, finite) -> binary32 [..., M, N]. ``ea``/``eb``: the operands' exponents (``_exponents``).

    The truncation of step 2 is the identity on a product whose lowest bit lies on the grid: a product of exponent
    ``e`` has ``2f`` fraction bits (``f`` the input format's), so it is cut only when ``E - e > 23 + extra - 2f``.
    Where no product is cut, their exact sum (a float64 matmul: every term a multiple of the grid, the sum below
    2^32 grid units) plus the cut ``c`` is the block's sum; the elements where some product is cut take the
    term-by-term path (all elements at once where most are cut). All are the model; the first is only faster."""
    e = ea[..., :, :, None] + eb[..., None, :, :]  # [..., M, kb, N]: each product's alignment exponent
    E = e.max(axis=-2)
    E = np.maximum(E, _exponents(c, _EMIN_OUT))
    E = np.maximum(E, np.int32(model.min_align_exponent))
    # one unit of the grid is 2^(E - 23 - extra_bits): scale so that it is 1 and truncate (trunc keeps the sign:
    # the magnitude goes toward zero). Powers of two: every scaling is exact in float64.
    scale = np.ldexp(1.0, (_OUT_FRACTION_BITS + model.extra_bits) - E)  # [..., M, N]
    c_cut = np.trunc(c * scale)
    product_slack = _OUT_FRACTION_BITS + model.extra_bits - 2 * _FRACTION_BITS[model.in_format]
    if product_slack < 8:  # fp16 / TF32 products (20 fraction bits): nearly every element cuts one
        return _finish(_grid_sum(a, ea, b, eb, E, scale) + c_cut, scale)
    far = np.int32(-_NO_EXPONENT)  # a zero operand's exponent for the least one: zero products take no part
    e_least = (np.where(ea == _NO_EXPONENT, far, ea)[..., :, :, None]
               + np.where(eb == _NO_EXPONENT, far, eb)[..., None, :, :]).min(axis=-2)
    cut = E - e_least > product_slack
    share = np.count_nonzero(cut) / max(1, cut.size)
    if share > 0.25:  # most elements cut a product: every term through the grid at once (broadcast, no gather)
        return _finish(_grid_sum(a, ea, b, eb, E, scale) + c_cut, scale)
    total = np.matmul(a, b) * scale + c_cut  # the sum in grid units: exact where no product is cut
    if share:
        where = np.nonzero(cut)
        lead, i, j = where[:-2], where[-2], where[-1]
        s = scale[where]
        terms = a[lead + (i, slice(None))] * b[lead + (slice(None), j)]  # [F, kb]
        terms *= s[:, None]
        np.trunc(terms, out=terms)
        total[where] = terms.sum(axis=-1) + c_cut[where]
    return _finish(total, scale)


def _grid_sum(a, ea, b, eb, E, scale) -> np.ndarray:
    """sum_k trunc(a_k b_k * scale) for every element: the products cut to the grid, in grid units (float64).

    In float32 where that is exact: a product (<= 22 significant bits) is exact below 2^128 (operand exponents
    summing to at most 125) unless it is subnormal, and then, with E >= -100, its scaled value is below 1/2 and
    truncates to 0 however it was rounded; the scale 2^(25 - E) is then a float32 too. Else in float64."""
    if E.min() >= -100 and ea.max() + eb.max() <= 125:
        a, b, scale = a.astype(np.float32), b.astype(np.float32), scale.astype(np.float32)
    terms = a[..., :, :, None] * b[..., None, :, :]  # [..., M, kb, N]
    terms *= scale[..., :, None, :]
    np.trunc(terms, out=terms)
    # integers below 2^(26 + extra_bits) each, at most 16 of them: the float64 sum is exact in any order
    return terms.sum(axis=-2, dtype=np.float64)


def _finish(total: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The block's sum in grid units -> binary32, normalised and rounded toward zero; an exact zero sum is +0."""
    d = round_toward_zero_f32(total / scale)
    return np.where(total == 0, np.float32(0), d)


def _specials(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """``GEMM.m``'s rule for non-finite operands over the whole K: (value, where) for the elements it decides, or
    None when every operand is finite. NaN if any product or C is NaN (``0 * Inf`` included) or +Inf and -Inf
    meet; else the infinity present."""
    if np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(c).all():
        return None
    with np.errstate(invalid="ignore"):
        p = a[..., :, :, None] * b[..., None, :, :]  # [..., M, K, N]
    nan = np.isnan(p).any(axis=-2) | np.isnan(c)
    pos = (p == np.inf).any(axis=-2) | (c == np.inf)
    neg = (p == -np.inf).any(axis=-2) | (c == -np.inf)
    value = np.where(nan | (pos & neg), np.nan, np.where(pos, np.inf, -np.inf))
    return value, nan | pos | neg


def mma_chain(a: np.ndarray, b: np.ndarray, c: np.ndarray, model: TensorCoreModel,
              max_elements: int = 1 << 22) -> np.ndarray:
    """``D = C + A @ B`` as one chain of tensor-core instructions computes it (the module doc's model).

    a: [..., M, K], b: [..., K, N] with values exactly representable in ``model.in_format`` (the caller rounds them:
    bf16/fp16 storage, or f32 reduced to TF32); c: [..., M, N] binary32 (the first accumulator); leading axes
    broadcast as in ``np.matmul``. Returns binary32 [..., M, N]. Work is vectorised over every output element; the
    loop runs over K blocks, and over slabs of the leading axes so that no temporary exceeds ``max_elements``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"mma_chain: a{a.shape} @ b{b.shape} do not contract")
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    c = np.broadcast_to(np.asarray(c, dtype=np.float32), lead + (M, N)).astype(np.float64)
    a = np.broadcast_to(a, lead + (M, K)).reshape((-1, M, K))
    b = np.broadcast_to(b, lead + (K, N)).reshape((-1, K, N))
    c = c.reshape((-1, M, N))
    if N < M:  # every product is a_mk b_kn either way: put the longer output axis innermost (faster broadcasts)
        t = (lambda x: np.ascontiguousarray(np.swapaxes(x, -1, -2)))
        return mma_chain(t(b), t(a), t(c).astype(np.float32),
                         model, max_elements).swapaxes(-1, -2).reshape(lead + (M, N))
    special = _specials(a, b, c)
    if special is not None:  # compute the finite chain on finite stand-ins, then overrule where GEMM.m says
        a, b, c = (np.where(np.isfinite(x), x, 0.0) for x in (a, b, c))
    out = np.empty(c.shape, dtype=np.float32)
    kb = model.block
    slab = max(1, max_elements // max(1, M * min(kb, K) * N))
    emin = _EMIN_IN[model.in_format]
    for s in range(0, c.shape[0], slab):
        A, B = a[s:s + slab], b[s:s + slab]
        eA, eB = _exponents(A, emin), _exponents(B, emin)
        acc = c[s:s + slab]
        for k0 in range(0, K, kb):
            d = _block_fma(A[..., k0:k0 + kb], eA[..., k0:k0 + kb], B[..., k0:k0 + kb, :], eB[..., k0:k0 + kb, :],
                           np.where(np.isfinite(acc), acc, 0.0), model)
            # an accumulator that overflowed stays infinite (inf - inf: NaN), as IEEE addition would carry it
            acc = np.where(np.isfinite(acc), d.astype(np.float64), acc + d)
        out[s:s + slab] = acc.astype(np.float32)
    if special is not None:
        value, where = special
        out = np.where(where, value.astype(np.float32), out)
    return out.reshape(lead + (M, N))
