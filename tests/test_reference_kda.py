"""The float64 KDA reference: two formulations, an independent numpy loop, finite differences, grouped value
heads (GVA: v, g, beta, the state, A_log and dt_bias with HV = a multiple of H heads)."""

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


def draw(seed=0, *, raw_gate=False, raw_beta=False, shape=(B, T, H, K, V), hv=None):
    """q, k [b,t,h,k]; v, g, beta, the state, A_log, dt_bias with ``hv`` value heads (h when None)."""
    b, t, h, k, v = shape
    hv = h if hv is None else hv
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)
    x = dict(q=n(b, t, h, k), k=n(b, t, h, k), v=n(b, t, hv, v))
    x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
    x["q"] /= np.linalg.norm(x["q"], axis=-1, keepdims=True)
    x["g"] = n(b, t, hv, k) if raw_gate else -np.logaddexp(0, -n(b, t, hv, k)) / 4
    x["beta"] = n(b, t, hv) if raw_beta else 1 / (1 + np.exp(-n(b, t, hv)))
    x["initial_state"] = n(b, hv, k, v)
    x["A_log"] = n(hv)
    x["dt_bias"] = n(hv * k)
    return x, n(b, t, hv, v), n(b, hv, k, v)


OPTION_SETS = {
    "plain": dict(),
    "l2norm+beta_sigmoid+neg_eigval": dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                           allow_neg_eigval=True),
    "gate_softplus": dict(use_gate_in_kernel=True),
    "gate_lb_no_A_log": dict(use_gate_in_kernel=True, lower_bound=-5.0, A_log=None),
    "gate_lb_safe": dict(use_gate_in_kernel=True, lower_bound=-3.0, safe_gate=True),
}


GVA_SETS = ("gate_softplus", "gate_lb_no_A_log")
"""Option sets that run with grouped value heads (H=1, HV=2) where the shape allows: the core (q and k repeated
to the value heads) then has the shapes of H=2, so it is compiled once for both."""


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
    opts, gva = OPTION_SETS[name], name in GVA_SETS
    x, do, dht = draw(1, raw_gate=opts.get("use_gate_in_kernel", False),
                      raw_beta=opts.get("use_beta_sigmoid_in_kernel", False),
                      shape=(B, T, 1, K, V) if gva else (B, T, H, K, V), hv=H)
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
    assert bwd["chunk"]["dq"].shape == x["q"].shape and bwd["chunk"]["dg"].shape == x["g"].shape


# ------------------------------------------------------------------ independent numpy loop
def numpy_kda(q, k, v, g, beta, h0, scale, A_log, dt_bias, *, l2=False, gate=None, lower_bound=None,
              beta_sigmoid=False, neg=False):
    """Token loop in plain numpy float64, with the options written out from fla's formulas; value head j
    reads q/k head j // (HV // H)."""
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
    HVv = v.shape[2]
    o = np.zeros(v.shape)
    S = np.array(h0, np.float64).copy()
    for b in range(Bb):
        for h in range(HVv):
            i = h // (HVv // Hh)
            s = S[b, h]
            for t in range(Tt):
                s = np.exp(g[b, t, h])[:, None] * s
                s = s + beta[b, t, h] * np.outer(k[b, t, i], v[b, t, h] - s.T @ k[b, t, i])
                o[b, t, h] = scale * s.T @ q[b, t, i]
            S[b, h] = s
    return o, S


@pytest.mark.parametrize("name, gva", [(n, False) for n in OPTION_SETS] + [(n, True) for n in GVA_SETS])
def test_forward_matches_numpy_loop(name, gva):
    opts = OPTION_SETS[name]
    shape = (1, 20, 1 if gva else 2, 4, 3)
    x, _, _ = draw(2, raw_gate=opts.get("use_gate_in_kernel", False),
                   raw_beta=opts.get("use_beta_sigmoid_in_kernel", False), shape=shape, hv=2)
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


def test_grouped_value_heads_are_each_value_head_with_its_qk_head():
    """H=2, HV=4: value head j is the ungrouped op on q/k head j // 2 with its own gate, beta, state, A_log and
    dt_bias[j*K:(j+1)*K]; dq, dk sum their group."""
    opts = OPTION_SETS["gate_softplus"]
    Hq, HV, Kd = 2, 4, 4
    x, do, dht = draw(7, raw_gate=True, shape=(1, 20, Hq, Kd, 3), hv=HV)
    kw, o = split(x, opts)
    out, ht = ref.chunk_kda(**kw, output_final_state=True, chunk_size=8, **o)
    d = ref.chunk_kda_bwd(**kw, do=do, dht=dht, chunk_size=8, **o)
    dq, dk = np.zeros_like(x["q"]), np.zeros_like(x["k"])
    for j in range(HV):
        i, heads, ch = j // (HV // Hq), slice(j, j + 1), slice(j * Kd, (j + 1) * Kd)
        kj = {n: (a[:, :, i:i + 1] if n in ("q", "k") else a[heads] if n == "A_log" else a[ch] if n == "dt_bias"
                  else a[:, heads] if n == "initial_state" else a[:, :, heads]) for n, a in kw.items()}
        oj, htj = ref.chunk_kda(**kj, output_final_state=True, chunk_size=8, **o)
        assert rel(out[:, :, heads], oj) < 1e-12 and rel(ht[:, heads], htj) < 1e-12, j
        dj = ref.chunk_kda_bwd(**kj, do=do[:, :, heads], dht=dht[:, heads], chunk_size=8, **o)
        for n in ("dv", "dg", "dbeta"):
            assert rel(d[n][:, :, heads], dj[n]) < 1e-12, (n, j)
        assert rel(d["dh0"][:, heads], dj["dh0"]) < 1e-12 and rel(d["dA_log"][heads], dj["dA_log"]) < 1e-12
        assert rel(d["ddt_bias"][ch], dj["ddt_bias"]) < 1e-12
        dq[:, :, i:i + 1] += dj["dq"]
        dk[:, :, i:i + 1] += dj["dk"]
    assert d["dq"].shape == x["q"].shape and rel(d["dq"], dq) < 1e-12 and rel(d["dk"], dk) < 1e-12


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
    kw = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    o64, _ = ref.chunk_kda(**kw, chunk_size=8)
    o32, _ = ref.chunk_kda(**kw, chunk_size=8, compute_dtype="float32")
    assert o32.dtype == np.float64 and 0 < rel(o32, o64) < 1e-5


@pytest.mark.parametrize("change, match", [
    (dict(beta=np.zeros((1, 16, 2))), "beta"),
    (dict(method="nope"), "method"),
    (dict(use_gate_in_kernel=True), "A_log"),
    (dict(compute_dtype="float16"), "compute_dtype"),
    (dict(q=np.zeros((1, 16, 2, 8)), k=np.zeros((1, 16, 2, 8)), v=np.zeros((1, 16, 3, 4))),
     r"HV=3 value heads must be a multiple of H=2"),
    (dict(g=np.zeros((1, 16, 2, 8))), r"^g must be \[B,T,H,K\] = \(1, 16, 1, 8\)"),
])
def test_invalid_arguments(change, match):
    x, _, _ = draw(6, shape=(1, 16, 1, 8, 4))
    kw = {**{n: x[n] for n in ("q", "k", "v", "g", "beta")}, **change}
    with pytest.raises(ValueError, match=match):
        ref.chunk_kda(**kw)
