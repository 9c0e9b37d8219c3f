"""Per-token cost of single ops on a [1,4,128,128] float64 state inside a 64-step lax.scan (the pieces of the
token step), jitted, the best of 5 calls: PYTHONPATH=. python reports/bench/2026-11-28-reference-check/token_ops.py"""
import time, numpy as np, jax, jax.numpy as jnp
from jax import lax
from references._x64 import float64_cpu
HI=lax.Precision.HIGHEST
B,C,H,K,V=1,64,4,128,128
rng=np.random.default_rng(0)
def tm(name, fn, *a):
    ts=[]
    for i in range(6):
        t0=time.perf_counter(); jax.block_until_ready(fn(*a)); ts.append(time.perf_counter()-t0)
    print(f"{name:40s} {min(ts[1:])*1e3/C*1e3:7.1f} us/token", flush=True)
with float64_cpu():
    S=jnp.asarray(rng.standard_normal((B,H,K,V))); ks=jnp.asarray(rng.standard_normal((C,B,H,K))); vs=jnp.asarray(rng.standard_normal((C,B,H,V)))
    def run(body): return jax.jit(lambda S,ks,vs: lax.scan(body,S,(ks,vs)))
    tm("carry only S*0.99", run(lambda S,x:(S*0.99, x[0])), S,ks,vs)
    tm("k.S  bhk,bhkv->bhv (dot)", run(lambda S,x:(S*0.99, jnp.einsum("bhk,bhkv->bhv",x[0],S,precision=HI))), S,ks,vs)
    tm("S.v  bhkv,bhv->bhk (dot)", run(lambda S,x:(S*0.99, jnp.einsum("bhkv,bhv->bhk",S,x[1],precision=HI))), S,ks,vs)
    tm("k.S  elementwise sum", run(lambda S,x:(S*0.99, jnp.sum(x[0][...,:,None]*S,-2))), S,ks,vs)
    tm("S.v  elementwise sum", run(lambda S,x:(S*0.99, jnp.sum(S*x[1][...,None,:],-1))), S,ks,vs)
    tm("k.S  default precision", run(lambda S,x:(S*0.99, jnp.einsum("bhk,bhkv->bhv",x[0],S))), S,ks,vs)
    tm("k.S  as matmul [B,H,1,K]@S", run(lambda S,x:(S*0.99, jnp.matmul(x[0][...,None,:],S,precision=HI)[...,0,:])), S,ks,vs)
    tm("S.v  as matmul S@[B,H,V,1]", run(lambda S,x:(S*0.99, jnp.matmul(S,x[1][...,:,None],precision=HI)[...,0])), S,ks,vs)
    tm("outer update S + k v^T", run(lambda S,x:(S+x[0][...,:,None]*x[1][...,None,:], x[0])), S,ks,vs)
    tm("kS + outer (fwd-like)", run(lambda S,x:(S+x[0][...,:,None]*(x[1]-jnp.einsum("bhk,bhkv->bhv",x[0],S,precision=HI))[...,None,:], x[0])), S,ks,vs)
