"""The TPU MXU rounding model of kernels_tpu.mxu on tiny dots with hand-computed results."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kernels_tpu.mxu import (BF16, BF16X3, BF16X4, F32_DOT_PRECISION, HI8, LO8, MID8, NEAREST, PASSES, dot,
                             modeled_dot, mxu_passes, pallas_lowers, piece, round_bf16, split_bf16, widen_fp16)

# a = 1 + 2^-10 + 2^-20: bf16 keeps 1 (8 bits), bf16x3 keeps 1 + 2^-10 (2 pieces), bf16x6 all of it
A = 1.0 + 2.0**-10 + 2.0**-20


@pytest.mark.parametrize("precision, expected", [
    (lax.Precision.DEFAULT, 1.0),  # one bf16 pass: the operand is rounded to bf16
    (BF16X3, 1.0 + 2.0**-10),  # hi*hi + hi*lo + lo*hi, lo = 2^-10 + 2^-20 rounded to bf16
    (BF16X4, 1.0 + 2.0**-10),  # lo*lo adds nothing here (b = 1 has no lo): 2^-20 was never in two pieces
    (lax.Precision.HIGHEST, A),  # bf16x6: f32 accuracy
])
def test_f32_dot_passes(precision, expected):
    a = jnp.array([[A]], jnp.float32)
    b = jnp.array([[1.0]], jnp.float32)
    assert float(dot(a, b, precision=precision, mxu_model=True)[0, 0]) == np.float32(expected)


@pytest.mark.parametrize("precision", [lax.Precision.DEFAULT, lax.Precision.HIGHEST])
def test_without_the_model_xla_cpu_is_exact(precision):
    # XLA:CPU computes an f32 dot exactly whatever the precision: the reason the model exists
    a = jnp.array([[A]], jnp.float32)
    assert float(dot(a, jnp.ones((1, 1)), precision=precision, mxu_model=False)[0, 0]) == np.float32(A)


def test_bf16x3_is_written_out_the_same_with_and_without_the_model():
    # the explicit split runs bf16 passes, which XLA:CPU and the model both compute exactly
    a = jnp.array([[A]], jnp.float32)
    for model in (True, False):
        assert float(dot(a, jnp.ones((1, 1)), precision=BF16X3, mxu_model=model)[0, 0]) == 1.0 + 2.0**-10


@pytest.mark.parametrize("model", [True, False])
def test_bf16x3_drops_lo_lo_and_bf16x4_keeps_an_fp16_product_whole(model):
    # (1 + 2^-10)(1 + 2^-9) = 1 + 2^-10 + 2^-9 + 2^-19, exact in f32. Both fp16 operands split exactly into
    # hi = 1 and lo = 2^-10, 2^-9; BF16X3 loses lo*lo = 2^-19, BF16X4 keeps it.
    a = jnp.array([[1.0 + 2.0**-10]], jnp.float32)
    b = jnp.array([[1.0 + 2.0**-9]], jnp.float32)
    assert float(dot(a, b, precision=BF16X3, mxu_model=model)[0, 0]) == 1.0 + 2.0**-10 + 2.0**-9
    assert float(dot(a, b, precision=BF16X4, mxu_model=model)[0, 0]) == 1.0 + 2.0**-10 + 2.0**-9 + 2.0**-19


def test_bf16x4_multiplies_every_pair_of_fp16_values_exactly():
    """Every product of two random fp16 values (normal range) is exact under BF16X4, as on fla's tensor
    cores; BF16X3 gets about a third of them wrong (those where both low pieces are non-zero)."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(4096) * 4.0 ** rng.integers(-3, 4, 4096)).astype(np.float16)
    b = (rng.standard_normal(4096) * 4.0 ** rng.integers(-3, 4, 4096)).astype(np.float16)
    exact = a.astype(np.float64) * b.astype(np.float64)
    assert np.array_equal(exact.astype(np.float32), exact)  # 22 significant bits fit in f32

    def products(precision):
        one = dot(jnp.asarray(a, jnp.float32)[:, None], jnp.ones((1, 1), jnp.float32), precision=precision,
                  mxu_model=True)  # widened the way the kernels widen fp16: exact
        return np.array(dot(jnp.diag(one[:, 0]), jnp.asarray(b, jnp.float32)[:, None], precision=precision,
                            mxu_model=True))[:, 0]

    assert np.array_equal(products(BF16X4), exact)
    wrong = np.mean(products(BF16X3) != exact)
    assert 0.2 < wrong < 0.9, wrong


def test_the_policy_multiplies_fp16_data_exactly():
    assert F32_DOT_PRECISION["float16"] == BF16X4


def test_pass_counts():
    assert PASSES == {lax.Precision.DEFAULT: 1, BF16X3: 3, BF16X4: 4, lax.Precision.HIGHEST: 6}


def test_bf16_operands_exact_products_f32_accumulation():
    # (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14: exact in f32, not representable in bf16
    a = jnp.full((1, 4), 1.0 + 2.0**-7, jnp.bfloat16)
    out = dot(a, a.T, precision=lax.Precision.DEFAULT, mxu_model=True)
    assert out.dtype == jnp.float32
    assert float(out[0, 0]) == 4 * (1.0 + 2.0**-6 + 2.0**-14)


def test_only_what_mosaic_lowers_exists():
    one = jnp.ones((1, 1), jnp.float32)
    if not pallas_lowers(lax.Precision.HIGH):  # jax 0.9.2, 0.10.2
        with pytest.raises(ValueError, match="Precision.HIGH"):
            dot(one, one, precision=lax.Precision.HIGH, mxu_model=True)
    with pytest.raises(ValueError, match="Bad lhs type"):  # Mosaic: HIGHEST takes f32 operands only
        dot(one.astype(jnp.bfloat16), one.astype(jnp.bfloat16), precision=lax.Precision.HIGHEST)
    with pytest.raises(ValueError, match="fp16"):
        dot(one.astype(jnp.float16), one.astype(jnp.float16), precision=lax.Precision.DEFAULT)


def test_widen_fp16_is_exact_and_leaves_other_dtypes():
    x = jnp.array([1.0 + 2.0**-10, 2.0**-24, 65504.0], jnp.float16)
    (w, b, none) = widen_fp16(x, jnp.ones(2, jnp.bfloat16), None)
    assert w.dtype == jnp.float32 and np.array_equal(np.asarray(w), np.asarray(x).astype(np.float32))
    assert b.dtype == jnp.bfloat16 and none is None


def test_every_dot_states_its_precision():
    with pytest.raises(ValueError, match="precision"):
        dot(jnp.ones((1, 1)), jnp.ones((1, 1)), precision=None)


# ------------------------------------------------------------ modeled MXU work
def test_dot_macs_hand_computed():
    from kernels_tpu.mxu import NT_T, TN, NN, dot_macs

    assert dot_macs((64, 128), (128, 32), NN) == 64 * 32 * 128
    assert dot_macs((128, 64), (128, 32), TN) == 64 * 32 * 128  # a.T @ b
    assert dot_macs((64, 128), (32, 128), NT_T) == 64 * 32 * 128  # a @ b.T
    batched = (((2,), (1,)), ((0,), (0,)))  # [B,M,K] x [B,K,N]
    assert dot_macs((3, 5, 7), (3, 7, 11), batched) == 3 * 5 * 11 * 7


def _kernel_with_loop(a_ref, b_ref, o_ref, *, precision):
    import jax

    def body(i, acc):
        return acc + dot(a_ref[...], b_ref[...], precision=precision, mxu_model=True)

    o_ref[...] = jax.lax.fori_loop(0, 3, body, jnp.zeros(o_ref.shape, jnp.float32))


@pytest.mark.parametrize("dtype, precision, passes", [
    (jnp.float32, lax.Precision.HIGHEST, 6), (jnp.float32, BF16X4, 4), (jnp.float32, BF16X3, 3),
    (jnp.float32, lax.Precision.DEFAULT, 1),
    (jnp.bfloat16, BF16X3, 1), (jnp.bfloat16, lax.Precision.DEFAULT, 1),  # two bf16 operands: one exact pass
])
def test_tally_counts_every_executed_dot(dtype, precision, passes):
    """A grid of 2 steps, each running a 3-iteration loop of one [16,128] x [128,128] dot: 6 dots executed."""
    import functools

    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from kernels_tpu.mxu import tally_mxu_work

    call = pl.pallas_call(functools.partial(_kernel_with_loop, precision=precision),
                          out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32), grid=(2,),
                          in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0)),
                                    pl.BlockSpec((128, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((16, 128), lambda i: (i, 0)),
                          interpret=pltpu.InterpretParams())
    with tally_mxu_work() as tally:
        jax.block_until_ready(call(jnp.ones((32, 128), dtype), jnp.ones((128, 128), dtype)))
    macs = 6 * 16 * 128 * 128
    assert tally.macs == {"forward": macs} and tally.pass_macs == {"forward": passes * macs}
    assert tally.ratio == passes


def test_nothing_is_tallied_without_the_model():
    from kernels_tpu.mxu import tally_mxu_work

    with tally_mxu_work() as tally:
        dot(jnp.ones((8, 128)), jnp.ones((128, 128)), precision=lax.Precision.HIGHEST, mxu_model=False)
    assert tally.macs == {} and np.isnan(tally.ratio)


# ------------------------------------------------------------ the passes as Mosaic emits them
# X = 1 + 2^-8 + 2^-16: bf16 keeps 8 significant bits, so nearest-even rounds X up to 1 + 2^-7, truncation
# keeps 1, and the truncation split is 1 | 2^-8 | 2^-16 (high, middle, low 8 bits)
X = 1.0 + 2.0**-8 + 2.0**-16


@pytest.mark.parametrize("bits, expected", [
    (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, the kept last bit is 0 (even): down to 1
    (0x3F818000, 0x3F82),  # 1 + 3 * 2^-8: a tie, the kept last bit is 1: up to 1 + 2^-6
    (0x3F808001, 0x3F81),  # just above the tie: up
    (0x3F807FFF, 0x3F80),  # just below the tie: down
    (0xBF818000, 0xBF82),  # the sign is kept, the magnitude rounds as above
    (0x7F7FFFFF, 0x7F80),  # the largest float32 rounds up to infinity
    (0x7F800000, 0x7F80),  # infinity stays
    (0x80000000, 0x8000),  # -0 stays
    (0x00000200, 0x0000),  # 2^-140, below half the smallest bf16 subnormal (2^-133): 0
    (0x00018000, 0x0002),  # a subnormal tie (1.5 units of 2^-133, the kept last bit 1): up to 2 units
])
def test_round_bf16_hand_computed(bits, expected):
    x = np.array([bits], np.uint32).view(np.float32)
    assert np.asarray(round_bf16(jnp.asarray(x))).view(np.uint16)[0] == expected
    assert np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).view(np.uint16)[0] == expected  # the cast's rounding


def test_round_bf16_keeps_nan_and_splits_as_the_cast():
    assert np.isnan(np.asarray(round_bf16(jnp.array([np.nan, -np.nan], jnp.float32)), np.float32)).all()
    x = jnp.asarray(np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 2.0 ** 40)
    for a, b in zip(split_bf16(x, 3, on_bits=True), split_bf16(x, 3)):
        assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_pieces_hand_computed():
    x = jnp.array([X, -X], jnp.float32)
    assert np.asarray(piece(x, NEAREST), np.float64).tolist() == [1 + 2.0**-7, -(1 + 2.0**-7)]
    assert np.asarray(piece(x, HI8), np.float64).tolist() == [1.0, -1.0]
    assert np.asarray(piece(x, MID8), np.float64).tolist() == [2.0**-8, -2.0**-8]
    assert np.asarray(piece(x, LO8), np.float64).tolist() == [2.0**-16, -2.0**-16]
    with pytest.raises(ValueError, match="bf16 operand"):
        piece(x, BF16)


def test_pass_tables_are_mosaics_llo_order():
    """(lhs piece, rhs piece) per pass, in the order of the llo.vmatmul ops Mosaic emits (libtpu 0.0.42.1 and
    0.0.50.1, v5e, v6e, v7x); tests/test_mosaic_dump.py checks them against the compiler again."""
    f32, bf16 = jnp.float32, jnp.bfloat16
    assert mxu_passes(lax.Precision.DEFAULT, f32, f32) == ((NEAREST, NEAREST),)
    assert mxu_passes(None, bf16, f32) == ((BF16, NEAREST),)
    assert mxu_passes(lax.Precision.HIGHEST, f32, f32) == (
        (LO8, HI8), (HI8, LO8), (MID8, MID8), (MID8, HI8), (HI8, MID8), (HI8, HI8))
    assert mxu_passes(lax.Precision.HIGH, f32, f32, pallas=False) == ((MID8, HI8), (HI8, MID8), (HI8, HI8))


def test_highest_truncates_and_drops_the_order_3_terms():
    """X^2 = 1 + 2^-7 + 3·2^-16 + 2^-23 + 2^-32 exactly. bf16x6 of the truncation split drops t1·t2, t2·t1
    (2^-24 each) and t2·t2, so it gives 1 + 2^-7 + 3·2^-16: one f32 ulp (2^-23) short of X^2 rounded. A
    split by rounding (1 + 2^-7 | -(2^-8 - 2^-16)) holds X in two pieces and would give X^2 rounded."""
    a = jnp.array([[X]], jnp.float32)
    got = float(dot(a, a, precision=lax.Precision.HIGHEST, mxu_model=True)[0, 0])
    assert got == 1 + 2.0**-7 + 3 * 2.0**-16
    assert float(np.float32(X) * np.float32(X)) == got + 2.0**-23


def test_high_is_three_truncation_passes():
    """hi·hi + hi·mid + mid·hi of X·X = 1 + 2·2^-8: the mid·mid term 2^-16 is dropped."""
    a = jnp.array([[X]], jnp.float32)
    got = modeled_dot(a, a, mxu_passes(lax.Precision.HIGH, a.dtype, a.dtype, pallas=False), (((1,), (0,)), ((), ())))
    assert float(got[0, 0]) == 1 + 2.0**-7
    if pallas_lowers(lax.Precision.HIGH):  # jax 0.12: a kernel dot at HIGH runs, modeled as Mosaic compiles it
        assert float(dot(a, a, precision=lax.Precision.HIGH, mxu_model=True)[0, 0]) == 1 + 2.0**-7


def test_pallas_lowers_asks_the_installed_jax():
    import jax

    assert pallas_lowers(lax.Precision.HIGHEST) and pallas_lowers(lax.Precision.DEFAULT)
    major_minor = tuple(int(p) for p in jax.__version__.split(".")[:2])
    if major_minor <= (0, 10):  # measured: 0.9.2 and 0.10.2 refuse HIGH, 0.12 lowers it
        assert not pallas_lowers(lax.Precision.HIGH)
    elif major_minor >= (0, 12):
        assert pallas_lowers(lax.Precision.HIGH)


# ------------------------------------------------------------------------------- Mosaic's vector-unit dots
def test_the_matrix_vector_dots_mosaic_runs_on_the_vpu():
    """canonicalize-mosaic's is_matrix_vector_dot: f32 operands, lhs [.., M, K] and a vector-like rhs [.., K] or
    [.., 1, K], both contracted on their last axis; anything else is the MXU's."""
    from kernels_tpu.mxu import NN, NT_T, on_vector_unit

    f32, bf16 = jnp.float32, jnp.bfloat16
    vec = (((1,), (0,)), ((), ()))
    assert on_vector_unit((64, 64), f32, (64,), f32, vec)  # lax.dot(matrix, vector): ejkernel's g_cumsum
    assert on_vector_unit((8, 128), f32, (1, 128), f32, NT_T)  # rhs [1, K] on its last axis
    assert on_vector_unit((2, 8, 128), f32, (2, 128), f32, (((2,), (1,)), ((0,), (0,))))  # batched
    assert not on_vector_unit((64, 64), f32, (64, 1), f32, NN)  # rhs [K, 1] contracted on its first axis: MXU
    assert not on_vector_unit((8, 128), f32, (2, 128), f32, NT_T)  # two rhs rows: a matrix
    assert not on_vector_unit((64, 64), bf16, (64,), bf16, vec)  # bf16: the MXU's
    assert not on_vector_unit((64, 64), f32, (64,), bf16, vec)
    assert not on_vector_unit((128, 8), f32, (128,), f32, (((0,), (0,)), ((), ())))  # lhs contracted on its first


def test_a_matrix_vector_dot_is_f32_products_and_an_f32_sum_at_any_precision():
    """x = 1 + 2^-12 (not a bf16 value): x*x = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 in f32 (a tie, to even); four
    of them sum to 4 + 2^-9 exactly. The VPU gives that at every precision; one MXU pass (DEFAULT) would round x to
    bf16, 1, and give 4; float64 gives 4 + 2^-9 + 2^-22."""
    from kernels_tpu.mxu import NN, NT_T

    x = 1.0 + 2.0**-12
    a = jnp.full((2, 4), x, jnp.float32)
    v = jnp.full((4,), x, jnp.float32)
    vec = (((1,), (0,)), ((), ()))
    for precision in (lax.Precision.DEFAULT, lax.Precision.HIGHEST):
        got = dot(a, v, precision=precision, dimension_numbers=vec, mxu_model=True)
        assert got.shape == (2,) and np.all(np.asarray(got) == 4.0 + 2.0**-9)
        row = dot(a, v[None, :], precision=precision, dimension_numbers=NT_T, mxu_model=True)
        assert row.shape == (2, 1) and np.all(np.asarray(row) == 4.0 + 2.0**-9)
    column = dot(a, v[:, None], precision=lax.Precision.DEFAULT, dimension_numbers=NN, mxu_model=True)
    assert np.all(np.asarray(column) == 4.0)  # [K, 1] stays on the MXU: x rounded to bf16
