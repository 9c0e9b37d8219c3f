"""The fused-recurrent (decode) kernels, kernels_tpu.kda.recurrent and gdn's and gdn2's use of it, in interpret mode.

- against the float64 reference, fp32 and bf16 (tolerances: 2^-20 for a float32 state after 64 tokens of
  once-rounded updates, measured 1e-7; a bf16 o is rounded once to 8 bits on output);
- no more rounding than fla's arithmetic: a float32 numpy model of fla's ``fused_recurrent`` kernel (the decay
  a multiply, the write one fused multiply-add, the sums of rounded products) on the same inputs, error for error,
  over 64 tokens and over one (where the kernel's one rounding per token is all that separates them);
- packed sequences, empty ones among them, equal separate runs bit for bit, and an empty sequence's ht is its h0;
- gdn's fused-recurrent entry is kda's kernel with the scalar gate broadcast over K, bit for bit;
- gdn2's (its erase key ``b * k`` and write gate ``w``): against its float64 reference and a numpy model of fla's
  ``fused_recurrent_gdn2`` arithmetic, with grouped value heads; packed with empty sequences; with b = w = beta it
  is kda's kernel to float32 rounding (the two round ``beta (v - S^T k)`` and ``beta v - S^T (beta k)``).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax.numpy as jnp

from kernels_tpu.gdn import fused_recurrent_gated_delta_rule
from kernels_tpu.gdn2 import fused_recurrent_gdn2
from kernels_tpu.kda import fused_recurrent_kda
from references import kda as ref
from references.gdn2 import chunk_gdn2

K, V = 128, 64
STATE_TOL = 2.0 ** -20


def rel_l2(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def inputs(seed, T, H, dtype, N=1):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (n(1, T, H, K), n(1, T, H, K)))
    return dict(q=q.astype(dtype), k=k.astype(dtype), v=n(1, T, H, V).astype(dtype),
                g=(-np.logaddexp(0.0, -n(1, T, H, K)) / 16).astype(np.float32),
                beta=(1 / (1 + np.exp(-n(1, T, H)))).astype(np.float32),
                initial_state=n(N, H, K, V).astype(np.float32))


def fla_arithmetic(q, k, v, g, beta, initial_state, scale):
    """float32 numpy, token by token, rounding where fla's compiled kernel rounds: ``h *= exp(g)``, the sums of
    rounded products, and the write ``h += k * dlt`` as one fused multiply-add (the exact product and sum in
    float64, rounded once to float32)."""
    f32 = np.float32
    h = initial_state[0].astype(f32).copy()  # [H, K, V]
    o = np.zeros(v.shape, f32)
    for t in range(q.shape[1]):
        for i in range(q.shape[2]):
            kt, qt = k[0, t, i].astype(f32), (q[0, t, i].astype(f32) * f32(scale)).astype(f32)
            h[i] = h[i] * np.exp(g[0, t, i])[:, None]
            u = np.sum(h[i] * kt[:, None], axis=0, dtype=f32)
            dlt = f32(beta[0, t, i]) * (v[0, t, i].astype(f32) - u)
            h[i] = (kt[:, None].astype(np.float64) * dlt[None, :] + h[i]).astype(f32)
            o[0, t, i] = np.sum(h[i] * qt[:, None], axis=0, dtype=f32)
    return o, h[None]


@pytest.mark.parametrize("dtype, T", [(np.float32, 64), (jnp.bfloat16, 64), (np.float32, 1)])
def test_against_reference_and_fla_arithmetic(dtype, T):
    """T = 1: a state one update from its h0, where fla rounds each element twice (decay, write) and the kernel
    once."""
    x = inputs(0, T, 2, dtype)
    scale = K ** -0.5
    o_r, ht_r = ref.chunk_kda(**x, output_final_state=True)
    o, ht = fused_recurrent_kda(**x, output_final_state=True, interpret=True)
    assert o.dtype == x["q"].dtype and ht.dtype == jnp.float32
    o_fla, ht_fla = fla_arithmetic(**x, scale=scale)
    errs = {"o": rel_l2(o, o_r), "ht": rel_l2(ht, ht_r)}
    fla_errs = {"o": rel_l2(o_fla.astype(x["q"].dtype), o_r), "ht": rel_l2(ht_fla, ht_r)}
    print(f"\nkernel {errs}\nfla's arithmetic {fla_errs}")
    assert errs["ht"] <= STATE_TOL
    assert errs["o"] <= (STATE_TOL if dtype == np.float32 else 2.0 ** -8)
    assert errs["ht"] <= fla_errs["ht"]  # the write rounds once, and the sums' products are exact
    if dtype == np.float32:
        assert errs["o"] <= fla_errs["o"]


def test_packed_equals_separate_runs_and_empty_sequences_keep_h0():
    lens = (1, 0, 7, 0, 9)  # an empty sequence first-after-one, between, and two in all
    cu = tuple(int(c) for c in np.cumsum((0,) + lens))
    x = inputs(1, cu[-1], 2, jnp.bfloat16, N=len(lens))
    o, ht = fused_recurrent_kda(**x, output_final_state=True, interpret=True, cu_seqlens=cu)
    for i, n in enumerate(lens):
        ht_i = np.asarray(ht[i])
        if n == 0:
            np.testing.assert_array_equal(ht_i, x["initial_state"][i])
            continue
        one = {name: a[:, cu[i]:cu[i + 1]] for name, a in x.items() if name != "initial_state"}
        o_i, ht_one = fused_recurrent_kda(**one, initial_state=x["initial_state"][i:i + 1], output_final_state=True,
                                          interpret=True)
        np.testing.assert_array_equal(np.asarray(o[:, cu[i]:cu[i + 1]]), np.asarray(o_i))
        np.testing.assert_array_equal(ht_i, np.asarray(ht_one[0]))


def test_gdn_is_kda_with_the_gate_broadcast():
    x = inputs(2, 12, 2, np.float32)
    gate = x.pop("g")[..., 0]  # [1, T, H]: one log decay per token and head
    o, ht = fused_recurrent_gated_delta_rule(**x, g=gate, output_final_state=True, interpret=True)
    o_k, ht_k = fused_recurrent_kda(**x, g=np.broadcast_to(gate[..., None], gate.shape + (K,)),
                                    output_final_state=True, interpret=True)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_k))
    np.testing.assert_array_equal(np.asarray(ht), np.asarray(ht_k))


# ------------------------------------------------------------------ gdn2: the erase key b * k, the write gate w
def gdn2_inputs(seed, T, H, HV, dtype, N=1):
    """kda's inputs with ``HV`` value heads, beta replaced by the erase gate b [1,T,HV,K] and the write gate w
    [1,T,HV,V], both sigmoid(N(0,1)) (b doubled on odd value heads: the [0, 2] range of negative eigenvalues)."""
    rng = np.random.default_rng(seed)
    x = inputs(seed, T, H, dtype, N)
    del x["beta"]
    sig = lambda *s: 1 / (1 + np.exp(-rng.standard_normal(s)))  # noqa: E731
    b = sig(1, T, HV, K) * np.where(np.arange(HV) % 2, 2.0, 1.0)[:, None]
    return dict(x, v=rng.standard_normal((1, T, HV, V)).astype(dtype),
                g=(-np.logaddexp(0.0, -rng.standard_normal((1, T, HV, K))) / 16).astype(np.float32),
                b=b.astype(dtype), w=sig(1, T, HV, V).astype(dtype),
                initial_state=rng.standard_normal((N, HV, K, V)).astype(np.float32))


def fla_gdn2_arithmetic(q, k, v, g, b, w, initial_state, scale):
    """float32 numpy of fla's ``fused_recurrent_gdn2`` per token: ``h *= exp(g)``, ``bk = b * k`` and ``w * v``
    rounded, the erase ``sum(h * bk)`` of rounded products, the write one fused multiply-add (float64, rounded
    once), value head j reading q/k head j // (HV // H)."""
    f32 = np.float32
    H, HV = q.shape[2], v.shape[2]
    h = initial_state[0].astype(f32).copy()  # [HV, K, V]
    o = np.zeros(v.shape, f32)
    for t in range(q.shape[1]):
        for j in range(HV):
            i = j // (HV // H)
            kt, qt = k[0, t, i].astype(f32), (q[0, t, i].astype(f32) * f32(scale)).astype(f32)
            h[j] = h[j] * np.exp(g[0, t, j])[:, None]
            erase = np.sum(h[j] * (b[0, t, j].astype(f32) * kt)[:, None], axis=0, dtype=f32)
            dlt = w[0, t, j].astype(f32) * v[0, t, j].astype(f32) - erase
            h[j] = (kt[:, None].astype(np.float64) * dlt[None, :] + h[j]).astype(f32)
            o[0, t, j] = np.sum(h[j] * qt[:, None], axis=0, dtype=f32)
    return o, h[None]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_gdn2_against_reference_and_fla_arithmetic(dtype):
    x = gdn2_inputs(3, 48, 1, 2, dtype)
    o_r, ht_r = chunk_gdn2(*(np.repeat(x[n], 2, axis=2) for n in ("q", "k")), x["v"], x["g"], x["b"], x["w"],
                           initial_state=x["initial_state"], output_final_state=True)
    o, ht = fused_recurrent_gdn2(**x, output_final_state=True, interpret=True)
    assert o.dtype == x["q"].dtype and ht.dtype == jnp.float32
    o_fla, ht_fla = fla_gdn2_arithmetic(**x, scale=K ** -0.5)
    errs = {"o": rel_l2(o, o_r), "ht": rel_l2(ht, ht_r)}
    fla_errs = {"o": rel_l2(o_fla.astype(x["q"].dtype), o_r), "ht": rel_l2(ht_fla, ht_r)}
    print(f"\ngdn2 kernel {errs}\nfla's arithmetic {fla_errs}")
    assert errs["ht"] <= STATE_TOL
    assert errs["o"] <= (STATE_TOL if dtype == np.float32 else 2.0 ** -8)
    assert errs["ht"] <= fla_errs["ht"]


def test_gdn2_packed_equals_separate_runs_and_empty_sequences_keep_h0():
    lens = (0, 5, 0, 3)
    cu = tuple(int(c) for c in np.cumsum((0,) + lens))
    x = gdn2_inputs(4, cu[-1], 1, 2, np.float32, N=len(lens))
    o, ht = fused_recurrent_gdn2(**x, output_final_state=True, interpret=True, cu_seqlens=cu)
    for i, n in enumerate(lens):
        if n == 0:
            np.testing.assert_array_equal(np.asarray(ht[i]), x["initial_state"][i])
            continue
        one = {name: a[:, cu[i]:cu[i + 1]] for name, a in x.items() if name != "initial_state"}
        o_i, ht_one = fused_recurrent_gdn2(**one, initial_state=x["initial_state"][i:i + 1], output_final_state=True,
                                           interpret=True)
        np.testing.assert_array_equal(np.asarray(o[:, cu[i]:cu[i + 1]]), np.asarray(o_i))
        np.testing.assert_array_equal(np.asarray(ht[i]), np.asarray(ht_one[0]))


def test_gdn2_with_b_and_w_beta_is_kda():
    x = inputs(5, 16, 2, np.float32)
    beta = x["beta"]
    gates = dict(b=np.broadcast_to(beta[..., None], beta.shape + (K,)), w=np.broadcast_to(beta[..., None],
                                                                                        beta.shape + (V,)))
    o, ht = fused_recurrent_gdn2(**{n: a for n, a in x.items() if n != "beta"}, **gates, output_final_state=True,
                                 interpret=True)
    o_k, ht_k = fused_recurrent_kda(**x, output_final_state=True, interpret=True)
    assert rel_l2(o, o_k) <= STATE_TOL and rel_l2(ht, ht_k) <= STATE_TOL
