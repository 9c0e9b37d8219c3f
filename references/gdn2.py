"""Float64 CPU reference for Gated DeltaNet-2 (GDN-2, fla's ``chunk_gdn2``), forward and backward.

Per head, with ``S`` of shape ``[K, V]`` (K first), a log decay ``g_t`` [K] per key channel, an erase gate
``b_t`` [K] per key channel and a write gate ``w_t`` [V] per value channel::

    S'_t = Diag(exp g_t) S_{t-1}
    S_t  = S'_t - k_t ((b_t * k_t)^T S'_t) + k_t (w_t * v_t)^T
         = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T
    o_t  = scale * S_t^T q_t

``S_0 = initial_state`` (zeros when absent) and ``ht = S_T``. With ``b_t = beta_t`` on every key channel and
``w_t = beta_t`` on every value channel this is KDA (:mod:`references.kda`) exactly; a gate the same on every
key channel as well gives GDN (:mod:`references.gdn`).

The chunked (WY) form differs from kda's only where the erase and write gates enter (:func:`wy_operands`):
within a chunk, with ``G`` the inclusive cumulative log decay from the chunk start, the new values
``delta_r = w_r * v_r - S'_r^T (b_r * k_r)`` solve ``(I + A) delta = U - W S_0`` with

    A[r, s] = sum_d (b_r * k_r)[d] k_s[d] exp(G_r[d] - G_s[d])   (s < r; 0 on and above the diagonal)
    U_r     = w_r * v_r,     W_r = (b_r * k_r) * exp(G_r)

(the erase side reads the second key operand ``b * k`` where kda reads ``beta k``), and the output and the
state pass are kda's: ``o = scale (q exp(G)) S_0 + scale tril(q-vs-k decayed scores) delta``,
``S_C = Diag(exp G_C) S_0 + (k exp(G_C - G))^T delta``. ``method="recurrent"`` runs the token update
instead, as a rank-one term (:func:`rank_one`). Both share kda's core and driver
(:class:`references.kda.DeltaRule`): chunks under ``jax.checkpoint`` or the token recurrence of
:mod:`references._rank_one`, padding and packed sequences with zero tokens (k = 0, g = 0: ``S -> S`` exactly
whatever b and w), the backward by ``jax.vjp`` (the token recurrence's written by hand).

Shapes (as fla-core 0.6.0, which asserts them): q, k, g, b [B,T,H,K]; v, w [B,T,H,V]; initial_state, ht
[N,H,K,V]; o [B,T,H,V]. fla's gdn2 has no grouped value heads (v has q's H heads), and neither has the
contract (:func:`op_contract.check_gdn2`). Packed variable-length sequences (``cu_seqlens``, B = 1, see
:mod:`references._varlen`): each sequence runs alone from ``initial_state[i]`` (or 0) to ``ht[i]`` (an empty
sequence's ``ht[i]`` is its ``initial_state[i]``) and chunks restart at its start.

Options follow ``fla.ops.gdn2.chunk_gdn2`` (fla-core 0.6.0), checked against its source: they are kda's
functions, reused here from :func:`references.kda.preprocess`:

- ``use_qk_l2norm_in_kernel``: ``x / sqrt(sum(x**2) + 1e-6)`` over the key axis, for q and k (fla's
  ``l2norm_fwd``, as kda).
- ``use_gate_in_kernel``: ``g`` is the raw gate input and the log decay is kda's in-kernel gate (fla's gdn2
  calls ``kda_gate_chunk_cumsum``): ``-exp(A_log[h]) * softplus(g + dt_bias[h, :])`` without ``lower_bound``;
  with it ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h, :]))``, or ``lower_bound * sigmoid(g +
  dt_bias[h, :])`` when ``A_log`` is None. ``A_log`` [H], ``dt_bias`` [H*K]. As in kda, ``lower_bound`` acts
  whenever the gate is in the kernel (not only with ``safe_gate``), and fla ignores A_log, dt_bias and
  lower_bound without the in-kernel gate (so does this reference: dA_log, ddt_bias None).
- ``safe_gate``: a numerics switch of fla's kernels; it does not change the function.
- There is no beta (so no ``use_beta_sigmoid_in_kernel`` / ``allow_neg_eigval``): b and w are used as given.

fla's ``state_v_first`` (a V-first [N,H,V,K] state) is a layout, handled where fla is called (the state
transposed), not here. fla's own limits (chunk_size 64 only, K <= 256, a float32 initial_state) are its
kernels'; this reference takes any chunk size and float dtype.

All work runs inside ``jax.enable_x64(True)`` on the CPU device with HIGHEST matmul precision; nothing is set
globally. Inputs may be numpy arrays of any float dtype (bfloat16 included), checked against the op contract
and upcast exactly to float64. Results are float64 numpy arrays (checked); ``compute_dtype="float32"`` runs
the same maths in float32.
"""

from __future__ import annotations

import jax.numpy as jnp

from op_contract import check_gdn2, gdn2_options

from . import kda
from .kda import METHODS, DeltaRule, backward, forward

__all__ = ["chunk_gdn2", "chunk_gdn2_bwd", "preprocess", "wy_operands", "rank_one", "METHODS",
           "GDN2"]

def preprocess(q, k, g, b, w, A_log=None, dt_bias=None, *, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
               safe_gate=False, lower_bound=None):
    """Apply gdn2's in-kernel options (kda's l2norm and gate) with jax ops; returns (q, k, g, b, w).

    Works in whatever dtype its inputs have (the reference calls it in float64)."""
    del safe_gate  # numerics only
    q, k, g, _ = kda.preprocess(q, k, g, None, A_log, dt_bias, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                use_gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound)
    return q, k, g, b, w


def wy_operands(k, v, G, strict_scores, b, w):
    """gdn2's side of the WY form: ``(A, w * v, (b * k) exp(G))``, A the strictly lower decayed scores of the
    erase key ``b * k`` (row r) against the key ``k`` (column s), ``strict_scores`` as in
    :func:`references.kda.kda_wy_operands`."""
    bk = b * k
    A = strict_scores(bk, k)
    return A, w * v, bk * jnp.exp(G)


def rank_one(k, v, b, w):
    """gdn2's token update as the rank-one term of :mod:`references._rank_one`: ``(a, m, c) = (k, b * k, w * v)``,
    so ``S_t = S'_t + k_t (w_t * v_t - S'_t^T (b_t * k_t))^T``."""
    return k, b * k, w * v


GDN2 = DeltaRule(check=check_gdn2, options=gdn2_options, preprocess=preprocess, gates=("b", "w"),
                 wy_operands=wy_operands, rank_one=rank_one)


def chunk_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, *,
               A_log=None, dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64",
               **options):
    """GDN-2 forward. Returns ``(o [B,T,H,V], ht [N,H,K,V])`` float64 numpy; ``ht`` is None unless
    ``output_final_state``.

    q, k, g, b [B,T,H,K]; v, w [B,T,H,V]. ``cu_seqlens``: N+1 offsets of packed sequences (B = 1);
    initial_state and ht are then [N,H,K,V]. ``options``: use_qk_l2norm_in_kernel, use_gate_in_kernel (with
    A_log [H], dt_bias [H*K]), safe_gate, lower_bound (see the module docstring). ``compute_dtype="float32"``
    runs the same maths in float32 (results still returned as float64).
    """
    return forward(GDN2, q, k, v, g, (b, w), scale, initial_state, output_final_state, A_log, dt_bias, cu_seqlens,
                   method, chunk_size, compute_dtype, options)


def chunk_gdn2_bwd(q, k, v, g, b, w, do, dht=None, scale=None, initial_state=None, *, A_log=None,
                   dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64", **options):
    """Gradients of ``sum(o*do) + sum(ht*dht)`` w.r.t. the raw inputs given, in float64.

    Returns dict(dq, dk, dv, dg, db, dw, dh0, dA_log, ddt_bias), each shaped as its input; ``dh0`` is None
    without ``initial_state``, ``dA_log`` / ``ddt_bias`` are None unless ``use_gate_in_kernel`` and that
    parameter is given. With ``cu_seqlens``, dht, initial_state and dh0 are [N,H,K,V].
    """
    return backward(GDN2, q, k, v, g, (b, w), do, dht, scale, initial_state, A_log, dt_bias, cu_seqlens, method,
                    chunk_size, compute_dtype, options)
