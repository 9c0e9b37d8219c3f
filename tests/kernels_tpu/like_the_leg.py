"""The kernels' tests run each call as the emulated TPU leg runs a case: one XLA:CPU program in which every operation
rounds as written. The leg gets that at XLA's full level by fencing every product
(:data:`harness.legs.tpu.INTERPRET_COMPILER_OPTIONS`, :mod:`harness.emulation.rounding`); a test's program compiles
at level 0 instead (:data:`harness.legs.tpu.LEVEL_0_OPTIONS`), where nothing is contracted either: a test's small
shapes are compile time, which level 0 halves, not run time.

Why: an interpret-mode run is nearly all XLA:CPU compile time, and the kernels called eagerly compile each of their
programs at XLA's default level, 2 to 3 times slower (gdn with grouped value heads, forward and backward: 27.6 s
eager, 10.3 s as one program with the leg's options, on this 2-core machine with other work beside it).

XLA's default emitters here, where the leg uses the loop emitters (``xla_cpu_use_fusion_emitters=False``, jax
0.10). At level 0 without fences, as the leg ran until 2026-11-28, the loop emitters broke what
tests/kernels_tpu/test_head_dims_and_varlen.py asserts: simple_gla's chunk kernel on packed sequences (bf16, lens
37+1+90) bit-equal to the same sequences run one at a time. At the leg's options (level 1, fenced, by the batched
grid) those tests pass too (checked 2026-11-29 by pointing :func:`leg_jit` at them: 5 passed).

- :func:`leg_jit`: ``jax.jit`` at level 0, for a test's own jitted program;
- :func:`like_the_leg`: a kernel entry point called eagerly becomes one such program per call signature. Floating
  arrays are its traced arguments; everything else (ints, tuples, ``cu_seqlens`` as numpy integers, flags, block
  sizes) stays a Python value, as the kernel expects it. Called inside another trace (a test's ``jax.vjp`` or its
  own ``leg_jit``), it is the plain function: the enclosing program's options apply.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from harness.legs.tpu import LEVEL_0_OPTIONS


def leg_jit(fn=None, **kwargs):
    """``jax.jit`` at XLA:CPU level 0, where nothing is contracted (usable as ``@leg_jit`` or ``leg_jit(fn)``)."""
    if fn is None:
        return functools.partial(leg_jit, **kwargs)
    return jax.jit(fn, compiler_options=dict(LEVEL_0_OPTIONS), **kwargs)


def _traced(value) -> bool:
    return isinstance(value, (np.ndarray, jax.Array)) and jnp.issubdtype(value.dtype, jnp.inexact)


def like_the_leg(fn):
    """``fn`` (a kernel entry point) called as one program compiled with the leg's options; see the module doc."""
    programs: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves((args, kwargs))):
            return fn(*args, **kwargs)
        at = tuple(i for i, a in enumerate(args) if _traced(a))
        names = tuple(sorted(k for k, v in kwargs.items() if _traced(v)))
        fixed_args = {i: a for i, a in enumerate(args) if i not in at}
        fixed_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        key = (len(args), at, names, repr(sorted(fixed_args.items())), repr(sorted(fixed_kwargs.items())))
        if key not in programs:
            def program(traced_args, traced_kwargs):
                given = {**dict(zip(at, traced_args)), **fixed_args}
                return fn(*(given[i] for i in range(len(args))), **traced_kwargs, **fixed_kwargs)

            programs[key] = leg_jit(program)
        return programs[key](tuple(args[i] for i in at), {k: kwargs[k] for k in names})

    call.like_the_leg = True
    return call
