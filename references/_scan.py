"""A token-by-token scan whose backward keeps one state per ``every`` tokens, not one per token.

``token_scan(step, S0, xs, every)`` is ``lax.scan(step, S0, xs)`` over the leading (token) axis of ``xs``, computed
as a scan over segments of ``every`` tokens whose body, a scan over the segment's tokens, is under
``jax.checkpoint``. The forward runs the same steps in the same order on the same values. The backward
(``jax.vjp``) keeps the state entering each segment (T / every of them) and recomputes the segment's states from
it, ``every`` at a time, instead of keeping T: memory ``(T / every + every)`` states, for about one more forward.

T is padded to whole segments with zero tokens, which the caller's ``step`` must leave as identity updates of the
state (every op here: k = 0, v = 0, log decay 0 give ``S -> S`` exactly, as packing relies on too); their outputs
are sliced off."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

CHECKPOINT_EVERY = 64
"""Tokens per segment: at T = 4096 the backward keeps 64 + 64 states instead of 4096."""


def token_scan(step, S0, xs, every: int | None = None):
    """``(S_T, ys)``, as ``lax.scan(step, S0, xs)`` gives them (module doc). ``xs``: a tuple of arrays with the
    tokens on axis 0; ``every`` defaults to :data:`CHECKPOINT_EVERY`."""
    T = xs[0].shape[0]
    every = max(1, min(CHECKPOINT_EVERY if every is None else every, T))
    n = -(-T // every)
    pad = n * every - T
    xs = tuple(jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) if pad else x for x in xs)
    segments = tuple(x.reshape(n, every, *x.shape[1:]) for x in xs)
    S, ys = lax.scan(jax.checkpoint(lambda S, seg: lax.scan(step, S, seg)), S0, segments)
    return S, jax.tree_util.tree_map(lambda y: y.reshape(n * every, *y.shape[2:])[:T], ys)
