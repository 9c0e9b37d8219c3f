import jax, numpy as np
rng = np.random.default_rng(0)
x, y, z = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(3)); x *= 4
a = np.abs(x) + 1
def run(o):
    r = np.asarray(jax.jit(lambda x, y, z: x * y + z, compiler_options=dict(o))(x, y, z))
    rs = np.asarray(jax.jit(lambda a: jax.lax.rsqrt(a), compiler_options=dict(o))(a))
    ls = np.asarray(jax.jit(lambda a: jax.nn.log_sigmoid(a), compiler_options=dict(o))(x))
    return r, rs, ls
base = run((("xla_backend_optimization_level", 0),))
print("default level vs level 0, differing values:", [int((u != v).sum()) for u, v in zip(run(()), base)])
