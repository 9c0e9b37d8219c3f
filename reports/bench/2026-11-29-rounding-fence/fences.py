"""What stops XLA:CPU from contracting ``a * b + c`` at its full level, on 65536 random float32 values each
(numpy's two roundings are the reference): python reports/bench/2026-11-29-rounding-fence/fences.py"""
import os

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax._src.lax import lax as lax_internal  # noqa: E402

from harness.emulation import rounding  # noqa: E402

rng = np.random.default_rng(0)
a, b, c = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(3))
two = a * b + c
mul = rounding.rounded(lax_internal.mul_p)


def xor_zero(p, zero):
    return lax.bitcast_convert_type(lax.bitcast_convert_type(p, jnp.uint32) ^ zero, jnp.float32)


tries = {
    "a * b + c": lambda a, b, c: a * b + c,
    "optimization_barrier(a * b) + c": lambda a, b, c: lax.optimization_barrier(a * b) + c,
    "reduce_precision(a * b, f32) + c": lambda a, b, c: lax.reduce_precision(a * b, 8, 23) + c,
    "xor with a constant 0": lambda a, b, c: xor_zero(a * b, jnp.uint32(0)) + c,
    "xor with an argument 0": lambda a, b, c, z: xor_zero(a * b, z) + c,
    "xor with replica-id (rounding.rounded)": lambda a, b, c: mul.bind(a, b) + c,
}
for name, f in tries.items():
    for level in (0, 1, 3):
        args = (a, b, c, np.uint32(0)) if "argument" in name else (a, b, c)
        y = np.asarray(jax.jit(f, compiler_options={"xla_backend_optimization_level": level})(*args))
        print(f"level {level}  {name:40s} differs from two roundings on {int((y != two).sum()):5d} of {y.size}")
