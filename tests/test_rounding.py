"""harness.emulation.rounding: a fenced result has the operation's own bits, and nothing fuses into it."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from jax import lax  # noqa: E402
from jax._src.lax import lax as lax_internal  # noqa: E402

from harness.emulation import rounding  # noqa: E402
from harness.emulation.pallas_batched import batched_interpret, unavailable  # noqa: E402
from harness.legs.tpu import INTERPRET_COMPILER_OPTIONS, interpret_options  # noqa: E402

# XLA:CPU above level 0, where LLVM contracts a * b + c unless fenced: by XLA's default emitters, and by the leg's
# options where this jax takes them (jax 0.10: the loop emitters)
LEVELS = [{"xla_backend_optimization_level": 1}]
if interpret_options() == INTERPRET_COMPILER_OPTIONS:
    LEVELS.append(dict(INTERPRET_COMPILER_OPTIONS))
FULL = LEVELS[-1]
ROUNDED_MUL = rounding.rounded(lax_internal.mul_p)


def _bits(x):
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}")


@pytest.mark.parametrize("options", LEVELS, ids=str)
def test_a_fenced_product_rounds_before_the_add(options):
    """a = 1 + 2^-12: a*a = 1 + 2^-11 + 2^-24 exactly, a tie at float32's ulp 2^-23 that rounds to even 1 + 2^-11.
    So a*a - (1 + 2^-11) is 0 with two roundings and 2^-24 fused into one."""
    a = np.full(4096, 1 + 2.0 ** -12, dtype=np.float32)
    c = np.full(4096, -(1 + 2.0 ** -11), dtype=np.float32)
    fenced = jax.jit(lambda a, c: ROUNDED_MUL.bind(a, a) + c, compiler_options=options)
    assert np.all(np.asarray(fenced(a, c)) == 0)
    sub = jax.jit(lambda a, c: -c - ROUNDED_MUL.bind(a, a), compiler_options=options)  # a*a fused into a subtract too
    assert np.all(np.asarray(sub(a, c)) == 0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_the_fence_keeps_every_bit(dtype):
    """Signed zeros, infinities, NaN payloads and subnormals come out of the fence as they went in."""
    info = ml_dtypes.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.smallest_subnormal),
                        -float(info.smallest_subnormal), float(info.max), float(info.tiny), 1.0, -3.5], dtype=dtype)
    bits = _bits(special).copy()
    bits[4] |= 1  # a NaN with a payload
    x = bits.view(dtype)
    ones = np.ones_like(x)
    out = jax.jit(lambda x, y: ROUNDED_MUL.bind(x, y), compiler_options=FULL)(x, ones)
    assert _bits(out).tolist() == _bits(jax.jit(lambda x, y: x * y, compiler_options=FULL)(x, ones)).tolist()


def test_which_results_are_fenced():
    jaxpr = jax.make_jaxpr(lambda x, i: (x * x, jnp.exp(x), x + x, jnp.sum(x), i * i, lax.rsqrt(x)))(
        np.ones(4, np.float32), np.ones(4, np.int32)).jaxpr
    fenced = {e.primitive.name for e in jaxpr.eqns if rounding.rounds(e)}
    assert fenced == {"mul", "exp", "rsqrt"}  # not the add, the sum, or the integer product


def test_a_fenced_result_is_vmapped_as_an_elementwise_op():
    """A scalar operand beside an array, and an operand the batch does not carry (the batched grid's programs)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    s = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    w = np.linspace(-1, 1, 4, dtype=np.float32)
    got = jax.vmap(lambda x, s: ROUNDED_MUL.bind(ROUNDED_MUL.bind(x, s), w))(x, s)
    assert np.array_equal(np.asarray(got), x * s[:, None] * w)
    exp = rounding.rounded(lax_internal.exp_p)
    assert np.array_equal(np.asarray(jax.vmap(exp.bind)(x)), np.asarray(jnp.exp(x)))


@pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}: the leg runs at level 0, unfenced")
def test_the_leg_rewrite_reaches_loops_and_conditionals():
    """The calls around the kernels are evaluated with every fenced result rounded, at any depth."""
    a = np.full(256, 1 + 2.0 ** -12, dtype=np.float32)
    c = np.full(256, -(1 + 2.0 ** -11), dtype=np.float32)

    def f(a, c):
        looped = lax.fori_loop(0, 2, lambda i, acc: acc + (a * a + c), jnp.zeros_like(a))
        branched = lax.cond(a[0] > 0, lambda: a * a + c, lambda: c)
        return looped, branched

    looped, branched = jax.jit(batched_interpret(f), compiler_options=FULL)(a, c)
    assert np.all(np.asarray(looped) == 0) and np.all(np.asarray(branched) == 0)
