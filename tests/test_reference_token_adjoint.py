"""The recurrent check's hand-written backward (references.kda._token_loop's custom vjp: each rule's
``token_adjoint`` and the decay's and output's adjoints, tokens in reverse, states recomputed by segments) against
jax.vjp of the plain token scan it replaced, on a tiny random float64 case (T=5, H=2, K=3, V=4), for each rule that
has one: kda's (kda and gdn: per-channel decay and one decay per head) and gdn2's. Gradients within 1e-13
relative, the forward bit for bit."""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from references import kda  # noqa: E402
from references.gdn import GDN  # noqa: E402
from references.gdn2 import GDN2  # noqa: E402
from references._x64 import float64_cpu  # noqa: E402

T, B, H, K, V = 5, 1, 2, 3, 4


def _tokens(rng, rule, gate_width):
    """q, k, v, g, *gates with the tokens on axis 0 ([T,B,H,...]), random."""
    n = lambda *s: jnp.asarray(rng.standard_normal((T, B, H, *s)))
    g = jnp.asarray(-rng.uniform(0.0, 0.5, (T, B, H, gate_width)))
    if rule is GDN2:
        gates = (jnp.asarray(rng.uniform(0.0, 1.0, (T, B, H, K))), jnp.asarray(rng.uniform(0.0, 1.0, (T, B, H, V))))
    else:
        gates = (jnp.asarray(rng.uniform(0.0, 2.0, (T, B, H))),)
    return (n(K), n(K), n(V), g, *gates)


@pytest.mark.parametrize("rule,gate_width", [(kda.KDA, K), (GDN, 1), (GDN2, K)], ids=["kda", "gdn", "gdn2"])
@pytest.mark.parametrize("segment", [1, 2, 8])
def test_hand_adjoint_is_the_vjp_of_the_scan(rule, gate_width, segment, monkeypatch):
    """Segments of 1, 2 (not dividing T=5: one token a segment) and 8 (the whole chunk)."""
    monkeypatch.setattr(kda, "TOKEN_SEGMENT", segment)
    rng = np.random.default_rng(7)
    scale = 0.6
    with float64_cpu(True):
        xs = _tokens(rng, rule, gate_width)
        S0 = jnp.asarray(rng.standard_normal((B, H, K, V)))
        cts = (jnp.asarray(rng.standard_normal((B, H, K, V))), jnp.asarray(rng.standard_normal((T, B, H, V))))
        plain = lambda S, xs: lax.scan(functools.partial(kda._token, rule, scale), S, xs)
        out_ref, vjp_ref = jax.vjp(plain, S0, xs)
        out, vjp = jax.vjp(lambda S, xs: kda._token_loop(rule, scale, S, xs), S0, xs)
        for a, b in zip(jax.tree_util.tree_leaves(out_ref), jax.tree_util.tree_leaves(out)):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        ref, got = jax.tree_util.tree_leaves(vjp_ref(cts)), jax.tree_util.tree_leaves(vjp(cts))
    assert len(ref) == len(got) == 1 + len(xs)
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and np.abs(a).max() > 0
        assert np.abs(b - a).max() <= 1e-13 * np.abs(a).max(), np.abs(b - a).max() / np.abs(a).max()


def test_a_wrong_adjoint_is_caught():
    """The comparison above sees a one-term error in an adjoint (kda's dbeta halved)."""
    def bad(S, k, v, beta, dS_new):
        dS, dk, dv, dbeta = kda.kda_token_adjoint(S, k, v, beta, dS_new)
        return dS, dk, dv, dbeta * 0.5

    rule = kda.DeltaRule(check=None, options=None, preprocess=None, token_adjoint=bad)
    rng = np.random.default_rng(7)
    with float64_cpu(True):
        xs = _tokens(rng, kda.KDA, K)
        S0 = jnp.asarray(rng.standard_normal((B, H, K, V)))
        cts = (jnp.zeros((B, H, K, V)), jnp.asarray(rng.standard_normal((T, B, H, V))))
        plain = lambda S, xs: lax.scan(functools.partial(kda._token, rule, 0.6), S, xs)
        ref = jax.vjp(plain, S0, xs)[1](cts)[1][4]
        got = jax.vjp(lambda S, xs: kda._token_loop(rule, 0.6, S, xs), S0, xs)[1](cts)[1][4]
    assert np.abs(np.asarray(got) - np.asarray(ref)).max() > 1e-3 * np.abs(np.asarray(ref)).max()
