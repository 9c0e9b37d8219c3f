"""Finding 2 of README.md, located: ejkernel's gated_delta_rule (T > 1, its XLA path) on one bf16 gdn case (B1 T128
H1 K128, g = logsigmoid/10, h0, qk l2norm) against a float64 token-by-token reference: bf16 inputs, f32 inputs, f32
inputs with only the gate rounded to bf16, per 16-token block, and chunk_size=64. Run: python probe.py (a few
seconds; jax on the CPU)."""
import warnings; warnings.filterwarnings("ignore")
import numpy as np, jax, jax.numpy as jnp, ml_dtypes
jax.config.update("jax_enable_x64", False)
from ejkernel.kernels._pallas.tpu.gated_delta_rule import gated_delta_rule as gdr
rng = np.random.default_rng(1)
B,T,H,K = 1,128,1,128
bf = lambda x: np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
q, k, v = (bf(rng.standard_normal((B,T,H,K))) for _ in range(3))
beta = bf(1/(1+np.exp(-rng.standard_normal((B,T,H))))); g = np.log(1/(1+np.exp(-rng.standard_normal((B,T,H)))))/10
h0 = rng.standard_normal((B,H,K,K)) * 0.1
def ref(q,k,v,beta,g,h0):
    qn = q/np.sqrt((q*q).sum(-1,keepdims=True)+1e-6); kn = k/np.sqrt((k*k).sum(-1,keepdims=True)+1e-6)
    S = h0.copy(); o = np.zeros_like(v)
    for t in range(T):
        S = S*np.exp(g[:,t])[:,:,None,None]
        vn = v[:,t] - np.einsum('bhk,bhkv->bhv', kn[:,t], S)
        S = S + beta[:,t][:,:,None,None]*kn[:,t][...,None]*vn[:,:,None,:]
        o[:,t] = np.einsum('bhk,bhkv->bhv', qn[:,t]*K**-0.5, S)
    return o, S
o_r, S_r = ref(q,k,v,beta,g,h0)
rel = lambda a, r: float(np.linalg.norm(np.asarray(a, np.float64)-r)/np.linalg.norm(r))
def run(dt, g_in):
    o, S = gdr(*(jnp.asarray(x, dt) for x in (q,k,v,beta)), jnp.asarray(g_in, jnp.float32), initial_state=jnp.asarray(h0, jnp.float32), use_qk_l2norm=True)
    return rel(o, o_r), rel(S, S_r), S.dtype
print("bf16 inputs            o %.2e ht %.2e %s" % run(jnp.bfloat16, g))
print("f32 inputs             o %.2e ht %.2e %s" % run(jnp.float32, g))
print("f32 inputs, g in bf16  o %.2e ht %.2e %s" % run(jnp.float32, bf(g)))
print("bf16(ht ref) alone     ht %.2e" % rel(bf(S_r), S_r))
o, S = gdr(*(jnp.asarray(x, jnp.bfloat16) for x in (q,k,v,beta)), jnp.asarray(g, jnp.float32), initial_state=jnp.asarray(h0, jnp.float32), use_qk_l2norm=True)
o = np.asarray(o, np.float64)
print("o per 16-token block:", " ".join("%.1e" % rel(o[:, i:i+16], o_r[:, i:i+16]) for i in range(0, T, 16)))
o2, _ = gdr(*(jnp.asarray(x, jnp.bfloat16) for x in (q,k,v,beta)), jnp.asarray(g, jnp.float32), initial_state=jnp.asarray(h0, jnp.float32), use_qk_l2norm=True, chunk_size=64)
print("bf16, chunk_size=64: o %.2e" % rel(o2, o_r))
