"""The recurrent check's core alone, forward and backward (jax.vjp), gdn at B1-T2048-H4 K=V=128 C=64, random float64
inputs; prints each call's wall time (the second is the one quoted). Run from a checkout:
    PYTHONPATH=. python reports/bench/2026-11-28-reference-check/check_fwd_bwd.py [T]"""
import time, sys, numpy as np, jax, jax.numpy as jnp
from references import kda as R
from references.gdn import GDN
from references._x64 import float64_cpu
B,T,H,K,V=1,int(sys.argv[1]) if len(sys.argv)>1 else 2048,4,128,128
rng=np.random.default_rng(0)
with float64_cpu():
    q=jnp.asarray(rng.standard_normal((B,T,H,K))/np.sqrt(K)); k=jnp.asarray(rng.standard_normal((B,T,H,K))/np.sqrt(K))
    v=jnp.asarray(rng.standard_normal((B,T,H,V))); g=jnp.asarray(-np.abs(rng.standard_normal((B,T,H,1)))/16)
    beta=jnp.asarray(rng.uniform(size=(B,T,H))); h0=jnp.asarray(rng.standard_normal((B,H,K,V)))
    do=jnp.asarray(rng.standard_normal((B,T,H,V))); dht=jnp.asarray(rng.standard_normal((B,H,K,V)))
    tokens=(q,k,v,g,beta)
    f=jax.jit(lambda t,h: R._core(GDN,t,h,K**-0.5,64,"recurrent"))
    def L(t,h): 
        _,vjp=jax.vjp(lambda t,h: R._core(GDN,t,h,K**-0.5,64,"recurrent"), t,h); return vjp((do,dht[None] if False else dht))
    gf=jax.jit(L)
    for name,fn in (("fwd",f),("bwd",gf)):
        for i in range(2):
            t0=time.perf_counter(); jax.block_until_ready(fn(tokens,h0)); print(name,i,time.perf_counter()-t0,flush=True)
