"""The float64 references against each other and against an independent numpy implementation.

The independent implementation below is a plain numpy loop over tokens with a
hand-derived reverse-time backward:

    dS_T = dht;  for t = T..1:  dS_t += scale q_t do_tᵀ
                               dq_t = scale S_t do_t,  dk_t = dS_t v_t,  dv_t = dS_tᵀ k_t
                               dg_t = exp(g_t) <dS_t, S_{t-1}>,  dS_{t-1} = exp(g_t) dS_t
    dh0 = dS_0,  dg_gamma_h = Σ_{b,t} dg_{b,t,h}
"""

import jax
import numpy as np
import pytest

from references.simple_gla import chunk_simple_gla, chunk_simple_gla_bwd


def numpy_simple_gla(q, k, v, gt, h0, do, dht, scale):
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = np.zeros((B, H, T + 1, K, V))
    S[:, :, 0] = h0
    o = np.zeros((B, T, H, V))
    for t in range(T):
        a = np.exp(gt[:, t])[..., None, None]
        S[:, :, t + 1] = a * S[:, :, t] + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = scale * np.einsum("bhkv,bhk->bhv", S[:, :, t + 1], q[:, t])
    dq, dk, dv, dg = (np.zeros_like(x) for x in (q, k, v, gt))
    dS = dht.copy()
    for t in reversed(range(T)):
        dS = dS + scale * np.einsum("bhk,bhv->bhkv", q[:, t], do[:, t])
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", S[:, :, t + 1], do[:, t])
        dk[:, t] = np.einsum("bhkv,bhv->bhk", dS, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", dS, k[:, t])
        a = np.exp(gt[:, t])
        dg[:, t] = a * np.einsum("bhkv,bhkv->bh", dS, S[:, :, t])
        dS = a[..., None, None] * dS
    return o, S[:, :, T], dict(dq=dq, dk=dk, dv=dv, dg=dg, dh0=dS)


def _inputs(rng, B=2, T=45, H=3, K=6, V=5):
    q, k = rng.standard_normal((2, B, T, H, K))
    v, do = rng.standard_normal((2, B, T, H, V))
    g = -np.log1p(np.exp(-rng.standard_normal((B, T, H)))) / 4
    gamma = -np.array([0.7071, 0.25, 0.01])[:H]
    h0, dht = rng.standard_normal((2, B, H, K, V))
    return q, k, v, do, g, gamma, h0, dht


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("gate", ["g", "g_gamma"])
@pytest.mark.parametrize("with_state", [False, True])
def test_reference_matches_independent_numpy(gate, with_state):
    rng = np.random.default_rng(7)
    q, k, v, do, g, gamma, h0, dht = _inputs(rng)
    B, T, H, _ = q.shape
    gt = g if gate == "g" else np.broadcast_to(gamma, (B, T, H))
    h0_ = h0 if with_state else None
    dht_ = dht if with_state else None
    scale = 0.3
    o_np, ht_np, grads_np = numpy_simple_gla(q, k, v, gt, h0 if with_state else 0 * h0, do,
                                             dht if with_state else 0 * dht, scale)
    kw = {gate: g if gate == "g" else gamma}
    for method in ("chunk", "recurrent"):
        o, ht = chunk_simple_gla(q, k, v, **kw, scale=scale, initial_state=h0_, output_final_state=True,
                                 method=method, chunk_size=16)
        assert o.dtype == np.float64 and ht.dtype == np.float64
        assert _rel(o, o_np) < 1e-12 and _rel(ht, ht_np) < 1e-12
        grads = chunk_simple_gla_bwd(q, k, v, do, dht_, **kw, scale=scale, initial_state=h0_, method=method,
                                     chunk_size=16)
        for name in ("dq", "dk", "dv"):
            assert grads[name].dtype == np.float64
            assert _rel(grads[name], grads_np[name]) < 1e-10, name
        if gate == "g":
            assert _rel(grads["dg"], grads_np["dg"]) < 1e-10 and grads["dg_gamma"] is None
        else:
            assert _rel(grads["dg_gamma"], grads_np["dg"].sum(axis=(0, 1))) < 1e-10 and grads["dg"] is None
        if with_state:
            assert _rel(grads["dh0"], grads_np["dh0"]) < 1e-10
        else:
            assert grads["dh0"] is None


@pytest.mark.parametrize("chunk_size", [16, 64, 128])
def test_chunked_and_recurrent_agree_steep_alibi(chunk_size):
    """|gamma| * C up to 90.5 at C=128: the float32 exp-overflow regime, exact in float64."""
    rng = np.random.default_rng(3)
    q, k, v, do, g, _, h0, dht = _inputs(rng, B=1, T=200, H=2)
    gamma = -np.array([2**-0.5, 2**-4]) * (1 + 1e-5)
    fwd = [chunk_simple_gla(q, k, v, g_gamma=gamma, initial_state=h0, output_final_state=True, method=m,
                            chunk_size=chunk_size) for m in ("chunk", "recurrent")]
    assert _rel(fwd[0][0], fwd[1][0]) < 1e-12 and _rel(fwd[0][1], fwd[1][1]) < 1e-12
    bwd = [chunk_simple_gla_bwd(q, k, v, do, dht, g_gamma=gamma, initial_state=h0, method=m,
                                chunk_size=chunk_size) for m in ("chunk", "recurrent")]
    for name in ("dq", "dk", "dv", "dg_gamma", "dh0"):
        assert _rel(bwd[0][name], bwd[1][name]) < 1e-12, name


def test_no_global_x64_and_bf16_inputs():
    import ml_dtypes

    rng = np.random.default_rng(0)
    q, k, v, do, g, *_ = _inputs(rng, B=1, T=8, H=1, K=4, V=4)
    o, _ = chunk_simple_gla(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)), g=g[..., :1])
    assert o.dtype == np.float64
    assert jax.numpy.ones(1).dtype == np.float32  # x64 stayed scoped to the call


def test_float32_compute_is_float32_quality():
    rng = np.random.default_rng(1)
    q, k, v, do, g, *_ = _inputs(rng)
    o64, _ = chunk_simple_gla(q, k, v, g=g)
    o32, _ = chunk_simple_gla(q, k, v, g=g, compute_dtype="float32")
    assert 1e-9 < _rel(o32, o64) < 1e-5


def test_reference_validates():
    rng = np.random.default_rng(1)
    q, k, v, do, g, gamma, *_ = _inputs(rng)
    with pytest.raises(ValueError, match="g must be"):
        chunk_simple_gla(q, k, v, g=g[:, :, :1])
    with pytest.raises(ValueError, match=r"g_gamma must be \[\] or \[H\]"):  # per channel is gla's
        chunk_simple_gla(q, k, v, g_gamma=np.full((3, 6), -0.1))
    with pytest.raises(ValueError, match="<= 0"):
        chunk_simple_gla(q, k, v, g=g, g_gamma=-gamma)


def test_hand_computed_both_gates():
    """T = 2, one head, K = V = 1, q = k = v = 1, scale 1: g = (0, -ln 2) and g_gamma = -ln 2 decay the state by
    1/2 at t = 1 (S_0 = 0: nothing to decay) and by 1/4 at t = 2, so S = (1, 1/4 + 1) and o = S."""
    one = np.ones((1, 2, 1, 1))
    g = np.array([0.0, -np.log(2)]).reshape(1, 2, 1)
    for method in ("chunk", "recurrent"):
        o, ht = chunk_simple_gla(one, one, one, g=g, g_gamma=np.array([-np.log(2)]), scale=1.0,
                                 output_final_state=True, method=method, chunk_size=2)
        np.testing.assert_allclose(o.ravel(), [1.0, 1.25], rtol=1e-15)
        np.testing.assert_allclose(ht.ravel(), [1.25], rtol=1e-15)
        # a scalar g_gamma is every head's: the same numbers
        o, _ = chunk_simple_gla(one, one, one, g=g, g_gamma=np.array(-np.log(2)), scale=1.0, method=method,
                                chunk_size=2)
        np.testing.assert_allclose(o.ravel(), [1.0, 1.25], rtol=1e-15)
        # with do = (0, 1): d o_2 / d g_2 = exp(g_2 + g_gamma) S_1 = 1/4, d o_2 / d g_1 = 0 (S_0 = 0: nothing to
        # decay), and g_gamma adds to both steps' log decay: dg_gamma = 1/4
        grads = chunk_simple_gla_bwd(one, one, one, np.array([0.0, 1.0]).reshape(one.shape), g=g,
                                     g_gamma=np.array([-np.log(2)]), scale=1.0, method=method, chunk_size=2)
        np.testing.assert_allclose(grads["dg_gamma"], [0.25], rtol=1e-14)
        np.testing.assert_allclose(grads["dg"].ravel(), [0.0, 0.25], rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("with_state", [False, True])
def test_both_gates_are_their_sum_and_match_numpy(with_state):
    """g with g_gamma is g + g_gamma (the decays multiply): against the numpy loop on the summed gate, and its
    gradients are the summed gate's, dg_gamma that dg summed over batch and tokens."""
    rng = np.random.default_rng(11)
    q, k, v, do, g, gamma, h0, dht = _inputs(rng)
    B, T, H, _ = q.shape
    h0_, dht_ = (h0, dht) if with_state else (None, None)
    gt = g + gamma
    o_np, ht_np, grads_np = numpy_simple_gla(q, k, v, gt, h0 if with_state else 0 * h0, do,
                                             dht if with_state else 0 * dht, 0.3)
    for method in ("chunk", "recurrent"):
        kw = dict(scale=0.3, initial_state=h0_, method=method, chunk_size=16)
        o, ht = chunk_simple_gla(q, k, v, g=g, g_gamma=gamma, output_final_state=True, **kw)
        assert _rel(o, o_np) < 1e-12 and _rel(ht, ht_np) < 1e-12
        grads = chunk_simple_gla_bwd(q, k, v, do, dht_, g=g, g_gamma=gamma, **kw)
        for name in ("dq", "dk", "dv", "dg"):
            assert _rel(grads[name], grads_np[name]) < 1e-10, name
        assert _rel(grads["dg_gamma"], grads_np["dg"].sum(axis=(0, 1))) < 1e-10
        if with_state:
            assert _rel(grads["dh0"], grads_np["dh0"]) < 1e-10


def test_scalar_g_gamma_is_every_heads():
    """g_gamma [] equals g_gamma [H] holding that value for every head (bit for bit: the same broadcast), and its
    gradient is the per-head one summed."""
    rng = np.random.default_rng(12)
    q, k, v, do, *_ = _inputs(rng)
    H = q.shape[2]
    scalar, per_head = np.array(-0.3), np.full((H,), -0.3)
    for method in ("chunk", "recurrent"):
        o1, ht1 = chunk_simple_gla(q, k, v, g_gamma=scalar, output_final_state=True, method=method, chunk_size=16)
        o2, ht2 = chunk_simple_gla(q, k, v, g_gamma=per_head, output_final_state=True, method=method, chunk_size=16)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(ht1, ht2)
        g1 = chunk_simple_gla_bwd(q, k, v, do, g_gamma=scalar, method=method, chunk_size=16)
        g2 = chunk_simple_gla_bwd(q, k, v, do, g_gamma=per_head, method=method, chunk_size=16)
        assert g1["dg_gamma"].shape == ()
        assert abs(g1["dg_gamma"] - g2["dg_gamma"].sum()) < 1e-12 * abs(g1["dg_gamma"])
        for name in ("dq", "dk", "dv"):
            np.testing.assert_array_equal(g1[name], g2[name])
