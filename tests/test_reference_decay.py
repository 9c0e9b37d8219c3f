"""references._decay.decayed_scores: the intra-chunk decayed product every gated reference shares."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from references._decay import causal_mask, decayed_scores
from references._x64 import float64_cpu


def _definition(a, b, G, inclusive):
    """The sum as written, in numpy float64: sum_d a[r,d] b[s,d] exp(G[r,d] - G[s,d]) on the mask."""
    C = a.shape[-2]
    G = np.broadcast_to(G, a.shape)
    out = np.zeros(a.shape[:-1] + (C,))
    for r in range(C):
        for s in range(r + 1 if inclusive else r):
            out[..., r, s] = np.sum(a[..., r, :] * b[..., s, :] * np.exp(G[..., r, :] - G[..., s, :]), axis=-1)
    return out


def _scores(*args, **kw):
    with float64_cpu():
        out = np.asarray(decayed_scores(*args, **kw))
    assert out.dtype == np.float64
    return out


def test_hand_computed_two_tokens():
    # a = [1, 2], b = [3, 4], one channel, G = [0, -1]: scores[1, 0] = 2 * 3 * e^-1; diagonal 1 * 3 and 2 * 4
    a, b, G = np.array([[1.0], [2.0]]), np.array([[3.0], [4.0]]), np.array([[0.0], [-1.0]])
    # (XLA's exp and libm's may differ in the last bit)
    assert _scores(a, b, G, inclusive=False) == pytest.approx(np.array([[0.0, 0.0], [6 * math.exp(-1), 0.0]]),
                                                              rel=1e-15, abs=0)
    assert _scores(a, b, G, inclusive=True) == pytest.approx(np.array([[3.0, 0.0], [6 * math.exp(-1), 8.0]]),
                                                             rel=1e-15, abs=0)


def test_hand_computed_per_channel_across_sub_blocks():
    # C = 4 cut into sub-blocks of 2: row 3 against column 0 goes through the split at row 1
    a = np.zeros((4, 2)); b = np.zeros((4, 2))
    a[3] = [1.0, 2.0]; b[0] = [5.0, 7.0]
    G = np.cumsum(np.array([[-0.5, -1.0], [-0.25, -2.0], [-1.0, -0.5], [-0.125, -0.75]]), axis=0)
    want = 1 * 5 * math.exp(G[3, 0] - G[0, 0]) + 2 * 7 * math.exp(G[3, 1] - G[0, 1])
    got = _scores(a, b, G, inclusive=False, block=2)
    assert got[3, 0] == pytest.approx(want, rel=1e-15)
    assert np.count_nonzero(got) == 1


@pytest.mark.parametrize("K_gate", [1, 8], ids=["per-head", "per-channel"])
@pytest.mark.parametrize("C,block", [(64, 16), (48, 16), (16, 16), (12, 16), (32, 8)])
@pytest.mark.parametrize("inclusive", [False, True])
def test_equals_the_definition(K_gate, C, block, inclusive):
    rng = np.random.default_rng(C + block + K_gate)
    a, b = rng.standard_normal((2, 3, C, 8)), rng.standard_normal((2, 3, C, 8))
    G = np.cumsum(-rng.uniform(0, 2, (2, 3, C, K_gate)), axis=-2)
    want = _definition(a, b, G, inclusive)
    got = _scores(a, b, G, inclusive=inclusive, block=block)
    assert np.max(np.abs(got - want)) <= 1e-14 * np.max(np.abs(want))
    assert not np.any(got[..., ~np.asarray(causal_mask(C, inclusive))])


def test_strong_decay_neither_overflows_nor_loses_the_near_diagonal():
    # -400 per token: exp of a cumulative gap of 6400 overflows any unsplit product; the split keeps every
    # factor <= 1, so far pairs are exactly 0 and neighbours keep their exp(-400) to the last bit
    C, K = 16, 4
    a = np.ones((C, K)); b = np.ones((C, K))
    G = np.cumsum(np.full((C, K), -400.0), axis=0)
    got = _scores(a, b, G, inclusive=False, block=4)
    assert np.all(np.isfinite(got))
    near = np.array([got[r, r - 1] for r in range(1, C)])
    assert near == pytest.approx(np.full(C - 1, K * math.exp(-400.0)), rel=1e-15, abs=0)
    assert np.all(np.tril(got, -2) == 0.0)


def test_differentiable_like_the_definition():
    # the references differentiate through it (jax.vjp): its gradient is the definition's
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 4)), rng.standard_normal((32, 4))
    G = np.cumsum(-rng.uniform(0, 1, (32, 4)), axis=0)
    w = rng.standard_normal((32, 32))

    def loss(f):
        return lambda a, b, G: jax.numpy.sum(w * f(a, b, G))

    def direct(a, b, G):
        mask = np.asarray(causal_mask(32, False))[..., None]
        diff = G[:, None, :] - G[None, :, :]
        e = jax.numpy.where(mask, jax.numpy.exp(jax.numpy.where(mask, diff, 0.0)), 0.0)
        return jax.numpy.sum(a[:, None, :] * b[None, :, :] * e, axis=-1)

    with float64_cpu():
        got = jax.grad(loss(lambda a, b, G: decayed_scores(a, b, G, inclusive=False, block=8)), (0, 1, 2))(a, b, G)
        want = jax.grad(loss(direct), (0, 1, 2))(a, b, G)
    for x, y in zip(got, want):
        assert np.max(np.abs(np.asarray(x) - np.asarray(y))) <= 1e-13 * np.max(np.abs(np.asarray(y)))
