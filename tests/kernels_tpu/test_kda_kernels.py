"""KDA Pallas TPU kernels (interpret mode, MXU model on) against the float64 reference.

Shapes are small (B=1, T<=128, H<=2, K=V=128, chunk 64) so the module runs in about two
minutes on one CPU core; compiled functions are shared between tests where the config allows.

Tolerances (relative L2 error against float64, per tensor, by the tensor's dtype):

- float32 tensors: ``F32_TOL = 4 * 2**-16`` (6.1e-5). Every kernel dot has f32 operands and runs
  as bf16x3 (the one policy, kernels_tpu.mxu, modelled here): each product carries up to ~2**-16
  relative error, plus f32 rounding in the chunk sums, the forward substitution and the state
  pass; measured 4e-6 .. 2.6e-5 (dA_log, ddt_bias: reductions over T and K with cancellation).
- bfloat16 tensors: ``BF16_TOL = 2**-8 + F32_TOL``. The result is computed in f32 and rounded
  once to bf16 on output; round-to-nearest to 8 significant bits has relative error <= 2**-8
  per element, so the rel-L2 is <= 2**-8 plus the f32 compute error (measured 1.65e-3, the
  2**-8/sqrt(3)-ish of uniform rounding). A gradient rounded twice (e.g. two bf16 casts summed)
  or a wrong transpose (the fault test: 4e-2) lands above it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels_tpu.kda import chunk_kda, chunk_kda_bwd, chunk_kda_fwd
from references import kda as ref
from like_the_leg import leg_jit

F32_TOL = 4 * 2.0**-16
BF16_TOL = 2.0 ** -8 + F32_TOL
K = V = 128
C = 64
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")


def rel_l2(x, y) -> float:
    x = np.asarray(x, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def tol_for(x) -> float:
    return BF16_TOL if np.asarray(x).dtype == ml_dtypes.bfloat16 else F32_TOL


def make_inputs(seed, B, T, H, dtype, *, h0=True, dht=True, raw_beta=False, normalise=True, gate="logsigmoid"):
    """Inputs as the harness draws them: q, k, v, do in ``dtype``; g, beta, h0, dht float32."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)
    q, k = n(B, T, H, K), n(B, T, H, K)
    if normalise:
        q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    if gate == "logsigmoid":
        g = -np.logaddexp(0.0, -n(B, T, H, K)) / 16  # logsigmoid(N(0,1)) / 16
    else:  # raw input of the in-kernel gate
        g = n(B, T, H, K)
    b = n(B, T, H)
    inp = dict(q=q, k=k, v=n(B, T, H, V), g=g, beta=b if raw_beta else 1 / (1 + np.exp(-b)))
    if h0:
        inp["initial_state"] = n(B, H, K, V)
    cast = {"q": dtype, "k": dtype, "v": dtype}
    inp = {name: x.astype(cast.get(name, np.float32)) for name, x in inp.items()}
    do = n(B, T, H, V).astype(dtype)
    dh = n(B, H, K, V).astype(np.float32) if dht else None
    return inp, do, dh


def reference(inp, do, dht, **opts):
    o, ht = ref.chunk_kda(**inp, output_final_state=True, **opts)
    grads = ref.chunk_kda_bwd(**inp, do=do, dht=dht, **opts)
    return o, ht, grads


def kernel_vjp(inp, do, dht, **opts):
    """o, ht and the gradients of sum(o*do)+sum(ht*dht) by jax.vjp through chunk_kda (custom VJP)."""
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias") if n in inp]

    @leg_jit
    def go(p, do, dht):
        def f(p):
            return chunk_kda(**p, output_final_state=True, chunk_size=C, interpret=True, **opts)

        (o, ht), vjp = jax.vjp(f, p)
        return o, ht, vjp((do, dht))[0]

    p = {n: jnp.asarray(inp[n]) for n in names}
    B, _, H, _ = inp["q"].shape
    dht = jnp.zeros((B, H, K, V), jnp.float32) if dht is None else jnp.asarray(dht)
    o, ht, g = go(p, jnp.asarray(do), dht)
    rename = {"initial_state": "dh0"}
    return np.asarray(o), np.asarray(ht), {rename.get(n, "d" + n): np.asarray(x) for n, x in g.items()}


def check(o, ht, grads, o_r, ht_r, g_r, label):
    errs = {"o": rel_l2(o, o_r), "ht": rel_l2(ht, ht_r)}
    tols = {"o": tol_for(o), "ht": tol_for(ht)}
    for name in GRADS:
        if g_r.get(name) is None:
            assert grads.get(name) is None, f"{label}: {name} should be absent"
            continue
        errs[name] = rel_l2(grads[name], g_r[name])
        tols[name] = tol_for(grads[name])
    print(f"\n{label}: " + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    bad = {n: (e, tols[n]) for n, e in errs.items() if not e <= tols[n]}
    assert not bad, f"{label}: rel-L2 over tolerance {bad}"
    return errs


# ------------------------------------------------------------------ fp32 via the explicit API
_FP32 = None


def fp32_case():
    global _FP32
    if _FP32 is None:
        inp, do, dht = make_inputs(0, 1, 128, 1, np.float32)
        _FP32 = (inp, do, dht, reference(inp, do, dht))
    return _FP32


def explicit(inp, do, dht, **kw):
    o, ht = chunk_kda_fwd(**inp, output_final_state=True, chunk_size=C, interpret=True)
    grads = chunk_kda_bwd(**inp, do=do, dht=dht, chunk_size=C, interpret=True, **kw)
    return np.asarray(o), np.asarray(ht), {n: None if x is None else np.asarray(x) for n, x in grads.items()}


def test_fp32_h0_dht_explicit_api():
    inp, do, dht, (o_r, ht_r, g_r) = fp32_case()
    o, ht, grads = explicit(inp, do, dht)
    assert o.dtype == np.float32 and ht.dtype == np.float32 and grads["dg"].dtype == np.float32
    check(o, ht, grads, o_r, ht_r, g_r, "fp32 T128 H1 h0 dht")


def test_fault_inverse_grad_missing_transpose_is_caught(inject):
    from faults import inverse_grad_missing_transpose
    from kernels_tpu import delta_rule

    inject(delta_rule, "inverse_grad", inverse_grad_missing_transpose)
    inp, do, dht, (o_r, ht_r, g_r) = fp32_case()
    o, ht, grads = explicit(inp, do, dht)
    # the fault lives in the backward of the triangular inverse: the forward, dq and dv are untouched
    assert rel_l2(o, o_r) <= F32_TOL and rel_l2(grads["dq"], g_r["dq"]) <= F32_TOL
    assert rel_l2(grads["dv"], g_r["dv"]) <= F32_TOL
    errs = {n: rel_l2(grads[n], g_r[n]) for n in ("dk", "dg", "dbeta")}
    print(f"\nfault inverse_grad_missing_transpose: {errs}")
    assert min(errs.values()) > 100 * F32_TOL, errs


def test_causality_probe_bit_exact():
    """Perturb q, k, v, g, beta, do (and dht) at positions > t0: o and dq at <= t0 are bit-identical."""
    inp, do, dht, _ = fp32_case()
    o0, _, g0 = explicit(inp, do, dht)
    rng = np.random.default_rng(7)
    for t0 in (40, 64 + 23):
        pert = {n: x.copy() for n, x in inp.items()}
        for n in ("q", "k", "v", "g", "beta"):
            x = pert[n]
            noise = rng.standard_normal(x[:, t0 + 1:].shape).astype(np.float32)
            x[:, t0 + 1:] = x[:, t0 + 1:] - np.abs(noise) if n == "g" else noise
        do_p = do.copy()
        do_p[:, t0 + 1:] = rng.standard_normal(do_p[:, t0 + 1:].shape)
        o1, _, g1 = explicit(pert, do_p, dht + 1)
        assert np.array_equal(o1[:, :t0 + 1], o0[:, :t0 + 1]), t0
        assert np.array_equal(g1["dq"][:, :t0 + 1], g0["dq"][:, :t0 + 1]), t0
        assert not np.array_equal(o1[:, t0 + 1:], o0[:, t0 + 1:])


# ------------------------------------------------------------------ bf16 and the options, via jax.vjp
def test_bf16_h0_dht_l2norm_and_beta_sigmoid_in_kernel():
    inp, do, dht = make_inputs(1, 1, 128, 2, ml_dtypes.bfloat16, raw_beta=True, normalise=False)
    opts = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    o, ht, grads = kernel_vjp(inp, do, dht, **opts)
    assert o.dtype == ml_dtypes.bfloat16 and grads["dq"].dtype == ml_dtypes.bfloat16
    check(o, ht, grads, *reference(inp, do, dht, **opts), "bf16 T128 H2 h0 dht l2norm+beta_sigmoid")


def test_bf16_gate_in_kernel_lower_bound_safe_gate_padded_T():
    inp, do, _ = make_inputs(2, 1, 100, 1, ml_dtypes.bfloat16, h0=False, dht=False, gate="raw")
    rng = np.random.default_rng(3)
    inp["A_log"] = rng.standard_normal(1).astype(np.float32)
    inp["dt_bias"] = rng.standard_normal(K).astype(np.float32)
    opts = dict(use_gate_in_kernel=True, lower_bound=-5.0, safe_gate=True)
    o, ht, grads = kernel_vjp(inp, do, None, **opts)
    check(o, ht, grads, *reference(inp, do, None, **opts), "bf16 T100 gate-in-kernel lb-5 safe_gate")


def test_fp32_gate_in_kernel_softplus_strong_decay():
    """-exp(A_log) softplus(g + dt_bias) with A_log ~ N(0,1): per-step decays down to about -10,
    chunk cumsums in the hundreds; the factored exponents must not overflow."""
    inp, do, dht = make_inputs(4, 1, 128, 1, np.float32, gate="raw")
    rng = np.random.default_rng(5)
    inp["A_log"] = rng.standard_normal(1).astype(np.float32) + 1.0
    inp["dt_bias"] = rng.standard_normal(K).astype(np.float32)
    opts = dict(use_gate_in_kernel=True)
    o, ht, grads = kernel_vjp(inp, do, dht, **opts)
    assert all(np.isfinite(x).all() for x in (o, ht, *grads.values()))
    check(o, ht, grads, *reference(inp, do, dht, **opts), "fp32 T128 gate-in-kernel softplus")


# ------------------------------------------------------------------ errors
def _args(T=64, H=1, k=K, v=V, dtype=np.float32):
    z = lambda *s: np.zeros(s, dtype)
    return dict(q=z(1, T, H, k), k=z(1, T, H, k), v=z(1, T, H, v), g=z(1, T, H, k).astype(np.float32),
                beta=z(1, T, H).astype(np.float32))


@pytest.mark.parametrize("change, exc, match", [
    (dict(beta=np.zeros((1, 64, 2), np.float32)), ValueError, "beta must be"),
    (dict(g=np.zeros((1, 64, 1, 64), np.float32)), ValueError, "g must be"),
    (dict(k=np.zeros((1, 32, 1, K), np.float32)), ValueError, "need q, k"),
    (dict(initial_state=np.zeros((1, 1, K, 64), np.float32)), ValueError, "initial_state"),
    (dict(interpret="yes"), ValueError, "interpret"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log"),
    (dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-7.0), ValueError, "lower_bound"),
    (dict(allow_neg_eigval=True), ValueError, "allow_neg_eigval"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(chunk_size=24), NotImplementedError, "chunk_size=64"),
    (dict(bogus=1), TypeError, "bogus"),
])
def test_invalid_arguments(change, exc, match):
    args = {**_args(), **change}
    with pytest.raises(exc, match=match):
        chunk_kda(**args)


def test_grouped_value_heads_need_the_gate_and_beta_at_hv_heads():
    args = _args()  # GVA: v has two value heads per q/k head, but g keeps q/k's one head
    args["v"] = np.zeros((1, 64, 2, V), np.float32)
    with pytest.raises(ValueError, match=r"g must be \[B,T,HV,K\]"):
        chunk_kda(**args)


@pytest.mark.parametrize("shape", [dict(k=64), dict(v=96), dict(k=192, v=64)])
def test_any_head_dim_runs_lane_padded(shape):
    """K and V need not be multiples of 128: padded internally (kernels_tpu.common.HeadPadding; exactness in
    test_head_dims_and_varlen.py). Shapes only: traced, not run."""
    args = _args(**shape)
    o, ht = jax.eval_shape(lambda a: chunk_kda(**a, output_final_state=True, interpret=True), args)
    Kd, Vd = shape.get("k", K), shape.get("v", V)
    assert o.shape == (1, 64, 1, Vd) and ht.shape == (1, 1, Kd, Vd)
