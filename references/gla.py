"""Float64 CPU JAX reference for GLA (gated linear attention, per-key-channel decay).

Layout follows flash-linear-attention: q, k ``[B,T,H,K]``, v ``[B,T,H,V]``,
state ``[B,H,K,V]``. Per head, with ``a_t = exp(gk_t)`` a per-key-channel decay:

    S_t = Diag(a_t) S_{t-1} + k_t v_t^T,    o_t = scale * S_t^T q_t,
    S_0 = h0 (optional, zeros otherwise),   ht = S_T.

The gate is ``g [B,T,H,K]`` (per-channel log decay), ``g_gamma`` constant over
the tokens (``[H]`` per head: ``gk_t[c] = g_gamma[h]`` for every t and c; ``[]``
one value for every head and channel; ``[H,K]`` per head and key channel:
``gk_t[c] = g_gamma[h, c]``), or both (``gk_t = g_t + g_gamma``, broadcast as
above: the decays multiply). The backward takes the loss
``sum(o * do) + sum(ht * dht)``.

Packed variable-length sequences (``cu_seqlens``, B = 1, see :mod:`references._varlen`): the
recurrence runs on each sequence alone, from ``initial_state[i]`` (or 0) to ``ht[i]``, and chunks
restart at each sequence start; ``initial_state``, ``ht``, ``dht`` and ``dh0`` are [N,H,K,V].

Two formulations check each other:

- ``method="recurrent"``: token by token, every head in one step, as the delta rules'
  rank-one update with nothing erased. Its backward is written by hand and recomputes
  the states from one kept every 64 tokens (:mod:`references._rank_one`), never T of them.
- ``method="chunk"`` (default): a ``lax.scan`` over chunks of ``chunk_size``
  tokens. Inside a chunk, with the inclusive in-chunk cumulative gate
  ``b_i = sum_{u<=i} gk_u``, every decay is written relative:

      o_i  = scale * [ (q_i * exp(b_i)) . S  + sum_{j<=i} sum_c q_ic k_jc exp(b_ic - b_jc) v_j ]
      S'   = exp(b_L) * S + sum_j (k_j * exp(b_L - b_j)) v_j^T        (L: last position)

  The causal mask is applied to the exponent ``b_ic - b_jc`` before ``exp``
  (masked entries get exponent 0, then the value 0), so no exponent is ever
  positive for a decaying gate. The chunk body is wrapped in
  ``jax.checkpoint``, so the backward (``jax.vjp`` of the scan) keeps only the
  NT chunk-boundary states, never T states nor the ``[C,C,K]`` intra tensors.

Everything runs in float64 without global side effects: inside
``jax.enable_x64(True)`` and ``jax.default_device(cpu)`` contexts, with every
einsum at ``Precision.HIGHEST``. Inputs are numpy arrays of any float dtype
(ml_dtypes bfloat16 included), checked against the op contract (:mod:`op_contract`:
shapes, float dtypes, chunk_size, scale, gates <= 0; the same errors as the
kernels); results are float64 numpy arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from op_contract import check_gla

from ._decay import decayed_scores
from ._rank_one import CHECKPOINT_EVERY, token_recurrence
from ._varlen import num_states, offsets, over_sequences
from ._x64 import COMPUTE_DTYPES, as_arrays, check_compute_dtype, float64_cpu, reference_jit

HIGHEST = lax.Precision.HIGHEST
METHODS = ("chunk", "recurrent")

__all__ = ["chunk_gla", "chunk_gla_bwd", "METHODS", "COMPUTE_DTYPES"]


def _ein(spec, *xs):
    return jnp.einsum(spec, *xs, precision=HIGHEST)


def _f64(x):
    return None if x is None else np.asarray(x).astype(np.float64)


def _validate(q, k, v, g, g_gamma, initial_state, scale, method, chunk_size, do=None, dht=None,
              compute_dtype="float64", cu_seqlens=None) -> tuple[float, tuple[int, ...] | None]:
    """The op contract (:func:`op_contract.check_gla`) on the inputs as given (before any cast), plus the
    reference's own arguments; returns the resolved scale and the packed offsets (a tuple, or None)."""
    check_compute_dtype(compute_dtype)
    if method not in METHODS:
        raise ValueError(f"{method=} must be one of {METHODS}")
    q, k, v, g, g_gamma, initial_state, do, dht = as_arrays(q, k, v, g, g_gamma, initial_state, do, dht)
    scale = check_gla(q, k, v, g, g_gamma, scale, initial_state, chunk_size, do=do, dht=dht, cu_seqlens=cu_seqlens)[1]
    return scale, offsets(cu_seqlens)


def _gate(g, g_gamma, shape):
    """Per-channel log decay [B,T,H,K] from the gates given: g, g_gamma ([H], [] or [H,K], broadcast over what it
    lacks), or their sum (traced: grads flow to each)."""
    if g_gamma is None:
        return g
    gamma = g_gamma[None, None, :, None] if g_gamma.ndim == 1 else g_gamma  # [H]; [] and [H,K] align at the end
    return jnp.broadcast_to(gamma, shape) if g is None else g + gamma


# ------------------------------------------------------------------ recurrent
def _recurrent(q, k, v, gk, h0, scale):
    """Token by token: the delta rules' rank-one recurrence with nothing erased (``a = k, m = 0, c = v``:
    ``S_t = Diag(exp gk_t) S_{t-1} + k_t v_t^T``), whose backward is written by hand and keeps a state per
    :data:`CHECKPOINT_EVERY` tokens (:mod:`references._rank_one`)."""
    B, T, H, K = q.shape
    S0 = jnp.zeros((B, H, K, v.shape[-1]), q.dtype) if h0 is None else h0
    return token_recurrence(scale, S0, q, k, jnp.zeros_like(k), v, gk, every=CHECKPOINT_EVERY)


# ---------------------------------------------------------------------- chunk
def _chunk(q, k, v, gk, h0, scale, C):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = -(-T // C)
    pad = NT * C - T
    if pad:  # zero k, v and a zero log gate (decay 1) leave the state untouched
        padT = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
        q, k, v, gk = padT(q), padT(k), padT(v), padT(gk)
    # [NT, B, H, C, *]
    split = lambda x: jnp.moveaxis(x.reshape(B, NT, C, H, x.shape[-1]), (1, 3), (0, 2))
    qc, kc, vc, gc = split(q), split(k), split(v), split(gk)
    S0 = jnp.zeros((B, H, K, V), q.dtype) if h0 is None else h0

    @jax.checkpoint
    def body(S, xs):
        q_n, k_n, v_n, g_n = xs  # [B,H,C,K] / [B,H,C,V]
        b = jnp.cumsum(g_n, axis=2)  # inclusive in-chunk cumulative gate
        bL = b[:, :, -1:, :]  # [B,H,1,K]
        # sum_c q_ic k_jc exp(b_ic - b_jc) for j <= i, as matrix products (references._decay)
        A = decayed_scores(q_n, k_n, b, inclusive=True)
        o = scale * (_ein("bhik,bhkv->bhiv", q_n * jnp.exp(b), S) + _ein("bhij,bhjv->bhiv", A, v_n))
        S = jnp.exp(bL)[:, :, 0, :, None] * S + _ein("bhjk,bhjv->bhkv", k_n * jnp.exp(bL - b), v_n)
        return S, o

    ST, o = lax.scan(body, S0, (qc, kc, vc, gc))  # o [NT,B,H,C,V]
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, NT * C, H, V)[:, :T]
    return o, ST


def _forward(q, k, v, g, g_gamma, h0, scale, method, chunk_size, offs=None):
    """(o, ht); with packed offsets ``offs`` every sequence runs alone from its own state (state reset)."""
    gk = _gate(g, g_gamma, q.shape)
    if method == "recurrent":
        core = lambda q, k, v, gk, h0: _recurrent(q, k, v, gk, h0, scale)  # noqa: E731
    else:
        core = lambda q, k, v, gk, h0: _chunk(q, k, v, gk, h0, scale, chunk_size)  # noqa: E731
    return over_sequences(core, offs, (q, k, v, gk), h0)


_forward_jit = reference_jit(_forward, static_argnums=(6, 7, 8, 9))


def _gradients(primals, do, dht, scale, method, chunk_size, offs):
    """The vjp of ``(o, ht)`` w.r.t. ``primals`` (a dict; None where an input is absent) at ``(do, dht)``."""
    def f(p):
        return _forward(p["q"], p["k"], p["v"], p["g"], p["g_gamma"], p["h0"], scale, method, chunk_size, offs)

    _, vjp = jax.vjp(f, primals)
    return vjp((do, dht))[0]


_gradients_jit = reference_jit(_gradients, static_argnums=(3, 4, 5, 6))


def _check(named, compute_dtype="float64"):
    """Assert every result really is compute_dtype (not by name), then return float64 arrays."""
    out = {}
    for name, x in named.items():
        if x is not None:
            assert x.dtype == np.dtype(compute_dtype), f"{name} came out {x.dtype}, not {compute_dtype}"
            x = x.astype(np.float64)
        out[name] = x
    return out


# --------------------------------------------------------------------- public
def chunk_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
              *, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64"):
    """Float64 forward: ``(o [B,T,H,V], ht [N,H,K,V] or None)`` as numpy float64.

    ``cu_seqlens``: N+1 offsets of packed sequences (B = 1); initial_state is then [N,H,K,V],
    else N = B. ``compute_dtype="float32"`` runs the same maths in float32 (results still
    returned as float64 arrays): only to exercise a harness gate, never a golden.
    """
    scale, offs = _validate(q, k, v, g, g_gamma, initial_state, scale, method, chunk_size,
                            compute_dtype=compute_dtype, cu_seqlens=cu_seqlens)
    q, k, v, g, g_gamma, h0 = map(_f64, (q, k, v, g, g_gamma, initial_state))
    with float64_cpu(compute_dtype == "float64"):
        o, ht = _forward_jit(*map(lambda x: None if x is None else jnp.asarray(x.astype(compute_dtype)),
                                  (q, k, v, g, g_gamma, h0)), scale, method, chunk_size, offs)
        o, ht = np.asarray(o), np.asarray(ht)
    out = _check({"o": o, "ht": ht if output_final_state else None}, compute_dtype)
    return out["o"], out["ht"]


def chunk_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None,
                  *, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64"):
    """Float64 gradients of ``sum(o*do) + sum(ht*dht)``.

    Returns ``dict(dq, dk, dv, dg, dg_gamma, dh0)`` of float64 numpy arrays,
    ``None`` where not applicable (``dg`` without g, ``dg_gamma`` without
    g_gamma, ``dh0`` without initial_state). With ``cu_seqlens``, dht,
    initial_state and dh0 are [N,H,K,V].
    """
    scale, offs = _validate(q, k, v, g, g_gamma, initial_state, scale, method, chunk_size, do=do, dht=dht,
                            compute_dtype=compute_dtype, cu_seqlens=cu_seqlens)
    q, k, v, do, dht, g, g_gamma, h0 = map(_f64, (q, k, v, do, dht, g, g_gamma, initial_state))
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = num_states(B, offs)
    with float64_cpu(compute_dtype == "float64"):
        j = lambda x: None if x is None else jnp.asarray(x.astype(compute_dtype))
        primals = {"q": j(q), "k": j(k), "v": j(v), "g": j(g), "g_gamma": j(g_gamma), "h0": j(h0)}
        dht64 = j(np.zeros((N, H, K, V))) if dht is None else j(dht)
        grads = _gradients_jit(primals, j(do), dht64, scale, method, chunk_size, offs)
        out = {name: None if grads[src] is None else np.asarray(grads[src])
               for name, src in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"),
                                 ("dg_gamma", "g_gamma"), ("dh0", "h0"))}
    return _check(out, compute_dtype)
