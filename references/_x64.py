"""Float64 on the CPU, scoped: no module-level ``jax_enable_x64``.

Every reference computes inside :func:`float64_cpu`, which turns on 64-bit
types for the duration of the call only, pins the work to the CPU device and
sets the default matmul precision to HIGHEST. Results leave as numpy arrays
whose dtype is checked, not assumed.

It also holds the BLAS libraries loaded in the process (OpenBLAS: jaxlib's LAPACK custom calls, the chunk
form's ``solve_triangular``, run on scipy's) to one thread for the call. With OpenBLAS's default threads (one per
core) beside XLA:CPU's own thread pool, 4 unit-lower 64x64 solves with 64 right-hand sides took 25-45 ms on this
2-core machine, and 0.13 ms with one thread, the same bits (2026-11-28, reports/bench/2026-11-28-reference-cost:
most likely OpenBLAS's workers waiting for cores that XLA's pool holds; not traced further). One thread changes
no value of smoke's references (the same report: every tensor bit for bit).
jaxlib loads that library (through scipy's ``cython_lapack``) at its first LAPACK call, which the limit, taken
on entry, would not see: this module imports it first.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import numpy as np
import scipy.linalg.cython_lapack  # noqa: F401 - loads the OpenBLAS jaxlib's LAPACK calls use (see below)
from threadpoolctl import threadpool_limits

COMPUTE_DTYPES = ("float64", "float32")


@contextlib.contextmanager
def float64_cpu(enable: bool = True) -> Iterator[None]:
    cpu = jax.devices("cpu")[0]
    with (jax.enable_x64(enable), jax.default_device(cpu), jax.default_matmul_precision("highest"),
          threadpool_limits(limits=1, user_api="blas")):
        yield


def as_arrays(*xs) -> list:
    """Each input as a numpy array as given (no cast, so the contract sees its dtype); None stays None."""
    return [None if x is None else np.asarray(x) for x in xs]


def to_jax(x, dtype: str):
    """Upcast an input (any float numpy dtype, bf16 included) to ``dtype`` exactly."""
    if x is None:
        return None
    import jax.numpy as jnp

    return jnp.asarray(np.asarray(x).astype(dtype))


def to_numpy(tree, dtype: str):
    """Convert jax results to numpy and check every array really is ``dtype``."""
    def conv(x):
        if x is None:
            return None
        a = np.asarray(x)
        if a.dtype != np.dtype(dtype):
            raise AssertionError(f"reference produced {a.dtype}, expected {dtype}")
        return a

    return jax.tree_util.tree_map(conv, tree, is_leaf=lambda x: x is None)


def check_compute_dtype(compute_dtype: str) -> None:
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"{compute_dtype=} must be one of {COMPUTE_DTYPES}")
