import time, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
H, K, V, T = 4, 128, 128, 2048
def rec(S, ks, vs):
    def step(S, kv):
        k, v = kv
        u = v - jnp.einsum("hk,hkv->hv", k, S)
        S = 0.99 * S + jnp.einsum("hk,hv->hkv", k, u)
        return S, jnp.einsum("hk,hkv->hv", k, S)
    return jax.lax.scan(step, S, (ks, vs))
f = jax.jit(rec)
rng = np.random.default_rng(0)
def mk(h):
    return (jnp.zeros((h, K, V)), jnp.asarray(rng.standard_normal((T, h, K)) * 0.05), jnp.asarray(rng.standard_normal((T, h, V))))
a = mk(H); b1 = mk(H // 2); b2 = mk(H // 2)
jax.block_until_ready(f(*a)); jax.block_until_ready(f(*b1))
for _ in range(2):
    t = time.perf_counter(); jax.block_until_ready(f(*a)); t1 = time.perf_counter() - t
    t = time.perf_counter(); r1 = f(*b1); r2 = f(*b2); jax.block_until_ready((r1, r2)); t2 = time.perf_counter() - t
    t = time.perf_counter(); jax.block_until_ready(f(*b1)); t3 = time.perf_counter() - t
    print(f"H4 one call {t1:.3f}s | two H2 calls {t2:.3f}s | one H2 call {t3:.3f}s")
from concurrent.futures import ThreadPoolExecutor
ex = ThreadPoolExecutor(2)
for _ in range(3):
    t = time.perf_counter()
    futs = [ex.submit(lambda b: jax.block_until_ready(f(*b)), b) for b in (b1, b2)]
    [x.result() for x in futs]
    print(f"two H2 calls in two threads {time.perf_counter() - t:.3f}s")
