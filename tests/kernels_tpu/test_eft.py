"""kernels_tpu.eft: every error-free transformation on hand-computed float32 values, in and out of a Pallas kernel,
and at XLA:CPU's default optimization level (which contracts a lone product into the add that receives it)."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_tpu import eft
from like_the_leg import leg_jit

F32 = np.float32
U = 2.0 ** -24  # float32's unit roundoff


def _exact(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def test_split_hand_values():
    # 1 + 2^-12 + 2^-20: the top 12 significant bits are 1 + 2^-11·0 ... -> hi = 1, lo = 2^-12 + 2^-20
    x = F32(1 + 2.0 ** -12 + 2.0 ** -20)
    hi, lo = (np.asarray(a) for a in eft.split(jnp.asarray([x])))
    assert hi[0] == F32(1.0) and lo[0] == F32(2.0 ** -12 + 2.0 ** -20)
    # 1 + 2^-11 keeps its 12th significant bit in hi
    hi, lo = (np.asarray(a) for a in eft.split(jnp.asarray([F32(-(1 + 2.0 ** -11))])))
    assert hi[0] == F32(-(1 + 2.0 ** -11)) and lo[0] == 0.0


def test_two_product_hand_value():
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: the last term is half an ulp of 1 + 2^-11, lost to the tie (to even)
    a = jnp.asarray([F32(1 + 2.0 ** -12)])
    p, e = eft.two_product(a, a)
    assert float(p[0]) == 1 + 2.0 ** -11 and float(e[0]) == 2.0 ** -24


def test_two_sum_hand_value():
    s, e = eft.two_sum(jnp.asarray([F32(1.0)]), jnp.asarray([F32(2.0 ** -30)]))
    assert float(s[0]) == 1.0 and float(e[0]) == 2.0 ** -30
    s, e = eft.two_sum(jnp.asarray([F32(2.0 ** -30)]), jnp.asarray([F32(-1.0)]))  # |a| < |b|: still exact
    assert float(s[0]) == -1.0 and float(e[0]) == 2.0 ** -30


def test_fma_rounds_once_where_mul_add_rounds_twice():
    a = jnp.asarray([F32(1 + 2.0 ** -12)])
    c = jnp.asarray([F32(-(1 + 2.0 ** -11))])
    assert float(eft.fma(a, a, c)[0]) == 2.0 ** -24  # exact: a*a + c = 2^-24
    # numpy rounds the product, then the add (XLA:CPU may contract them into one fma: jax 0.12 does at level 0)
    assert float(np.float32(np.asarray(a)[0] * np.asarray(a)[0]) + np.asarray(c)[0]) == 0.0


@pytest.mark.parametrize("opt_level", ["leg", "default"])
def test_exact_on_random_operands_whatever_the_compiler(opt_level):
    """Against float64 on 4096 random triples over 8 binades, under the leg's level-0 XLA and XLA's default level
    (which fuses a lone multiply into an add): the error terms are exact, fma is within half an ulp."""
    rng = np.random.default_rng(0)
    a, b, c = (F32(rng.standard_normal(4096) * 2.0 ** rng.integers(-4, 4, 4096)) for _ in range(3))
    jit = leg_jit if opt_level == "leg" else jax.jit
    p, e = jit(eft.two_product)(a, b)
    np.testing.assert_array_equal(_exact(p) + _exact(e), _exact(a) * _exact(b))
    s, t = jit(eft.two_sum)(a, c)
    np.testing.assert_array_equal(_exact(s) + _exact(t), _exact(a) + _exact(c))
    exact = _exact(a) * _exact(b) + _exact(c)
    got = _exact(jit(eft.fma)(a, b, c))
    ulp = np.spacing(np.abs(exact).astype(F32)).astype(np.float64)
    assert np.all(np.abs(got - exact) <= 0.5 * ulp * (1 + 1e-6))
    plain = _exact((a * b).astype(F32) + c)  # numpy: the product rounded, then the add
    assert np.sum(np.abs(plain - exact) > 0.5 * ulp) > 100  # the two-rounding form the fma replaces


def test_dot_rows_products_exact():
    # rows of x times a column y: the products' errors are summed, so a sum of exact products is exact
    x = jnp.asarray(np.full((4, 128), 1 + 2.0 ** -12, F32))
    y = jnp.asarray(np.full((4, 1), 1 + 2.0 ** -12, F32))
    got = np.asarray(eft.dot_rows(x, y, axis=1))  # 128 (1 + 2^-11 + 2^-24) is exact in float32
    assert got.shape == (4, 1) and np.all(got == F32(128 * (1 + 2.0 ** -11 + 2.0 ** -24)))


def test_halving_sum_has_one_order():
    # [2^24, 1, -2^24, 1] in float32: left to right, 2^24 + 1 rounds back to 2^24 and the sum is 1; in halves,
    # (2^24 - 2^24) + (1 + 1) = 2, which is also the exact sum
    x = jnp.asarray(np.array([[2.0 ** 24, 1, -(2.0 ** 24), 1]], F32))
    assert F32(F32(F32(F32(2.0 ** 24) + F32(1)) - F32(2.0 ** 24)) + F32(1)) == 1  # the sequential order's answer
    got = np.asarray(eft.halving_sum(x, axis=1))
    assert got.shape == (1, 1) and got[0, 0] == 2
    got = np.asarray(eft.halving_sum(x.T, axis=0))  # the same along the other axis
    assert got.shape == (1, 1) and got[0, 0] == 2
    # length 3 is padded to 4: (a + c) + (b + 0) with a = 2^24, b = 1, c = -2^24 gives exactly 1
    assert np.asarray(eft.halving_sum(jnp.asarray(np.array([2.0 ** 24, 1, -(2.0 ** 24)], F32)), axis=0))[0] == 1
    # and with b, c swapped the halves are (2^24 + 1) + (-2^24 + 0): 2^24 + 1 rounds to 2^24, so 0
    assert np.asarray(eft.halving_sum(jnp.asarray(np.array([2.0 ** 24, -(2.0 ** 24), 1], F32)), axis=0))[0] == 0


def test_dot_rows_sums_in_halves():
    # the same cancellation through dot_rows: exact products (y = 1), summed in halves
    x = jnp.asarray(np.array([[2.0 ** 24], [1], [-(2.0 ** 24)], [1]], F32))
    got = np.asarray(eft.dot_rows(x, jnp.ones_like(x), axis=0))
    assert got.shape == (1, 1) and got[0, 0] == 2


def test_in_a_pallas_kernel():
    a = np.full((8, 128), 1 + 2.0 ** -12, F32)
    c = np.full((8, 128), -(1 + 2.0 ** -11), F32)

    def kernel(a_ref, c_ref, o_ref):
        o_ref[...] = eft.fma(a_ref[...], a_ref[...], c_ref[...])

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(a.shape, jnp.float32), interpret=True)
    assert np.all(np.asarray(leg_jit(call)(a, c)) == F32(2.0 ** -24))
