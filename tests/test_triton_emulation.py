"""Tests for harness.emulation.triton_interpreter (Triton interpreter fixes).

Kernels here are tiny; every expected value is computed by hand or from
float64 numpy on the exact input values.
"""

import importlib.util
import os

import numpy as np
import pytest

# the GPU leg's frameworks: a TPU-side install (the tpu extra, no torch nor triton) skips this module. triton is
# looked for, not imported: imported before harness.emulation sets the interpreter up, triton.language's own
# @jit helpers would be compiled-mode functions, which no interpreted kernel can call.
if importlib.util.find_spec("triton") is None:
    pytest.skip("the Triton interpreter tests need triton (the gpu or cpu extra)", allow_module_level=True)
torch = pytest.importorskip("torch", reason="the Triton interpreter tests need torch (the gpu or cpu extra)")

from harness.emulation import autotune, setup  # noqa: E402
from harness.emulation import triton_interpreter as emu  # noqa: E402
from harness.emulation.triton_interpreter import (bf16_bits_to_f32, f32_to_bf16_bits, pinned_autotune,  # noqa: E402
                                                  round_to_tf32, triton_emulation)

if not emu.native_cuda_available():
    # No GPU: the GPU leg can only run interpreted; do what the leg does.
    emu.enable_interpreter_mode()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402


def _ijit(fn):
    """Interpreted kernel regardless of the process mode (for CUDA machines)."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@pytest.fixture(autouse=True)
def _interp_mode(monkeypatch):
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    with triton.knobs.runtime.scope(), triton.knobs.language.scope():
        triton.knobs.runtime.interpret = True
        yield


# ---------------------------------------------------------------- kernels


@_ijit
def _axb_plus_a(A, B, O, N: tl.constexpr):
    o = tl.arange(0, N)
    a = tl.load(A + o)
    b = tl.load(B + o)
    tl.store(O + o, a * b + a)


@_ijit
def _add(A, B, O, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(O + o, tl.load(A + o) + tl.load(B + o))


@_ijit
def _mul(A, B, O, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(O + o, tl.load(A + o) * tl.load(B + o))


@_ijit
def _cast(X, O, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(O + o, tl.load(X + o).to(O.dtype.element_ty))


@_ijit
def _sum_max(X, S, M, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(X + o)
    tl.store(S, tl.sum(x, axis=0))
    tl.store(M, tl.max(x, axis=0))


@_ijit
def _dot(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    offs = r[:, None] * N + r[None, :]
    tl.store(C + offs, tl.dot(tl.load(A + offs), tl.load(B + offs)))


@_ijit
def _dot_ieee(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    offs = r[:, None] * N + r[None, :]
    tl.store(C + offs, tl.dot(tl.load(A + offs), tl.load(B + offs), input_precision="ieee"))


@_ijit
def _loop_var(O, NT):
    acc = tl.zeros([1], dtype=tl.int64)
    for i_t in range(NT):
        acc += i_t.to(tl.int64) * 4294967296  # needs int64 arithmetic
    for j in tl.range(0, 3):
        acc += j.to(tl.int64)
    tl.store(O + tl.arange(0, 1), acc)


def _bf16(vals):
    return torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16)


def _run(kernel, *args, **kw):
    kernel[(1, )](*args, **kw)


# ---------------------------------------------------------------- bf16


def test_bf16_axb_plus_a_is_exact():
    a, b = _bf16([-3.0] * 16), _bf16([4.0] * 16)
    out = torch.empty_like(a)
    with triton_emulation():
        _run(_axb_plus_a, a, b, out, N=16)
    # (-3)*4 + (-3) = -15 exactly (the brief quoted "15"; the sign is a typo:
    # -15 is the only correct value, and the stock interpreter gives -5.5e19).
    assert torch.all(out.float() == -15.0)


def test_bf16_stock_interpreter_is_wrong_and_fix_is_scoped():
    # Documents the bug the layer fixes (raw-bit arithmetic) and that leaving
    # the block brings the stock behaviour back.
    a, b = _bf16([-3.0] * 16), _bf16([4.0] * 16)
    out = torch.empty_like(a)
    _run(_axb_plus_a, a, b, out, N=16)
    assert not torch.all(out.float() == -15.0)


def test_bf16_round_to_nearest_even():
    # bf16 has 7 fraction bits: ulp(1) = 2**-7, ulp([2,4)) = 2**-6.
    # 1 + 2**-8 is a tie between 1 (even) and 1+2**-7 (odd)   -> 1
    # (1+2**-7) + 2**-8 ties between 1+2**-7 (odd), 1+2**-6   -> 1 + 2**-6
    a = _bf16([1.0, 1.0 + 2**-7] + [0.0] * 14)
    b = _bf16([2**-8, 2**-8] + [0.0] * 14)
    out = torch.empty_like(a)
    with triton_emulation():
        _run(_add, a, b, out, N=16)
    assert out[0].item() == 1.0
    assert out[1].item() == 1.0 + 2**-6
    # 3 * (1+2**-7) = 3 + 1.5 ulp: tie between 3+1ulp (odd) and 3+2ulp (even).
    # Truncation would give 3.015625; RNE gives 3.03125.
    a = _bf16([3.0] * 16)
    b = _bf16([1.0 + 2**-7] * 16)
    with triton_emulation():
        _run(_mul, a, b, out, N=16)
    assert torch.all(out.float() == 3.03125)


def test_f32_to_bf16_cast_rounds_to_nearest_even():
    x = torch.tensor([1 + 2**-8 + 2**-20, 1 + 2**-8, -(1 + 2**-7 + 2**-8)] + [0.0] * 13, dtype=torch.float32)
    out = torch.empty(16, dtype=torch.bfloat16)
    with triton_emulation():
        _run(_cast, x, out, N=16)
    assert out[:3].float().tolist() == [1 + 2**-7, 1.0, -(1 + 2**-6)]
    assert torch.equal(out, x.to(torch.bfloat16))  # torch casts with RNE too


def test_bf16_reductions_use_values_not_bits():
    x = _bf16([-2.0, 1.0, -0.5, 3.0] + [0.0] * 12)
    s = torch.empty(1, dtype=torch.bfloat16)
    m = torch.empty(1, dtype=torch.bfloat16)
    with triton_emulation():
        _run(_sum_max, x, s, m, N=16)
    assert s.item() == 1.5 and m.item() == 3.0


def test_bit_helpers():
    x = np.array([1 + 2**-8, 1 + 2**-7 + 2**-8, np.inf, -np.inf, 3.39e38, 3.4e38], np.float32)
    got = bf16_bits_to_f32(f32_to_bf16_bits(x))
    assert got[:4].tolist() == [1.0, 1 + 2**-6, np.inf, -np.inf]
    assert got[4] == np.float32(3.3895313892515355e38)  # largest finite bf16
    assert got[5] == np.inf  # above the midpoint to 2**128: RNE overflows
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    t = np.array([1 + 2**-11 + 2**-12, 1 + 2**-11], np.float32)
    assert round_to_tf32(t, "truncate").tolist() == [1.0, 1.0]
    assert round_to_tf32(t, "rne").tolist() == [1 + 2**-10, 1.0]
    assert round_to_tf32(t, "rna").tolist() == [1 + 2**-10, 1 + 2**-10]


def test_bf16_rounding_is_ml_dtypes_cast_on_every_exponent_and_keeps_nan_and_shape():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    # every sign and exponent, with random fractions and the fractions that sit on and beside a rounding tie
    fractions = np.concatenate([rng.integers(0, 2**23, 4096), [0x7FFF, 0x8000, 0x8001, 0x18000, 0x17FFF, 0x7FFFFF]])
    bits = ((np.arange(512, dtype=np.uint64)[:, None] << np.uint64(23)) | fractions.astype(np.uint64)[None]).ravel()
    x = bits.astype(np.uint32).view(np.float32)
    finite = np.isfinite(x)
    assert (f32_to_bf16_bits(x[finite]) == x[finite].astype(ml_dtypes.bfloat16).view(np.uint16)).all()
    assert (f32_to_bf16_bits(x, "rtz")[finite] == (bits[finite] >> np.uint64(16)).astype(np.uint16)).all()
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(x[np.isnan(x)]))).all()  # the quiet bit kept, never inf
    strided = x[::3]  # a view, not a copy: the same bits
    assert (f32_to_bf16_bits(strided) == f32_to_bf16_bits(strided.copy())).all()
    one = f32_to_bf16_bits(np.array(1.5, np.float32))
    assert isinstance(one, np.ndarray) and one.shape == () and int(one) == 0x3FC0
    assert bf16_bits_to_f32(np.array([0x3FC0, 0xBF80], np.uint16)).tolist() == [1.5, -1.0]


# ---------------------------------------------------------------- dots


def test_bf16_dot_accumulates_in_f32():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    b = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    c = torch.empty(16, 16, dtype=torch.float32)
    with triton_emulation():
        _run(_dot, a, b, c, N=16)
    A, B = a.double().numpy(), b.double().numpy()
    ref = A @ B
    # f32 accumulation bound gamma_K * |A||B| with K = 16, u = 2**-24.
    bound = 16 * 2.0**-24 * (np.abs(A) @ np.abs(B)) + 1e-30
    assert np.all(np.abs(c.double().numpy() - ref) <= bound)


# x = 1 + 0.75 ulp_tf32(1), y = 1 + 0.25 ulp_tf32(1); dot(x*I, y*ones) = x*y.
_X = 1 + 2**-11 + 2**-12
_Y = 1 + 2**-12
# Hand-computed x*y = 1 + 2**-10 + 3*2**-24 in each mode:
_EXPECTED = {
    "tf32-truncate": 1.0,  # trunc(x) = trunc(y) = 1
    "tf32-rne": 1 + 2**-10,  # rne(x) = 1+2**-10, rne(y) = 1
    # f32 rounding of 1 + 2**-10 + 1.5 * 2**-23 is a tie -> even -> +2**-22
    "ieee": 1 + 2**-10 + 2**-22,
    # big_x = 1+2**-10, small_x = -2**-12, big_y = 1, small_y = 2**-12:
    # small_x*big_y + big_x*small_y = 2**-22; + big_x*big_y = 1+2**-10+2**-22
    "tf32x3": 1 + 2**-10 + 2**-22,
}


def _xy_dot(kernel=_dot, **emu_kw):
    a = torch.eye(16, dtype=torch.float32) * _X
    b = torch.full((16, 16), _Y, dtype=torch.float32)
    c = torch.empty(16, 16, dtype=torch.float32)
    with triton_emulation(**emu_kw):
        _run(kernel, a, b, c, N=16)
    vals = torch.unique(c)
    assert vals.numel() == 1
    return vals.item()


def test_f32_dot_default_is_tf32_truncated():
    assert _xy_dot() == _EXPECTED["tf32-truncate"]
    assert _xy_dot(dot_precision="tf32") == _EXPECTED["tf32-truncate"]


def test_f32_dot_tf32_rne_option():
    assert _xy_dot(tf32_rounding="rne") == _EXPECTED["tf32-rne"]


def test_f32_dot_tf32x3_and_ieee():
    assert _xy_dot(dot_precision="tf32x3") == _EXPECTED["tf32x3"]
    assert _xy_dot(dot_precision="ieee") == _EXPECTED["ieee"]


def test_f32_dot_env_default_and_explicit_precision(monkeypatch):
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")  # honoured like on a GPU
    assert _xy_dot() == _EXPECTED["ieee"]
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    # explicit input_precision in the kernel wins over the block default ...
    assert _xy_dot(_dot_ieee, dot_precision="tf32") == _EXPECTED["ieee"]
    # ... unless forced
    assert _xy_dot(_dot_ieee, dot_precision="tf32", force_dot_precision=True) == _EXPECTED["tf32-truncate"]
    assert os.environ.get("TRITON_F32_DEFAULT") is None


# ---------------------------------------------------------------- loops


def test_loop_induction_variable_is_a_tensor():
    out = torch.zeros(1, dtype=torch.int64)
    with triton_emulation():
        _run(_loop_var, out, 3)
    assert out.item() == (0 + 1 + 2) * 4294967296 + (0 + 1 + 2)


def test_loop_induction_variable_fails_without_fix():
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(Exception):
        _run(_loop_var, out, 3)


# ---------------------------------------------------------------- comparisons are int1


@_ijit
def _mask_from_scalar_compare(CU, X, O, BD: tl.constexpr, W: tl.constexpr):
    # fla's causal_conv1d compute_dh0_kernel: a loaded length compared with a static_range index, & a bool block
    i_n = tl.program_id(0)
    seq_len = tl.load(CU + i_n + 1) - tl.load(CU + i_n)  # an int64 scalar
    o_d = tl.arange(0, BD)
    m_d = o_d < 3
    for t in tl.static_range(0, W):
        m_t = (t < seq_len) & m_d  # the scalar comparison is splatted to the block's shape
        tl.store(O + (i_n * W + t) * BD + o_d, tl.load(X + t * BD + o_d, mask=m_t, other=0))


@_ijit
def _compare_to_f32(A, B, O, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(O + o, (tl.load(A + o) < tl.load(B + o)).to(tl.float32))


def _masked_by_scalar_compare():
    cu = torch.tensor([0, 1, 3], dtype=torch.int64)  # lengths 1 and 2
    x = torch.arange(1, 13, dtype=torch.float32)  # rows t = 0, 1, 2 of 4: 1..4, 5..8, 9..12
    out = torch.full((2 * 3 * 4, ), -1.0)
    _mask_from_scalar_compare[(2, )](cu, x, out, BD=4, W=3)
    return out.view(2, 3, 4).tolist()


def test_a_splatted_scalar_comparison_is_a_bool_load_mask():
    with triton_emulation():
        got = _masked_by_scalar_compare()
    assert got == [[[1, 2, 3, 0], [0, 0, 0, 0], [0, 0, 0, 0]],  # length 1: row 0 only, columns < 3
                   [[1, 2, 3, 0], [5, 6, 7, 0], [0, 0, 0, 0]]]  # length 2: rows 0 and 1
    # the stock handle says int64, so the splat makes an int64 mask: "mask has unsupported dtype"
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        _masked_by_scalar_compare()


def test_a_bf16_comparison_casts_as_a_bool():
    a, b = _bf16([1.0, 2.0, 3.0, -4.0]), _bf16([2.0, 1.0, 4.0, 5.0])
    out = torch.full((4, ), -1.0)
    with triton_emulation():
        _run(_compare_to_f32, a, b, out, N=4)
    assert out.tolist() == [1.0, 0.0, 1.0, 1.0]  # not the bools read as bf16 bits (1 -> 2^-133)


# ---------------------------------------------------------------- scalar arithmetic as the PTX computes it


@_ijit
def _scalar_ops(A, B, C, O, N: tl.constexpr, F32: tl.constexpr):
    o = tl.arange(0, N)
    a, b, c = tl.load(A + o), tl.load(B + o), tl.load(C + o)
    tl.store(O + o, a * b + c)
    tl.store(O + N + o, c - a * b)
    tl.store(O + 2 * N + o, a * b - c)
    tl.store(O + 3 * N + o, a / b)
    if F32:  # tl.sqrt and the precise forms take f32 only
        tl.store(O + 4 * N + o, tl.math.exp2(c))
        tl.store(O + 5 * N + o, tl.sqrt(c))
        tl.store(O + 6 * N + o, tl.div_rn(a, b))
        tl.store(O + 7 * N + o, tl.sqrt_rn(c))


def _scalar(a, b, c, dtype=torch.float32, **kw):
    args = [torch.tensor(v, dtype=torch.float32).to(dtype) for v in (a, b, c)]
    out = torch.zeros(8 * len(a), dtype=dtype)
    with triton_emulation(**kw):
        _run(_scalar_ops, *args, out, N=len(a), F32=dtype == torch.float32)
    return [[float(v) for v in r] for r in out.float().view(8, len(a))]


U = 1 + 2.0**-12  # U*U = 1 + 2^-11 + 2^-24: an f32 midpoint, 1 + 2^-11 once rounded


def test_a_product_fused_into_its_add_rounds_once():
    # p = U*U is exact in one fma; c picks the cases: p - (1 + 2^-11) = 2^-24 exactly, and p +- 2^-80, just above and
    # below the midpoint, round up and down (a float64 sum would land on the midpoint and round to the even one)
    M, tiny = 1 + 2.0**-11, 2.0**-80
    got = _scalar([U] * 4, [U] * 4, [-M, tiny, M, -tiny])
    assert got[0] == [2.0**-24, M + 2.0**-23, 2 + 2.0**-10, M]  # a*b + c
    assert got[1] == [-(2 + 2.0**-10), -M, -2.0**-24, -(M + 2.0**-23)]  # c - a*b = fma(-a, b, c)
    assert got[2] == [2 + 2.0**-10, M, 2.0**-24, M + 2.0**-23]  # a*b - c = fma(a, b, -c)
    stock = _scalar([U] * 4, [U] * 4, [-M, tiny, M, -tiny], ptx_arith=False)  # a*b rounds to M first
    assert stock[0] == [0.0, M, 2 + 2.0**-10, M] and stock[2] == [2 + 2.0**-10, M, 0.0, M]


def test_bf16_contracts_too():
    v = 1 + 2.0**-7  # v*v = 1 + 2^-6 + 2^-14: 1 + 2^-6 in bf16
    assert _scalar([v], [v], [-(1 + 2.0**-6)], torch.bfloat16)[0] == [2.0**-14]
    assert _scalar([v], [v], [-(1 + 2.0**-6)], torch.bfloat16, ptx_arith=False)[0] == [0.0]


def test_division_is_the_dividend_times_the_reciprocal():
    got = _scalar([3.0, 3.0 * 2.0**100], [7.0, 1.5 * 2.0**127], [1.0, 1.0])
    rcp7 = np.float32(1) / np.float32(7)
    assert got[3][0] == float(np.float32(3) * rcp7) != float(np.float32(3) / np.float32(7))
    assert got[6][0] == float(np.float32(3) / np.float32(7))  # div_rn stays correctly rounded
    # a divisor beyond 2^126: both scaled by 1/4, so the reciprocal (2/3 * 2^-125) stays normal; unscaled it would be
    # the subnormal 2/3 * 2^-127, which has two fewer bits
    exact = 3.0 * 2.0**100 / (1.5 * 2.0**127)  # 2^-26
    assert got[3][1] == float(np.float32(3 * 2.0**98) * (np.float32(1) / np.float32(1.5 * 2.0**125)))
    assert abs(got[3][1] - exact) <= 2.0**-26 * 2.0**-23


def test_exp2_and_sqrt_flush_subnormals_where_the_ptx_does():
    got = _scalar([1.0] * 4, [1.0] * 4, [-126.0, -130.0, 2.0**-130, 4.0])
    assert got[4][:2] == [2.0**-126, 0.0]  # ex2.approx.ftz: 2^-130 is subnormal, flushed
    assert got[5][2:] == [0.0, 2.0]  # sqrt.approx.ftz: the subnormal operand reads as 0
    assert got[7][2] == 2.0**-65  # sqrt_rn keeps it
    stock = _scalar([1.0] * 4, [1.0] * 4, [-126.0, -130.0, 2.0**-130, 4.0], ptx_arith=False)
    assert stock[4][1] == 2.0**-130 and stock[5][2] == 2.0**-65


# ---------------------------------------------------------------- autotune


def _make_tuned():

    def fill(O, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(O + o, tl.full([BLOCK], BLOCK, tl.int32), mask=o < n)

    fill.__module__ = __name__
    return triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=2),
                                    triton.Config({"BLOCK": 32}, num_warps=4)], key=["n"])(_ijit(fill))


_tuned_fill = _make_tuned()


def test_autotune_without_driver_fails_stock():
    out = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(Exception):
        _tuned_fill[(1, )](out, 32)


@pytest.mark.parametrize("ctx", ["emulation", "pinned"])
def test_autotune_pin_picks_first_config_and_records(ctx):
    out = torch.zeros(32, dtype=torch.int32)
    cm = triton_emulation() if ctx == "emulation" else pinned_autotune()
    with cm as session:
        _tuned_fill[(1, )](out, 32)
        _tuned_fill[(1, )](out, 32)  # same key: recorded once
    assert out[:16].tolist() == [16] * 16 and out[16:].tolist() == [0] * 16
    recs = session.autotune_records()
    assert len(recs) == 1
    r = recs[0]
    assert (r.kernel, r.config, r.num_warps, r.index, r.n_configs) == ("fill", {"BLOCK": 16}, 2, 0, 2)
    assert session.chosen_configs()["fill"][0]["BLOCK"] == 16
    assert "fill[BLOCK=16,w2," in session.configs_summary()
    assert _tuned_fill.cache == {}  # nothing leaks into the autotuner cache


def test_autotune_rule_last():
    out = torch.zeros(32, dtype=torch.int32)
    with pinned_autotune("last") as session:
        _tuned_fill[(1, )](out, 32)
    assert out.tolist() == [32] * 32
    assert session.autotune_records()[0].config == {"BLOCK": 32}


# ---------------------------------------------------------------- scoping


def _snapshot():
    return {
        "builder": dict(vars(interp.interpreter_builder)),
        "reduce": interp.ReduceOps,
        "scan": interp.ScanOps,
        "rewrite": vars(interp.InterpretedFunction)["rewrite"],
        "runs": {cls: vars(cls).get("run") for cls in autotune._autotuner_classes()},
        "knob": dict(vars(triton.knobs.language)),
        "env": os.environ.get("TRITON_F32_DEFAULT"),
        "recorders": list(autotune._RECORDERS),
    }


def test_patches_removed_on_exit_exception_and_nesting():
    before = _snapshot()
    with triton_emulation(dot_precision="ieee"):
        assert "binary_op" in vars(interp.interpreter_builder)
        assert triton.knobs.language.fp32_default == "ieee"
        with triton_emulation(dot_precision="tf32x3"):  # re-entrant
            assert triton.knobs.language.fp32_default == "tf32x3"
        assert triton.knobs.language.fp32_default == "ieee"
        assert "binary_op" in vars(interp.interpreter_builder)
    assert _snapshot() == before
    with pytest.raises(ZeroDivisionError):
        with triton_emulation(dot_precision="tf32"):
            1 / 0
    assert _snapshot() == before
    for _ in range(3):  # repeated entry
        with triton_emulation():
            pass
    assert _snapshot() == before
    assert Autotuner.run is before["runs"][Autotuner]


def test_refuses_native_mode():
    triton.knobs.runtime.interpret = False
    with pytest.raises(RuntimeError):
        with triton_emulation():
            pass


def test_versions_and_cuda_probe():
    v = emu.triton_versions()
    assert v["triton"] == triton.__version__ and v["torch"] == torch.__version__
    assert v["fla-core"]
    assert emu.native_cuda_available() == torch.cuda.is_available()


# ---------------------------------------------------------------- fla


def _simple_gla_reference(q, k, v, g, scale):
    """float64 recurrence: S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

    q, k: [T, H, K]; v: [T, H, V]; g: [T, H] (log-space per-head gate).
    """
    T, H, K = q.shape
    S = np.zeros((H, K, v.shape[-1]))
    o = np.zeros((T, H, v.shape[-1]))
    for t in range(T):
        S = np.exp(g[t])[:, None, None] * S + k[t][:, :, None] * v[t][:, None, :]
        o[t] = scale * np.einsum("hk,hkv->hv", q[t], S)
    return o, S


def _rel_l2(x, ref):
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def _fla_interpreted():
    import fla.ops.utils.op as op
    return setup._is_interpreted_kernel(op.exp) is True


@pytest.mark.slow
def test_fla_chunk_simple_gla_bf16_fwd_bwd():
    if not _fla_interpreted():
        pytest.skip("fla was imported in native mode")
    from fla.ops.simple_gla import chunk_simple_gla

    B, T, H, K, V = 1, 64, 1, 64, 64
    g0 = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g0).to(torch.bfloat16).requires_grad_()
    k = torch.randn(B, T, H, K, generator=g0).to(torch.bfloat16).requires_grad_()
    v = torch.randn(B, T, H, V, generator=g0).to(torch.bfloat16).requires_grad_()
    g = (-torch.rand(B, T, H, generator=g0) * 0.1 - 0.01).float().requires_grad_()
    do = torch.randn(B, T, H, V, generator=g0).to(torch.bfloat16)
    scale = K**-0.5
    with triton_emulation() as session:
        o, _ = chunk_simple_gla(q, k, v, g=g, scale=scale)
        o.backward(do)
    assert session.autotune_records(), "fla's autotuned kernels should have been pinned"
    grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad, "dg": g.grad}
    for name, t in [("o", o), *grads.items()]:
        assert t is not None and torch.isfinite(t.float()).all(), name

    # float64 reference on the same (bf16-rounded) inputs; grads via torch autograd
    # through the float64 recurrence written with torch ops.
    qd, kd, vd = (x.detach().double()[0].requires_grad_() for x in (q, k, v))
    gd = g.detach().double()[0].requires_grad_()
    S = torch.zeros(H, K, V, dtype=torch.float64)
    outs = []
    for t in range(T):
        S = torch.exp(gd[t])[:, None, None] * S + kd[t][:, :, None] * vd[t][:, None, :]
        outs.append(scale * torch.einsum("hk,hkv->hv", qd[t], S))
    o_ref = torch.stack(outs)
    o_ref.backward(do.double()[0])
    o_np, _ = _simple_gla_reference(qd.detach().numpy(), kd.detach().numpy(), vd.detach().numpy(),
                                    gd.detach().numpy(), scale)
    assert np.allclose(o_np, o_ref.detach().numpy())
    # Tolerances: o/dq/dk/dv are stored in bf16 (unit roundoff 2**-8 = 3.9e-3)
    # and intermediate chunk products are re-rounded to bf16 before tl.dot, so
    # a few bf16 ulps of relative L2 error is expected: 2e-2 (~5 ulp).  dg is
    # float32 but is assembled from bf16-level terms with cancellation
    # (dg = sum q*dq - k*dk), so it gets 5e-2.  The stock interpreter gives NaN
    # or O(1e19) here, so these bounds are far from vacuous.
    refs = {"o": o_ref, "dq": qd.grad, "dk": kd.grad, "dv": vd.grad, "dg": gd.grad}
    tol = {"o": 2e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2, "dg": 5e-2}
    got = {"o": o, **grads}
    for name, ref in refs.items():
        err = _rel_l2(got[name].detach().double()[0].numpy(), ref.detach().numpy())
        assert err < tol[name], (name, err)


@_ijit
def _dot_bf16x3(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    offs = r[:, None] * N + r[None, :]
    tl.store(C + offs, tl.dot(tl.load(A + offs), tl.load(B + offs), input_precision="bf16x3"))


@_ijit
def _dot_bf16x6(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    offs = r[:, None] * N + r[None, :]
    tl.store(C + offs, tl.dot(tl.load(A + offs), tl.load(B + offs), input_precision="bf16x6"))


def _one_entry_dot(kernel, x):
    a = torch.eye(16, dtype=torch.float32) * x
    b = torch.ones(16, 16, dtype=torch.float32)
    c = torch.empty(16, 16, dtype=torch.float32)
    with triton_emulation():
        _run(kernel, a, b, c, N=16)
    return torch.unique(c).item()


def test_f32_dot_bf16x3_and_bf16x6():
    """The NVIDIA backend's bf16 multi-pass precisions (fla's kda safe-gate path uses them).

    x = 1 + 2^-10 + 2^-20 (exact in f32): bf16 pieces 1, 2^-10, 2^-20. bf16x3 keeps
    hi*1 + lo*1 with two pieces: 1 + 2^-10; bf16x6 keeps the third piece too.
    """
    x = 1.0 + 2.0**-10 + 2.0**-20
    assert _one_entry_dot(_dot_bf16x3, x) == 1.0 + 2.0**-10
    assert _one_entry_dot(_dot_bf16x6, x) == x


def test_the_emulated_leg_refuses_a_triton_its_fixes_do_not_patch():
    from harness.emulation import EMULATED_TRITON, emulation_problem

    assert emulation_problem(f"{EMULATED_TRITON}.0") is None and emulation_problem(f"{EMULATED_TRITON}.7") is None
    reason = emulation_problem("3.7.1")
    assert reason.startswith(f"the emulated GPU leg needs triton {EMULATED_TRITON}.x") and "found 3.7.1" in reason
    assert emulation_problem() is None  # this environment's triton (the cpu extra's pin) is the emulated one


def test_the_emulated_leg_refuses_when_another_library_imported_triton_language_first():
    """A library that imports ``triton.language`` before the GPU leg turns interpreter mode on leaves Triton's
    built-ins compiled: the leg refuses every case with the reason and the fix, instead of an error row per tensor
    ("Cannot call @triton.jit'd outside of the scope of a kernel"). In a fresh process each way round."""
    import subprocess
    import sys

    probe = ("{first}\nfrom harness.legs import make_leg\nfrom harness.app import case_from_id\n"
             "from harness.ops import get_op\nleg = make_leg('gpu')\n"
             "case = case_from_id('simple_gla.fused_recurrent/B1-T16-H1-K64-V64/fp32/g=logsigmoid/16/C64/h0')\n"
             "print(repr(leg.supports(get_op(case.op), case)))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    late = subprocess.run([sys.executable, "-c", probe.format(first="import triton.language")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert late.returncode == 0, late.stderr[-2000:]
    assert "triton.language was imported before the GPU leg" in late.stdout and "process of its own" in late.stdout
    fresh = subprocess.run([sys.executable, "-c", probe.format(first="")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert fresh.stdout.strip().splitlines()[-1] == "None"
