"""fp16 data times fp16 data is exact in the kernels, as on fla's fp16 tensor cores (kernels_tpu.mxu, BF16X4).

Where the final state is a single outer product it must be bit-exact: one token, or a decay so strong that
every earlier token's weight underflows to 0 in f32 (exp(-200)). Then ``ht = k_T v_T^T``, each entry one
product of two fp16 values (22 significant bits, exact in f32). This is issue 20's mechanism in its purest
form: with three bf16 passes (lo*lo dropped) about a third of the entries were wrong."""

import jax.numpy as jnp
import numpy as np
import pytest

from kernels_tpu.gla import chunk_gla_fwd
from kernels_tpu.simple_gla import chunk_simple_gla_fwd, fused_chunk_simple_gla_fwd

B, H, K, V = 1, 2, 128, 128


def _tokens(T, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, n)), jnp.float16) for n in (K, K, V))
    return q, k, v


def _last_outer(k, v):
    kT, vT = np.asarray(k[:, -1], np.float64), np.asarray(v[:, -1], np.float64)  # [B, H, K], [B, H, V]
    return np.einsum("bhk,bhv->bhkv", kT, vT)


@pytest.mark.parametrize("T", [1, 5, 70])
@pytest.mark.parametrize("fn", [chunk_simple_gla_fwd, fused_chunk_simple_gla_fwd, "gla"])
def test_a_state_that_is_one_outer_product_is_exact(fn, T):
    q, k, v = _tokens(T)
    # token t enters ht with weight exp(g_{t+1} + ... + g_T): 1 for the last, exp(-200 n) = 0 in f32 before it
    g = jnp.full((B, T, H), -200.0, jnp.float32)
    if fn == "gla":
        _, ht = chunk_gla_fwd(q, k, v, g=jnp.broadcast_to(g[..., None], (B, T, H, K)), output_final_state=True,
                              interpret=True)
    else:
        _, ht = fn(q, k, v, g=g, output_final_state=True, interpret=True)
    exact = _last_outer(k, v)
    assert np.array_equal(exact.astype(np.float32), exact)
    assert np.array_equal(np.asarray(ht, np.float64), exact)
