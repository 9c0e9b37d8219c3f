"""The TPU MXU rounding model of kernels_tpu.mxu on tiny dots with hand-computed results."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kernels_tpu.mxu import BF16X3, PASSES, dot, widen_fp16

# a = 1 + 2^-10 + 2^-20: bf16 keeps 1 (8 bits), bf16x3 keeps 1 + 2^-10 (2 pieces), bf16x6 all of it
A = 1.0 + 2.0**-10 + 2.0**-20


@pytest.mark.parametrize("precision, expected", [
    (lax.Precision.DEFAULT, 1.0),  # one bf16 pass: the operand is rounded to bf16
    (BF16X3, 1.0 + 2.0**-10),  # hi*hi + hi*lo + lo*hi, lo = 2^-10 + 2^-20 rounded to bf16
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


def test_bf16x3_keeps_an_fp16_product_whole():
    # (1 + 2^-10)(1 + 2^-9): fp16 operands split exactly into two bf16 pieces; only lo*lo = 2^-19 is lost
    a = jnp.array([[1.0 + 2.0**-10]], jnp.float32)
    b = jnp.array([[1.0 + 2.0**-9]], jnp.float32)
    assert float(dot(a, b, precision=BF16X3, mxu_model=True)[0, 0]) == 1.0 + 2.0**-10 + 2.0**-9


def test_pass_counts():
    assert PASSES == {lax.Precision.DEFAULT: 1, BF16X3: 3, lax.Precision.HIGHEST: 6}


def test_bf16_operands_exact_products_f32_accumulation():
    # (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14: exact in f32, not representable in bf16
    a = jnp.full((1, 4), 1.0 + 2.0**-7, jnp.bfloat16)
    out = dot(a, a.T, precision=lax.Precision.DEFAULT, mxu_model=True)
    assert out.dtype == jnp.float32
    assert float(out[0, 0]) == 4 * (1.0 + 2.0**-6 + 2.0**-14)


def test_only_what_mosaic_lowers_exists():
    one = jnp.ones((1, 1), jnp.float32)
    with pytest.raises(ValueError, match="Precision.HIGH"):
        dot(one, one, precision=lax.Precision.HIGH, mxu_model=True)
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
