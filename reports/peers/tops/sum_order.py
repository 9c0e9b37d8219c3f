# Run with each stack's python from the repository root: python reports/peers/tops/sum_order.py
"""Is the 1.2x dq/dk rel_l2 of kernels_tpu.gated_recurrent against fla on tops' fp32 cases the order of the V-axis
sum in interpret mode? Run the kernel as is, then with eft.dot_rows's sums as an explicit pairwise tree (a TPU lane
reduction's shape), both against the float64 reference, on B2-T32-H4-K32-V64 fp32 g=logsigmoid(N(0,1))."""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import numpy as np, jax, jax.numpy as jnp
from kernels_tpu import eft
import kernels_tpu.gated_recurrent as gr
from references import simple_gla as ref

B, T, H, K, V = 2, 32, 4, 32, 64
def rel(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64); return np.linalg.norm(x - y) / np.linalg.norm(y)

def tree(x, axis):
    x = jnp.moveaxis(x, axis, -1)
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:2 * h]
    return jnp.moveaxis(x, -1, axis)

orig = eft.dot_rows
def dot_rows_tree(x, y, axis, y_parts=None):
    p, e = eft.two_product(x, y, None, y_parts)
    return tree(p, axis) + tree(e, axis)

def grads(seed):
    rng = np.random.default_rng(seed); n = lambda *s: rng.standard_normal(s).astype(np.float32)
    q, k, v, do = n(B, T, H, K), n(B, T, H, K), n(B, T, H, V), n(B, T, H, V)
    g = (-np.logaddexp(0.0, -rng.standard_normal((B, T, H)))).astype(np.float32)
    out = {}
    for name, fn in (("xla", orig), ("tree", dot_rows_tree)):
        gr.eft.dot_rows = fn
        jax.clear_caches()  # the kernels' jitted wrappers traced the previous dot_rows
        f = lambda q, k, v: gr.fused_recurrent_simple_gla(q, k, v, g=jnp.asarray(g), interpret=True)[0]
        o, vjp = jax.vjp(f, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
        out[name] = (o,) + vjp(jnp.asarray(do))
    gr.eft.dot_rows = orig
    r = ref.chunk_simple_gla_bwd(q, k, v, do, None, g=g, chunk_size=16)
    o_r, _ = ref.chunk_simple_gla(q, k, v, g=g, chunk_size=16)
    return {name: dict(o=rel(x[0], o_r), dq=rel(x[1], r["dq"]), dk=rel(x[2], r["dk"]), dv=rel(x[3], r["dv"]))
            for name, x in out.items()}

for seed in range(3):
    e = grads(seed)
    print(seed, {k: {t: f"{v:.3e}" for t, v in d.items()} for k, d in e.items()})
