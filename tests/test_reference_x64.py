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
