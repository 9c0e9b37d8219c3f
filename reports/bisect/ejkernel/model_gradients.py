"""Whose is the zero gradient, and whose is "Transpose rule ... for 'custom_vjp_call' not implemented"?

jax.grad of ejkernel's gated_delta_rule (T = 32 > 1: its XLA path, from 0.0.78 on; fp32, K = V = 64, h0) under
three versions of the candidate leg's MXU model of a pure-JAX dot, and outside any model. Run with one ejkernel
release first on the path (``PYTHONPATH=<its folder>:<its dependencies>:. python
reports/bisect/ejkernel/model_gradients.py``); it prints, per model, each gradient's max |difference| relative to
jax's own gradient outside the model, or the error.

- ``bit-mask``: the model before commit b5dec6d: the bf16 split as written (bit masks), differentiated by jax;
- ``custom_vjp``: b5dec6d's: the model wrapped in a jax.custom_vjp whose backward is the exact dot's pullback;
- ``primitive``: this tree's (``harness.legs.external.modeled_dot_p``): a bilinear primitive.

The earlier models are rebuilt here from the test side (``_modeled_dot_general``'s last step replaced), not kept in
the harness."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harness.legs import external
from kernels_tpu import mxu


def bit_mask(passes, dims, precision):
    def model(a, b):
        with external.unmodelled_dots():
            return mxu.modeled_dot(a, b, passes, dims, record=False)
    return model


def custom_vjp(passes, dims, precision):
    @jax.custom_vjp
    def model(a, b):
        return bit_mask(passes, dims, precision)(a, b)

    def backward(operands, cotangent):
        with external.unmodelled_dots():
            pullback = jax.vjp(lambda a, b: lax.dot_general(a, b, dims, precision=precision,
                                                            preferred_element_type=jnp.float32), *operands)[1]
        return pullback(cotangent)

    model.defvjp(lambda a, b: (model(a, b), (a, b)), backward)
    return model


def primitive(passes, dims, precision):
    return lambda a, b: external.modeled_dot_p().bind(a, b, passes=passes, dimension_numbers=dims,
                                                      precision=precision)


class Swapped:
    """``modeled_dot_p().bind`` answered by another model while the block runs (the leg binds through it)."""

    def __init__(self, make):
        self.make = make

    def bind(self, a, b, *, passes, dimension_numbers, precision):
        return self.make(passes, dimension_numbers, precision)(a, b)


def main():
    import importlib.metadata

    from peers.ejkernel import ENTRY, IMPORT_ERROR

    if IMPORT_ERROR:
        sys.exit(IMPORT_ERROR)
    rng = np.random.default_rng(0)
    B, T, H, K, V = 1, 32, 1, 64, 64
    q, k = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((B, T, H, V)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.1, 0.9, (B, T, H)), jnp.float32)
    g = jnp.asarray(-rng.uniform(0.01, 0.2, (B, T, H)), jnp.float32)
    h0 = jnp.asarray(rng.standard_normal((B, H, K, V)) * 0.1, jnp.float32)

    def loss(q, k, v, beta, g, h0):
        o, ht = ENTRY(q, k, v, beta, g, initial_state=h0, use_qk_l2norm=True)
        return jnp.sum(o * jnp.cos(o)) + jnp.sum(ht.astype(jnp.float32) * 0.5)

    names = ("dq", "dk", "dv", "dbeta", "dg", "dh0")
    args = (q, k, v, beta, g, h0)
    exact = jax.grad(loss, argnums=range(6))(*args)
    print(f"ejkernel {importlib.metadata.version('ejkernel')}, jax {jax.__version__}")
    for name, make in (("bit-mask", bit_mask), ("custom_vjp", custom_vjp), ("primitive", primitive)):
        real = external.modeled_dot_p
        external.modeled_dot_p = lambda: Swapped(make) if make is not primitive else real()
        try:
            with external.mxu_rounding():
                jax.clear_caches()
                got = jax.grad(loss, argnums=range(6))(*args)
            said = ", ".join(f"{n} {float(jnp.max(jnp.abs(x - e)) / jnp.max(jnp.abs(e))):.1e}"
                             + (" (all zero)" if not jnp.any(x) else "") for n, x, e in zip(names, got, exact))
        except Exception as exc:  # noqa: BLE001 - the error is the finding
            said = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        finally:
            external.modeled_dot_p = real
            jax.clear_caches()
        print(f"  {name:10s} {said}")


if __name__ == "__main__":
    main()
