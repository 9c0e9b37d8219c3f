"""The float64 KDA reference: two formulations, an independent numpy loop, finite differences."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from references import kda as ref

B, T, H, K, V, C = 2, 50, 2, 16, 8, 16  # T not a multiple of C: the padded last chunk is exercised
REL = 1e-10


def rel(x, y) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def draw(seed=0, *, raw_gate=False, raw_beta=False, shape=(B, T, H, K, V)):
    b, t, h, k, v = shape
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)
    x = dict(q=n(b, t, h, k), k=n(b, t, h, k), v=n(b, t, h, v))
    x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
    x["q"] /= np.linalg.norm(x["q"], axis=-1, keepdims=True)
    x["g"] = n(b, t, h, k) if raw_gate else -np.logaddexp(0, -n(b, t, h, k)) / 4
    x["beta"] = n(b, t, h) if raw_beta else 1 / (1 + np.exp(-n(b, t, h)))
    x["initial_state"] = n(b, h, k, v)
    x["A_log"] = n(h)
    x["dt_bias"] = n(h * k)
    return x, n(b, t, h, v), n(b, h, k, v)


OPTION_SETS = {
    "plain": dict(),
    "l2norm+beta_sigmoid+neg_eigval": dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                           allow_neg_eigval=True),
    "gate_softplus": dict(use_gate_in_kernel=True),
    "gate_lb_no_A_log": dict(use_gate_in_kernel=True, lower_bound=-5.0, A_log=None),
    "gate_lb_safe": dict(use_gate_in_kernel=True, lower_bound=-3.0, safe_gate=True),
}


def split(x, opts):
    """Inputs + options for a call: A_log / dt_bias only when the gate is in the kernel."""
    opts = dict(opts)
    kw = {n: x[n] for n in ("q", "k", "v", "g", "beta", "initial_state")}
    if opts.get("use_gate_in_kernel"):
        kw["A_log"] = opts.pop("A_log", x["A_log"])
        kw["dt_bias"] = x["dt_bias"]
    opts.pop("A_log", None)
    return kw, opts


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_recurrent_matches_chunked_fwd_bwd(name):
    opts = OPTION_SETS[name]
    x, do, dht = draw(1, raw_gate=opts.get("use_gate_in_kernel", False),
                      raw_beta=opts.get("use_beta_sigmoid_in_kernel", False))
    kw, o = split(x, opts)
    fwd = {m: ref.chunk_kda(**kw, output_final_state=True, method=m, chunk_size=C, **o) for m in ref.METHODS}
    assert rel(fwd["chunk"][0], fwd["recurrent"][0]) < REL
    assert rel(fwd["chunk"][1], fwd["recurrent"][1]) < REL
    bwd = {m: ref.chunk_kda_bwd(**kw, do=do, dht=dht, method=m, chunk_size=C, **o) for m in ref.METHODS}
    expect = {"dq", "dk", "dv", "dg", "dbeta", "dh0"}
    if opts.get("use_gate_in_kernel"):
        expect |= {"ddt_bias"} | ({"dA_log"} if kw["A_log"] is not None else set())
    present = {n for n, a in bwd["chunk"].items() if a is not None}
    assert present == expect
    for n in expect:
        assert bwd["chunk"][n].dtype == np.float64
        assert rel(bwd["chunk"][n], bwd["recurrent"][n]) < REL, n


# ------------------------------------------------------------------ independent numpy loop
def numpy_kda(q, k, v, g, beta, h0, scale, A_log, dt_bias, *, l2=False, gate=None, lower_bound=None,
              beta_sigmoid=False, neg=False):
    """Token loop in plain numpy float64, with the options written out from fla's formulas."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    if l2:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if gate:
        Hh, Kk = g.shape[-2:]
        x = g + dt_bias.reshape(Hh, Kk)
        if lower_bound is None:
            g = -np.exp(A_log)[:, None] * np.log1p(np.exp(x))
        else:
            a = np.exp(A_log)[:, None] if A_log is not None else 1.0
            g = lower_bound / (1 + np.exp(-a * x))
    if beta_sigmoid:
        beta = (2.0 if neg else 1.0) / (1 + np.exp(-beta))
    Bb, Tt, Hh, Kk = q.shape
    o = np.zeros(v.shape)
    S = np.array(h0, np.float64).copy()
    for b in range(Bb):
        for h in range(Hh):
            s = S[b, h]
            for t in range(Tt):
                s = np.exp(g[b, t, h])[:, None] * s
                s = s + beta[b, t, h] * np.outer(k[b, t, h], v[b, t, h] - s.T @ k[b, t, h])
                o[b, t, h] = scale * s.T @ q[b, t, h]
            S[b, h] = s
    return o, S


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_forward_matches_numpy_loop(name):
    opts = OPTION_SETS[name]
    shape = (1, 20, 2, 4, 3)
    x, _, _ = draw(2, raw_gate=opts.get("use_gate_in_kernel", False),
                   raw_beta=opts.get("use_beta_sigmoid_in_kernel", False), shape=shape)
    kw, o = split(x, opts)
    out, ht = ref.chunk_kda(**kw, output_final_state=True, chunk_size=8, scale=0.7, **o)
    o_np, ht_np = numpy_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], 0.7,
                            kw.get("A_log"), x["dt_bias"], l2=o.get("use_qk_l2norm_in_kernel", False),
                            gate=o.get("use_gate_in_kernel", False), lower_bound=o.get("lower_bound"),
                            beta_sigmoid=o.get("use_beta_sigmoid_in_kernel", False),
                            neg=o.get("allow_neg_eigval", False))
    assert rel(out, o_np) < 1e-12 and rel(ht, ht_np) < 1e-12


# ------------------------------------------------------------------ finite differences
@pytest.mark.parametrize("name", ["plain", "gate_softplus"])
def test_gradients_match_finite_differences(name):
    opts = OPTION_SETS[name]
    shape = (1, 20, 1, 4, 3)
    x, do, dht = draw(3, raw_gate=opts.get("use_gate_in_kernel", False), shape=shape)
    kw, o = split(x, opts)
    grads = ref.chunk_kda_bwd(**kw, do=do, dht=dht, chunk_size=8, **o)

    def loss(kw_):
        out, ht = ref.chunk_kda(**kw_, output_final_state=True, chunk_size=8, **o)
        return float((out * do).sum() + (ht * dht).sum())

    entries = [("q", (0, 3, 0, 1)), ("k", (0, 11, 0, 2)), ("v", (0, 9, 0, 0)), ("g", (0, 5, 0, 2)),
               ("beta", (0, 7, 0)), ("initial_state", (0, 0, 1, 2))]
    if opts.get("use_gate_in_kernel"):
        entries += [("A_log", (0,)), ("dt_bias", (3,))]
    eps = 1e-6
    for n, idx in entries:
        plus, minus = dict(kw), dict(kw)
        plus[n], minus[n] = kw[n].copy(), kw[n].copy()
        plus[n][idx] += eps
        minus[n][idx] -= eps
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        an = grads["dh0" if n == "initial_state" else "d" + n][idx]
        assert abs(fd - an) <= 1e-7 * max(1.0, abs(an)), (n, fd, an)


# ------------------------------------------------------------------ dtypes and side effects
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_low_precision_inputs_give_float64_without_global_x64(dtype):
    x, do, dht = draw(4, shape=(1, 16, 1, 8, 4))
    kw = {n: x[n].astype(dtype) for n in ("q", "k", "v", "g", "beta")}
    o, ht = ref.chunk_kda(**kw, output_final_state=True, chunk_size=8)
    grads = ref.chunk_kda_bwd(**kw, do=do.astype(dtype), chunk_size=8)
    assert o.dtype == ht.dtype == np.float64
    assert grads["dh0"] is None and grads["dA_log"] is None
    assert all(grads[n].dtype == np.float64 for n in ("dq", "dk", "dv", "dg", "dbeta"))
    # the bits in are the bits used: same result as feeding the exactly upcast float64 arrays
    o64, _ = ref.chunk_kda(**{n: a.astype(np.float64) for n, a in kw.items()}, chunk_size=8)
    assert np.array_equal(o, o64)
    assert not jax.config.jax_enable_x64 and jnp.zeros(1).dtype == jnp.float32


def test_compute_dtype_float32_is_close_and_returned_as_float64():
    x, do, dht = draw(5, shape=(1, 16, 1, 8, 4))
    kw = {n: x[n] for n in ("q", "k", "v", "g", "beta", "initial_state")}
    o64, _ = ref.chunk_kda(**kw, chunk_size=8)
    o32, _ = ref.chunk_kda(**kw, chunk_size=8, compute_dtype="float32")
    assert o32.dtype == np.float64 and 0 < rel(o32, o64) < 1e-5


@pytest.mark.parametrize("change, match", [
    (dict(beta=np.zeros((1, 16, 2))), "beta"),
    (dict(method="nope"), "method"),
    (dict(use_gate_in_kernel=True), "A_log"),
    (dict(compute_dtype="float16"), "compute_dtype"),
])
def test_invalid_arguments(change, match):
    x, _, _ = draw(6, shape=(1, 16, 1, 8, 4))
    kw = {**{n: x[n] for n in ("q", "k", "v", "g", "beta")}, **change}
    with pytest.raises(ValueError, match=match):
        ref.chunk_kda(**kw)
