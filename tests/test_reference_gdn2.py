"""The float64 Gated DeltaNet-2 (gdn2) reference: its two formulations against each other, kda and gdn as its
special cases, an independent token loop written here (numpy for the forward and finite differences, the same
loop in jax.numpy for autodiff), the in-kernel options against their formulas, the contract, and fla's own
torch reference (``fla.ops.gdn2.naive``) run in float64.

Most tests share one tiny shape (``draw``'s defaults) so that they share the reference's compiled functions:
compiling, not computing, is what these tests spend their time on.
"""

from __future__ import annotations

import importlib.util
import pathlib
import types

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from op_contract import check_gdn2
from references import gdn, kda
from references import gdn2 as ref
from references._x64 import float64_cpu

TOL = 1e-12
GRADS = ("dq", "dk", "dv", "dg", "db", "dw", "dh0", "dA_log", "ddt_bias")


def rel(x, y) -> float:
    return float(np.linalg.norm(np.asarray(x) - np.asarray(y)) / np.linalg.norm(y))


def draw(seed, B=1, T=7, H=2, K=3, V=4, *, N=None, raw_gate=False, raw_qk=False, b_max=2.0):
    """float64 inputs: q, k unit rows (raw unless ``raw_qk``), g a log decay (a raw gate input with
    ``raw_gate``), b in [0, b_max], w in [0, 1], h0 [N,H,K,V], A_log [H], dt_bias [H*K]; and do, dht."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    N = B if N is None else N
    x = dict(q=n(B, T, H, K), k=n(B, T, H, K), v=n(B, T, H, V))
    if not raw_qk:
        x["q"] /= np.linalg.norm(x["q"], axis=-1, keepdims=True)
        x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
    x["g"] = n(B, T, H, K) if raw_gate else -np.logaddexp(0, -n(B, T, H, K)) / 4
    x["b"] = b_max * rng.uniform(size=(B, T, H, K))
    x["w"] = rng.uniform(size=(B, T, H, V))
    x["initial_state"] = n(N, H, K, V)
    x["A_log"], x["dt_bias"] = n(H) / 2, n(H * K)
    return x, n(B, T, H, V), n(N, H, K, V)


OPTION_SETS = {
    "plain": dict(),
    "l2norm+gate": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True),
    "gate_lb_no_A_log": dict(use_gate_in_kernel=True, lower_bound=-5.0, A_log=None),
    "gate_lb_safe": dict(use_gate_in_kernel=True, lower_bound=-3.0, safe_gate=True),
}


def call_args(x, opts, *, h0=True):
    """(inputs, options) of a call: A_log / dt_bias only with the in-kernel gate (``A_log=None`` in the option
    set drops it), initial_state only with ``h0``."""
    opts = dict(opts)
    kw = {n: x[n] for n in ("q", "k", "v", "g", "b", "w")}
    if h0:
        kw["initial_state"] = x["initial_state"]
    if opts.get("use_gate_in_kernel"):
        kw["A_log"] = opts.pop("A_log", x["A_log"])
        kw["dt_bias"] = x["dt_bias"]
    opts.pop("A_log", None)
    return kw, opts


def drawn(name, seed, **shape):
    opts = OPTION_SETS[name]
    x, do, dht = draw(seed, raw_gate=opts.get("use_gate_in_kernel", False),
                      raw_qk=opts.get("use_qk_l2norm_in_kernel", False), **shape)
    return x, do, dht, opts


# ------------------------------------------------------------------ the two formulations
CONFIGS = {  # name -> (option set, chunk size, shape, cu_seqlens, with h0, scale); the tests below reuse these
    "lb_no_A_log-C16-B2": ("gate_lb_no_A_log", 16, dict(B=2), None, False, 0.7),  # a chunk longer than T, h0 = 0
    "l2norm+gate-C3": ("l2norm+gate", 3, dict(), None, True, None),  # T=7: a short last chunk
    "lb_safe-C2-varlen": ("gate_lb_safe", 2, dict(N=3), (0, 3, 3, 7), True, None),  # an empty sequence, a
}  # boundary inside a chunk
PLAIN = ("plain", 3, dict(), None, True, None)
"""No options: the call most tests share (chunk size 3, h0, the default scale)."""
FORMULATION_CASES = [CONFIGS[n] for n in CONFIGS]


def packed(cu):
    return {} if cu is None else dict(cu_seqlens=np.array(cu))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_chunked_wy_matches_token_recurrence(config):
    name, C, shape, cu, h0, scale = CONFIGS[config]
    x, do, dht, opts = drawn(name, 1, **shape)
    kw, o = call_args(x, opts, h0=h0)
    kw["scale"] = scale
    fwd = {m: ref.chunk_gdn2(**kw, output_final_state=True, method=m, chunk_size=C, **packed(cu), **o)
           for m in ref.METHODS}
    assert rel(fwd["chunk"][0], fwd["recurrent"][0]) < TOL
    assert rel(fwd["chunk"][1], fwd["recurrent"][1]) < TOL
    bwd = {m: ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, method=m, chunk_size=C, **packed(cu), **o)
           for m in ref.METHODS}
    expect = {"dq", "dk", "dv", "dg", "db", "dw"} | ({"dh0"} if h0 else set())
    if o.get("use_gate_in_kernel"):
        expect |= {"ddt_bias"} | ({"dA_log"} if kw["A_log"] is not None else set())
    assert set(bwd["chunk"]) == set(GRADS)
    assert {n for n, a in bwd["chunk"].items() if a is not None} == expect
    for n in expect:
        assert bwd["chunk"][n].shape == kw["initial_state" if n == "dh0" else n[1:]].shape, n
        assert rel(bwd["chunk"][n], bwd["recurrent"][n]) < TOL, n
    if cu is not None:  # the empty sequence: its final state is its initial state, its dh0 its dht, exactly
        for m in ref.METHODS:
            assert np.array_equal(fwd[m][1][1], x["initial_state"][1])
            assert np.array_equal(bwd[m]["dh0"][1], dht[1])


# ------------------------------------------------------------------ kda and gdn as special cases
def test_b_and_w_equal_to_beta_give_kda():
    """b = beta on every key channel and w = beta on every value channel: kda's results (with the in-kernel
    gate, packed sequences, an empty one); kda's dbeta is the sum of db over K and dw over V."""
    name, C, shape, cu, h0, _ = CONFIGS["lb_safe-C2-varlen"]
    x, do, dht, opts = drawn(name, 2, **shape)
    beta = np.random.default_rng(5).uniform(size=x["q"].shape[:3])
    x["b"] = np.repeat(beta[..., None], x["q"].shape[-1], -1)
    x["w"] = np.repeat(beta[..., None], x["v"].shape[-1], -1)
    kw, o = call_args(x, opts, h0=h0)
    kkw = {n: a for n, a in kw.items() if n not in ("b", "w")}
    o2, ht2 = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=C, **packed(cu), **o)
    o1, ht1 = kda.chunk_kda(**kkw, beta=beta, output_final_state=True, chunk_size=C, **packed(cu), **o)
    assert rel(o2, o1) < 1e-14 and rel(ht2, ht1) < 1e-14
    d2 = ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, chunk_size=C, **packed(cu), **o)
    d1 = kda.chunk_kda_bwd(**kkw, beta=beta, do=do, dht=dht, chunk_size=C, **packed(cu), **o)
    for n in ("dq", "dk", "dv", "dg", "dh0", "dA_log", "ddt_bias"):
        assert (d1[n] is None) == (d2[n] is None), n
        if d1[n] is not None:
            assert rel(d2[n], d1[n]) < 1e-14, n
    assert rel(d2["db"].sum(-1) + d2["dw"].sum(-1), d1["dbeta"]) < 1e-14


def test_a_scalar_gate_as_well_gives_gdn():
    x, do, dht = draw(3)
    g = -np.logaddexp(0, -np.random.default_rng(6).standard_normal(x["q"].shape[:3])) / 4
    beta = np.random.default_rng(7).uniform(size=g.shape)
    K, V = x["q"].shape[-1], x["v"].shape[-1]
    kw = dict(q=x["q"], k=x["k"], v=x["v"], initial_state=x["initial_state"])
    two = dict(g=np.repeat(g[..., None], K, -1), b=np.repeat(beta[..., None], K, -1),
               w=np.repeat(beta[..., None], V, -1))
    o2, ht2 = ref.chunk_gdn2(**kw, **two, output_final_state=True, chunk_size=3)
    o1, ht1 = gdn.chunk_gdn(**kw, g=g, beta=beta, output_final_state=True, chunk_size=3)
    assert rel(o2, o1) < 1e-14 and rel(ht2, ht1) < 1e-14
    d2 = ref.chunk_gdn2_bwd(**kw, **two, do=do, dht=dht, chunk_size=3)
    d1 = gdn.chunk_gdn_bwd(**kw, g=g, beta=beta, do=do, dht=dht, chunk_size=3)
    for n in ("dq", "dk", "dv", "dh0"):
        assert rel(d2[n], d1[n]) < 1e-14, n
    assert rel(d2["dg"].sum(-1), d1["dg"]) < 1e-14
    assert rel(d2["db"].sum(-1) + d2["dw"].sum(-1), d1["dbeta"]) < 1e-14


# ------------------------------------------------------------------ an independent token loop
def token_loop(xp, q, k, v, g, b, w, h0, scale, cu=None, *, l2=False, gate=False, A_log=None, dt_bias=None,
               lower_bound=None):
    """GDN-2 token by token from the update rule, all heads at once, with the options written out from fla's
    formulas. ``xp`` is numpy or jax.numpy (no in-place updates, so jax can differentiate it). Returns (o, ht)."""
    B, T, H, K = q.shape
    if l2:
        q = q / xp.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / xp.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if gate:
        x = g if dt_bias is None else g + dt_bias.reshape(H, K)
        if lower_bound is None:
            g = -xp.exp(A_log)[:, None] * xp.logaddexp(0.0, x)
        else:
            a = 1.0 if A_log is None else xp.exp(A_log)[:, None]
            g = lower_bound / (1.0 + xp.exp(-a * x))
    spans = [(i, i, 0, T) for i in range(B)] if cu is None else [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    rows, states = {}, []
    for n, r, t0, t1 in spans:
        S = xp.zeros((H, K, v.shape[-1])) if h0 is None else h0[n]  # [H,K,V]
        for t in range(t0, t1):
            kt = k[r, t]
            S = xp.exp(g[r, t])[:, :, None] * S
            erase = xp.einsum("hk,hkv->hv", b[r, t] * kt, S)
            S = S + kt[:, :, None] * (w[r, t] * v[r, t] - erase)[:, None, :]
            rows[(r, t)] = scale * xp.einsum("hk,hkv->hv", q[r, t], S)
        states.append(S)
    o = xp.stack([xp.stack([rows[(r, t)] for t in range(T)]) for r in range(B)])
    return o, xp.stack(states)


LOOP_CASES = {**CONFIGS, "plain-C3": PLAIN}


def loop_call(xp, kw, o, cu, scale):
    return token_loop(xp, kw["q"], kw["k"], kw["v"], kw["g"], kw["b"], kw["w"], kw.get("initial_state"), scale,
                      cu, l2=o.get("use_qk_l2norm_in_kernel", False), gate=o.get("use_gate_in_kernel", False),
                      A_log=kw.get("A_log"), dt_bias=kw.get("dt_bias"), lower_bound=o.get("lower_bound"))


@pytest.mark.parametrize("config", list(LOOP_CASES))
def test_forward_and_gradients_match_the_token_loop(config):
    """Forward against the numpy loop; every gradient against jax's autodiff of the same loop in jax.numpy."""
    name, C, shape, cu, h0, scale = LOOP_CASES[config]
    x, do, dht, opts = drawn(name, 4, **shape)
    kw, o = call_args(x, opts, h0=h0)
    kw["scale"] = scale
    scale = x["q"].shape[-1] ** -0.5 if scale is None else scale
    out, ht = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=C, **packed(cu), **o)
    o_np, ht_np = loop_call(np, kw, o, cu, scale)
    assert rel(out, o_np) < 1e-10 and rel(ht, ht_np) < 1e-10
    grads = ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, chunk_size=C, **packed(cu), **o)
    params = {n: a for n, a in kw.items() if a is not None and n != "scale"}
    with float64_cpu():
        def loss(p):
            o_, ht_ = loop_call(jnp, p, o, cu, scale)
            return jnp.sum(o_ * do) + jnp.sum(ht_ * dht)

        auto = jax.grad(loss)({n: jnp.asarray(a) for n, a in params.items()})
    assert {"dh0" if n == "initial_state" else "d" + n for n in auto} == {n for n, a in grads.items()
                                                                          if a is not None}
    for n, a in auto.items():
        d = grads["dh0" if n == "initial_state" else "d" + n]
        assert d.dtype == np.float64 and rel(d, np.asarray(a)) < 1e-10, n


def test_gradients_match_finite_differences_of_the_numpy_loop():
    """An entry of every gradient against fourth-order central differences of the numpy loop (step 1e-3:
    truncation ~1e-14, rounding ~1e-13)."""
    x, do, dht, opts = drawn("l2norm+gate", 5)
    kw, o = call_args(x, opts)
    grads = ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, chunk_size=3, **o)

    def loss(kw_):
        o_, ht_ = loop_call(np, kw_, o, None, 3 ** -0.5)
        return float((o_ * do).sum() + (ht_ * dht).sum())

    entries = [("q", (0, 3, 0, 1)), ("k", (0, 6, 1, 2)), ("v", (0, 2, 0, 3)), ("g", (0, 5, 1, 0)),
               ("b", (0, 1, 0, 2)), ("w", (0, 4, 1, 1)), ("initial_state", (0, 1, 2, 3)), ("A_log", (1,)),
               ("dt_bias", (4,))]
    h = 1e-3
    for n, idx in entries:
        def at(step):
            kw_ = dict(kw)
            kw_[n] = kw[n].copy()
            kw_[n][idx] += step
            return loss(kw_)

        fd = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12 * h)
        an = grads["dh0" if n == "initial_state" else "d" + n][idx]
        assert abs(fd - an) <= 1e-10 * max(1.0, abs(an)), (n, fd, an)


# ------------------------------------------------------------------ the in-kernel options against their formulas
def softplus(x):
    return np.logaddexp(0.0, x)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("name", ["l2norm+gate"])
def test_in_kernel_options_are_their_formulas(name):
    """The options' call equals the plain call on the options' outputs computed here in numpy, and its raw
    gradients are the plain call's through the options' Jacobians (chain rule written out). The gate with
    ``lower_bound`` (with and without A_log) is checked against the token loop's formulas (forward) and their
    autodiff (dg, dA_log, ddt_bias): compile time."""
    x, do, dht, opts = drawn(name, 6)
    kw, o = call_args(x, opts)
    H, K = x["q"].shape[2:]
    lb, A_log, dt = o.get("lower_bound"), kw["A_log"], kw["dt_bias"].reshape(H, K)
    xg = x["g"] + dt
    if lb is None:  # -exp(A_log) softplus(g + dt_bias)
        a = np.exp(A_log)[:, None]
        g, dg_dx, dg_dA = -a * softplus(xg), -a * sigmoid(xg), -a * softplus(xg)
    else:  # lower_bound sigmoid(a (g + dt_bias)), a = exp(A_log) or 1
        a = 1.0 if A_log is None else np.exp(A_log)[:, None]
        s = sigmoid(a * xg)
        g, dg_dx, dg_dA = lb * s, lb * s * (1 - s) * a, lb * s * (1 - s) * a * xg
    l2 = o.get("use_qk_l2norm_in_kernel", False)
    r = {n: 1 / np.sqrt((x[n] ** 2).sum(-1, keepdims=True) + 1e-6) if l2 else 1.0 for n in ("q", "k")}
    plain = dict(kw, q=x["q"] * r["q"], k=x["k"] * r["k"], g=g)
    for n in ("A_log", "dt_bias"):
        del plain[n]
    out, ht = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=3, **o)
    out0, ht0 = ref.chunk_gdn2(**plain, output_final_state=True, chunk_size=3)
    assert rel(out, out0) < 1e-13 and rel(ht, ht0) < 1e-13
    d = ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, chunk_size=3, **o)
    d0 = ref.chunk_gdn2_bwd(**plain, do=do, dht=dht, chunk_size=3)
    for n in ("dv", "db", "dw", "dh0"):
        assert rel(d[n], d0[n]) < 1e-13, n
    for n in ("q", "k"):  # d(x r)/dx = r I - r^3 x x^T
        dn = d0["d" + n]
        want = r[n] * dn - (r[n] ** 3 * x[n] * (x[n] * dn).sum(-1, keepdims=True) if l2 else 0.0)
        assert rel(d["d" + n], want) < 1e-13, n
    assert rel(d["dg"], d0["dg"] * dg_dx) < 1e-13
    assert rel(d["ddt_bias"], (d0["dg"] * dg_dx).sum((0, 1)).reshape(H * K)) < 1e-13
    if A_log is None:
        assert d["dA_log"] is None
    else:
        assert rel(d["dA_log"], (d0["dg"] * dg_dA).sum((0, 1, 3))) < 1e-13


def test_without_the_gate_A_log_dt_bias_and_lower_bound_are_ignored():
    x, do, dht = draw(7)
    kw, _ = call_args(x, {})
    o0, ht0 = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=3)
    o1, ht1 = ref.chunk_gdn2(**kw, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-1.0,
                             output_final_state=True, chunk_size=3)
    assert np.array_equal(o0, o1) and np.array_equal(ht0, ht1)
    d = ref.chunk_gdn2_bwd(**kw, A_log=x["A_log"], dt_bias=x["dt_bias"], do=do, dht=dht, chunk_size=3)
    assert d["dA_log"] is None and d["ddt_bias"] is None


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_low_precision_inputs_give_float64_everywhere(dtype):
    x, do, dht = draw(8)
    kw, _ = call_args(x, {})
    low = {n: a.astype(dtype) for n, a in kw.items()}
    o, ht = ref.chunk_gdn2(**low, output_final_state=True, chunk_size=3)
    grads = ref.chunk_gdn2_bwd(**low, do=do.astype(dtype), dht=dht.astype(dtype), chunk_size=3)
    o64, ht64 = ref.chunk_gdn2(**{n: a.astype(np.float64) for n, a in low.items()}, output_final_state=True,
                               chunk_size=3)
    assert o.dtype == ht.dtype == np.float64
    assert np.array_equal(o, o64) and np.array_equal(ht, ht64)  # an exact upcast, then the float64 maths
    assert {n: a.dtype for n, a in grads.items() if a is not None} == {n: np.dtype(np.float64) for n in GRADS[:7]}
    assert jnp.zeros(1).dtype == jnp.float32  # no global x64


def test_float32_compute_returns_float64_and_is_close():
    x, _, _ = draw(9)
    kw, _ = call_args(x, {})
    o, ht = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=3, compute_dtype="float32")
    o64, _ = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=3)
    assert o.dtype == ht.dtype == np.float64 and 0 < rel(o, o64) < 1e-5


# ------------------------------------------------------------------ the contract
def test_contract():
    x, do, dht = draw(10)
    kw, _ = call_args(x, {})
    with pytest.raises(ValueError, match=r"b must be \[B,T,H,K\]"):
        ref.chunk_gdn2(**dict(kw, b=kw["b"][..., 0]))
    with pytest.raises(ValueError, match=r"w must be \[B,T,H,V\]"):
        ref.chunk_gdn2(**dict(kw, w=kw["b"]))
    with pytest.raises(ValueError, match="g is a log decay"):
        ref.chunk_gdn2(**dict(kw, g=-kw["g"]))
    with pytest.raises(ValueError, match="A_log must be given"):
        ref.chunk_gdn2(**kw, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="lower_bound=1.0"):
        ref.chunk_gdn2(**kw, use_gate_in_kernel=True, lower_bound=1.0)
    with pytest.raises(TypeError, match="use_beta_sigmoid_in_kernel"):  # gdn2 has no beta
        ref.chunk_gdn2(**kw, use_beta_sigmoid_in_kernel=True)
    with pytest.raises(NotImplementedError, match="grouped value heads"):  # nor grouped value heads, in fla
        ref.chunk_gdn2(**dict(kw, v=np.concatenate([kw["v"]] * 2, 2), w=np.concatenate([kw["w"]] * 2, 2)))
    with pytest.raises(ValueError, match="method"):
        ref.chunk_gdn2(**kw, method="fused")
    dims, scale = check_gdn2(*(kw[n] for n in ("q", "k", "v", "g", "b", "w")))
    assert (dims.B, dims.T, dims.H, dims.K, dims.V, dims.N) == (1, 7, 2, 3, 4, 1) and scale == 3 ** -0.5


# ------------------------------------------------------------------ fla's own torch reference, in float64
class _Float64Torch:
    """``torch`` for fla's naive gdn2 functions, with its float32 (buffers, casts) read as float64."""

    def __init__(self, torch):
        self._torch, self.float32 = torch, torch.float64

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _fla_naive():
    """fla's ``ops/gdn2/naive.py`` loaded as a module of its own: it needs torch only, and importing the ``fla``
    package would load its Triton kernels (seconds). Skips where fla or the file is missing."""
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("fla is not installed")
    path = pathlib.Path(spec.origin).parent / "ops" / "gdn2" / "naive.py"
    if not path.is_file():
        pytest.skip(f"this fla has no {path.relative_to(path.parents[2])}")
    module_spec = importlib.util.spec_from_file_location("_fla_gdn2_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _in_float64(fn, torch):
    return types.FunctionType(fn.__code__, {**fn.__globals__, "torch": _Float64Torch(torch)}, fn.__name__,
                              fn.__defaults__, fn.__closure__)


@pytest.mark.parametrize("which", ["naive_recurrent_gdn2", "naive_chunk_gdn2"])
def test_fla_naive_gdn2_in_float64(which, monkeypatch):
    """fla's naive gdn2 computes in float32 (``.float()``, float32 buffers); run with those read as float64 it
    is the same function in float64: forward and torch autograd's gradients against the reference, and run as
    shipped (float32) near it."""
    torch = pytest.importorskip("torch")
    naive = _fla_naive()
    x, do, dht = draw(11)
    kw, _ = call_args(x, {})
    extra = dict(chunk_size=3) if which == "naive_chunk_gdn2" else {}
    out, ht = ref.chunk_gdn2(**kw, output_final_state=True, chunk_size=3)
    grads = ref.chunk_gdn2_bwd(**kw, do=do, dht=dht, chunk_size=3)

    as_shipped = getattr(naive, which)
    t32 = {n: torch.tensor(a, dtype=torch.float32) for n, a in kw.items()}
    o32, ht32 = as_shipped(**t32, output_final_state=True, **extra)
    assert o32.dtype == torch.float32 and rel(o32.detach().numpy(), out) < 1e-5

    monkeypatch.setattr(torch.Tensor, "float", torch.Tensor.double)
    fn = _in_float64(as_shipped, torch)
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in kw.items()}
    o, h = fn(**t, output_final_state=True, **extra)
    assert o.dtype == h.dtype == torch.float64
    assert rel(o.detach().numpy(), out) < TOL and rel(h.detach().numpy(), ht) < TOL
    ((o * torch.tensor(do)).sum() + (h * torch.tensor(dht)).sum()).backward()
    for n, a in t.items():
        assert rel(a.grad.numpy(), grads["dh0" if n == "initial_state" else "d" + n]) < TOL, n
