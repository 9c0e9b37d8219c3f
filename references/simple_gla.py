"""Float64 CPU references for simple_gla (scalar-gated linear attention).

Per batch and head, with a per-token log decay ``g_t`` (``g`` [B,T,H]), a
constant ``g_t = gamma_h`` (``g_gamma`` [H], or [] one value for every head), or
both at once (``g_t = g[b,t,h] + gamma_h``: the decays multiply):

    S_t = exp(g_t) S_{t-1} + k_t v_tᵀ          S_0 = h0 (or 0)      S: [K, V]
    o_t = scale · S_tᵀ q_t                     ht  = S_T

Gradients are those of the scalar loss ``sum(o * do) + sum(ht * dht)``.

Packed variable-length sequences (``cu_seqlens``, B = 1, see :mod:`references._varlen`): the
recurrence above runs on each sequence alone, from ``initial_state[i]`` (or 0) to ``ht[i]``, and
chunks restart at each sequence start; ``initial_state``, ``ht``, ``dht`` and ``dh0`` are [N,H,K,V].

Two formulations check each other (tests hold them to 1e-12 relative):

- ``method="recurrent"``: the token-by-token recurrence above, every head in one step, as the delta rules' rank-one
  update with nothing erased; its backward is written by hand and recomputes the states from one kept every 64
  tokens (:mod:`references._rank_one`).
- ``method="chunk"`` (default): split T into NT chunks of C tokens. With
  ``b_i`` the inclusive cumulative log decay inside a chunk and ``S`` the state
  entering it,

      o_i   = scale · ( exp(b_i) q_iᵀ S + Σ_{j≤i} exp(b_i − b_j) (q_i·k_j) v_j )
      S_out = exp(b_C) S + Σ_j exp(b_C − b_j) k_j v_jᵀ

  Every exponent is ≤ 0 (the masked triangle is zeroed before ``exp``), the
  intra-chunk part is one batched einsum, and only the NT chunk states cross
  the sequential scan, so the backward (``jax.vjp``) keeps NT states, never T.

Public functions mirror fla's names and [B,T,H,*] layout and take numpy arrays
of any float dtype (bfloat16 included); they check them against the op contract
(:mod:`op_contract`: shapes, float dtypes, chunk_size, scale, gates <= 0, the same
errors as the kernels), upcast exactly and return float64 numpy arrays.
``compute_dtype="float32"`` runs the same maths in float32: the reference leg
uses it to show the gate working before other legs exist.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from op_contract import check_simple_gla

from ._rank_one import CHECKPOINT_EVERY, token_recurrence
from ._varlen import num_states, offsets, over_sequences
from ._x64 import as_arrays, check_compute_dtype, float64_cpu, reference_jit, to_jax, to_numpy

__all__ = ["chunk_simple_gla", "chunk_simple_gla_bwd", "naive_recurrent_simple_gla"]


def _log_decay(g, g_gamma, B, T, H, dtype):
    """Per-token log decay [B,T,H] from the gates given: g, g_gamma ([H] or [] broadcast over the tokens and
    heads), their sum when both are (traced: gradients flow to each), zeros (no decay) when neither is."""
    gamma = None if g_gamma is None else jnp.broadcast_to(g_gamma, (H,))[None, None, :]
    if g is not None:
        return g if gamma is None else g + gamma
    if gamma is not None:
        return jnp.broadcast_to(gamma, (B, T, H))
    return jnp.zeros((B, T, H), dtype)


# ------------------------------------------------------------ formulations
def _recurrent(q, k, v, gt, h0, scale):
    """Token-by-token recurrence. q,k [B,T,H,K], v [B,T,H,V], gt [B,T,H], h0 [B,H,K,V]: the delta rules' rank-one
    recurrence with nothing erased (``a = k, m = 0, c = v``: ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``), whose backward
    is written by hand and keeps a state per :data:`~references._rank_one.CHECKPOINT_EVERY` tokens
    (:mod:`references._rank_one`)."""
    return token_recurrence(scale, h0, q, k, jnp.zeros_like(k), v, gt[..., None], every=CHECKPOINT_EVERY)


def _chunked(q, k, v, gt, h0, scale, C):
    """Chunked form: batched intra-chunk attention, a scan over chunk states only."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = math.ceil(T / C)
    pad = NT * C - T
    if pad:  # zero q/k/v and zero log decay leave every state and output unchanged
        widths = ((0, 0), (0, pad), (0, 0), (0, 0))
        q, k, v = (jnp.pad(a, widths) for a in (q, k, v))
        gt = jnp.pad(gt, widths[:3])
    # [B, NT, H, C, *]: the batch dims (b, n, h) lead, so every einsum below is a plain batched matrix
    # product; with h between the chunk and feature dims XLA:CPU transposes around each dot (1.8x slower)
    q, k, v = (a.reshape(B, NT, C, H, a.shape[-1]).transpose(0, 1, 3, 2, 4) for a in (q, k, v))
    b = jnp.cumsum(gt.reshape(B, NT, C, H).transpose(0, 1, 3, 2), axis=3)  # [B,NT,H,C] inclusive in-chunk log decay
    b_last = b[..., -1]  # [B, NT, H]

    causal = jnp.tril(jnp.ones((C, C), dtype=bool))  # [i, j]: j <= i
    diff = b[..., :, None] - b[..., None, :]  # [B,NT,H,i,j] = b_i - b_j
    decay = jnp.where(causal, jnp.exp(jnp.where(causal, diff, 0.0)), 0.0)
    scores = jnp.einsum("bnhik,bnhjk->bnhij", q, k) * decay
    o_intra = jnp.einsum("bnhij,bnhjv->bnhiv", scores, v)

    # contribution of each chunk to the state it hands on: sum_j exp(b_C - b_j) k_j v_j^T
    k_to_end = k * jnp.exp(b_last[..., None] - b)[..., None]
    u = jnp.einsum("bnhjk,bnhjv->bnhkv", k_to_end, v)

    def carry_state(S, x):
        u_c, decay_c = x  # [B,H,K,V], [B,H]
        return jnp.exp(decay_c)[..., None, None] * S + u_c, S  # emit the state entering the chunk

    ht, S_in = jax.lax.scan(carry_state, h0, (jnp.moveaxis(u, 1, 0), jnp.moveaxis(b_last, 1, 0)))
    S_in = jnp.moveaxis(S_in, 0, 1)  # [B,NT,H,K,V]
    o_inter = jnp.einsum("bnhik,bnhkv->bnhiv", q * jnp.exp(b)[..., None], S_in)
    o = (scale * (o_inter + o_intra)).transpose(0, 1, 3, 2, 4).reshape(B, NT * C, H, V)[:, :T]
    return o, ht


@functools.partial(reference_jit, static_argnames=("scale", "method", "chunk_size", "offs"))
def _forward(q, k, v, g, g_gamma, h0, scale, method, chunk_size, offs=None):
    """(o, ht); with packed offsets ``offs`` every sequence runs alone from its own state (state reset)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if method not in ("chunk", "recurrent"):
        raise ValueError(f"{method=} must be 'chunk' or 'recurrent'")
    gt = _log_decay(g, g_gamma, B, T, H, q.dtype)

    def core(q, k, v, gt, h0):
        if h0 is None:
            h0 = jnp.zeros((q.shape[0], H, K, V), q.dtype)
        if method == "recurrent":
            return _recurrent(q, k, v, gt, h0, scale)
        return _chunked(q, k, v, gt, h0, scale, chunk_size)

    return over_sequences(core, offs, (q, k, v, gt), h0)


@functools.partial(reference_jit, static_argnames=("scale", "method", "chunk_size", "offs"))
def _backward(primals, d_o, d_ht, scale, method, chunk_size, offs=None):
    """Gradients of sum(o*do) + sum(ht*dht) w.r.t. every array in ``primals``."""
    def f(p):
        return _forward(p["q"], p["k"], p["v"], p.get("g"), p.get("g_gamma"), p["h0"], scale, method, chunk_size,
                        offs)

    _, vjp = jax.vjp(f, primals)
    return vjp((d_o, d_ht))[0]


def _prepare(q, k, v, g, g_gamma, initial_state, scale, chunk_size, compute_dtype, do=None, dht=None,
             cu_seqlens=None):
    """The inputs as numpy arrays, checked against the op contract (:mod:`op_contract`); the resolved scale
    and the packed offsets (a tuple, or None)."""
    check_compute_dtype(compute_dtype)
    q, k, v, g, g_gamma, initial_state, do, dht = as_arrays(q, k, v, g, g_gamma, initial_state, do, dht)
    _, scale = check_simple_gla(q, k, v, g, g_gamma, scale, initial_state, chunk_size, do=do, dht=dht,
                                cu_seqlens=cu_seqlens)
    return [q, k, v, g, g_gamma, initial_state], scale, offsets(cu_seqlens)


# ----------------------------------------------------------------- public
def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     *, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64"):
    """Forward: ``(o [B,T,H,V], ht [N,H,K,V] or None)`` as float64 numpy arrays.

    Args mirror ``fla.ops.simple_gla.chunk_simple_gla``: q, k [B,T,H,K]; v
    [B,T,H,V]; g [B,T,H], g_gamma [H] or [] (log decays), or both (summed); scale defaults to K**-0.5;
    initial_state [N,H,K,V]; cu_seqlens the N+1 offsets of packed sequences (B = 1),
    else N = B.
    """
    arrays, scale, offs = _prepare(q, k, v, g, g_gamma, initial_state, scale, chunk_size, compute_dtype,
                                   cu_seqlens=cu_seqlens)
    with float64_cpu(compute_dtype == "float64"):
        q, k, v, g, g_gamma, h0 = (to_jax(a, compute_dtype) for a in arrays)
        o, ht = _forward(q, k, v, g, g_gamma, h0, scale, method, chunk_size, offs)
        o, ht = to_numpy((o, ht), compute_dtype)
    return o.astype(np.float64), (ht.astype(np.float64) if output_final_state else None)


def chunk_simple_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None,
                         *, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64"):
    """Backward of ``sum(o*do) + sum(ht*dht)``: dict(dq, dk, dv, dg, dg_gamma, dh0).

    ``dg`` is None unless g is given, ``dg_gamma`` (g_gamma's shape) unless g_gamma is given,
    ``dh0`` unless initial_state is given. All arrays are float64 numpy. With
    ``cu_seqlens``, dht, initial_state and dh0 are [N,H,K,V].
    """
    arrays, scale, offs = _prepare(q, k, v, g, g_gamma, initial_state, scale, chunk_size, compute_dtype, do, dht,
                                   cu_seqlens)
    B, T, H, K = arrays[0].shape
    V = arrays[2].shape[-1]
    N = num_states(B, offs)
    with float64_cpu(compute_dtype == "float64"):
        q, k, v, g, g_gamma, h0 = (to_jax(a, compute_dtype) for a in arrays)
        if h0 is None:
            h0 = jnp.zeros((N, H, K, V), compute_dtype)
        d_o = to_jax(do, compute_dtype)
        d_ht = jnp.zeros((N, H, K, V), compute_dtype) if dht is None else to_jax(dht, compute_dtype)
        primals = {n: a for n, a in dict(q=q, k=k, v=v, g=g, g_gamma=g_gamma, h0=h0).items() if a is not None}
        grads = _backward(primals, d_o, d_ht, scale=scale, method=method, chunk_size=chunk_size, offs=offs)
        grads = to_numpy(grads, compute_dtype)
    out = {f"d{n}": grads[n].astype(np.float64) for n in ("q", "k", "v")}
    out["dg"] = grads["g"].astype(np.float64) if "g" in grads else None
    out["dg_gamma"] = grads["g_gamma"].astype(np.float64) if "g_gamma" in grads else None
    out["dh0"] = grads["h0"].astype(np.float64) if initial_state is not None else None
    return out


def naive_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, *, cu_seqlens=None):
    """The token-by-token recurrence, float64 (fla's ``naive`` counterpart)."""
    return chunk_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens=cu_seqlens,
                            method="recurrent")
