"""simple_gla's and gla's fused-recurrent (decode) kernels, kernels_tpu.gated_recurrent, in interpret mode.

- forward and gradients (through ``jax.vjp``, as the TPU leg takes them) against the float64 references, on packed
  sequences with an empty one, h0 and dht, in bf16, fp16 and fp32, under every gate form (g; g_gamma [], [H],
  [H,K]; both at once);
- an empty sequence's state passes through bit for bit: ht = h0 and dh0 = dht;
- the state rounds once per token: one token from h0 gives the correctly rounded ``exp(g) h0 + k v^T`` (computed
  exactly with fractions), where a separate multiply and add would not.
"""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_tpu.gated_recurrent import fused_recurrent_gla, fused_recurrent_simple_gla
from like_the_leg import leg_jit
from references import gla as ref_gla
from references import simple_gla as ref_simple_gla

K, V, H = 32, 16, 2
LENS = (5, 0, 11)
CU = (0, 5, 5, 16)


def rel_l2(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def inputs(seed, dtype, op, gates):
    rng = np.random.default_rng(seed)
    T, N = sum(LENS), len(LENS)
    n = lambda *s: rng.standard_normal(s)
    x = dict(q=n(1, T, H, K).astype(dtype), k=n(1, T, H, K).astype(dtype), v=n(1, T, H, V).astype(dtype),
             initial_state=n(N, H, K, V).astype(np.float32))
    g_shape = (1, T, H, K) if op == "gla" else (1, T, H)
    if "g" in gates:
        x["g"] = (-np.logaddexp(0.0, -n(*g_shape)) / 4).astype(np.float32)
    gamma = {"g_gamma[]": (), "g_gamma[H]": (H,), "g_gamma[H,K]": (H, K)}
    for form, shape in gamma.items():
        if form in gates:
            x["g_gamma"] = (-np.abs(n(*shape)) / 4).astype(np.float32)
    return x, n(1, T, H, V).astype(dtype), n(N, H, K, V).astype(np.float32)


def run(fn, x, do, dht):
    """o, ht and the gradients of every input, through jax.vjp of the public function (one leg program)."""
    names = list(x)

    @leg_jit
    def program(args, do, dht):
        f = lambda *a: fn(**dict(zip(names, a)), output_final_state=True, interpret=True, cu_seqlens=CU)
        (o, ht), vjp = jax.vjp(f, *args)
        return o, ht, dict(zip(names, vjp((do, dht))))

    return program(tuple(jnp.asarray(x[n]) for n in names), jnp.asarray(do), jnp.asarray(dht))


CASES = [("simple_gla", np.float32, ("g",)), ("simple_gla", jnp.bfloat16, ("g", "g_gamma[H]")),
         ("simple_gla", np.float16, ("g_gamma[]",)), ("gla", np.float32, ("g", "g_gamma[H,K]")),
         ("gla", jnp.bfloat16, ("g",)), ("gla", np.float16, ("g_gamma[H,K]",)), ("gla", np.float32, ("g_gamma[H]",))]
GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg_gamma", "initial_state": "dh0"}


@pytest.mark.parametrize("op, dtype, gates", CASES, ids=lambda p: getattr(p, "__name__", str(p)))
def test_against_the_float64_reference_with_an_empty_sequence(op, dtype, gates):
    x, do, dht = inputs(0, dtype, op, gates)
    fn, ref = ((fused_recurrent_gla, ref_gla.chunk_gla) if op == "gla"
               else (fused_recurrent_simple_gla, ref_simple_gla.chunk_simple_gla))
    ref_bwd = ref_gla.chunk_gla_bwd if op == "gla" else ref_simple_gla.chunk_simple_gla_bwd
    o, ht, grads = run(fn, x, do, dht)
    gates_in = {n: x[n] for n in ("g", "g_gamma") if n in x}
    common = dict(initial_state=x["initial_state"], cu_seqlens=CU, chunk_size=16)
    o_r, ht_r = ref(x["q"], x["k"], x["v"], **gates_in, output_final_state=True, **common)
    g_r = ref_bwd(x["q"], x["k"], x["v"], do, dht, **gates_in, **common)
    assert o.dtype == x["q"].dtype and ht.dtype == jnp.float32
    # an empty sequence (sequence 1) passes its state through bit for bit, both ways
    np.testing.assert_array_equal(np.asarray(ht)[1], x["initial_state"][1])
    np.testing.assert_array_equal(np.asarray(grads["initial_state"])[1], dht[1])
    # float32 state: a few ulp after 11 once-rounded updates; an output in the input dtype: one rounding to it
    out_tol = {np.float32: 2.0 ** -20, jnp.bfloat16: 2.0 ** -8, np.float16: 2.0 ** -11}[dtype]
    errs = {"o": rel_l2(o, o_r), "ht": rel_l2(ht, ht_r)}
    errs.update({GRAD_NAMES[n]: rel_l2(grads[n], g_r[GRAD_NAMES[n]]) for n in x})
    print(f"\n{op} {np.dtype(dtype).name} {gates}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    for name, err in errs.items():
        in_dtype = name in ("o", "dq", "dk", "dv")
        # dg_gamma sums every token's (and channel's) term in float32: its terms cancel
        tol = out_tol if in_dtype else (2.0 ** -16 if name == "dg_gamma" else 2.0 ** -20)
        assert err <= tol, (name, err, tol)
    for n in x:
        assert grads[n].shape == x[n].shape and grads[n].dtype == x[n].dtype


def round_f32(e: Fraction) -> np.float32:
    """The float32 nearest the exact ``e`` (of the candidates around its float64 rounding; ties not expected)."""
    f = np.float32(float(e))
    candidates = (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
    return min(candidates, key=lambda c: abs(Fraction(float(c)) - e))


def test_one_token_rounds_the_state_once():
    """h0 plus one token: ``exp(g) h0 + k v^T`` correctly rounded to float32 (exact value by fractions), with
    ``exp(g)`` the float32 the kernel takes; plain multiplies and an add (three roundings) miss it on some elements."""
    rng = np.random.default_rng(3)
    Kd, Vd = 16, 16
    q, k = (rng.standard_normal((1, 1, 1, Kd)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((1, 1, 1, Vd)).astype(np.float32)
    g = (-np.abs(rng.standard_normal((1, 1, 1, Kd))) / 4).astype(np.float32)
    h0 = rng.standard_normal((1, 1, Kd, Vd)).astype(np.float32)
    _, ht = leg_jit(lambda *a: fused_recurrent_gla(*a[:3], g=a[3], initial_state=a[4], output_final_state=True,
                                                   interpret=True))(q, k, v, g, h0)
    decay = np.asarray(leg_jit(jnp.exp)(g))[0, 0, 0]
    ht = np.asarray(ht)[0, 0]
    exact = [[Fraction(float(decay[i])) * Fraction(float(h0[0, 0, i, j]))
              + Fraction(float(k[0, 0, 0, i])) * Fraction(float(v[0, 0, 0, j])) for j in range(Vd)] for i in range(Kd)]
    once = np.array([[round_f32(e) for e in row] for row in exact], np.float32)
    np.testing.assert_array_equal(ht, once)
    products = k[0, 0, 0][:, None] * v[0, 0, 0][None, :]
    separate = (decay[:, None] * h0[0, 0]) + products  # three float32 roundings, as a plain multiply and add
    assert (separate != once).any()  # the check can tell one rounding from several


def fla_arithmetic(q, k, v, g, h0, scale):
    """float32 numpy, token by token, rounding where fla's compiled ``fused_recurrent_gla`` rounds: ``h *= exp(g)``,
    the write ``h += k v^T`` as one fused multiply-add (exact product and sum in float64, rounded once), o the sum
    of rounded products."""
    f32 = np.float32
    h = h0[0].astype(f32).copy()  # [H, K, V]
    o = np.zeros(v.shape, f32)
    for t in range(q.shape[1]):
        for i in range(q.shape[2]):
            kt, qt = k[0, t, i].astype(f32), (q[0, t, i].astype(f32) * f32(scale)).astype(f32)
            h[i] = h[i] * np.exp(g[0, t, i])[:, None]
            h[i] = (kt[:, None].astype(np.float64) * v[0, t, i].astype(np.float64)[None, :] + h[i]).astype(f32)
            o[0, t, i] = np.sum(h[i] * qt[:, None], axis=0, dtype=f32)
    return o, h[None]


@pytest.mark.parametrize("T", [64, 1])
def test_no_more_rounding_than_fla_arithmetic(T):
    """fp32, against the float64 reference: the kernel's ht error is at most that of fla's arithmetic on the same
    inputs (T = 1: a state one update from h0, where fla rounds each element twice and the kernel once)."""
    rng = np.random.default_rng(7)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)
    q, k, v, h0 = n(1, T, H, K), n(1, T, H, K), n(1, T, H, V), n(1, H, K, V)
    g = (-np.logaddexp(0.0, -n(1, T, H, K)) / 16).astype(np.float32)
    o, ht = leg_jit(lambda *a: fused_recurrent_gla(*a[:3], g=a[3], initial_state=a[4], output_final_state=True,
                                                   interpret=True))(q, k, v, g, h0)
    o_r, ht_r = ref_gla.chunk_gla(q, k, v, g=g, initial_state=h0, output_final_state=True, chunk_size=16)
    o_f, ht_f = fla_arithmetic(q, k, v, g, h0, K ** -0.5)
    errs, fla_errs = (rel_l2(ht, ht_r), rel_l2(o, o_r)), (rel_l2(ht_f, ht_r), rel_l2(o_f, o_r))
    print(f"\nT={T} kernel ht, o {errs}; fla's arithmetic {fla_errs}")
    assert errs[0] <= fla_errs[0]
    assert errs[1] <= fla_errs[1]  # o: one sum over K in each, of exact products in the kernel
