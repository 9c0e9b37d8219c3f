"""The short causal convolution (``conv1d=W``): the float64 reference against computations written here
independently (explicit loops, an explicit Jacobian), the op composed with it, the TPU kernels' float32 twin,
and the case rules."""

from __future__ import annotations

import numpy as np
import pytest

from cases.case import Case, Gate
from references.conv1d import causal_conv1d, causal_conv1d_bwd

W, D = 4, 5
LENS = (2, 6, 3)  # the first shorter than W-1: its final state keeps an input of its initial state


def _silu(z):
    return z / (1 + np.exp(-z))


def _loops(x, w, b, h0, offs, act=True):
    """y[t, d] = silu(b[d] + sum_j w[d, j] x[t-(W-1)+j, d]), element by element, x before a sequence's start
    read from its state; and each sequence's final state (its last W-1 inputs, the state in front)."""
    y = np.zeros_like(x)
    ht = np.zeros_like(h0)
    for i, (bos, eos) in enumerate(zip(offs[:-1], offs[1:])):
        hist = [h0[i, :, c] for c in range(W - 1)] + [x[0, t] for t in range(bos, eos)]
        for t in range(eos - bos):
            for d in range(x.shape[2]):
                z = b[d] + sum(w[d, j] * hist[t + j][d] for j in range(W))
                y[0, bos + t, d] = _silu(z) if act else z
        for c in range(W - 1):
            ht[i, :, c] = hist[len(hist) - (W - 1) + c]
    return y, ht


@pytest.fixture
def draw():
    rng = np.random.default_rng(7)
    T = sum(LENS)
    return (rng.standard_normal((1, T, D)), rng.standard_normal((D, W)) / 2, rng.standard_normal(D),
            rng.standard_normal((len(LENS), D, W - 1)), np.concatenate([[0], np.cumsum(LENS)]))


def test_forward_matches_explicit_loops(draw):
    x, w, b, h0, offs = draw
    y, ht = causal_conv1d(x, w, b, h0, output_final_state=True, activation="silu", cu_seqlens=offs)
    y_loop, ht_loop = _loops(x, w, b, h0, offs)
    assert y.dtype == ht.dtype == np.float64
    np.testing.assert_allclose(y, y_loop, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(ht, ht_loop)  # copies of inputs: exact
    # the first sequence (2 tokens) keeps the last entry of its initial state as the oldest input
    np.testing.assert_array_equal(ht[0, :, 0], h0[0, :, 2])


def test_no_state_reads_zeros_and_identity_activation(draw):
    x, w, b, _, offs = draw
    y, _ = causal_conv1d(x, w, b, None, activation=None, cu_seqlens=offs)
    y_loop, _ = _loops(x, w, b, np.zeros((len(LENS), D, W - 1)), offs, act=False)
    np.testing.assert_allclose(y, y_loop, rtol=1e-13, atol=1e-14)


def test_gradients_match_the_explicit_jacobian(draw):
    """The pre-activation is linear in (x, h0, w, b) jointly per argument: its Jacobian, assembled column by
    column from the explicit loops, times silu'(z) * dy, is each gradient; dht adds to the inputs it copies."""
    x, w, b, h0, offs = draw
    rng = np.random.default_rng(8)
    dy, dht = rng.standard_normal(x.shape), rng.standard_normal(h0.shape)
    got = causal_conv1d_bwd(x, w, b, dy, dht, initial_state=h0, activation="silu", cu_seqlens=offs)
    z, ht = _loops(x, w, b, h0, offs, act=False)
    s = 1 / (1 + np.exp(-z))
    gz = dy * (s * (1 + z * (1 - s)))  # d silu(z) / dz = s (1 + z (1 - s))
    args = {"x": x, "weight": w, "bias": b, "h0": h0}

    def linear(name):  # the map from one argument to (z, ht), the others fixed
        def f(a):
            kw = {**args, name: a}
            return _loops(kw["x"], kw["weight"], kw["bias"], kw["h0"], offs, act=False)
        return f

    for name, a in args.items():
        f = linear(name)
        z0, ht0 = f(np.zeros_like(a))
        grad = np.zeros(a.size)
        for i in range(a.size):
            e = np.zeros(a.size)
            e[i] = 1
            zi, hti = f(e.reshape(a.shape))
            grad[i] = np.sum((zi - z0) * gz) + np.sum((hti - ht0) * dht)
        np.testing.assert_allclose(got["d" + ("x" if name == "x" else name)], grad.reshape(a.shape), rtol=1e-12,
                                   atol=1e-12, err_msg=name)
    del ht


def test_gdn_behind_the_convolution_matches_loops_then_the_recurrence():
    """The op's reference binding with conv1d: the convolved q, k, v (explicit loops here) fed to the
    token-by-token recurrence (the reference's other formulation) give the same o and ht."""
    from harness.ops import get_op
    from references.gdn import chunk_gdn
    from cases.inputs import make_inputs

    case = Case("gdn", "chunk", B=1, T=sum(LENS) + 60, H=1, HV=2, K=16, V=16, dtype="bfloat16", gate=Gate("g"),
                chunk_size=16, h0=True, lens=LENS + (60,),
                options=(("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True),
                         ("conv1d", W), ("conv1d_bias", True)))
    op = get_op("gdn")
    op.validate(case)
    x = {n: a.astype(np.float64) for n, a in make_inputs(case, op.inputs(case)).arrays.items()}
    got = op.reference(case, x)
    qkv = np.concatenate([x[n].reshape(1, case.T, -1) for n in "qkv"], -1)
    y, ht = _loops(qkv, x["conv_weight"].astype(np.float64), x["conv_bias"], x["conv_h0"], case.cu_seqlens)
    hk = case.H * case.K
    q, k = y[..., :hk].reshape(1, case.T, 1, 16), y[..., hk:2 * hk].reshape(1, case.T, 1, 16)
    v = y[..., 2 * hk:].reshape(1, case.T, 2, 16)
    o, S = chunk_gdn(q, k, v, x["g"], x["beta"], case.resolved_scale, x["h0"], True, cu_seqlens=case.cu_seqlens,
                     method="recurrent", use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    np.testing.assert_allclose(got["o"], o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["ht"], S, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got["conv_ht"], ht)
    assert {"dconv_weight", "dconv_bias", "dconv_h0"} <= set(got)


def test_tpu_kernels_twin_is_float32_of_the_same_law(draw):
    import jax.numpy as jnp

    from kernels_tpu.conv1d import causal_conv1d as tpu_conv

    x, w, b, h0 = (a.astype(np.float32) for a in draw[:4])
    offs = tuple(int(c) for c in draw[4])
    y, ht = tpu_conv(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), jnp.asarray(h0), "silu", cu_seqlens=offs)
    y64, ht64 = causal_conv1d(x, w, b, h0, output_final_state=True, activation="silu", cu_seqlens=offs)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), y64, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(ht), ht64)


@pytest.mark.parametrize("options, match", [
    ((("conv1d", 4),), "use_qk_l2norm_in_kernel=1"),
    ((("use_qk_l2norm_in_kernel", True), ("conv1d", 1)), "integer in"),
    ((("use_qk_l2norm_in_kernel", True), ("conv1d", True)), "integer in"),
    ((("use_qk_l2norm_in_kernel", True), ("conv1d_bias", True)), "needs conv1d"),
])
def test_case_rules(options, match):
    from harness.ops import get_op

    for op in ("gdn", "kda"):
        case = Case(op, "chunk", B=1, T=8, H=1, K=16, V=16, gate=Gate("g"), chunk_size=64, options=options)
        with pytest.raises(ValueError, match=match):
            get_op(op).validate(case)


def test_reference_refuses_misshapen_state(draw):
    x, w, b, h0, offs = draw
    with pytest.raises(ValueError, match=r"initial_state must be \[N, D, W-1\]"):
        causal_conv1d(x, w, b, h0[:, :, :2], cu_seqlens=offs)
