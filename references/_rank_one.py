"""The delta rules' token-by-token recurrence (the reference's check), forward and its backward by hand.

Every delta rule here (kda, gdn, gdn2) changes its state by one rank-one term per token. Per head, with S [K, V],
``e_t = exp(g_t)`` on the key rows ([K], or one value per head) and the rule's three vectors ``a_t``, ``m_t`` [K]
and ``c_t`` [V] (``DeltaRule.rank_one``)::

    y_t = (Diag(e_t) S_{t-1})^T m_t               what the decayed state recalls for the erase key m_t
    S_t = Diag(e_t) S_{t-1} + a_t (c_t - y_t)^T   the recalled value replaced by c_t, along a_t
    o_t = scale S_t^T q_t

kda and gdn: ``a = beta k, m = k, c = v``; gdn2: ``a = k, m = b * k, c = w * v``. The rule's map from its inputs
to ``(a, m, c)`` is elementwise and runs outside this loop, so autodiff takes its gradients there.

**Backward**, the tokens in reverse with the carry ``dS`` the gradient w.r.t. ``S_t``. With ``r = c - y`` and
``dS' = dS + scale q do^T`` (the output's share)::

    dr  = dS'^T a   = dS^T a + scale (q . a) do        dc = dr
    da  = dS' r     = dS r + scale q (do . r)
    dm  = -Diag(e) S_{t-1} dr                          (y's gradient is -dr)
    dq  = scale S_t do = scale (e * (S_{t-1} do) + a (r . do))
    dg  = e * rowsum(S_{t-1} * (dS' - m dr^T))         summed over K for one decay per head
    dS_{t-1} = e * (dS + scale q do^T - m dr^T)

**Cost.** The loop is memory-bound: a token reads and writes whole states, and XLA:CPU does the rest of its work in
less time. So each pass over a state is one the maths needs:

- the decay is folded into the recall (``y = S^T (e * m)``) and the update (``e * S + a r^T``, one pass);
- the walk back (:func:`_token_adjoint`) reads the carried gradient once for ``dr`` and rewrites it once. The
  products of ``S_{t-1}`` that dq and dm need, and of ``dS'_t`` that da needs, are taken per segment from the states
  at its ends and its tokens (:func:`_segment_products`), not from the segment's states written to a stack and read
  back (XLA:CPU copies each one out and in: most of the backward's time) nor from the carry read three times;
- ``dg`` is taken per segment from a symmetry of the recurrence (:func:`_decay_grads`), not from a row sum per
  token (XLA:CPU sums a row serially: slower than the rest of the token).

Measured in reports/bench/2026-11-29-reference-check-rank-one.

**Memory.** The forward keeps the state entering each chunk of ``every`` tokens (the case's chunk size: as many
states as the chunk form keeps). The backward recomputes a chunk when it reaches it, keeping the states entering and
leaving each segment of :data:`SEGMENT` tokens and each token's ``r`` ([V]), then walks the segments back. So it
holds ``T / every + 2 every / SEGMENT`` states, never ``T``, and no case is refused for its size.

T is padded to whole segments with zero tokens (a = m = c = 0, g = 0: ``S -> S`` exactly, as packing relies on too);
their outputs are sliced off.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST

__all__ = ["token_recurrence"]


def _recall(S, x):
    """``x^T S`` over the key rows: [B,H,K] x [B,H,K,V] -> [B,H,V]."""
    return jnp.einsum("bhk,bhkv->bhv", x, S, precision=_HI)


def _update(S, a, m, c, g):
    """The state update (module doc): ``(S_t, r_t)`` from ``S_{t-1}``, ``r_t = c_t - y_t`` the value written."""
    e = jnp.exp(g)
    r = c - _recall(S, e * m)
    return e[..., :, None] * S + a[..., :, None] * r[..., None, :], r


def _token(scale, S, x):
    """One token (module doc): ``(S_t, o_t)`` from ``S_{t-1}``; x = (q, a, m, c, g) each [B,H,*]."""
    q, *update = x
    S, _ = _update(S, *update)
    return S, scale * _recall(S, q)


def _token_adjoint(scale, dS, x):
    """One token back (module doc), the part that needs the carry itself: from ``dS`` (w.r.t. ``S_t``) and
    ``x = (q, a, m, g, do)`` to ``dS_{t-1}`` and the token's ``dr`` (``dc = dr``). One product of the carry and one
    pass that rewrites it: the products of ``S_{t-1}`` (dq, dm) and of ``dS'_t`` (da) are taken afterwards for the
    whole segment (:func:`_segment_products`)."""
    q, a, m, g, do = x
    dr = _recall(dS, a) + scale * jnp.sum(q * a, axis=-1, keepdims=True) * do
    e = jnp.exp(g)
    dS = e[..., :, None] * (dS + scale * q[..., :, None] * do[..., None, :] - m[..., :, None] * dr[..., None, :])
    return dS, dr


def _decayed(scores, v, diff, where):
    """``out[t] = sum_s scores[t, s] v_s exp(diff[t, s])`` over the (t, s) of ``where`` [L, L]: scores [L,L,B,H],
    v [L,B,H,K], diff [L,L,B,H,K] (or [...,1]: one decay per head), every exponent that ``where`` keeps <= 0."""
    keep = where[:, :, None, None, None]
    w = jnp.where(keep, jnp.exp(jnp.where(keep, diff, 0.0)), 0.0)
    return jnp.einsum("tsbh,sbhk,tsbhk->tbhk", scores, v, jnp.broadcast_to(w, (*diff.shape[:-1], v.shape[-1])),
                      precision=_HI)


def _segment_products(S_e, dS_end, q, a, m, g, r, do, dr, scale):
    """The products the walk back leaves out, for every token t of a segment, without its states or gradients:
    ``S_{t-1} do_t`` and ``S_{t-1} dr_t`` (for dq, dm) and ``da_t = dS'_t r_t``, from the state entering the
    segment ``S_e``, the gradient w.r.t. its last state ``dS_end`` and the segment's tokens. The recurrences
    unrolled, with ``G`` the log decays summed from the segment's start (``G_{-1} = 0``)::

        S_{t-1} = Diag(exp G_{t-1}) S_e + sum_{s<t} Diag(exp(G_{t-1} - G_s)) a_s r_s^T
        dS_t    = Diag(exp(G_end - G_t)) dS_end + sum_{s>t} Diag(exp(G_s - G_t)) (scale q_s do_s^T - m_s dr_s^T)

    every exponent <= 0. A segment's states written to a stack and read back, or the carried gradient read three
    times a token, cost more than the tokens' work (XLA:CPU copies each state out and in); these are a few small
    matrix products per segment. Tokens on axis 0: q, a, m, g [L,B,H,K] (g [L,B,H,1]), r, do, dr [L,B,H,V]."""
    L = a.shape[0]
    G = jnp.cumsum(g, axis=0)
    G_prev = jnp.concatenate([jnp.zeros_like(G[:1]), G[:-1]])  # G_{t-1}
    t, s = jnp.arange(L)[:, None], jnp.arange(L)[None, :]
    up_to = G_prev[:, None] - G[None, :]  # [t, s]: G_{t-1} - G_s
    from_t = G[None, :] - G[:, None]  # [t, s]: G_s - G_t

    def state_times(x):  # S_{t-1} x_t
        entering = jnp.exp(G_prev) * jnp.einsum("bhkv,tbhv->tbhk", S_e, x, precision=_HI)
        return entering + _decayed(jnp.einsum("tbhv,sbhv->tsbh", x, r, precision=_HI), a, up_to, s < t)

    leaving = jnp.exp(G[-1] - G) * jnp.einsum("bhkv,tbhv->tbhk", dS_end, r, precision=_HI)
    da = (leaving + scale * _decayed(jnp.einsum("sbhv,tbhv->tsbh", do, r, precision=_HI), q, from_t, s >= t)
          - _decayed(jnp.einsum("sbhv,tbhv->tsbh", dr, r, precision=_HI), m, from_t, s > t))
    return state_times(do), state_times(dr), da


def _decay_grads(S_end, dS_end, xs, grads):
    """The log decays' gradients over a segment, from a symmetry of the recurrence instead of a row sum per token.

    Scaling the key rows of every state from ``S_t`` to the segment's last, ``S_end``, by ``Diag(lambda)`` leaves
    every output of the segment unchanged when ``e_t``, ``a_s`` take the factor ``lambda`` and ``m_s``, ``q_s``
    (s >= t) its inverse; only ``S_end`` as the later tokens read it changes. Differentiating in ``log lambda``::

        dg_t = rowsum(S_end * dS_end) + sum_{s=t..end} (q_s dq_s + m_s dm_s - a_s da_s)

    with ``dS_end`` the gradient w.r.t. ``S_end`` from the tokens after it. One row sum of two states per segment
    (XLA:CPU sums a row serially: about 90 us for [4,128,128] here, more than a token's other work) and a sum of
    at most :data:`SEGMENT` vectors per token."""
    q, a, m, _, g = xs
    dq, da, dm, _ = grads
    dg = jnp.sum(S_end * dS_end, axis=-1) + lax.cumsum(q * dq + m * dm - a * da, axis=0, reverse=True)
    if g.shape[-1] != dg.shape[-1]:  # one decay per head, broadcast over the key rows
        dg = jnp.sum(dg, axis=-1, keepdims=True)
    return dg


CHECKPOINT_EVERY = 64
"""Tokens per kept state for the recurrences that have no chunk size of their own (simple_gla's and gla's
``fused_recurrent`` cases): fla's chunk size, so as many states as their chunk form keeps."""

SEGMENT = 16
"""Tokens per segment of the backward within a chunk: :func:`_segment_products` holds ``[SEGMENT, SEGMENT, B, H, K]``
tensors of decays per segment (one per chunk would be 16 times larger: 0.5 GB at the stress shapes), and
:func:`_decay_grads` sums at most ``SEGMENT`` terms per token. Measured at B1-T2048-H4 (gdn's and kda's backward):
segments of 16 were faster than 8, 32 or 64 tokens."""


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _chunks(scale, every, segment, S0, xs):
    """The tokens in order from S0 [B,H,K,V], xs = (q, a, m, c, g) each [T,B,H,*] (T a multiple of ``every``, a
    multiple of ``segment``): ``(S_T, o [T,B,H,V])``."""
    return lax.scan(functools.partial(_token, scale), S0, xs)


def _by(n, x):
    """[T, ...] -> [T / n, n, ...]."""
    return x.reshape(x.shape[0] // n, n, *x.shape[1:])


def _chunks_fwd(scale, every, segment, S0, xs):
    """The same steps in the same order, chunk by chunk, keeping the state entering each."""
    def chunk(S, xs):
        S_new, o = lax.scan(functools.partial(_token, scale), S, xs)
        return S_new, (o, S)

    S_T, (o, S_enter) = lax.scan(chunk, S0, tuple(_by(every, x) for x in xs))
    return (S_T, o.reshape(-1, *o.shape[2:])), (S_enter, xs)


def _chunks_bwd(scale, every, segment, res, cts):
    """The chunks in reverse, each one: its tokens' ``r`` and the states entering and leaving each segment
    recomputed from the state entering the chunk (the forward's own update: the same values), then each segment
    in reverse: its tokens walked back by :func:`_token_adjoint` from the carry (``dS_T`` = ht's cotangent), then
    dq, dm, da (:func:`_segment_products`) and dg (:func:`_decay_grads`) for the whole segment."""
    S_enter, xs = res
    dS_T, do = cts

    def segment_back(dS, seg):
        S_e, S_end, xs, r, do = seg
        q, a, m, c, g = xs
        dS_e, dr = lax.scan(functools.partial(_token_adjoint, scale), dS, (q, a, m, g, do), reverse=True)
        S_do, S_dr, da = _segment_products(S_e, dS, q, a, m, g, r, do, dr, scale)
        e = jnp.exp(g)
        dq = scale * (e * S_do + a * jnp.sum(r * do, axis=-1, keepdims=True))
        dm = -e * S_dr
        grads = (dq, da, dm, dr)
        return dS_e, (*grads, _decay_grads(S_end, dS, xs, grads))

    def chunk_back(dS, ch):
        S_c, xs, do = ch
        segs = tuple(_by(segment, x) for x in xs)

        def segment_fwd(S, seg):
            S_new, r = lax.scan(lambda S, x: _update(S, *x), S, seg[1:])
            return S_new, (S, r)

        S_last, (S_e, r) = lax.scan(segment_fwd, S_c, segs)
        S_end = jnp.concatenate([S_e[1:], S_last[None]])
        dS_c, grads = lax.scan(segment_back, dS, (S_e, S_end, segs, r, _by(segment, do)), reverse=True)
        return dS_c, tuple(d.reshape(-1, *d.shape[2:]) for d in grads)

    dS0, dxs = lax.scan(chunk_back, dS_T, (S_enter, tuple(_by(every, x) for x in xs), _by(every, do)), reverse=True)
    return dS0, tuple(d.reshape(-1, *d.shape[2:]) for d in dxs)


_chunks.defvjp(_chunks_fwd, _chunks_bwd)


def token_recurrence(scale: float, S0, q, a, m, c, g, every: int):
    """``(o [B,T,H,V], S_T [B,H,K,V])`` of the recurrence (module doc) from S0 [B,H,K,V]; q, a, m [B,T,H,K],
    c [B,T,H,V], g [B,T,H,K] or [B,T,H,1]. The backward keeps a state per ``every`` tokens."""
    T = q.shape[1]
    every = max(1, min(every, T))
    pad = (-T) % every
    segment = max(d for d in range(1, min(SEGMENT, every) + 1) if every % d == 0)
    tokens = tuple(jnp.moveaxis(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)), 1, 0)
                   for x in (q, a, m, c, g))
    S_T, o = _chunks(scale, every, segment, S0, tokens)
    return jnp.moveaxis(o, 0, 1)[:, :T], S_T
