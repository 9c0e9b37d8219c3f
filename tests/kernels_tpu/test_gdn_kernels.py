"""GDN's TPU path (kernels_tpu.gdn: the gate in float32 jax, then kda's Pallas kernels) and grouped value heads
(kernels_tpu.common.value_heads), in interpret mode with the MXU model.

- gdn on kda's kernels is exactly kda with the scalar decay on every key channel: o and ht bit-equal, dg the
  float32 sum of kda's per-channel dg;
- GVA is exactly q and k repeated to the value heads: o, ht and the value-head gradients bit-equal to the
  repeated call; dq and dk the group's sum within bf16 rounding;
- against the float64 gdn reference within the kda kernels' tolerances (tests/kernels_tpu/test_kda_kernels.py
  states them), with the in-kernel gate, GVA and packed sequences.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels_tpu.gdn import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd
from kernels_tpu.kda import chunk_kda, chunk_kda_bwd
from references import gdn as ref

F32_TOL = 4 * 2.0**-16
BF16_TOL = 2.0**-8 + F32_TOL
K = V = 128
C = 64


def rel_l2(x, y) -> float:
    x, y = (np.asarray(a, np.float64) for a in (x, y))
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def draw(seed, T, H, HV, dtype, *, gate_in_kernel=False, N=1):
    """q, k [1,T,H,K], v [1,T,HV,V] in ``dtype``; g, beta [1,T,HV], h0 [N,HV,K,V] and the gate's A_log,
    dt_bias [HV] in float32; do, dht."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (n(1, T, H, K), n(1, T, H, K)))
    g = n(1, T, HV) if gate_in_kernel else -np.logaddexp(0.0, -n(1, T, HV)) / 16
    inp = dict(q=q.astype(dtype), k=k.astype(dtype), v=n(1, T, HV, V).astype(dtype), g=g.astype(np.float32),
               beta=(1 / (1 + np.exp(-n(1, T, HV)))).astype(dtype), initial_state=n(N, HV, K, V).astype(np.float32))
    if gate_in_kernel:
        inp.update(A_log=n(HV).astype(np.float32), dt_bias=n(HV).astype(np.float32), use_gate_in_kernel=True)
    return inp, n(1, T, HV, V).astype(dtype), n(N, HV, K, V).astype(np.float32)


def test_gdn_is_kda_with_the_decay_on_every_channel():
    inp, do, dht = draw(0, 100, 1, 1, ml_dtypes.bfloat16)
    o, ht = chunk_gated_delta_rule(**inp, output_final_state=True, chunk_size=C, interpret=True)
    kda_inp = dict(inp, g=np.repeat(inp["g"][..., None], K, axis=-1))
    o_kda, ht_kda = chunk_kda(**kda_inp, output_final_state=True, chunk_size=C, interpret=True)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_kda))
    np.testing.assert_array_equal(np.asarray(ht), np.asarray(ht_kda))
    d = chunk_gated_delta_rule_bwd(**inp, do=do, dht=dht, chunk_size=C, interpret=True)
    d_kda = chunk_kda_bwd(**kda_inp, do=do, dht=dht, chunk_size=C, interpret=True)
    for name in ("dq", "dk", "dv", "dbeta", "dh0"):
        np.testing.assert_array_equal(np.asarray(d[name]), np.asarray(d_kda[name]), err_msg=name)
    assert d["dg"].shape == inp["g"].shape and d["dg"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(d["dg"]), np.asarray(d_kda["dg"], np.float64).sum(-1), rtol=1e-5,
                               atol=1e-6)


def test_grouped_value_heads_are_q_and_k_repeated():
    inp, do, dht = draw(1, 64, 1, 2, ml_dtypes.bfloat16)
    o, ht = chunk_gated_delta_rule(**inp, output_final_state=True, chunk_size=C, interpret=True)
    rep = dict(inp, q=np.repeat(inp["q"], 2, axis=2), k=np.repeat(inp["k"], 2, axis=2))
    o_rep, ht_rep = chunk_gated_delta_rule(**rep, output_final_state=True, chunk_size=C, interpret=True)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_rep))
    np.testing.assert_array_equal(np.asarray(ht), np.asarray(ht_rep))
    d = chunk_gated_delta_rule_bwd(**inp, do=do, dht=dht, chunk_size=C, interpret=True)
    d_rep = chunk_gated_delta_rule_bwd(**rep, do=do, dht=dht, chunk_size=C, interpret=True)
    for name in ("dq", "dk"):  # the group's sum, rounded to bf16 once (the repeated call rounds each head first)
        per_head = np.asarray(d_rep[name], np.float32).reshape(1, 64, 1, 2, K).sum(axis=3)
        assert d[name].shape == inp[name[1:]].shape and d[name].dtype == jnp.bfloat16
        assert rel_l2(d[name], per_head) < 2.0**-8, name
    for name in ("dv", "dg", "dbeta", "dh0"):
        np.testing.assert_array_equal(np.asarray(d[name]), np.asarray(d_rep[name]), err_msg=name)


@pytest.mark.parametrize("dtype, gate_in_kernel, lens", [
    (np.float32, True, None),
    (ml_dtypes.bfloat16, False, (1, 3, 60)),
])
def test_against_the_float64_reference(dtype, gate_in_kernel, lens):
    N = 1 if lens is None else len(lens)
    inp, do, dht = draw(2, 64, 1, 2, dtype, gate_in_kernel=gate_in_kernel, N=N)
    packed = {} if lens is None else dict(cu_seqlens=tuple(np.cumsum((0,) + lens).tolist()))
    o, ht = chunk_gated_delta_rule(**inp, output_final_state=True, chunk_size=C, interpret=True, **packed)
    d = chunk_gated_delta_rule_bwd(**inp, do=do, dht=dht, chunk_size=C, interpret=True, **packed)
    o_ref, ht_ref = ref.chunk_gdn(**inp, output_final_state=True, chunk_size=C, **packed)
    d_ref = ref.chunk_gdn_bwd(**inp, do=do, dht=dht, chunk_size=C, **packed)
    got = {"o": o, "ht": ht, **d}
    want = {"o": o_ref, "ht": ht_ref, **d_ref}
    for name, y in want.items():
        if y is None:
            assert got[name] is None, name
            continue
        tol = BF16_TOL if np.asarray(got[name]).dtype == ml_dtypes.bfloat16 else F32_TOL
        assert rel_l2(got[name], y) < tol, (name, rel_l2(got[name], y))
