"""XLA:CPU flags at level 1-2 against level 0 on x*y+z, rsqrt, log_sigmoid (README.md)."""
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
x, y, z = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(3)); x *= 4
fns = {"fma": lambda x, y, z: x * y + z, "rsqrt": lambda x, y, z: jax.lax.rsqrt(jnp.abs(x) + 1),
       "logsigmoid": lambda x, y, z: jax.nn.log_sigmoid(x)}
for name, f in fns.items():
    base = np.asarray(jax.jit(f, compiler_options={"xla_backend_optimization_level": 0})(x, y, z))
    for opts in [{"xla_backend_optimization_level": 1},
                 {"xla_backend_optimization_level": 1, "xla_cpu_enable_fast_math": False},
                 {"xla_backend_optimization_level": 2, "xla_cpu_enable_fast_min_max": False},
                 {"xla_cpu_enable_platform_dependent_math": False}]:
        try:
            r = np.asarray(jax.jit(f, compiler_options=opts)(x, y, z)); print(name, opts, int((r != base).sum()), "differ")
        except Exception as e: print(name, opts, "error", str(e)[:100])
