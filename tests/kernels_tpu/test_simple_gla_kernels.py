"""simple_gla Pallas TPU kernels (chunk, fused_chunk) in interpret mode on CPU,
against a float64 token-by-token recurrence written here.

Tolerances are rel-L2 ``||x - ref|| / ||ref||`` per tensor:

- fp32 inputs: every dot runs as bf16x3 (the one policy, kernels_tpu.mxu), each
  product within ~2**-16 relative (measured 4e-6..1.1e-5, dg the largest);
  4 * 2**-16 (6.1e-5) leaves headroom for accumulation over T=256 without
  hiding a real bug (one wrong term is >1e-3).
- bf16 inputs: the outputs are rounded to bf16 (rel-L2 of that alone ~1.7e-3)
  and, as in fla, the decayed scores and the state are rounded to bf16 before
  their dots (measured total ~2.5e-3); 1e-2 is ~2.5 bf16 ulps (2**-8).
- fp16 inputs: widened to f32, dots as bf16x3; the fp16 output rounding dominates
  (~2.1e-4 measured); 2e-3 is ~2 fp16 ulps (2**-10).
Float32 outputs of bf16/fp16 cases (ht, dh0, dg) use the same tolerance as the
case: they are computed from bf16-rounded intermediates. dg_gamma (a sum with
cancellation) gets the tolerance times its condition number, see below.

The reference is a float64 numpy loop over tokens (no JAX compile, so the file
stays fast); its hand-written backward is checked against float64 JAX autodiff
(inside ``jax.enable_x64(True)``) in test_reference_matches_x64_autodiff.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from kernels_tpu.simple_gla import (chunk_simple_gla, chunk_simple_gla_bwd, chunk_simple_gla_fwd,
                                    fused_chunk_simple_gla, fused_chunk_simple_gla_bwd, fused_chunk_simple_gla_fwd)

DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
RTOL = {"fp32": 4 * 2.0**-16, "bf16": 1e-2, "fp16": 2e-3}
IMPLS = {
    "chunk": (chunk_simple_gla_fwd, chunk_simple_gla_bwd, chunk_simple_gla),
    "fused": (fused_chunk_simple_gla_fwd, fused_chunk_simple_gla_bwd, fused_chunk_simple_gla),
}
K = V = 128


# ------------------------------------------------------------------ reference
def reference(q, k, v, g_tok, h0, do, dht, scale):
    """Plain float64 numpy, token by token (no compile: keeps the tests fast).

    Forward:  S_t = a_t S_{t-1} + k_t v_t^T (a_t = exp(g_t)), o_t = scale S_t^T q_t.
    Backward of sum(o*do) + sum(S_T*dht), with G_t = dL/dS_t:
      G_T = dht + scale q_T do_T^T,  G_t = scale q_t do_t^T + a_{t+1} G_{t+1}
      dq_t = scale S_t do_t,  dk_t = G_t v_t,  dv_t = G_t^T k_t,
      dg_t = a_t <S_{t-1}, G_t>,  dh0 = a_1 G_1.
    (Cross-checked against float64 JAX autodiff in test_reference_matches_x64_autodiff.)
    """
    q, k, v, g_tok, h0, do, dht = (np.asarray(x, np.float64) for x in (q, k, v, g_tok, h0, do, dht))
    B, T, H, _ = q.shape
    a = np.exp(g_tok)  # [B, T, H]
    S = np.empty((T + 1,) + h0.shape)  # S[t + 1] = state after token t
    S[0] = h0
    for t in range(T):
        S[t + 1] = a[:, t, :, None, None] * S[t] + k[:, t, :, :, None] * v[:, t, :, None, :]
    o = scale * np.einsum("tbhkv,bthk->bthv", S[1:], q)
    dq, dk, dv, dg = (np.empty_like(x) for x in (q, k, v, g_tok))
    G = dht.copy()
    for t in reversed(range(T)):
        G = G + scale * q[:, t, :, :, None] * do[:, t, :, None, :]  # G_t
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", S[t + 1], do[:, t])
        dk[:, t] = np.einsum("bhkv,bhv->bhk", G, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", G, k[:, t])
        dg[:, t] = a[:, t] * np.einsum("bhkv,bhkv->bh", S[t], G)
        G = a[:, t, :, None, None] * G  # contribution to G_{t-1}
    return dict(o=o, ht=S[T], dq=dq, dk=dk, dv=dv, dg=dg, dh0=G)


def test_reference_matches_x64_autodiff():
    """The hand-written numpy backward equals float64 JAX autodiff of the same recurrence."""
    rng = np.random.default_rng(0)
    B, T, H, Kd, Vd = 2, 9, 2, 4, 3
    q, k = rng.standard_normal((2, B, T, H, Kd))
    v, do = rng.standard_normal((2, B, T, H, Vd))
    g_tok = -rng.random((B, T, H))
    h0, dht = rng.standard_normal((2, B, H, Kd, Vd))
    ref = reference(q, k, v, g_tok, h0, do, dht, 0.3)
    with jax.enable_x64(True):
        def run(q, k, v, g_tok, h0):
            def step(S, x):
                q_t, k_t, v_t, g_t = x
                S = jnp.exp(g_t)[:, :, None, None] * S + k_t[..., :, None] * v_t[..., None, :]
                return S, 0.3 * jnp.einsum("bhkv,bhk->bhv", S, q_t)

            ht, o = jax.lax.scan(step, h0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g_tok)))
            return jnp.moveaxis(o, 0, 1), ht

        (o, ht), vjp = jax.vjp(run, *(jnp.asarray(x) for x in (q, k, v, g_tok, h0)))
        grads = vjp((jnp.asarray(do), jnp.asarray(dht)))
        auto = dict(o=o, ht=ht, **dict(zip(("dq", "dk", "dv", "dg", "dh0"), grads)))
        for name, x in auto.items():
            assert x.dtype == jnp.float64
            np.testing.assert_allclose(ref[name], np.asarray(x), rtol=1e-12, atol=1e-12, err_msg=name)


def rel_l2(x, ref):
    x = np.asarray(np.asarray(x, np.float32), np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def alibi_layer0_g_gamma(H):
    """Layer-0 ALiBi log decay for H a power of two: -2**(-8(h+1)/H) * (1 + 1e-5)."""
    return (-(2.0 ** (-8.0 * (np.arange(H) + 1) / H)) * (1 + 1e-5)).astype(np.float32)


def make_inputs(seed, B, T, H, dtype, gate, with_h0, with_dht):
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    x = dict(
        q=rng.standard_normal((B, T, H, K)).astype(dt),
        k=rng.standard_normal((B, T, H, K)).astype(dt),
        v=rng.standard_normal((B, T, H, V)).astype(dt),
        do=rng.standard_normal((B, T, H, V)).astype(dt),
        h0=rng.standard_normal((B, H, K, V)).astype(np.float32) if with_h0 else None,
        dht=rng.standard_normal((B, H, K, V)).astype(np.float32) if with_dht else None,
        g=None, g_gamma=None,
    )
    if gate == "g":  # fla's test gate: logsigmoid(N(0,1)) / 16
        z = rng.standard_normal((B, T, H))
        x["g"] = ((np.minimum(z, 0) - np.log1p(np.exp(-np.abs(z)))) / 16).astype(np.float32)
        x["g_tok"] = x["g"]
    elif gate == "g_gamma":  # the steepest layer-0 ALiBi head (H=16) next to a mild one
        x["g_gamma"] = np.array([-(2.0 ** -0.5) * (1 + 1e-5), -(2.0 ** -4)], np.float32)[:H]
        x["g_tok"] = np.broadcast_to(x["g_gamma"], (B, T, H))
    else:
        x["g_tok"] = np.zeros((B, T, H), np.float32)
    return x


def expected(x, scale):
    B, T, H, _ = x["q"].shape
    h0 = x["h0"] if x["h0"] is not None else np.zeros((B, H, K, V))
    dht = x["dht"] if x["dht"] is not None else np.zeros((B, H, K, V))
    return reference(x["q"], x["k"], x["v"], x["g_tok"], h0, x["do"], dht, scale)


# ------------------------------------------------------------------ accuracy
@dataclasses.dataclass(frozen=True)
class Case:
    impl: str
    gate: str
    dtype: str
    C: int
    T: int
    h0: bool = True
    dht: bool = True
    num_steps: int = 1

    def __str__(self):
        return (f"{self.impl}-{self.gate}-{self.dtype}-C{self.C}-T{self.T}-ns{self.num_steps}"
                f"{'-h0' if self.h0 else ''}{'-dht' if self.dht else ''}")


CASES = [
    Case("chunk", "g", "fp32", 64, 256),
    Case("chunk", "g_gamma", "fp32", 128, 256),
    Case("chunk", "g", "bf16", 128, 256),
    Case("chunk", "g_gamma", "bf16", 64, 200, dht=False),  # T padded to 256 internally
    Case("chunk", "g", "fp16", 64, 128, h0=False),
    Case("fused", "g", "fp32", 64, 256, num_steps=3),  # NT=4: falls back to 2 steps
    Case("fused", "g_gamma", "bf16", 128, 256, num_steps=2),
]
B, H = 1, 2


def case_inputs(case):
    return make_inputs(zlib.crc32(str(case).encode()), B, case.T, H, case.dtype, case.gate, case.h0, case.dht)


def case_kwargs(case, x):
    kw = dict(g=x["g"], g_gamma=x["g_gamma"], initial_state=x["h0"], chunk_size=case.C, interpret=True)
    if case.impl == "fused":
        kw["num_steps"] = case.num_steps
    return kw


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_backward_match_float64_reference(case):
    x = case_inputs(case)
    fwd, bwd, _ = IMPLS[case.impl]
    kw = case_kwargs(case, x)
    o, ht = fwd(x["q"], x["k"], x["v"], output_final_state=True, **kw)
    grads = bwd(x["q"], x["k"], x["v"], x["do"], dht=x["dht"], **kw)
    ref = expected(x, K ** -0.5)

    assert o.dtype == x["q"].dtype and ht.dtype == jnp.float32
    for name in ("dq", "dk", "dv"):
        assert grads[name].dtype == x["q"].dtype, name
    got = dict(o=o, ht=ht, dq=grads["dq"], dk=grads["dk"], dv=grads["dv"])
    if case.h0:
        got["dh0"] = grads["dh0"]
        assert grads["dh0"].dtype == jnp.float32
    else:
        assert grads["dh0"] is None
    if case.gate == "g":
        got["dg"] = grads["dg"]
        assert grads["dg"].dtype == jnp.float32 and grads["dg_gamma"] is None
    elif case.gate == "g_gamma":
        assert grads["dg"] is None and grads["dg_gamma"].shape == (H,)
        got["dg_gamma"] = grads["dg_gamma"]
        ref["dg_gamma"] = ref["dg"].sum(axis=(0, 1))
    else:
        assert grads["dg"] is None and grads["dg_gamma"] is None
    tol = {n: RTOL[case.dtype] for n in got}
    if "dg_gamma" in got:
        # dg_gamma sums per-token gradients of both signs: the sum cancels (up to
        # ~26x here), so per-token errors are amplified by this condition number
        cond = np.linalg.norm(np.abs(ref["dg"]).sum(axis=(0, 1))) / np.linalg.norm(ref["dg_gamma"])
        tol["dg_gamma"] *= max(1.0, cond)
    errors = {n: rel_l2(a, ref[n]) for n, a in got.items()}
    print(case, {n: f"{e:.2e}" for n, e in errors.items()})
    bad = {n: (e, tol[n]) for n, e in errors.items() if not e <= tol[n]}
    assert not bad, f"{case}: rel-L2 (error, tolerance) too large: {bad}"


# ------------------------------------------------------------------ autodiff
# These reuse accuracy cases' configurations, so the kernels come from the jit cache.
def test_jax_vjp_through_custom_vjp_matches_explicit_backward():
    case = CASES[2]  # chunk, g, bf16, C128, h0 and dht
    x = case_inputs(case)
    fwd, bwd, fn = IMPLS[case.impl]
    kw = case_kwargs(case, x)
    del kw["g"], kw["initial_state"]

    def f(q, k, v, g, h0):
        return fn(q, k, v, g=g, initial_state=h0, output_final_state=True, **kw)

    (o, ht), vjp = jax.vjp(f, x["q"], x["k"], x["v"], x["g"], x["h0"])
    dq, dk, dv, dg, dh0 = vjp((jnp.asarray(x["do"]), jnp.asarray(x["dht"])))
    o2, ht2 = fwd(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"], output_final_state=True, **kw)
    explicit = bwd(x["q"], x["k"], x["v"], x["do"], g=x["g"], initial_state=x["h0"], dht=x["dht"], **kw)
    np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(o2, np.float32))
    np.testing.assert_array_equal(ht, ht2)
    for got, name in ((dq, "dq"), (dk, "dk"), (dv, "dv"), (dg, "dg"), (dh0, "dh0")):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(explicit[name], np.float32), name)


def test_jax_grad_wrt_g_gamma_and_initial_state():
    case = CASES[3]  # chunk, g_gamma, bf16, C64, T=200 (padded), h0, no dht, no ht
    x = case_inputs(case)
    kw = case_kwargs(case, x)
    del kw["g_gamma"], kw["initial_state"]
    q, k, v = (jnp.asarray(x[n]) for n in "qkv")

    def loss(g_gamma, h0, q):
        o, ht = chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0, **kw)
        assert ht is None
        return jnp.sum(o.astype(jnp.float32) * x["do"].astype(jnp.float32))

    dg_gamma, dh0, dq = jax.grad(loss, argnums=(0, 1, 2))(x["g_gamma"], x["h0"], q)
    ref = expected(x, K ** -0.5)
    assert dq.dtype == q.dtype
    for name, got, want in (("dg_gamma", dg_gamma, ref["dg"].sum(axis=(0, 1))), ("dh0", dh0, ref["dh0"]),
                            ("dq", dq, ref["dq"])):
        assert rel_l2(got, want) <= RTOL["bf16"], (name, rel_l2(got, want))


def test_fused_multistep_forward_equals_chunk_forward():
    # the same per-chunk maths, only num_steps chunks per grid step: bitwise equal
    case = CASES[2]  # chunk, g, bf16, C128, T256: NT=2
    x = case_inputs(case)
    kw = case_kwargs(case, x)
    o1, ht1 = chunk_simple_gla_fwd(x["q"], x["k"], x["v"], output_final_state=True, **kw)
    o2, ht2 = fused_chunk_simple_gla_fwd(x["q"], x["k"], x["v"], output_final_state=True, num_steps=2, **kw)
    np.testing.assert_array_equal(np.asarray(o1, np.float32), np.asarray(o2, np.float32))
    np.testing.assert_array_equal(ht1, ht2)


# ------------------------------------------------------------------ overflow safety
def _alibi_chunk128_inputs():
    """C=128, H=16, layer-0 ALiBi: head 0 has |gamma| * 127 = 89.8 > 88.7 (f32 exp overflow)."""
    B, T, H = 1, 128, 16
    x = make_inputs(11, B, T, H, "bf16", "none", False, False)
    x["g_gamma"] = alibi_layer0_g_gamma(H)
    x["g_tok"] = np.broadcast_to(x["g_gamma"], (B, T, H))
    assert float(-x["g_gamma"].min()) * 127 > 88.73
    return x


@pytest.mark.parametrize("impl", ["chunk", "fused"])
def test_unsafe_masked_exp_overflows_at_chunk128_alibi_layer0(impl, inject):
    """The named helper ``causal_decay`` swapped for the upstream bug (exp, then mask) gives NaN/Inf."""
    from faults import unsafe_causal_decay
    from kernels_tpu.simple_gla import chunk as chunk_module
    from kernels_tpu.simple_gla import fused_chunk as fused_module

    inject(chunk_module, "causal_decay", unsafe_causal_decay)
    inject(fused_module, "causal_decay", unsafe_causal_decay)
    x = _alibi_chunk128_inputs()
    fwd, bwd, _ = IMPLS[impl]
    kw = dict(g_gamma=x["g_gamma"], chunk_size=128, interpret=True)
    if impl == "chunk":
        o, _ = fwd(x["q"], x["k"], x["v"], **kw)
        assert not np.all(np.isfinite(np.asarray(o, np.float32))), "fault injection should give NaN/Inf in o"
    else:
        grads = bwd(x["q"], x["k"], x["v"], x["do"], **kw)
        assert not np.all(np.isfinite(np.asarray(grads["dq"], np.float32))), "fault injection should reach dq"


def test_safe_kernels_finite_and_accurate_at_chunk128_alibi_layer0():
    x = _alibi_chunk128_inputs()
    kw = dict(g_gamma=x["g_gamma"], chunk_size=128, interpret=True)
    o, ht = chunk_simple_gla_fwd(x["q"], x["k"], x["v"], output_final_state=True, **kw)
    grads = chunk_simple_gla_bwd(x["q"], x["k"], x["v"], x["do"], **kw)
    ref = expected(x, K ** -0.5)
    got = dict(o=o, ht=ht, dq=grads["dq"], dk=grads["dk"], dv=grads["dv"], dg_gamma=grads["dg_gamma"])
    ref["dg_gamma"] = ref["dg"].sum(axis=(0, 1))
    for name, a in got.items():
        assert np.all(np.isfinite(np.asarray(a, np.float32))), name
        assert rel_l2(a, ref[name]) <= RTOL["bf16"], (name, rel_l2(a, ref[name]))


# ------------------------------------------------------------------ validation
def _spec(*shape, dtype=jnp.bfloat16):
    # shapes only: validation must reject before touching (tracing) any array
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("fn", [chunk_simple_gla, chunk_simple_gla_fwd, fused_chunk_simple_gla,
                                fused_chunk_simple_gla_fwd])
def test_any_head_dim_runs_lane_padded(fn):
    """K and V need not be multiples of 128: padded internally (kernels_tpu.common.HeadPadding; exactness in
    test_head_dims_and_varlen.py). Shapes only: traced, not run."""
    for Kd, Vd in ((64, 128), (128, 96), (192, 64)):
        q, v, h0 = _spec(1, 128, 2, Kd), _spec(1, 128, 2, Vd), _spec(1, 2, Kd, Vd, dtype=jnp.float32)
        gamma = np.full((2,), -0.1, np.float32)  # numpy: its sign is checked without tracing
        o, ht = jax.eval_shape(lambda q, v, h0: fn(q, q, v, g_gamma=gamma, initial_state=h0, output_final_state=True,
                                                   interpret=True), q, v, h0)
        assert (o.shape, o.dtype, ht.shape) == ((1, 128, 2, Vd), jnp.bfloat16, (1, 2, Kd, Vd))


def test_backward_validates_too():
    q = _spec(1, 128, 2, 64)
    grads = jax.eval_shape(lambda q, v: chunk_simple_gla_bwd(q, q, v, v, interpret=True), q, _spec(1, 128, 2, 96))
    assert grads["dq"].shape == (1, 128, 2, 64) and grads["dv"].shape == (1, 128, 2, 96)
    with pytest.raises(ValueError, match="do must be"):
        fused_chunk_simple_gla_bwd(_spec(1, 128, 2, 128), _spec(1, 128, 2, 128), _spec(1, 128, 2, 128),
                                   _spec(1, 64, 2, 128), interpret=True)


def test_invalid_inputs_raise_value_error():
    q = _spec(1, 128, 2, 128)
    g = _spec(1, 128, 2, dtype=jnp.float32)
    gg = _spec(2, dtype=jnp.float32)
    with pytest.raises(NotImplementedError, match="not both at once"):  # valid (the contract's), not run here
        chunk_simple_gla(q, q, q, g=g, g_gamma=gg, interpret=True)
    with pytest.raises(NotImplementedError, match=r"g_gamma per head, \[H\]"):
        chunk_simple_gla(q, q, q, g_gamma=_spec(dtype=jnp.float32), interpret=True)
    with pytest.raises(ValueError, match=r"g_gamma must be \[\] or \[H\]"):
        chunk_simple_gla(q, q, q, g_gamma=_spec(2, 128, dtype=jnp.float32), interpret=True)
    with pytest.raises(ValueError, match="g must be"):
        chunk_simple_gla(q, q, q, g=_spec(1, 128, 3, dtype=jnp.float32), interpret=True)
    with pytest.raises(ValueError, match="initial_state"):
        chunk_simple_gla(q, q, q, initial_state=_spec(1, 2, 128, 64, dtype=jnp.float32), interpret=True)
    with pytest.raises(ValueError, match="share one floating dtype"):
        chunk_simple_gla(q, _spec(1, 128, 2, 128, dtype=jnp.float32), q, interpret=True)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_simple_gla(q, q, q, chunk_size=0, interpret=True)
    with pytest.raises(NotImplementedError, match="chunk_size=40"):
        chunk_simple_gla(q, q, q, chunk_size=40, interpret=True)
    with pytest.raises(ValueError, match="num_steps"):
        fused_chunk_simple_gla(q, q, q, num_steps=0, interpret=True)
