"""Does eft.two_product / eft.fma stay exact under this jax's jit (XLA:CPU) and inside a Pallas interpret kernel?"""
import sys; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from kernels_tpu import eft
print(jax.__version__)
rng = np.random.default_rng(0)
a = rng.standard_normal((8, 128)).astype(np.float32); b = rng.standard_normal((8, 128)).astype(np.float32)
exact = a.astype(np.float64) * b.astype(np.float64)
p, e = jax.jit(lambda a, b: eft.two_product(a, b))(a, b)
print("jit two_product exact:", np.array_equal(np.asarray(p, np.float64) + np.asarray(e, np.float64), exact))
def k(a_ref, b_ref, p_ref, e_ref):
    p, e = eft.two_product(a_ref[...], b_ref[...]); p_ref[...] = p; e_ref[...] = e
p, e = pl.pallas_call(k, out_shape=[jax.ShapeDtypeStruct(a.shape, jnp.float32)] * 2, interpret=True)(a, b)
print("pallas interpret two_product exact:", np.array_equal(np.asarray(p, np.float64) + np.asarray(e, np.float64), exact))
c = rng.standard_normal((8, 128)).astype(np.float32)
f = jax.jit(lambda a, b, c: eft.fma(a, b, c))(a, b, c)
ref = (exact + c.astype(np.float64)).astype(np.float32)
print("jit fma correctly rounded:", np.mean(np.asarray(f) == ref))
