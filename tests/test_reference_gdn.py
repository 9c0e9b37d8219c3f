"""The float64 gated delta rule (gdn) reference: two formulations, an independent numpy loop with finite
differences, grouped value heads, packed sequences, and gdn as kda with one gate on every key channel.

Most tests share one tiny shape (``draw``'s defaults, chunk size ``C``) so that they share the reference's
compiled functions: compiling, not computing, is what these tests spend their time on.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from op_contract import check_gdn
from references import gdn as ref
from references import kda

TOL = 1e-12
C = 4  # T = 7: a short last chunk


def rel(x, y) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def draw(seed, B=1, T=7, H=2, HV=4, K=3, V=3, *, N=None, raw_gate=False, raw_beta=False, raw_qk=False):
    """float64 inputs (log decays <= 0 unless raw_gate; then the gate's A_log, dt_bias [HV]), and do, dht."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    N = B if N is None else N
    x = dict(q=n(B, T, H, K), k=n(B, T, H, K), v=n(B, T, HV, V), initial_state=n(N, HV, K, V))
    if not raw_qk:
        x["q"] /= np.linalg.norm(x["q"], axis=-1, keepdims=True)
        x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
    x["g"] = n(B, T, HV) if raw_gate else -np.logaddexp(0, -n(B, T, HV)) / 4
    x["beta"] = n(B, T, HV) if raw_beta else 1 / (1 + np.exp(-n(B, T, HV)))
    if raw_gate:
        x["A_log"], x["dt_bias"] = n(HV) / 2, n(HV)
    return x, n(B, T, HV, V), n(N, HV, K, V)


OPTION_SETS = {
    "plain": dict(),
    "l2norm+beta_sigmoid+neg_eigval": dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                           allow_neg_eigval=True),
    "gate": dict(use_gate_in_kernel=True),
    "all": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True),
}


def draw_for(opts, seed, **shape):
    """``draw`` with the raw inputs the options take (q, k unnormalised, raw gate, beta logits)."""
    return draw(seed, raw_gate=opts.get("use_gate_in_kernel", False),
                raw_beta=opts.get("use_beta_sigmoid_in_kernel", False),
                raw_qk=opts.get("use_qk_l2norm_in_kernel", False), **shape)


# ------------------------------------------------------------------ two formulations
@pytest.mark.parametrize("name, shape, cu", [
    ("plain", dict(), None),  # no options, no initial state
    ("all", dict(T=13, H=2, HV=8, N=3), (0, 5, 6, 13)),  # every option, GVA, packed (boundaries in chunks), h0
])
def test_recurrent_matches_chunked_fwd_bwd(name, shape, cu):
    opts = OPTION_SETS[name]
    x, do, dht = draw_for(opts, 1, **shape)
    if not opts:
        del x["initial_state"]
    packed = {} if cu is None else dict(cu_seqlens=np.array(cu))
    fwd = {m: ref.chunk_gdn(**x, output_final_state=True, method=m, chunk_size=C, **packed, **opts)
           for m in ref.METHODS}
    assert rel(fwd["chunk"][0], fwd["recurrent"][0]) < TOL
    assert rel(fwd["chunk"][1], fwd["recurrent"][1]) < TOL
    bwd = {m: ref.chunk_gdn_bwd(**x, do=do, dht=dht, method=m, chunk_size=C, **packed, **opts)
           for m in ref.METHODS}
    expect = {"dq", "dk", "dv", "dg", "dbeta"} | ({"dh0"} if "initial_state" in x else set())
    expect |= {"dA_log", "ddt_bias"} if "A_log" in x else set()
    assert {n for n, a in bwd["chunk"].items() if a is not None} == expect
    for n in expect:
        assert rel(bwd["chunk"][n], bwd["recurrent"][n]) < TOL, n


# ------------------------------------------------------------------ an independent numpy loop
def numpy_gdn(q, k, v, g, beta, h0, scale, A_log=None, dt_bias=None, *, l2=False, gate=False, beta_sigmoid=False,
              neg=False):
    """The gated delta rule token by token in plain numpy float64, from the maths: per value head j (reading
    q/k head j // (HV // H)), S = exp(g) S; S += beta k (v - S^T k)^T; o = scale S^T q."""
    if l2:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if gate:
        x = g + (0.0 if dt_bias is None else dt_bias)
        g = -np.exp(A_log) * np.log1p(np.exp(x))
    if beta_sigmoid:
        beta = (2.0 if neg else 1.0) / (1 + np.exp(-beta))
    Bb, Tt, Hh, _ = q.shape
    HVv = v.shape[2]
    o = np.zeros(v.shape)
    S = np.array(h0, np.float64)
    for b in range(Bb):
        for j in range(HVv):
            i = j // (HVv // Hh)
            s = S[b, j]
            for t in range(Tt):
                s = np.exp(g[b, t, j]) * s
                s = s + beta[b, t, j] * np.outer(k[b, t, i], v[b, t, j] - s.T @ k[b, t, i])
                o[b, t, j] = scale * s.T @ q[b, t, i]
            S[b, j] = s
    return o, S


def numpy_call(x, opts):
    flags = dict(l2=opts.get("use_qk_l2norm_in_kernel", False), gate=opts.get("use_gate_in_kernel", False),
                 beta_sigmoid=opts.get("use_beta_sigmoid_in_kernel", False), neg=opts.get("allow_neg_eigval", False))
    return numpy_gdn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["q"].shape[-1] ** -0.5,
                     x.get("A_log"), x.get("dt_bias"), **flags)


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_forward_matches_numpy_loop(name):
    """GVA (H=2, HV=4) with an initial state; the chunked form (the token loop equals it, above)."""
    opts = OPTION_SETS[name]
    x, _, _ = draw_for(opts, 2)
    o_np, ht_np = numpy_call(x, opts)
    o, ht = ref.chunk_gdn(**x, output_final_state=True, chunk_size=C, **opts)
    assert rel(o, o_np) < TOL and rel(ht, ht_np) < TOL


@pytest.mark.parametrize("name", ["gate", "l2norm+beta_sigmoid+neg_eigval"])
def test_gradients_match_finite_differences_of_the_numpy_loop(name):
    """Every entry of every input (A_log and dt_bias with the in-kernel gate) against central differences of
    the independent loop, with grouped value heads (H=2, HV=4), T=7, K=V=3."""
    opts = OPTION_SETS[name]
    x, do, dht = draw_for(opts, 3)
    grads = ref.chunk_gdn_bwd(**x, do=do, dht=dht, chunk_size=C, **opts)

    def loss(x_):
        o, ht = numpy_call(x_, opts)
        return float((o * do).sum() + (ht * dht).sum())

    eps = 1e-6
    for n, a in x.items():
        an = grads["dh0" if n == "initial_state" else "d" + n]
        assert an.shape == a.shape and an.dtype == np.float64, n
        fd = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus, minus = a.copy(), a.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd[idx] = (loss({**x, n: plus}) - loss({**x, n: minus})) / (2 * eps)
        np.testing.assert_allclose(an, fd, rtol=1e-7, atol=1e-7, err_msg=n)


# ------------------------------------------------------------------ grouped value heads
def test_grouped_value_heads_are_each_value_head_with_its_qk_head():
    """H=2, HV=4: value head j is the ungrouped op on q/k head j // 2; dq, dk sum their group. (The token
    loop runs it; the chunked form equals it, above; GVA with options and h0: the numpy loop above.)"""
    H, HV, G = 2, 4, 2
    x, do, dht = draw(4, H=H, HV=HV)
    del x["initial_state"]
    kw = dict(chunk_size=C, method="recurrent")
    o, ht = ref.chunk_gdn(**x, output_final_state=True, **kw)
    d = ref.chunk_gdn_bwd(**x, do=do, dht=dht, **kw)
    dq, dk = np.zeros_like(x["q"]), np.zeros_like(x["k"])
    for j in range(HV):
        i = j // G
        xj = {n: (a[:, :, i:i + 1] if n in ("q", "k") else a[:, :, j:j + 1]) for n, a in x.items()}
        oj, htj = ref.chunk_gdn(**xj, output_final_state=True, **kw)
        assert rel(o[:, :, j:j + 1], oj) < TOL and rel(ht[:, j:j + 1], htj) < TOL, j
        dj = ref.chunk_gdn_bwd(**xj, do=do[:, :, j:j + 1], dht=dht[:, j:j + 1], **kw)
        for n in ("dv", "dg", "dbeta"):
            assert rel(d[n][:, :, j:j + 1], dj[n]) < TOL, (n, j)
        dq[:, :, i:i + 1] += dj["dq"]
        dk[:, :, i:i + 1] += dj["dk"]
    assert d["dq"].shape == x["q"].shape and rel(d["dq"], dq) < TOL and rel(d["dk"], dk) < TOL


# ------------------------------------------------------------------ packed sequences
def test_packed_equals_each_sequence_alone():
    lens = (7, 1, 7)  # boundaries inside chunks; a one-token sequence
    cu = np.cumsum((0,) + lens)
    opts = OPTION_SETS["gate"]
    x, do, dht = draw_for(opts, 5, T=sum(lens), N=len(lens))
    o, ht = ref.chunk_gdn(**x, output_final_state=True, chunk_size=C, cu_seqlens=cu, **opts)
    d = ref.chunk_gdn_bwd(**x, do=do, dht=dht, chunk_size=C, cu_seqlens=cu, **opts)
    dA, dbias = np.zeros_like(x["A_log"]), np.zeros_like(x["dt_bias"])
    for i, (bos, eos) in enumerate(zip(cu[:-1], cu[1:])):
        xi = {n: (a if n in ("A_log", "dt_bias") else a[i:i + 1] if n == "initial_state" else a[:, bos:eos])
              for n, a in x.items()}
        oi, hti = ref.chunk_gdn(**xi, output_final_state=True, chunk_size=C, **opts)
        assert rel(o[:, bos:eos], oi) < TOL and rel(ht[i:i + 1], hti) < TOL, i
        di = ref.chunk_gdn_bwd(**xi, do=do[:, bos:eos], dht=dht[i:i + 1], chunk_size=C, **opts)
        for n in ("dq", "dk", "dv", "dg", "dbeta"):
            assert rel(d[n][:, bos:eos], di[n]) < TOL, (n, i)
        assert rel(d["dh0"][i:i + 1], di["dh0"]) < TOL
        dA += di["dA_log"]
        dbias += di["ddt_bias"]
    assert rel(d["dA_log"], dA) < TOL and rel(d["ddt_bias"], dbias) < TOL


# ------------------------------------------------------------------ gdn is kda with one gate on every channel
def test_gdn_is_kda_with_the_gate_broadcast_over_k():
    """With the in-kernel gate: kda's dt_bias [HV*K] is gdn's [HV] repeated over the channels."""
    opts = OPTION_SETS["gate"]
    x, do, dht = draw_for(opts, 6)
    K = x["q"].shape[-1]
    xk = dict(x, g=np.repeat(x["g"][..., None], K, axis=-1), dt_bias=np.repeat(x["dt_bias"], K))
    o, ht = ref.chunk_gdn(**x, output_final_state=True, chunk_size=C, **opts)
    ok, htk = kda.chunk_kda(**xk, output_final_state=True, chunk_size=C, **opts)
    assert rel(o, ok) < TOL and rel(ht, htk) < TOL
    d = ref.chunk_gdn_bwd(**x, do=do, dht=dht, chunk_size=C, **opts)
    dk = kda.chunk_kda_bwd(**xk, do=do, dht=dht, chunk_size=C, **opts)
    for n in ("dq", "dk", "dv", "dbeta", "dh0", "dA_log"):
        assert rel(d[n], dk[n]) < TOL, n
    assert rel(d["dg"], dk["dg"].sum(-1)) < TOL
    assert rel(d["ddt_bias"], dk["ddt_bias"].reshape(-1, K).sum(-1)) < TOL


# ------------------------------------------------------------------ dtypes and side effects
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_low_precision_inputs_give_float64_without_global_x64(dtype):
    x, do, _ = draw(7)
    del x["initial_state"]  # (dh0 and ht: above)
    kw = {n: a.astype(dtype) for n, a in x.items()}
    o, ht = ref.chunk_gdn(**kw, output_final_state=True, chunk_size=C)
    grads = ref.chunk_gdn_bwd(**kw, do=do.astype(dtype), chunk_size=C)
    assert o.dtype == ht.dtype == np.float64 and o.shape == x["v"].shape and ht.shape == (1, 4, 3, 3)
    assert grads["dh0"] is None and grads["dA_log"] is None and grads["ddt_bias"] is None
    for n, a in x.items():
        assert grads["d" + n].dtype == np.float64 and grads["d" + n].shape == a.shape, n
    o64, _ = ref.chunk_gdn(**{n: a.astype(np.float64) for n, a in kw.items()}, chunk_size=C)
    assert np.array_equal(o, o64)  # the bits in are the bits used
    assert not jax.config.jax_enable_x64 and jnp.zeros(1).dtype == jnp.float32


def test_compute_dtype_float32_is_close_and_returned_as_float64():
    x, _, _ = draw(8)
    o64, _ = ref.chunk_gdn(**x, chunk_size=C)
    o32, _ = ref.chunk_gdn(**x, chunk_size=C, compute_dtype="float32")
    assert o32.dtype == np.float64 and 0 < rel(o32, o64) < 1e-5


def test_gate_parameters_are_ignored_without_the_in_kernel_gate():
    x, do, _ = draw(9)
    del x["initial_state"]
    o, _ = ref.chunk_gdn(**x, chunk_size=C)
    o2, _ = ref.chunk_gdn(**x, A_log=np.ones(4), dt_bias=np.ones(4), chunk_size=C)
    assert np.array_equal(o, o2)
    d = ref.chunk_gdn_bwd(**x, do=do, A_log=np.ones(4), chunk_size=C)
    assert d["dA_log"] is None and d["ddt_bias"] is None


# ------------------------------------------------------------------ the contract
@pytest.mark.parametrize("change, exc, match", [
    (lambda x: dict(v=x["v"][:, :, :3], g=x["g"][:, :, :3], beta=x["beta"][:, :, :3]),
     ValueError, r"HV=3 value heads must be a multiple of H=2"),
    (lambda x: dict(g=np.abs(x["g"])), ValueError, r"^g is a log decay and must be <= 0"),
    (lambda x: dict(g=x["g"][..., None].repeat(4, axis=-1)), ValueError, r"^g must be \[B,T,HV\]"),
    (lambda x: dict(use_gate_in_kernel=True), ValueError, r"^A_log must be given"),
    (lambda x: dict(allow_neg_eigval=True), ValueError, r"^allow_neg_eigval=True requires"),
    (lambda x: dict(initial_state=x["initial_state"][:, :1]), ValueError, r"^initial_state must be \[B,HV,K,V\]"),
    (lambda x: dict(method="nope"), ValueError, "method"),
    (lambda x: dict(compute_dtype="float16"), ValueError, "compute_dtype"),
    (lambda x: dict(lower_bound=-1.0), TypeError, r"unknown options \['lower_bound'\]"),
])
def test_invalid_arguments(change, exc, match):
    x, do, _ = draw(10)
    kw = {**x, **change(x)}
    for fn, extra in ((ref.chunk_gdn, {}), (ref.chunk_gdn_bwd, dict(do=do))):
        with pytest.raises(exc, match=match) as info:
            fn(**kw, **extra)
    if exc is ValueError and "method" not in kw and "compute_dtype" not in kw:  # the op contract's message
        contract = {n: kw.pop(n) for n in ("use_gate_in_kernel", "allow_neg_eigval") if n in kw}
        with pytest.raises(ValueError) as direct:
            check_gdn(**kw, opts=contract)
        assert str(direct.value) == str(info.value)
