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
import functools
from typing import Callable, Iterator

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


# ------------------------------------------------------------------ how XLA:CPU compiles a reference's programs
QUICK_COMPILE_OPTIONS = (("xla_cpu_use_fusion_emitters", False), ("xla_llvm_disable_expensive_passes", True))
"""XLA:CPU's options for a small reference program: its loop emitters (not its fusion emitters), and LLVM without
its expensive passes. Each compiles faster, and neither changed a value where measured (neither turns on a
fast-math flag: an operation rounds as it does at the defaults; tests/test_reference_x64.py holds it on a sum that
tells a fused multiply-add from two roundings). Measured on smoke's 21 kda and gla cases (golden and check, one process, 2-core Xeon, 2026-11-30; reports/bench/2026-11-30-reference-compile):
100 s at the defaults, 80 s with the loop emitters, 72 s with both, every one of 198 tensors bit for bit. Both
cost run time on a long case (kda B1-T2048-H4: about 10-15% warm), so they are for programs that compile for
longer than they run (:data:`QUICK_COMPILE_BELOW`)."""

QUICK_COMPILE_BELOW = 1 << 21
"""The inputs (elements, all arrays together) below which a reference program is compiled with
:data:`QUICK_COMPILE_OPTIONS`: every case of smoke (its largest inputs hold 0.46 M elements), all but 3 of
regressions' 154 (up to 2.6 M), none of the benchmark's (B1-T2048-H4 holds about 5 M), where a warm run is the
measure."""


@functools.cache
def quick_compile_options() -> tuple[tuple[str, object], ...]:
    """The options of :data:`QUICK_COMPILE_OPTIONS` that this process's XLA takes (jax 0.12's has no loop emitters,
    and an option XLA lacks fails the compile): asked once each, on a one-operation program."""
    taken = []
    for option in QUICK_COMPILE_OPTIONS:
        try:
            jax.jit(lambda x: x + 1, compiler_options=dict([option])).lower(1.0).compile()
        except Exception:  # XLA's INVALID_ARGUMENT ("No such compile option"), raised as a JaxRuntimeError
            continue
        taken.append(option)
    return tuple(taken)


def reference_jit(fn: Callable, **jit_options) -> Callable:
    """``jax.jit(fn, **jit_options)``, compiled with :func:`quick_compile_options` when its array arguments hold
    fewer than :data:`QUICK_COMPILE_BELOW` elements, at XLA's defaults otherwise: the same values either way, so a
    case's size chooses only how long its programs take to compile and to run. Called inside another traced
    program it is a plain ``jax.jit`` (jax takes compiler options only on the outermost): it compiles with that
    program's options."""
    default = jax.jit(fn, **jit_options)
    quick = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        size = sum(int(np.prod(x.shape)) for x in leaves if hasattr(x, "shape"))
        if size >= QUICK_COMPILE_BELOW or any(isinstance(x, jax.core.Tracer) for x in leaves):
            return default(*args, **kwargs)  # inside another program (traced), which holds the options
        if not quick:
            quick[0] = jax.jit(fn, compiler_options=dict(quick_compile_options()), **jit_options)
        return quick[0](*args, **kwargs)

    return call
