"""Where an operation's bits depend on what XLA:CPU fuses it with, at level 0 and at level 3: each op applied to
numpy's rounded product x*c ("alone") and to x*c computed in the same program ("fused"), 65536 float32 values;
and rsqrt(x + eps) against rsqrt of numpy's x + eps. python reports/bench/2026-11-29-rounding-fence/context.py"""
import os

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

rng = np.random.default_rng(1)
x = (rng.standard_normal(1 << 16) * 3).astype(np.float32)
c = np.float32(0.37)
ops = {"exp": jnp.exp, "log": lambda v: jnp.log(jnp.abs(v) + 1), "log1p": lambda v: jnp.log1p(jnp.abs(v)),
       "logistic": lax.logistic, "tanh": jnp.tanh, "sqrt": lambda v: jnp.sqrt(jnp.abs(v) + 1),
       "div": lambda v: 1 / (jnp.abs(v) + 1), "expm1": jnp.expm1, "pow": lambda v: (jnp.abs(v) + 1) ** 1.3}
for name, f in ops.items():
    row = []
    for level in (0, 1, 3):
        opts = {"xla_backend_optimization_level": level}
        alone = np.asarray(jax.jit(f, compiler_options=opts)(x * c))
        fused = np.asarray(jax.jit(lambda v: f(v * c), compiler_options=opts)(x))
        row.append(int((alone != fused).sum()))
    print(f"{name:9s} fused != alone: level 0 {row[0]:6d}, level 1 {row[1]:6d}, level 3 {row[2]:6d}")
y = (np.abs(rng.standard_normal(1 << 16)) * 30).astype(np.float32)
eps = np.float32(1e-6)
for level in (0, 1, 3):
    opts = {"xla_backend_optimization_level": level}
    alone = np.asarray(jax.jit(lax.rsqrt, compiler_options=opts)(y + eps))
    fused = np.asarray(jax.jit(lambda v: lax.rsqrt(v + 1e-6), compiler_options=opts)(y))
    print(f"rsqrt(x + eps) fused != alone: level {level} {int((alone != fused).sum())}")
