"""references._x64.float64_cpu: float64 on the CPU, and the BLAS libraries held to one thread for the call only."""

import jax
import jax.numpy as jnp
import numpy as np
from threadpoolctl import threadpool_info

from references._x64 import float64_cpu


def _blas_threads() -> dict[str, int]:
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def _unit_lower_inverse():
    """The chunk golden's call (references.kda._chunk_step_wy): (I + N)^-1 by a unit-lower triangular solve."""
    L = jnp.asarray([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [3.0, 4.0, 1.0]])
    return np.asarray(jax.scipy.linalg.solve_triangular(L, jnp.eye(3, dtype=L.dtype), lower=True,
                                                        unit_diagonal=True))


def test_float64_cpu_holds_blas_to_one_thread_and_restores_it():
    with float64_cpu():
        inverse = _unit_lower_inverse()  # loads jaxlib's LAPACK (scipy's OpenBLAS) if nothing has yet
        inside = _blas_threads()
    before = _blas_threads()  # after the scope: what the process has when no reference runs
    assert inside, "no BLAS library found: the limit would hold nothing"
    assert set(inside.values()) == {1}, inside
    with float64_cpu():
        assert _blas_threads() == dict.fromkeys(before, 1)
    assert _blas_threads() == before
    # by hand: [[1,0,0],[2,1,0],[3,4,1]]^-1 = [[1,0,0],[-2,1,0],[-3+8,-4,1]]
    np.testing.assert_array_equal(inverse, [[1.0, 0.0, 0.0], [-2.0, 1.0, 0.0], [5.0, -4.0, 1.0]])
    assert inverse.dtype == np.float64


# ------------------------------------------------------------------ reference_jit: how a reference program compiles
import pytest  # noqa: E402

import references._x64 as x64  # noqa: E402


def _product_plus(a, b, c):
    return a * b + c


# a*b = 1 - 2^-60 exactly; rounded to float64 it is 1, so a*b + c rounds to 0 in two steps and to -2^-60 fused
_A, _B, _C = 1.0 + 2.0 ** -30, 1.0 - 2.0 ** -30, -1.0


def test_the_quick_options_round_as_the_defaults_do():
    """A small program (quick options) and a plain jax.jit (XLA's defaults) give the same bits, on the sum that
    tells a fused multiply-add from two roundings."""
    with float64_cpu():
        a, b, c = (jnp.full((8,), x, jnp.float64) for x in (_A, _B, _C))
        quick = np.asarray(x64.reference_jit(_product_plus)(a, b, c))
        plain = np.asarray(jax.jit(_product_plus)(a, b, c))
    assert set(quick.tolist()) <= {0.0, -(2.0 ** -60)}, quick
    np.testing.assert_array_equal(quick, plain)


def test_the_quick_options_are_those_this_xla_takes():
    taken = x64.quick_compile_options()
    assert set(taken) <= set(x64.QUICK_COMPILE_OPTIONS)
    assert ("xla_llvm_disable_expensive_passes", True) in taken  # every XLA of the three stacks has it


@pytest.mark.parametrize("size, quick", [(x64.QUICK_COMPILE_BELOW - 1, True), (x64.QUICK_COMPILE_BELOW, False)])
def test_the_inputs_size_chooses_the_options(monkeypatch, size, quick):
    """An option XLA refuses, swapped in from the test side, fails exactly the programs compiled with the quick
    options: those whose inputs hold fewer than QUICK_COMPILE_BELOW elements, never one traced inside another."""
    monkeypatch.setattr(x64, "quick_compile_options", lambda: (("xla_no_such_option_here", True),))
    f = x64.reference_jit(lambda x: x * 2.0)
    x = np.zeros(size, np.float32)
    if quick:
        with pytest.raises(Exception, match="xla_no_such_option_here"):
            f(x)
        np.testing.assert_array_equal(jax.jit(f)(x[:4]), np.zeros(4))  # nested: the outer program's options
    else:
        np.testing.assert_array_equal(f(x)[:4], np.zeros(4))
