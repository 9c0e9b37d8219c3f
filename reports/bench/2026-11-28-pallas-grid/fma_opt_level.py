"""Which rounding x*y+z and rsqrt get under XLA:CPU level 0 and level 2 (README.md)."""
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
x, y, z = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(3)); x *= 4
for o in [(("xla_backend_optimization_level", 0),), (("xla_cpu_max_isa", "SSE4_2"),), ()]:
    f = jax.jit(lambda x, y, z: x * y + z, compiler_options=dict(o))
    r = np.asarray(f(x, y, z))
    unfused = x * y + z  # numpy: the product rounded to f32, then the sum
    fused = (x.astype(np.float64) * y + z).astype(np.float32)  # product exact in f64, one (double) rounding
    g = jax.jit(lambda a: jax.lax.rsqrt(a), compiler_options=dict(o))
    a = np.abs(x) + 1
    rs = np.asarray(g(a)); exact = (1 / np.sqrt(a.astype(np.float64))).astype(np.float32)
    print(o, "fma: == numpy unfused", int((r == unfused).sum()), "== fused", int((r == fused).sum()), "of", r.size,
          "| rsqrt == correctly rounded", int((rs == exact).sum()))
