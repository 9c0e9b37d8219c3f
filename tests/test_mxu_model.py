"""The TPU MXU rounding model of kernels_tpu.mxu on tiny dots with hand-computed results."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kernels_tpu.mxu import dot

# a = 1 + 2^-10 + 2^-20: bf16 keeps 1 (8 bits), bf16x3 keeps 1 + 2^-10 (2 pieces), bf16x6 all of it
A = 1.0 + 2.0**-10 + 2.0**-20


@pytest.mark.parametrize("precision, expected", [
    (lax.Precision.DEFAULT, 1.0),  # one bf16 pass: the operand is rounded to bf16
    (lax.Precision.HIGH, 1.0 + 2.0**-10),  # bf16x3: hi*hi + hi*lo + lo*hi, lo = 2^-10 + 2^-20 rounded to bf16
    (lax.Precision.HIGHEST, A),  # bf16x6: f32 accuracy
])
def test_f32_dot_passes(precision, expected):
    a = jnp.array([[A]], jnp.float32)
    b = jnp.array([[1.0]], jnp.float32)
    assert float(dot(a, b, precision=precision, mxu_model=True)[0, 0]) == np.float32(expected)
    # without the model XLA:CPU computes the f32 dot exactly whatever the precision
    assert float(dot(a, b, precision=precision, mxu_model=False)[0, 0]) == np.float32(A)


def test_bf16_operands_exact_products_f32_accumulation():
    # (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14: exact in f32, not representable in bf16
    a = jnp.full((1, 4), 1.0 + 2.0**-7, jnp.bfloat16)
    out = dot(a, a.T, precision=lax.Precision.DEFAULT, mxu_model=True)
    assert out.dtype == jnp.float32
    assert float(out[0, 0]) == 4 * (1.0 + 2.0**-6 + 2.0**-14)


def test_fp16_operands_have_no_native_mode():
    # 1 + 2^-10 is an fp16 number; DEFAULT rounds it to bf16 (1.0), HIGH keeps it
    a = jnp.array([[1.0 + 2.0**-10]], jnp.float16)
    one = jnp.array([[1.0]], jnp.float16)
    assert float(dot(a, one, precision=lax.Precision.DEFAULT, mxu_model=True)[0, 0]) == 1.0
    assert float(dot(a, one, precision=lax.Precision.HIGH, mxu_model=True)[0, 0]) == 1.0 + 2.0**-10


def test_every_dot_states_its_precision():
    with pytest.raises(ValueError, match="precision"):
        dot(jnp.ones((1, 1)), jnp.ones((1, 1)), precision=None)
