"""The float64 GLA reference: chunked vs recurrent, and against plain numpy.

The numpy oracle below shares no code with ``references.gla``: a Python loop
over tokens for the forward and a hand-derived reverse loop for the backward,
itself checked by central finite differences on a few entries.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from references.gla import chunk_gla, chunk_gla_bwd


def rel(a, b):
    return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-300))


def make(B=1, T=40, H=2, K=8, V=6, seed=0):
    r = np.random.default_rng(seed)
    x = {
        "q": r.standard_normal((B, T, H, K)),
        "k": r.standard_normal((B, T, H, K)),
        "v": r.standard_normal((B, T, H, V)),
        "do": r.standard_normal((B, T, H, V)),
        "h0": r.standard_normal((B, H, K, V)),
        "dht": r.standard_normal((B, H, K, V)),
        # logsigmoid(N(0,1)) / 16, fla's test gate
        "g": -np.logaddexp(0.0, -r.standard_normal((B, T, H, K))) / 16,
        # per-head constant decays: the steepest ALiBi slope 2**-0.5 and a mild one
        "g_gamma": -np.array([2 ** -0.5, 2 ** -4.0] + [0.1] * max(0, H - 2))[:H],
    }
    return x


# --------------------------------------------------------------- numpy oracle
def np_forward(q, k, v, gk, h0, scale):
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = np.zeros((B, H, K, V)) if h0 is None else h0.copy()
    o = np.zeros((B, T, H, V))
    states = [S.copy()]
    for t in range(T):
        S = np.exp(gk[:, t])[..., None] * S + k[:, t][..., None] * v[:, t][..., None, :]
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)
        states.append(S.copy())
    return o, S, states


def np_backward(q, k, v, gk, h0, scale, do, dht):
    B, T, H, K = q.shape
    _, _, states = np_forward(q, k, v, gk, h0, scale)
    dS = np.zeros_like(states[0]) if dht is None else dht.copy()
    dq, dk, dv, dgk = (np.zeros_like(x) for x in (q, k, v, gk))
    for t in reversed(range(T)):
        S_t, S_prev = states[t + 1], states[t]
        dS = dS + scale * q[:, t][..., None] * do[:, t][..., None, :]
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", S_t, do[:, t])
        dk[:, t] = np.einsum("bhkv,bhv->bhk", dS, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", dS, k[:, t])
        a = np.exp(gk[:, t])
        dgk[:, t] = a * np.einsum("bhkv,bhkv->bhk", S_prev, dS)
        dS = a[..., None] * dS
    return dq, dk, dv, dgk, dS


def gk_of(x, kind):
    B, T, H, K = x["q"].shape
    return x["g"] if kind == "g" else np.broadcast_to(x["g_gamma"][None, None, :, None], (B, T, H, K))


def gate_kw(x, kind):
    return {"g": x["g"]} if kind == "g" else {"g_gamma": x["g_gamma"]}


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["g", "g_gamma"])
@pytest.mark.parametrize("T,C", [(40, 16), (64, 16), (37, 8)])
def test_chunk_matches_recurrent(kind, T, C):
    x = make(T=T)
    kw = dict(**gate_kw(x, kind), initial_state=x["h0"])
    oc, hc = chunk_gla(x["q"], x["k"], x["v"], **kw, output_final_state=True, chunk_size=C)
    orr, hr = chunk_gla(x["q"], x["k"], x["v"], **kw, output_final_state=True, method="recurrent")
    assert rel(oc, orr) <= 1e-10 and rel(hc, hr) <= 1e-10
    gc = chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], x["dht"], **kw, chunk_size=C)
    gr = chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], x["dht"], **kw, method="recurrent")
    assert set(gc) == {"dq", "dk", "dv", "dg", "dg_gamma", "dh0"}
    for name in gc:
        assert (gc[name] is None) == (gr[name] is None), name
        if gc[name] is not None:
            assert rel(gc[name], gr[name]) <= 1e-10, (name, rel(gc[name], gr[name]))
    assert (gc["dg"] is None) == (kind == "g_gamma") and (gc["dg_gamma"] is None) == (kind == "g")


@pytest.mark.parametrize("kind", ["g", "g_gamma"])
@pytest.mark.parametrize("method", ["chunk", "recurrent"])
def test_against_numpy_loop(kind, method):
    x = make(T=24, K=4, V=3, seed=1)
    scale = 0.37
    gk = gk_of(x, kind)
    o_np, ht_np, _ = np_forward(x["q"], x["k"], x["v"], gk, x["h0"], scale)
    kw = dict(**gate_kw(x, kind), scale=scale, initial_state=x["h0"], method=method, chunk_size=8)
    o, ht = chunk_gla(x["q"], x["k"], x["v"], **kw, output_final_state=True)
    assert rel(o, o_np) <= 1e-12 and rel(ht, ht_np) <= 1e-12
    dq, dk, dv, dgk, dh0 = np_backward(x["q"], x["k"], x["v"], gk, x["h0"], scale, x["do"], x["dht"])
    got = chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], x["dht"], **kw)
    want = {"dq": dq, "dk": dk, "dv": dv, "dh0": dh0}
    want["dg" if kind == "g" else "dg_gamma"] = dgk if kind == "g" else dgk.sum(axis=(0, 1, 3))
    for name, w in want.items():
        assert rel(got[name], w) <= 1e-12, (name, rel(got[name], w))


def test_numpy_backward_by_finite_differences():
    """The hand-derived numpy backward agrees with central differences of the numpy forward."""
    x = make(T=10, K=3, V=2, seed=2)
    scale = 0.5

    def loss(q, k, v, gk, h0):
        o, ht, _ = np_forward(q, k, v, gk, h0, scale)
        return float((o * x["do"][:, :10]).sum() + (ht * x["dht"]).sum())

    args = [x["q"], x["k"], x["v"], x["g"], x["h0"]]
    grads = np_backward(*args[:4], x["h0"], scale, x["do"], x["dht"])
    eps = 1e-6
    for which, idx in ((0, (0, 3, 1, 2)), (1, (0, 7, 0, 1)), (2, (0, 0, 1, 1)), (3, (0, 2, 1, 0)),
                       (3, (0, 9, 0, 2)), (4, (0, 1, 2, 1))):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[which][idx] += eps
        minus[which][idx] -= eps
        fd = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert abs(fd - grads[which][idx]) <= 1e-7 * max(1.0, abs(fd)), (which, idx, fd, grads[which][idx])


def test_outputs_float64_from_bf16_and_no_global_x64():
    import jax

    x = make(T=16, K=4, V=4)
    q, k, v = (x[n].astype(ml_dtypes.bfloat16) for n in ("q", "k", "v"))
    o, ht = chunk_gla(q, k, v, g=x["g"].astype(np.float32), output_final_state=True, chunk_size=8)
    assert o.dtype == np.float64 and ht.dtype == np.float64
    o2, ht2 = chunk_gla(q, k, v, g=x["g"].astype(np.float32), chunk_size=8)
    assert ht2 is None and np.array_equal(o, o2)
    grads = chunk_gla_bwd(q, k, v, x["do"].astype(ml_dtypes.bfloat16), g=x["g"], chunk_size=8)
    for name in ("dq", "dk", "dv", "dg"):
        assert grads[name].dtype == np.float64
    assert grads["dh0"] is None and grads["dg_gamma"] is None
    assert not jax.config.jax_enable_x64


def test_stable_alibi_chunk128():
    """Steep ALiBi decay at chunk 128 (exp(0.7071*128) overflows float32): finite, matches recurrent."""
    x = make(T=256, K=4, V=4, seed=3)
    kw = dict(g_gamma=np.array([-2 ** -0.5, -0.5]), initial_state=x["h0"])
    oc, hc = chunk_gla(x["q"], x["k"], x["v"], **kw, output_final_state=True, chunk_size=128)
    orr, hr = chunk_gla(x["q"], x["k"], x["v"], **kw, output_final_state=True, method="recurrent")
    assert np.isfinite(oc).all() and rel(oc, orr) <= 1e-10 and rel(hc, hr) <= 1e-10


def test_invalid_inputs():
    x = make(T=8)
    with pytest.raises(ValueError):
        chunk_gla(x["q"], x["k"], x["v"])  # no gate
    with pytest.raises(ValueError, match=r"g_gamma must be \[\] or \[H\] or \[H,K\]"):
        chunk_gla(x["q"], x["k"], x["v"], g_gamma=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="<= 0"):
        chunk_gla(x["q"], x["k"], x["v"], g=x["g"], g_gamma=-x["g_gamma"])
    with pytest.raises(ValueError):
        chunk_gla(x["q"], x["k"], x["v"], g=x["g"], method="fused")


def test_hand_computed_per_channel_g_gamma():
    """T = 2, one head, K = 2, V = 1, q = k = v = 1, scale 1, g_gamma [H,K] = (-ln 2, 0): channel 0 halves its
    state each step, channel 1 keeps it. S_1 = (1, 1), S_2 = (1/2 + 1, 1 + 1) = (1.5, 2); o_t = q . S_t = (2, 3.5).
    Both gates: g = (0, -ln 2) on channel 1 at t = 2 only, so S_2 = (1.5, 1/2 + 1) and o_2 = 3."""
    q = k = np.ones((1, 2, 1, 2))
    v = np.ones((1, 2, 1, 1))
    gamma = np.array([[-np.log(2), 0.0]])
    g = np.zeros((1, 2, 1, 2))
    g[0, 1, 0, 1] = -np.log(2)
    for method in ("chunk", "recurrent"):
        kw = dict(scale=1.0, output_final_state=True, method=method, chunk_size=2)
        o, ht = chunk_gla(q, k, v, g_gamma=gamma, **kw)
        np.testing.assert_allclose(o.ravel(), [2.0, 3.5], rtol=1e-15)
        np.testing.assert_allclose(ht.ravel(), [1.5, 2.0], rtol=1e-15)
        o, ht = chunk_gla(q, k, v, g=g, g_gamma=gamma, **kw)
        np.testing.assert_allclose(o.ravel(), [2.0, 3.0], rtol=1e-15)
        np.testing.assert_allclose(ht.ravel(), [1.5, 1.5], rtol=1e-15)


@pytest.mark.parametrize("method", ["chunk", "recurrent"])
def test_g_gamma_forms_are_a_constant_per_channel_gate(method):
    """g_gamma [H,K], [H] and [] equal gla with g = g_gamma broadcast to [B,T,H,K] (to 1e-15: the same values into
    the same computation), and their gradient is that g's summed to g_gamma's shape; both gates at once equal
    g + g_gamma (the sum in float64, as the reference computes it)."""
    x = make(B=2, T=37, H=3, K=5, V=4, seed=4)
    B, T, H, K = x["q"].shape
    r = np.random.default_rng(5)
    forms = {"H,K": -np.abs(r.standard_normal((H, K))) / 10, "H": -np.abs(r.standard_normal(H)) / 10,
             "": np.array(-0.07)}
    kw = dict(initial_state=x["h0"], method=method, chunk_size=8)
    qkv = (x["q"], x["k"], x["v"])
    for shape, gamma in forms.items():
        g_full = np.broadcast_to(gamma if gamma.ndim != 1 else gamma[:, None], (B, T, H, K))
        for extra in ({}, {"g": x["g"]}):
            want_g = g_full + extra["g"] if extra else g_full
            o, ht = chunk_gla(*qkv, g_gamma=gamma, **extra, output_final_state=True, **kw)
            o_g, ht_g = chunk_gla(*qkv, g=want_g, output_final_state=True, **kw)
            assert rel(o, o_g) <= 1e-15 and rel(ht, ht_g) <= 1e-15, (shape, extra.keys())
            got = chunk_gla_bwd(*qkv, x["do"], x["dht"], g_gamma=gamma, **extra, **kw)
            want = chunk_gla_bwd(*qkv, x["do"], x["dht"], g=want_g, **kw)
            for name in ("dq", "dk", "dv", "dh0"):
                assert rel(got[name], want[name]) <= 1e-14, (shape, name)
            axes = {"H,K": (0, 1), "H": (0, 1, 3), "": (0, 1, 2, 3)}[shape]
            assert got["dg_gamma"].shape == gamma.shape
            assert rel(got["dg_gamma"], want["dg"].sum(axis=axes)) <= 1e-12, shape
            if extra:
                assert rel(got["dg"], want["dg"]) <= 1e-14


def test_compute_dtype_float32_is_close_and_returned_as_float64():
    x = make(T=32, K=4, V=4, seed=5)
    kw = dict(g=x["g"], initial_state=x["h0"], chunk_size=16)
    o64, _ = chunk_gla(x["q"], x["k"], x["v"], **kw)
    o32, _ = chunk_gla(x["q"], x["k"], x["v"], **kw, compute_dtype="float32")
    assert o32.dtype == np.float64 and 0 < rel(o32, o64) <= 1e-5
    with pytest.raises(ValueError):
        chunk_gla(x["q"], x["k"], x["v"], **kw, compute_dtype="float16")
