"""Elementwise ops under XLA:CPU level 0 against level 2 with a capped ISA: which round differently (README.md)."""
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal(1 << 16).astype(np.float32) * 4)
y = jnp.asarray(rng.standard_normal(1 << 16).astype(np.float32))
z = jnp.asarray(rng.standard_normal(1 << 16).astype(np.float32))
fns = {"exp": lambda x, y, z: jnp.exp(x), "log": lambda x, y, z: jnp.log(jnp.abs(x) + 1e-3), "exp2": lambda x, y, z: jnp.exp2(x),
       "log1p": lambda x, y, z: jnp.log1p(jnp.abs(x)), "sigmoid": lambda x, y, z: jax.nn.sigmoid(x),
       "logsigmoid": lambda x, y, z: jax.nn.log_sigmoid(x), "fma": lambda x, y, z: x * y + z, "div": lambda x, y, z: x / y,
       "rsqrt": lambda x, y, z: jax.lax.rsqrt(jnp.abs(x)+1), "sqrt": lambda x, y, z: jnp.sqrt(jnp.abs(x)),
       "sum": lambda x, y, z: jnp.sum(x.reshape(256, 256), axis=1), "cumsum": lambda x, y, z: jnp.cumsum(x.reshape(256,256), axis=1)}
for name, f in fns.items():
    outs = [np.asarray(jax.jit(f, compiler_options=dict(o)).lower(x, y, z).compile()(x, y, z)) for o in
            [(("xla_backend_optimization_level", 0),), (("xla_cpu_max_isa", "SSE4_2"),)]]
    print(f"{name:10s} level0 vs level2+SSE4_2: {int((outs[0] != outs[1]).sum())} of {outs[0].size} differ")
