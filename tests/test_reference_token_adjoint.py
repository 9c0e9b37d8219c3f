"""The recurrent check's hand-written backward (references._rank_one: the rank-one update's adjoint, tokens in
reverse, states recomputed by chunks and segments, the decays' gradients from the recurrence's scaling symmetry)
against jax.vjp of the plain token scan, on tiny random float64 cases: per-channel decay (kda, gdn2) and one decay
per head (gdn). Gradients within 1e-13 relative, the forward bit for bit. Then each rule's map to (a, m, c) and a
wrong adjoint, injected from here, caught."""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import references._rank_one as rank_one  # noqa: E402
from references import kda  # noqa: E402
from references.gdn2 import GDN2  # noqa: E402
from references._x64 import float64_cpu  # noqa: E402

B, H, K, V = 1, 2, 3, 4
SCALE = 0.6


def _tokens(rng, T, gate_width):
    """q, a, m [B,T,H,K], c [B,T,H,V], g [B,T,H,gate_width] (log decays <= 0), random."""
    n = lambda *s: jnp.asarray(rng.standard_normal((B, T, H, *s)))  # noqa: E731
    return n(K), n(K), n(K), n(V), jnp.asarray(-rng.uniform(0.0, 0.5, (B, T, H, gate_width)))


def _plain(S0, q, a, m, c, g):
    """The recurrence as one lax.scan of the forward's own token step, differentiated by jax."""
    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, a, m, c, g))
    S_T, o = lax.scan(functools.partial(rank_one._token, SCALE), S0, xs)
    return jnp.moveaxis(o, 0, 1), S_T


def _both(T, gate_width, every, seed=7):
    """(plain outputs, plain gradients, hand outputs, hand gradients) at random cotangents."""
    rng = np.random.default_rng(seed)
    with float64_cpu(True):
        tokens = _tokens(rng, T, gate_width)
        S0 = jnp.asarray(rng.standard_normal((B, H, K, V)))
        cts = (jnp.asarray(rng.standard_normal((B, T, H, V))), jnp.asarray(rng.standard_normal((B, H, K, V))))
        out_ref, vjp_ref = jax.vjp(_plain, S0, *tokens)
        hand = lambda S0, *xs: rank_one.token_recurrence(SCALE, S0, *xs, every=every)  # noqa: E731
        out, vjp = jax.vjp(hand, S0, *tokens)
        return [[np.asarray(x) for x in jax.tree_util.tree_leaves(t)] for t in (out_ref, vjp_ref(cts), out, vjp(cts))]


@pytest.mark.parametrize("gate_width", [K, 1], ids=["per-channel", "per-head"])
@pytest.mark.parametrize("T,every", [(5, 8), (5, 2), (37, 16), (40, 40)],
                         ids=["one-chunk", "padded", "segments", "segments-of-10"])
def test_hand_adjoint_is_the_vjp_of_the_scan(gate_width, T, every):
    """Chunks of 8 (T=5 in one padded chunk), 2 (three chunks of two tokens, the last padded), 16 (37 tokens: three chunks, the
    last padded, segments of 16) and 40 (segments of 10: the longest divisor of 40 up to SEGMENT)."""
    out_ref, grads_ref, out, grads = _both(T, gate_width, every)
    for a, b in zip(out_ref, out):
        assert np.array_equal(a, b)
    assert len(grads_ref) == len(grads) == 6
    for a, b in zip(grads_ref, grads):
        assert a.shape == b.shape and np.abs(a).max() > 0
        assert np.abs(b - a).max() <= 1e-13 * np.abs(a).max(), np.abs(b - a).max() / np.abs(a).max()


def test_rank_one_maps():
    """kda (and gdn): a = beta k, m = k, c = v; gdn2: a = k, m = b * k, c = w * v, on hand-picked values."""
    k, v = jnp.asarray([1.0, -2.0]), jnp.asarray([3.0, 4.0, 5.0])
    a, m, c = kda.kda_rank_one(k, v, jnp.asarray(0.5))
    assert a.tolist() == [0.5, -1.0] and m.tolist() == [1.0, -2.0] and c.tolist() == [3.0, 4.0, 5.0]
    a, m, c = GDN2.rank_one(k, v, jnp.asarray([0.5, 0.25]), jnp.asarray([2.0, 0.0, -1.0]))
    assert a.tolist() == [1.0, -2.0] and m.tolist() == [0.5, -0.5] and c.tolist() == [6.0, 0.0, -5.0]


def test_a_wrong_adjoint_is_caught(monkeypatch):
    """The comparison above sees a one-term error in the adjoint (dr without the output's share), and where: in
    dc = dr, the gradient that the walk back gives directly."""
    def bad(scale, dS, x):
        dS_prev, dr = true_adjoint(scale, dS, x)
        q, a, m, g, do = x
        return dS_prev, dr - scale * jnp.sum(q * a, axis=-1, keepdims=True) * do

    true_adjoint = rank_one._token_adjoint
    monkeypatch.setattr(rank_one, "_token_adjoint", bad)
    _, grads_ref, _, grads = _both(5, K, 8)
    dc_ref, dc = grads_ref[4], grads[4]
    assert np.abs(dc - dc_ref).max() > 1e-3 * np.abs(dc_ref).max()
