"""The tensor-core model (harness/emulation/tensor_core.py) and the emulated tl.dot that uses it.

Three kinds of evidence:
- the GPUs' own outputs: 256 inner products per GPU and input format from the validation data Khattak and Mikaitis
  measured on V100, A100, H100, H200 and B200 (tests/data/tensor_core, see its README), reproduced bit for bit, where
  "exact products, rounded once" misses a third of them;
- hand-computed cases, each where the model and "exact then round once" differ, and each worked out in its comment;
- the emulated tl.dot (bf16, TF32, TF32x3, BF16x3) is the model of the selected generation.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from harness.emulation.tensor_core import (ARCHS, EMULATED_ARCHS, MODELS, TensorCoreModel, mma_chain, model_for,
                                           round_toward_zero_f32)

DATA = Path(__file__).resolve().parent / "data" / "tensor_core" / "validation_subset.npz"
ARCH_OF_GPU = {"V100": "sm_70", "A100": "sm_80", "H100": "sm_90", "H200": "sm_90", "B200": "sm_100"}
FLT_MAX = float(np.finfo(np.float32).max)


def _sets():
    with np.load(DATA) as z:
        return sorted({k.rsplit("_", 1)[0] for k in z.files})


def exact_then_round(a, b, c):
    """What the emulation did before this model: exact products, the K-sum in float64, one rounding to binary32."""
    with np.errstate(over="ignore"):
        return (np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)) + np.asarray(c, np.float64)
                ).astype(np.float32)


def dot(values, arch, fmt="bf16", c=0.0):
    """One output element: sum_k values[k] * 1 + c through ``arch``'s tensor core."""
    a = np.asarray(values, np.float64)[None, :]
    out = mma_chain(a, np.ones((a.shape[1], 1)), np.full((1, 1), c, np.float32), model_for(arch, fmt))
    return out[0, 0]


# ---------------------------------------------------------------- the GPUs' own outputs


@pytest.mark.parametrize("name", _sets())
def test_the_model_reproduces_the_gpus_measured_inner_products(name):
    gpu, fmt = name.split("_")
    with np.load(DATA) as z:
        a, b = z[f"{name}_a"].view(np.float32), z[f"{name}_b"].view(np.float32)
        c, d = z[f"{name}_c"].view(np.float32), z[f"{name}_d"].view(np.uint32)
    got = mma_chain(a[:, None, :], b[:, :, None], c[:, None, None], model_for(ARCH_OF_GPU[gpu], fmt))[:, 0, 0]
    bad = np.flatnonzero(got.view(np.uint32) != d)
    assert bad.size == 0, f"{name}: {bad.size} of {d.size} differ from the GPU, first row {bad[:1]}"
    # the data tells the models apart: exact products rounded once miss many of these rows
    once = exact_then_round(a[:, None, :], b[:, :, None], c[:, None, None])[:, 0, 0]
    assert (once.view(np.uint32) != d).sum() > d.size // 10


def test_every_generation_and_format_of_the_paper_is_tested_on_gpu_data():
    tested = {(ARCH_OF_GPU[n.split("_")[0]], n.split("_")[1]) for n in _sets()}
    assert tested == set(MODELS)
    assert EMULATED_ARCHS == ("sm_80", "sm_90", "sm_100") and ARCHS[0] == "sm_70"


# ---------------------------------------------------------------- hand-computed


def test_small_terms_are_truncated_at_the_blocks_alignment():
    """H100, bf16: 1 and fifteen x = 1.5 * 2^-25 in one 16-product block. The grid is 2^(0 - 23 - 2) = 2^-25, so
    each x keeps 2^-25 and loses 2^-26: 1 + 15 * 2^-25 = 1 + 3.75 * 2^-23, toward zero 1 + 3 * 2^-23. Exact and
    rounded once: 1 + 22.5 * 2^-25 = 1 + 5.625 * 2^-23 -> 1 + 6 * 2^-23."""
    x = 1.5 * 2.0**-25
    values = [1.0] + [x] * 15
    assert dot(values, "sm_90") == 1 + 3 * 2.0**-23
    assert exact_then_round(np.array([values]), np.ones((16, 1)), 0.0)[0, 0] == 1 + 6 * 2.0**-23


def test_a_term_below_the_grid_vanishes_even_when_the_exact_sum_is_representable():
    """1 - 1 + 2^-30 in one block: aligned to E = 0, 2^-30 is below every generation's grid (2^-23 .. 2^-25) and
    is cut to 0; the exact sum 2^-30 is a binary32 number."""
    for arch in EMULATED_ARCHS:
        assert dot([1.0, -1.0, 2.0**-30], arch) == 0.0
    assert exact_then_round(np.array([[1.0, -1.0, 2.0**-30]]), np.ones((3, 1)), 0.0)[0, 0] == 2.0**-30


@pytest.mark.parametrize("arch, block", [("sm_80", 8), ("sm_90", 16), ("sm_100", 16)])
def test_the_block_size_is_where_the_alignment_starts_afresh(arch, block):
    """1 - 1 at k = 0, 1 and 2^-30 at k: in the same block 2^-30 is lost (above); in the next block it meets a +0
    accumulator that sets no exponent, and is kept."""
    for k, want in ((block - 1, 0.0), (block, 2.0**-30)):
        values = np.zeros(2 * block)
        values[[0, 1, k]] = 1.0, -1.0, 2.0**-30
        assert dot(values, arch) == want, (arch, k)
    # V100 (fp16, 4-product blocks, no extra bit): 2^-24 is fp16's least subnormal, half of the grid 2^-23
    assert dot([1.0, -1.0, 0.0, 2.0**-24], "sm_70", "fp16") == 0.0
    assert dot([1.0, -1.0, 0.0, 0.0, 2.0**-24], "sm_70", "fp16") == 2.0**-24


def test_the_accumulator_is_truncated_like_a_product():
    """The running accumulator is one more term of the next block: 2^-30 carried from block 1 (or given as C) meets
    1 - 1 in block 2, aligned to E = 0, and is cut to 0."""
    values = np.zeros(32)
    values[[0, 16, 17]] = 2.0**-30, 1.0, -1.0
    assert dot(values, "sm_90") == 0.0
    assert dot([1.0, -1.0], "sm_90", c=2.0**-30) == 0.0
    assert dot([2.0**-30], "sm_90", c=0.0) == 2.0**-30  # alone, nothing is lost


def test_the_extra_alignment_bits_per_generation():
    """1 - 1 + 2^-(23+n) in one block keeps 2^-(23+n) exactly when n <= the extra bits (A100 1, H100 2)."""
    for arch, extra in (("sm_80", 1), ("sm_90", 2)):
        kept = [dot([1.0, -1.0, 2.0**-(23 + n)], arch) != 0 for n in (1, 2, 3)]
        assert kept == [n <= extra for n in (1, 2, 3)], arch


def test_the_result_is_rounded_toward_zero():
    """1 + 1.5 * 2^-23 lies on the grid (1.5 * 2^-23 = 3 * 2^-24): exact in the block, then normalised to 24 bits
    toward zero: 1 + 2^-23 (nearest-even would give 1 + 2^-22); the negative mirror goes toward zero too."""
    assert dot([1.0, 1.5 * 2.0**-23], "sm_90") == 1 + 2.0**-23
    assert dot([-1.0, -1.5 * 2.0**-23], "sm_80") == -(1 + 2.0**-23)
    assert exact_then_round(np.array([[1.0, 1.5 * 2.0**-23]]), np.ones((2, 1)), 0.0)[0, 0] == 1 + 2.0**-22


def test_overflow_subnormals_and_zero():
    """FLT_MAX + 2^103 (half its ulp): toward zero FLT_MAX, where nearest-even gives Inf; 2^127 * 2 = 2^128 is
    Inf. 1.5 * 2^-149 (a bf16 product 1.5 * 2^-100 * 2^-49) truncates to the least subnormal 2^-149 (nearest-even:
    2^-148). An exact zero sum is +0, also from -0 operands."""
    assert dot([2.0**103], "sm_90", c=FLT_MAX) == np.float32(FLT_MAX)
    assert np.isinf(exact_then_round(np.array([[2.0**103]]), np.ones((1, 1)), FLT_MAX)[0, 0])
    assert dot([2.0**127, 2.0**127], "sm_90") == np.inf
    tiny = mma_chain(np.array([[1.5 * 2.0**-100]]), np.array([[2.0**-49]]), np.zeros((1, 1), np.float32),
                     model_for("sm_90", "bf16"))[0, 0]
    assert tiny == 2.0**-149
    for z in (dot([1.0, -1.0], "sm_90"), dot([0.0], "sm_90", c=-0.0), dot([-0.0], "sm_90", c=-0.0)):
        assert z == 0 and not np.signbit(z)


def test_the_alignment_exponent_has_a_floor():
    """H100 bf16: products 2^-149 (2^-100 * 2^-49) and -1.5 * 2^-160 (-1.5 * 2^-100 * 2^-60). E is not -149 but the
    floor -133, so the grid is 2^-158 and the second product (0.375 of a unit) is cut to 0: 2^-149. Without the
    floor (grid 2^-174) it would be kept and the sum, just under 2^-149, truncates to 0."""
    import dataclasses

    a, b = np.array([[2.0**-100, -1.5 * 2.0**-100]]), np.array([[2.0**-49], [2.0**-60]])
    m = model_for("sm_90", "bf16")
    assert mma_chain(a, b, np.zeros((1, 1), np.float32), m)[0, 0] == 2.0**-149
    floorless = dataclasses.replace(m, min_align_exponent=-1024)
    assert mma_chain(a, b, np.zeros((1, 1), np.float32), floorless)[0, 0] == 0.0


def test_special_values_follow_the_papers_gemm():
    """Over the whole K and C: a NaN operand, 0 * Inf, or +Inf meeting -Inf is NaN; one infinity wins over finite
    terms (also across blocks)."""
    assert np.isnan(dot([np.nan, 1.0], "sm_90"))
    assert np.isnan(mma_chain(np.array([[0.0]]), np.array([[np.inf]]), np.zeros((1, 1), np.float32),
                              model_for("sm_90", "bf16"))[0, 0])
    assert np.isnan(dot([np.inf, -np.inf], "sm_90"))
    assert np.isnan(dot([np.inf], "sm_90", c=-np.inf))
    values = np.zeros(40)
    values[[0, 30]] = -np.inf, 5.0
    assert dot(values, "sm_90") == -np.inf
    assert np.isnan(dot([1.0], "sm_90", c=np.nan))
    # a finite chain that overflows in block 1 stays infinite in block 2
    values = np.zeros(32)
    values[[0, 1, 16]] = 2.0**127, 2.0**127, -1.0
    assert dot(values, "sm_90") == np.inf


# ---------------------------------------------------------------- vectorised = one element at a time


def test_the_vectorised_chain_equals_one_element_at_a_time():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((3, 5, 40)) * 2.0 ** rng.integers(-20, 20, (3, 5, 40))).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, 40, 4)).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((3, 5, 4)).astype(np.float32)
    for arch in EMULATED_ARCHS:
        m = model_for(arch, "bf16")
        got = mma_chain(a.astype(np.float64), b.astype(np.float64), c, m)
        assert got.dtype == np.float32 and got.shape == (3, 5, 4)
        one = np.array([[[mma_chain(a[p, i:i + 1].astype(np.float64), b[p, :, j:j + 1].astype(np.float64),
                                    c[p, i:i + 1, j:j + 1], m)[0, 0] for j in range(4)] for i in range(5)]
                        for p in range(3)])
        assert np.array_equal(got.view(np.uint32), one.view(np.uint32))
        # slabs of the batch (a small memory cap) and a broadcast operand give the same bits
        small = mma_chain(a.astype(np.float64), b[:1].astype(np.float64), c, m, max_elements=64)
        assert np.array_equal(small, mma_chain(a.astype(np.float64), np.broadcast_to(b[:1], b.shape).astype(
            np.float64), c, m))
        assert not np.array_equal(got, exact_then_round(a, b, c))  # the data exercises the truncation


def _one_element(a, b, c, m: TensorCoreModel) -> float:
    """The module doc's model for one element, written again term by term in Python integers (no shortcut)."""
    import math

    emin = {"fp16": -14, "bf16": -126, "tf32": -126}[m.in_format]

    def exponent(x, least):
        return max(math.frexp(x)[1] - 1, least)

    for k0 in range(0, len(a), m.block):
        terms = [(x * y, exponent(x, emin) + exponent(y, emin)) for x, y in zip(a[k0:k0 + m.block], b[k0:k0 + m.block])
                 if x != 0 and y != 0]
        if c != 0:
            terms.append((c, exponent(c, -126)))
        if not terms:
            c = 0.0
            continue
        E = max([e for _, e in terms] + [m.min_align_exponent])
        unit = 2.0 ** (E - 23 - m.extra_bits)
        total = sum(math.trunc(t / unit) for t, _ in terms)  # exact: t / unit is a power-of-two scaling
        c = float(round_toward_zero_f32(np.array([total * unit]))[0]) if total else 0.0
    return c


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "tf32"])
@pytest.mark.parametrize("spread", [12, 0])
def test_the_vectorised_chain_equals_the_model_written_term_by_term(fmt, spread):
    """Random operands with exponents spread over 2^+-12 (most elements cut some product: the dense path) or
    normal (a few do: the exact-sum shortcut and the gathered path), K = 40 (two and a half 16-blocks, five
    8-blocks): mma_chain against ``_one_element``, every generation."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    dtype = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "tf32": np.float32}[fmt]
    a = (rng.standard_normal((2, 6, 40)) * 2.0 ** rng.integers(-spread, spread + 1, (2, 6, 40))
         ).astype(dtype).astype(np.float64)
    b = (rng.standard_normal((2, 40, 7)) * 2.0 ** rng.integers(-spread, spread + 1, (2, 40, 7))
         ).astype(dtype).astype(np.float64)
    if fmt == "tf32":
        from harness.emulation.bits import round_to_tf32

        a, b = (round_to_tf32(x.astype(np.float32)).astype(np.float64) for x in (a, b))
    a[0, 0, :5] = 0.0  # zero products take no part
    c = rng.standard_normal((2, 6, 7)).astype(np.float32)
    for arch in EMULATED_ARCHS:
        m = model_for(arch, fmt)
        got = mma_chain(a, b, c, m)
        want = np.array([[[_one_element(list(a[p, i]), list(b[p, :, j]), float(c[p, i, j]), m) for j in range(7)]
                          for i in range(6)] for p in range(2)], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), arch


def test_round_toward_zero_f32():
    v = np.array([1 + 2.0**-24, -(1 + 2.0**-24), 1 + 3 * 2.0**-24, 1.5 * 2.0**-149, 2.0**128, -2.0**129, 0.0])
    want = [1.0, -1.0, 1 + 2.0**-23, 2.0**-149, np.inf, -np.inf, 0.0]
    assert round_toward_zero_f32(v).tolist() == want


def test_bad_parameters_and_shapes_are_one_line_errors():
    with pytest.raises(ValueError, match="no tensor-core model for arch='sm_70' in_format='bf16'"):
        model_for("sm_70", "bf16")
    with pytest.raises(ValueError, match="block=3 must divide"):
        TensorCoreModel("sm_x", "X", "bf16", 3, 1, -132, "mma", 16)
    with pytest.raises(ValueError, match="do not contract"):
        mma_chain(np.ones((2, 3)), np.ones((4, 2)), np.zeros((2, 2)), model_for("sm_90", "bf16"))


# ---------------------------------------------------------------- the emulated tl.dot


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch")
                                  is None, reason="the emulated tl.dot needs triton and torch (the gpu or cpu extra)")


@pytest.fixture(scope="module")
def interp():
    from harness.emulation import triton_interpreter as emu

    if not emu.native_cuda_available():
        emu.enable_interpreter_mode()
    import torch
    import triton
    import triton.language as tl

    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True

        @triton.jit
        def kernel(A, B, C, O, N: tl.constexpr, PREC: tl.constexpr):
            r = tl.arange(0, N)
            offs = r[:, None] * N + r[None, :]
            acc = tl.load(C + offs)
            tl.store(O + offs, tl.dot(tl.load(A + offs), tl.load(B + offs), acc, input_precision=PREC))

    def run(a, b, c, prec="tf32", **kw):
        a, b, c = (torch.as_tensor(x) for x in (a, b, c))
        o = torch.empty(c.shape, dtype=torch.float32)
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            with emu.triton_emulation(**kw):
                kernel[(1,)](a, b, c, o, N=a.shape[0], PREC=prec)
        return o.numpy()

    return run, torch


@needs_triton
def test_the_emulated_bf16_dot_is_the_selected_generations_tensor_core(interp):
    """Row 0 of A: 1, -1 and 2^-30 at k = 8: one block on an H100 (2^-30 lost), two on an A100 (kept); every other
    element is the model's too, with the dot's acc as the first C."""
    run, torch = interp
    rng = np.random.default_rng(3)
    a = torch.from_numpy(rng.standard_normal((16, 16)).astype(np.float32)).to(torch.bfloat16)
    a[0] = 0
    a[0, [0, 1, 8]] = torch.tensor([1.0, -1.0, 2.0**-30]).to(torch.bfloat16)
    b = torch.from_numpy(rng.standard_normal((16, 16)).astype(np.float32)).to(torch.bfloat16)
    b[:, 0] = 1
    c = rng.standard_normal((16, 16)).astype(np.float32)
    c[0, 0] = 0
    A, B = a.float().double().numpy(), b.float().double().numpy()
    for arch, first in (("sm_90", 0.0), (None, 0.0), ("sm_80", 2.0**-30)):
        got = run(a, b, c) if arch is None else run(a, b, c, tensor_core=arch)
        assert got[0, 0] == first, arch
        want = mma_chain(A, B, c, model_for(arch or "sm_90", "bf16"))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), arch
    with pytest.raises(ValueError, match="tensor_core must be one of"):
        run(a, b, c, tensor_core="sm_70")


@needs_triton
def test_the_emulated_tf32_paths_chain_the_tensor_core(interp):
    """TF32: operands truncated to TF32, then the model (8-product blocks on sm_90). TF32x3 as Triton 3.9 compiles
    it: small_a.big_b from 0, + big_a.small_b, NaN -> 0, + big_a.big_b, then the acc in one f32 add."""
    run, _ = interp
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    from harness.emulation.bits import round_to_tf32

    m = model_for("sm_90", "tf32")
    want = mma_chain(round_to_tf32(a), round_to_tf32(b), c, m)
    assert np.array_equal(run(a, b, c, "tf32"), want)
    ab, bb = round_to_tf32(a, "rna"), round_to_tf32(b, "rna")
    asm, bsm = a - ab, b - bb
    p1 = mma_chain(round_to_tf32(asm), bb, np.zeros_like(c), m)
    p2 = mma_chain(ab, round_to_tf32(bsm), p1, m)
    want3 = (mma_chain(ab, bb, p2, m).astype(np.float64) + c).astype(np.float32)
    assert np.array_equal(run(a, b, c, "tf32x3"), want3)
    assert not np.array_equal(want3, exact_then_round(a, b, c))


@needs_triton
def test_the_emulated_bf16x3_adds_the_acc_after_its_passes(interp):
    """BF16x3 of x = 1 + 2^-10 + 2^-20 (pieces 1, 2^-10, 2^-20) against ones, acc = -1: the passes give
    1 + 2^-10 (the third piece is dropped), then the f32 add of -1: 2^-10."""
    run, _ = interp
    x = 1.0 + 2.0**-10 + 2.0**-20
    a = (np.eye(16) * x).astype(np.float32)
    got = run(a, np.ones((16, 16), np.float32), np.full((16, 16), -1.0, np.float32), "bf16x3")
    assert np.all(got == 2.0**-10)
