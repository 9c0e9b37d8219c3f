"""Decayed scores within one chunk, the intra-chunk product every gated reference shares.

For rows ``a`` and ``b`` [..., C, K] and a cumulative log decay ``G`` [..., C, K] (per key channel) or
[..., C, 1] (one decay per head, broadcast over the channels)::

    scores[r, s] = sum_d a[r, d] b[s, d] exp(G[r, d] - G[s, d])      for s < r (strict) or s <= r (inclusive)

and 0 elsewhere. ``G`` is non-increasing along the chunk (every op's log decay is <= 0, checked by the op
contracts), so every exponent that survives the mask is <= 0 and nothing overflows.

How it is computed, so that the work is matrix products and not C * C * K exponentials:

- **One decay per head** (``G[..., 1]``): ``exp(G_r - G_s)`` does not depend on d, so
  ``scores = (a b^T) * exp(G_r - G_s)``, one GEMM and C * C exponentials.
- **Per key channel**: the chunk is cut into sub-blocks of ``block`` rows. A diagonal sub-block is a chunk of
  its own, cut the same way into halves (recursively, down to :data:`DIRECT` rows, where the scores are the
  direct sum above). For r in a later sub-block than s, the decay splits at the last row ``e`` of s's
  sub-block::

      exp(G_r - G_s) = exp(G_r - G_e) * exp(G_e - G_s)         both exponents <= 0 (s <= e < r)

  so ``scores[r, s] = (a_r * exp(G_r - G_e)) . (b_s * exp(G_e - G_s))``: one GEMM per sub-block of columns.
  Both factors are <= 1: a product that underflows is one whose exact value is below 1e-308 as well.

Masked entries get the exponent 0 before ``exp`` and the value 0 after, so no masked exponent is ever
evaluated at a large value. Works in whatever float dtype it is given (the references call it in float64);
matrix products at ``Precision.HIGHEST``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST
BLOCK = 16
"""Rows per sub-block of the per-channel form (fla's intra-chunk sub-block)."""
DIRECT = 4
"""The fewest rows a sub-block is cut into: a diagonal sub-block of fewer is summed directly."""


def causal_mask(C: int, inclusive: bool):
    """[C, C] boolean: s < r (strict) or s <= r (inclusive)."""
    r = jnp.arange(C)
    return r[:, None] >= r[None, :] if inclusive else r[:, None] > r[None, :]


def _masked_exp(diff, mask):
    return jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0.0)), 0.0)


def decayed_scores(a, b, G, *, inclusive: bool, block: int = BLOCK):
    """``scores[..., r, s]`` (see the module docstring): a, b [..., C, K]; G [..., C, K] or [..., C, 1]."""
    C = a.shape[-2]
    mask = causal_mask(C, inclusive)
    if G.shape[-1] == 1:  # one decay per head
        diff = G[..., :, None, 0] - G[..., None, :, 0]
        return jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=_HI) * _masked_exp(diff, mask)
    if C % block or C <= block or block < DIRECT:
        return _direct(a, b, G, mask)
    lead = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2], G.shape[:-2])
    if len(lead) != 1:  # one leading dim: the sub-blocks below add two per level, and XLA:CPU's matrix library
        # refuses (aborts on) a tensor of rank 8
        flat = [jnp.broadcast_to(x, (*lead, *x.shape[-2:])).reshape(-1, *x.shape[-2:]) for x in (a, b, G)]
        return decayed_scores(*flat, inclusive=inclusive, block=block).reshape(*lead, C, C)
    n = C // block
    blocks = lambda x: x.reshape(*x.shape[:-2], n, block, x.shape[-1])  # noqa: E731  [..., n, block, K]
    # diagonal sub-blocks: each one chunk of `block` rows, cut in halves the same way down to DIRECT rows
    Gb = blocks(G)
    diag = decayed_scores(blocks(a), blocks(b), Gb, inclusive=inclusive, block=block // 2)  # [..., n, r, s]
    # later rows against each sub-block j, split at its last row e_j
    G_end = Gb[..., -1, :]  # [..., n, K]
    later = jnp.arange(C)[None, :] // block > jnp.arange(n)[:, None]  # [n, C]: row r after sub-block j
    left = a[..., None, :, :] * _masked_exp(G[..., None, :, :] - G_end[..., :, None, :], later[..., None])
    right = blocks(b) * jnp.exp(G_end[..., :, None, :] - Gb)  # [..., n, block, K], exponents <= 0
    off = jnp.einsum("...jrd,...jsd->...rjs", left, right, precision=_HI)  # [..., C, n, block]
    off = off.reshape(*off.shape[:-2], C)  # rows after the block of s, zero elsewhere
    same = jnp.eye(n, dtype=bool)[:, None, :, None]  # [n, 1, n, 1]: r and s in one sub-block
    diag_full = jnp.where(same, diag[..., :, :, None, :], 0.0).reshape(*diag.shape[:-3], C, C)
    return off + diag_full


def _direct(a, b, G, mask):
    """The definition itself: C * C * K exponentials (a chunk too short to cut)."""
    e = _masked_exp(G[..., :, None, :] - G[..., None, :, :], mask[..., None])
    return jnp.sum(a[..., :, None, :] * b[..., None, :, :] * e, axis=-1)
