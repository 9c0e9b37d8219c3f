"""Float64 CPU reference for the gated delta rule (GDN, fla's ``chunk_gated_delta_rule``), forward and backward.

Per value head, with ``S`` of shape ``[K, V]`` and one scalar log decay ``g_t`` per token and value head::

    S'_t = exp(g_t) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T
    o_t  = scale * S_t^T q_t

``S_0 = initial_state`` (zeros when absent) and ``ht = S_T``. This is KDA (:mod:`references.kda`) with the
same gate on every key channel, ``Diag(exp g_t) = exp(g_t) I``: the reference applies GDN's in-kernel
options and runs kda's float64 core and driver (:func:`references.kda.forward` /
:func:`~references.kda.backward`) with ``g`` as [B,T,HV,1], one decay broadcast over the K channels where it
acts (exact: the same float64 values). Its intra-chunk decayed scores are then one matrix product times
``exp(G_r - G_s)`` (:func:`references._decay.decayed_scores`), and ``dg`` the sum over K of the broadcast's
gradient, by autodiff.

Shapes (as fla-core 0.6.0): q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; initial_state, ht
[N,HV,K,V]; o [B,T,HV,V]. Grouped value heads (GVA, HV a multiple of H): value head j reads q/k head
``j // (HV // H)`` (fla: ``i_h // (HV // H)`` in its kernels); q and k are repeated to the HV heads
after the l2norm option (exact) and autodiff sums each group's gradients into dq, dk [B,T,H,K].

Packed variable-length sequences (``cu_seqlens``, B = 1, see :mod:`references._varlen`): each sequence runs
alone from ``initial_state[i]`` (or 0) to ``ht[i]`` and chunks restart at its start; initial_state, ht,
dht and dh0 are [N,HV,K,V]. The in-kernel options act token by token, so they commute with packing.

Options follow ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (fla-core 0.6.0), checked against its
source:

- ``use_qk_l2norm_in_kernel``: ``x / sqrt(sum(x**2) + 1e-6)`` over the key axis, for q and k (fla's
  ``l2norm_fwd`` with its default ``eps=1e-6``; the same function as kda's, shared:
  :func:`references.kda.qk_beta_options`).
- ``use_gate_in_kernel``: ``g`` is the raw gate input and the log decay is
  ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` (fla's ``gdn_gate_chunk_cumsum`` and its torch twin
  ``naive_gdn_gate``), ``A_log`` [HV] required, ``dt_bias`` [HV] optional, h the value head. fla's
  Triton softplus switches to the identity above 20 (an error below 2.1e-9); this reference uses the exact
  softplus, whose derivative ``sigmoid`` is what fla's gate backward uses. Without the option fla ignores
  A_log and dt_bias, and so does this reference (their gradients are None).
- ``use_beta_sigmoid_in_kernel``: ``beta = sigmoid(beta)``, times 2 with ``allow_neg_eigval``, which
  (as in fla) requires the sigmoid: ValueError otherwise.

Two formulations check each other: ``method="recurrent"`` (token by token) and ``method="chunk"`` (kda's
WY form); both run chunk by chunk under ``jax.checkpoint``.

All work runs inside ``jax.enable_x64(True)`` on the CPU device with HIGHEST matmul precision; nothing is
set globally. Inputs may be numpy arrays of any float dtype (bfloat16 included), checked against the op
contract (:func:`op_contract.check_gdn`: the same errors as the kernels) and upcast exactly to float64.
Results are float64 numpy arrays (checked); ``compute_dtype="float32"`` runs the same maths in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from op_contract import check_gdn, gdn_options

from .kda import METHODS, DeltaRule, backward, forward, qk_beta_options

__all__ = ["chunk_gdn", "chunk_gdn_bwd", "preprocess", "METHODS"]


def preprocess(q, k, g, beta, A_log=None, dt_bias=None, *, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """Apply GDN's in-kernel options with jax ops; returns (q, k, g [B,T,HV], beta) of the recurrence.

    Works in whatever dtype its inputs have (the reference calls it in float64).
    """
    q, k, beta = qk_beta_options(q, k, beta, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                 allow_neg_eigval=allow_neg_eigval)
    if use_gate_in_kernel:
        x = g if dt_bias is None else g + dt_bias
        g = -jnp.exp(A_log) * jax.nn.softplus(x)
    return q, k, g, beta


GDN = DeltaRule(check=check_gdn, options=gdn_options, preprocess=preprocess)


def chunk_gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *,
              A_log=None, dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64",
              **options):
    """GDN forward. Returns ``(o [B,T,HV,V], ht [N,HV,K,V])`` float64 numpy; ``ht`` is None unless
    ``output_final_state``.

    q, k [B,T,H,K]; v [B,T,HV,V], g [B,T,HV], beta [B,T,HV] (HV a multiple of H: grouped value heads).
    ``cu_seqlens``: N+1 offsets of packed sequences (B = 1); initial_state and ht are then [N,HV,K,V].
    ``options``: use_qk_l2norm_in_kernel, use_gate_in_kernel (with A_log [HV], dt_bias [HV]),
    use_beta_sigmoid_in_kernel, allow_neg_eigval (see the module docstring). ``compute_dtype="float32"``
    runs the same maths in float32 (results still returned as float64).
    """
    return forward(GDN, q, k, v, g, (beta,), scale, initial_state, output_final_state, A_log, dt_bias, cu_seqlens,
                   method, chunk_size, compute_dtype, options)


def chunk_gdn_bwd(q, k, v, g, beta, do, dht=None, scale=None, initial_state=None, *, A_log=None,
                  dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64", **options):
    """Gradients of ``sum(o*do) + sum(ht*dht)`` w.r.t. the raw inputs given, in float64.

    Returns dict(dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias), each shaped as its input (dq, dk [B,T,H,K],
    dg [B,T,HV]); ``dh0`` is None without ``initial_state``, ``dA_log`` / ``ddt_bias`` are None unless
    ``use_gate_in_kernel`` and that parameter is given. With ``cu_seqlens``, dht, initial_state and dh0 are
    [N,HV,K,V].
    """
    return backward(GDN, q, k, v, g, (beta,), do, dht, scale, initial_state, A_log, dt_bias, cu_seqlens, method,
                    chunk_size, compute_dtype, options)
