"""GDN-2 Pallas TPU kernels (interpret mode, MXU model on) against the float64 reference (references.gdn2) and
against this project's kda kernels (b = w = beta is KDA).

Shapes are small (B=1, T<=128, H<=2, K=V=32, one case at K=V=128): the kernels lane-pad K and V to 128, so
K=V=32 costs the same kernel work as 128 and the small head dims also cover the padding. Every run is one
XLA:CPU program at the emulated leg's level (conftest.py, like_the_leg.py).

Tolerances (relative L2 error against float64, per tensor, by the tensor's dtype), as kda's kernel tests derive
them (tests/kernels_tpu/test_kda_kernels.py), since the kernels are kda's with the two gated operands changed:

- float32 tensors: ``F32_TOL = 4 * 2**-16`` (6.1e-5). Every kernel dot has f32 operands and runs as bf16x3 (the
  one policy, kernels_tpu.mxu, modelled here): each product carries up to ~2**-16 relative error, plus f32
  rounding in the chunk sums, the forward substitution and the state pass.
- bfloat16 tensors: ``BF16_TOL = 2**-8 + F32_TOL``: computed in f32, rounded once to bf16 on output
  (round-to-nearest to 8 significant bits: relative error <= 2**-8 per element), plus the f32 compute error.
- float16 tensors: ``FP16_TOL = 2**-11 + F32_TOL``, the same argument with fp16's 11 significant bits (the
  policy's fp16 dots are bf16x4, exact products of fp16 data, so the f32 compute error is no larger).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels_tpu.gdn2 import chunk as gdn2_chunk
from kernels_tpu.gdn2 import chunk_gdn2, chunk_gdn2_bwd, chunk_gdn2_fwd
from kernels_tpu.kda import chunk_kda
from references import gdn2 as ref
from like_the_leg import leg_jit

F32_TOL = 4 * 2.0**-16
BF16_TOL = 2.0**-8 + F32_TOL
FP16_TOL = 2.0**-11 + F32_TOL
C = 64
GRADS = ("dq", "dk", "dv", "dg", "db", "dw", "dh0", "dA_log", "ddt_bias")
PRIMALS = ("q", "k", "v", "g", "b", "w", "initial_state", "A_log", "dt_bias")


def rel_l2(x, y) -> float:
    x = np.asarray(x, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def tol_for(x) -> float:
    return {ml_dtypes.bfloat16: BF16_TOL, np.float16: FP16_TOL}.get(np.asarray(x).dtype.type, F32_TOL)


def make_inputs(seed, T, H, K, V, dtype, *, N=1, h0=True, dht=True, gate="logsigmoid", normalise=True):
    """q, k, v, b, w, do in ``dtype`` (b = 2 sigmoid, fla's typical erase range [0, 2]; w = sigmoid, its write
    range [0, 1]); g, h0, dht float32. B = 1; ``N`` states (packed sequences when N > 1)."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    q, k = n(1, T, H, K), n(1, T, H, K)
    if normalise:
        q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    # logsigmoid(N(0,1)) / 16: per-token decays near exp(-0.05), so a chunk of 64 decays by about e^-3
    g = -np.logaddexp(0.0, -n(1, T, H, K)) / 16 if gate == "logsigmoid" else n(1, T, H, K)
    inp = dict(q=q, k=k, v=n(1, T, H, V), g=g, b=2 * sig(n(1, T, H, K)), w=sig(n(1, T, H, V)))
    if h0:
        inp["initial_state"] = n(N, H, K, V)
    inp = {name: x.astype(np.float32 if name in ("g", "initial_state") else dtype) for name, x in inp.items()}
    do = n(1, T, H, V).astype(dtype)
    dh = n(N, H, K, V).astype(np.float32) if dht else None
    return inp, do, dh


def reference(inp, do, dht, **opts):
    o, ht = ref.chunk_gdn2(**inp, output_final_state=True, **opts)
    grads = ref.chunk_gdn2_bwd(**inp, do=do, dht=dht, **opts)
    return o, ht, grads


def kernel_vjp(inp, do, dht, fn=chunk_gdn2, chunk_size=C, mxu_model=None, **opts):
    """o, ht and the gradients of sum(o*do) + sum(ht*dht) by jax.vjp through ``fn`` (its custom VJP), one program.
    Keyword options that are arrays (A_log, dt_bias) are primals; the rest are static."""
    names = [n for n in inp if isinstance(inp[n], np.ndarray)]

    @leg_jit
    def go(p, do, dht):
        def f(p):
            return fn(**p, output_final_state=True, chunk_size=chunk_size, interpret=True, mxu_model=mxu_model,
                      **opts)

        (o, ht), vjp = jax.vjp(f, p)
        return o, ht, vjp((do, dht))[0]

    p = {n: jnp.asarray(inp[n]) for n in names}
    o, ht, g = go(p, jnp.asarray(do), jnp.asarray(dht))
    rename = {"initial_state": "dh0"}
    return np.asarray(o), np.asarray(ht), {rename.get(n, "d" + n): np.asarray(x) for n, x in g.items()}


def check(o, ht, grads, o_r, ht_r, g_r, label):
    errs = {"o": rel_l2(o, o_r), "ht": rel_l2(ht, ht_r)}
    tols = {"o": tol_for(o), "ht": tol_for(ht)}
    for name in GRADS:
        if g_r.get(name) is None:
            assert grads.get(name) is None, f"{label}: {name} should be absent"
            continue
        assert grads[name].shape == g_r[name].shape, (label, name)
        errs[name] = rel_l2(grads[name], g_r[name])
        tols[name] = tol_for(grads[name])
    print(f"\n{label}: " + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    bad = {n: (e, tols[n]) for n, e in errs.items() if not e <= tols[n]}
    assert not bad, f"{label}: rel-L2 over tolerance {bad}"
    return errs


# ------------------------------------------------------------------ fp32 via the explicit API
def test_fp32_h0_dht_explicit_api_chunk_32():
    """chunk_gdn2_fwd and chunk_gdn2_bwd; chunk 32 (the kernels take any multiple of 16, fla's gdn2 only 64): the
    same function, so the same reference."""
    inp, do, dht = make_inputs(0, 128, 1, 32, 32, np.float32)
    o, ht = chunk_gdn2_fwd(**inp, output_final_state=True, chunk_size=32, interpret=True)
    grads = chunk_gdn2_bwd(**inp, do=do, dht=dht, chunk_size=32, interpret=True)
    o, ht = np.asarray(o), np.asarray(ht)
    grads = {n: None if x is None else np.asarray(x) for n, x in grads.items()}
    assert set(grads) == set(GRADS)
    assert o.dtype == ht.dtype == grads["dg"].dtype == grads["db"].dtype == np.float32
    check(o, ht, grads, *reference(inp, do, dht), "fp32 T128 H1 K=V=32 C32 h0 dht")


@pytest.mark.heavy  # three forward-and-backward programs, 28 s on 2 cores
def test_causality_probe_bit_exact():
    """Perturb q, k, v, g, b, w and do (and dht) at positions > t0: o and dq at <= t0 are bit-identical."""
    inp, do, dht = make_inputs(0, 128, 1, 32, 32, np.float32)
    o0, _, g0 = kernel_vjp(inp, do, dht)
    rng = np.random.default_rng(7)
    for t0 in (40, 64 + 23):
        pert = {n: x.copy() for n, x in inp.items()}
        for n in ("q", "k", "v", "g", "b", "w"):
            x = pert[n]
            noise = rng.standard_normal(x[:, t0 + 1:].shape).astype(np.float32)
            x[:, t0 + 1:] = x[:, t0 + 1:] - np.abs(noise) if n == "g" else noise
        do_p = do.copy()
        do_p[:, t0 + 1:] = rng.standard_normal(do_p[:, t0 + 1:].shape)
        o1, _, g1 = kernel_vjp(pert, do_p, dht + 1)
        assert np.array_equal(o1[:, :t0 + 1], o0[:, :t0 + 1]), t0
        assert np.array_equal(g1["dq"][:, :t0 + 1], g0["dq"][:, :t0 + 1]), t0
        assert not np.array_equal(o1[:, t0 + 1:], o0[:, t0 + 1:])


# ------------------------------------------------------------------ bf16 and the options, via jax.vjp
def test_bf16_h0_dht_l2norm_in_kernel_K128():
    inp, do, dht = make_inputs(1, 128, 2, 128, 128, ml_dtypes.bfloat16, normalise=False)
    opts = dict(use_qk_l2norm_in_kernel=True)
    o, ht, grads = kernel_vjp(inp, do, dht, **opts)
    assert o.dtype == grads["dq"].dtype == grads["db"].dtype == grads["dw"].dtype == ml_dtypes.bfloat16
    assert ht.dtype == grads["dg"].dtype == grads["dh0"].dtype == np.float32
    check(o, ht, grads, *reference(inp, do, dht, **opts), "bf16 T128 H2 K=V=128 h0 dht l2norm")


def test_fp32_gate_in_kernel_lower_bound_with_A_log_dt_bias_padded_T():
    """lower_bound * sigmoid(exp(A_log) (g + dt_bias)) with safe_gate (fla: lower_bound in [-5, 0)); T = 100 ends
    inside the second chunk (identity tokens fill it)."""
    inp, do, dht = make_inputs(2, 100, 1, 32, 32, np.float32, gate="raw")
    rng = np.random.default_rng(3)
    inp["A_log"] = rng.standard_normal(1).astype(np.float32)
    inp["dt_bias"] = rng.standard_normal(32).astype(np.float32)
    opts = dict(use_gate_in_kernel=True, lower_bound=-5.0, safe_gate=True)
    o, ht, grads = kernel_vjp(inp, do, dht, **opts)
    assert grads["dA_log"].shape == (1,) and grads["ddt_bias"].shape == (32,)
    check(o, ht, grads, *reference(inp, do, dht, **opts), "fp32 T100 gate-in-kernel lb-5 safe_gate A_log dt_bias")


@pytest.mark.heavy  # a second in-op gate form; CI runs it once, in -m heavy, not on each of its three stacks
def test_bf16_gate_in_kernel_softplus_strong_decay():
    """-exp(A_log) softplus(g + dt_bias), A_log ~ N(1, 1): per-step decays down to about -10, chunk cumsums in
    the hundreds; the factored exponents must not overflow."""
    inp, do, dht = make_inputs(4, 128, 1, 32, 32, ml_dtypes.bfloat16, gate="raw")
    rng = np.random.default_rng(5)
    inp["A_log"] = rng.standard_normal(1).astype(np.float32) + 1.0
    inp["dt_bias"] = rng.standard_normal(32).astype(np.float32)
    opts = dict(use_gate_in_kernel=True)
    o, ht, grads = kernel_vjp(inp, do, dht, **opts)
    assert all(np.isfinite(np.asarray(x, np.float64)).all() for x in (o, ht, *grads.values()))
    check(o, ht, grads, *reference(inp, do, dht, **opts), "bf16 T128 gate-in-kernel softplus")


@pytest.mark.heavy  # fp16 widened at the boundary (kda's tests hold that path by default); CI runs it once, in -m
# heavy, not on each of its three stacks
def test_fp16_chunk_16():
    """fp16 is widened to f32 before the kernels (Mosaic loads no fp16) and its dots run as the policy's bf16x4;
    chunk 16, one sub-chunk per chunk (no off-diagonal blocks)."""
    inp, do, dht = make_inputs(6, 64, 1, 32, 32, np.float16)
    o, ht, grads = kernel_vjp(inp, do, dht, chunk_size=16)
    assert o.dtype == grads["dq"].dtype == grads["db"].dtype == grads["dw"].dtype == np.float16
    check(o, ht, grads, *reference(inp, do, dht), "fp16 T64 chunk 16")


# ------------------------------------------------------------------ packed sequences, padding
def test_packed_with_an_empty_sequence_passes_its_state_through():
    """cu_seqlens (0, 37, 37, 100): a sequence ending inside a chunk, an empty one, one spanning a chunk boundary.
    The empty sequence's chunk is all identity tokens (q = k = v = 0, g = 0, b = w = 0): its ht is its h0 and its
    dh0 its dht, bit for bit."""
    cu = np.array([0, 37, 37, 100])
    inp, do, dht = make_inputs(8, 100, 1, 32, 32, np.float32, N=3)
    o, ht, grads = kernel_vjp(inp, do, dht, cu_seqlens=cu)
    np.testing.assert_array_equal(ht[1], inp["initial_state"][1])
    np.testing.assert_array_equal(grads["dh0"][1], dht[1])
    check(o, ht, grads, *reference(inp, do, dht, cu_seqlens=cu), "fp32 packed 37+0+63")


# ------------------------------------------------------------------ b = w = beta is KDA
@pytest.mark.heavy  # two kernels' programs; CI runs it once, in -m heavy, not on each of its three stacks
def test_b_and_w_equal_to_beta_is_this_projects_kda(monkeypatch):
    """b = beta on every key channel and w = beta on every value channel: the same function as kda with beta,
    computed in another order (the erase key beta*k enters the pair scores where kda scales them by beta after).

    To see the float32 rounding alone, both kernels run with f32-accurate dots: the float32 policy's precision set
    to HIGHEST and no MXU model, so XLA:CPU computes every dot in f32 (under bf16x3 the split's dropped 2**-16
    terms would differ between the two orders, ~2e-6). Bound: rel-L2 <= 2**-19, i.e. 32 f32 ulps (2**-24)
    gathered along the chain of dots, the unit-lower inverse and the state pass. dbeta is the sum of db over K
    and of dw over V (the chain rule of the broadcast)."""
    from kernels_tpu import mxu

    jax.clear_caches()  # the kernels' jitted wrappers are cached by config; the policy table is read at trace time
    monkeypatch.setitem(mxu.F32_DOT_PRECISION, "float32", mxu.Precision.HIGHEST)
    inp, do, dht = make_inputs(9, 128, 1, 32, 32, np.float32)
    beta = 1 / (1 + np.exp(-np.random.default_rng(10).standard_normal((1, 128, 1)))).astype(np.float32)
    gd = dict(inp, b=np.broadcast_to(beta[..., None], inp["b"].shape).copy(),
              w=np.broadcast_to(beta[..., None], inp["w"].shape).copy())
    kd = {n: x for n, x in inp.items() if n not in ("b", "w")}
    kd["beta"] = beta
    try:
        o, ht, g = kernel_vjp(gd, do, dht, mxu_model=False)
        o_k, ht_k, g_k = kernel_vjp(kd, do, dht, fn=chunk_kda, mxu_model=False)
    finally:
        jax.clear_caches()  # no trace under the patched policy outlives the test
    pairs = {"o": (o, o_k), "ht": (ht, ht_k),
             "dbeta": (g["db"].sum(-1) + g["dw"].sum(-1), g_k["dbeta"]),
             **{n: (g[n], g_k[n]) for n in ("dq", "dk", "dv", "dg", "dh0")}}
    errs = {n: rel_l2(a, np.asarray(b, np.float64)) for n, (a, b) in pairs.items()}
    print("\ngdn2(b=w=beta) vs kda, f32 dots: " + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    assert max(errs.values()) <= 2.0**-19, errs


# ------------------------------------------------------------------ errors
def _args(T=64, H=1, K=32, V=32, dtype=np.float32):
    z = lambda *s: np.zeros(s, dtype)  # noqa: E731
    return dict(q=z(1, T, H, K), k=z(1, T, H, K), v=z(1, T, H, V), g=z(1, T, H, K), b=z(1, T, H, K),
                w=z(1, T, H, V))


@pytest.mark.parametrize("change, exc, match", [
    (dict(v=np.zeros((1, 64, 2, 32), np.float32)), NotImplementedError, "grouped value heads are not supported"),
    (dict(b=np.zeros((1, 64, 1, 16), np.float32)), ValueError, "b must be"),
    (dict(w=np.zeros((1, 64, 1), np.float32)), ValueError, "w must be"),
    (dict(g=np.full((1, 64, 1, 32), 0.5, np.float32)), ValueError, "log decay"),
    (dict(initial_state=np.zeros((1, 1, 32, 16), np.float32)), ValueError, "initial_state"),
    (dict(interpret="yes"), ValueError, "interpret"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log"),
    (dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-7.0), ValueError, "lower_bound"),
    (dict(use_beta_sigmoid_in_kernel=True), TypeError, "use_beta_sigmoid_in_kernel"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(chunk_size=24), NotImplementedError, "chunk_size"),
])
def test_invalid_arguments(change, exc, match):
    # the module's own function, not the program conftest.py makes of it: the checks run before tracing and read
    # a concrete gate's values, which a traced g does not have
    with pytest.raises(exc, match=match):
        gdn2_chunk.chunk_gdn2(**{**_args(), **change})


def test_any_head_dim_runs_lane_padded():
    """K and V need not be multiples of 128, nor equal: padded internally. Shapes only: traced, not run."""
    args = _args(K=64, V=96)
    o, ht = jax.eval_shape(lambda a: chunk_gdn2(**a, output_final_state=True, interpret=True), args)
    assert o.shape == (1, 64, 1, 96) and ht.shape == (1, 1, 64, 96)
