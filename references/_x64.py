"""Float64 on the CPU, scoped: no module-level ``jax_enable_x64``.

Every reference computes inside :func:`float64_cpu`, which turns on 64-bit
types for the duration of the call only, pins the work to the CPU device and
sets the default matmul precision to HIGHEST. Results leave as numpy arrays
whose dtype is checked, not assumed.

It also holds the BLAS libraries loaded in the process (OpenBLAS: jaxlib's LAPACK custom calls, the chunk
form's ``solve_triangular``, run on scipy's) to one thread for the call. Their worker threads spin for work
while XLA:CPU's own thread pool holds the cores, so on this 2-core machine each small ``trsm`` waited on
descheduled workers: 4 unit-lower 64x64 solves with 64 right-hand sides took 25-45 ms with OpenBLAS's default
threads and 0.13 ms with one, bit for bit the same result (2026-11-28, reports/bench/2026-11-28-reference-cost).
The results do not depend on it: a one-thread BLAS call is the same sequence of operations a threaded one
splits, and the reference's tests compare the values, not the threads.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import numpy as np
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
