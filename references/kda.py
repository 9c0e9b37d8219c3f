"""Float64 CPU reference for KDA (Kimi delta attention), forward and backward.

Per head, with ``S`` of shape ``[K, V]`` and ``exp(g_t)`` acting on the key rows::

    S'_t = Diag(exp g_t) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T
    o_t  = scale * S_t^T q_t

``S_0 = initial_state`` (zeros when absent) and ``ht = S_T``.

Grouped value heads (fla's GVA): q, k [B,T,H,K] and v [B,T,HV,V] with HV a multiple of H; g, beta, the
state, A_log and dt_bias have HV heads. Value head j reads q/k head ``j // (HV // H)``, as fla's kernels
(``i_h = i_hv // (HV // H)``) and its naive reference (``q.repeat_interleave(HV // H, dim=2)``): q and k
are repeated to the HV heads after the l2norm option (exact), and autodiff of the repeat sums each group's
HV // H gradients into dq, dk [B,T,H,K].

Packed variable-length sequences (``cu_seqlens``, B = 1, see :mod:`references._varlen`): the
recurrence runs on each sequence alone, from ``initial_state[i]`` (or 0) to ``ht[i]``, and chunks
restart at each sequence start; ``initial_state``, ``ht``, ``dht`` and ``dh0`` are [N,HV,K,V]. The
in-kernel options act token by token (l2norm, gate, beta sigmoid), so they commute with packing.

Options follow ``fla.ops.kda.chunk_kda`` (fla-core 0.6.0), checked against its source:

- ``use_qk_l2norm_in_kernel``: ``x / sqrt(sum(x**2) + 1e-6)`` over the key axis, for q and k
  (fla ``l2norm_fwd`` with its default ``eps=1e-6``; the gradient is the exact one of that map).
- ``use_gate_in_kernel``: ``g`` is the raw gate input. Without ``lower_bound``:
  ``g = -exp(A_log[h]) * softplus(g + dt_bias[h, :])``; with ``lower_bound``:
  ``g = lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h, :]))``, or
  ``lower_bound * sigmoid(g + dt_bias[h, :])`` when ``A_log`` is None (h a value head). ``A_log`` has
  shape ``[HV]``, ``dt_bias`` ``[HV*K]`` (viewed ``[HV, K]``), both optional as in fla. fla's Triton
  softplus switches to the identity above 20 (an error below 2.1e-9); this reference uses the exact softplus.
  ``lower_bound`` only acts through the gate: fla ignores it when ``use_gate_in_kernel=False``.
- ``use_beta_sigmoid_in_kernel``: ``beta = sigmoid(beta)``, times 2 with ``allow_neg_eigval``.
- ``safe_gate``: a numerics switch of fla's intra-chunk kernel (M=16 tensor-core path for
  gates bounded below); it does not change the function. Its argument checks are mirrored.

fla 0.6.0 has no gate sentinel: the only "sentinel" in KDA is the graph-mode varlen chunk
index ``i_n = -1`` (``prepare_chunk_indices_static``) on padded chunk rows, which kernels skip.
A gate of ``-inf`` (a hard state reset) is not special-cased by fla and is not supported here.

The driver (:func:`forward`, :func:`backward`: contract, in-kernel options, value heads, float64 core) is
shared with :mod:`references.gdn`, whose scalar gate is broadcast over the key channels, and with
:mod:`references.gdn2`, whose per-channel erase and write gates replace beta in the update
(:class:`DeltaRule`: its ``gates``, ``wy_operands`` and ``rank_one``).

Two formulations check each other: ``method="recurrent"`` (token by token) and
``method="chunk"`` (WY form: per chunk ``Akk``, its unit-lower-triangular inverse, ``w``, ``u``,
the delta-rule state pass and the output; the decayed key and query scores as matrix products,
:func:`references._decay.decayed_scores`), chunk by chunk under ``jax.checkpoint``, so that the backward
(``jax.vjp``) keeps only the ``NT`` chunk-start states. The token-by-token form is the rule's rank-one update
(``DeltaRule.rank_one``) run by :func:`references._rank_one.token_recurrence`, whose backward is written by hand
(the tokens in reverse, the states recomputed from one kept every C tokens), not autodiff of its scan, which cost
about 9x the forward (reports/bench/2026-11-28-reference-check).

All work runs inside ``jax.enable_x64(True)`` on the CPU device with HIGHEST matmul precision;
nothing is set globally. Inputs may be numpy arrays of any float dtype (bfloat16 included),
checked against the op contract (:mod:`op_contract`: shapes, float dtypes, chunk_size, scale,
``g <= 0`` unless ``use_gate_in_kernel``; the same errors as the kernels); they are upcast exactly
to float64. Results are float64 numpy arrays (checked).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from op_contract import check_kda, kda_options

from ._decay import decayed_scores
from ._rank_one import token_recurrence
from ._varlen import num_states, offsets, over_sequences
from ._x64 import as_arrays, check_compute_dtype, float64_cpu, reference_jit, to_jax, to_numpy

L2NORM_EPS = 1e-6
METHODS = ("chunk", "recurrent")
_HI = lax.Precision.HIGHEST

__all__ = ["chunk_kda", "chunk_kda_bwd", "preprocess", "METHODS", "L2NORM_EPS", "DeltaRule", "forward", "backward",
           "qk_beta_options", "kda_wy_operands", "kda_rank_one"]


def _to_np(x, dtype: str) -> np.ndarray:
    """Checked to be in the compute dtype, then returned as float64."""
    return to_numpy(x, dtype).astype(np.float64)


# ------------------------------------------------------------------ options
def qk_beta_options(q, k, beta, *, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                    allow_neg_eigval=False):
    """The in-kernel options kda and gdn share (the same functions in fla): q, k l2-normalised over K,
    beta through a sigmoid (doubled with ``allow_neg_eigval``). Returns (q, k, beta)."""
    if use_qk_l2norm_in_kernel:
        q = q * lax.rsqrt(jnp.sum(q * q, axis=-1, keepdims=True) + L2NORM_EPS)
        k = k * lax.rsqrt(jnp.sum(k * k, axis=-1, keepdims=True) + L2NORM_EPS)
    if use_beta_sigmoid_in_kernel:
        beta = jax.nn.sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)
    return q, k, beta


def preprocess(q, k, g, beta, A_log=None, dt_bias=None, *, use_qk_l2norm_in_kernel=False,
               use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
               lower_bound=None, **_unused):
    """Apply the in-kernel options with jax ops; returns (q, k, g, beta) of the core recurrence.

    Works in whatever dtype its inputs have (the reference calls it in float64).
    """
    q, k, beta = qk_beta_options(q, k, beta, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                 allow_neg_eigval=allow_neg_eigval)
    if use_gate_in_kernel:
        HV, K = g.shape[-2:]
        x = g if dt_bias is None else g + dt_bias.reshape(HV, K)
        if lower_bound is None:
            g = -jnp.exp(A_log).reshape(HV, 1) * jax.nn.softplus(x)
        else:
            if A_log is not None:
                x = jnp.exp(A_log).reshape(HV, 1) * x
            g = lower_bound * jax.nn.sigmoid(x)
    return q, k, g, beta


# ------------------------------------------------------------------ cores
def _to_chunks(x, C):
    """[B,T,H,...] (T a multiple of C) -> [NT,B,H,C,...]."""
    B, T, H = x.shape[:3]
    x = x.reshape(B, T // C, C, H, *x.shape[3:])
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)


def _from_chunks(x):
    """[NT,B,H,C,V] -> [B,NT*C,H,V]."""
    NT, B, H, C, V = x.shape
    return jnp.transpose(x, (1, 0, 3, 2, 4)).reshape(B, NT * C, H, V)


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HI)


def kda_wy_operands(k, v, G, strict_scores, beta):
    """KDA's side of the WY form (:func:`_chunk_step_wy`): ``(Akk, beta v, beta k exp(G))``, Akk the strictly
    lower decayed key scores ``beta_r sum_d k_r[d] k_s[d] exp(G_r[d] - G_s[d])`` (s < r);
    ``strict_scores(a, b)`` gives ``sum_d a_r[d] b_s[d] exp(G_r[d] - G_s[d])`` for s < r
    (:func:`references._decay.decayed_scores`)."""
    Akk = beta[..., :, None] * strict_scores(k, k)
    return Akk, beta[..., None] * v, beta[..., None] * k * jnp.exp(G)


def kda_rank_one(k, v, beta):
    """KDA's token update as the rank-one term of :mod:`references._rank_one`: ``(a, m, c) = (beta k, k, v)``, so
    ``S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T``."""
    return beta[..., None] * k, k, v


def _chunk_step_wy(rule, scale, S, xs):
    """One chunk in WY form. S [B,H,K,V]; xs (q, k, v, g, *gates) each [B,H,C,...]; ``rule.wy_operands``
    gives the op's Akk and the right-hand sides of u and w."""
    q, k, v, g, *gates = xs
    C = q.shape[-2]
    G = jnp.cumsum(g, axis=-2)  # [B,H,C,K] (or [B,H,C,1]: one decay per head), log decay from the chunk start
    strict_scores = functools.partial(decayed_scores, G=G, inclusive=False)
    Akk, u_rhs, w_rhs = rule.wy_operands(k, v, G, strict_scores, *gates)
    eye = jnp.eye(C, dtype=q.dtype)
    Tinv = jax.scipy.linalg.solve_triangular(eye + Akk, jnp.broadcast_to(eye, Akk.shape), lower=True,
                                             unit_diagonal=True)
    u = _mm(Tinv, u_rhs)
    w = _mm(Tinv, w_rhs)
    delta = u - _mm(w, S)  # the new values (kda: beta_t (v_t - S'_t^T k_t))
    Aqk = scale * decayed_scores(q, k, G, inclusive=True)
    o = scale * _mm(q * jnp.exp(G), S) + _mm(Aqk, delta)
    G_last = G[..., -1, :]  # [B,H,K]
    kdec = k * jnp.exp(G_last[..., None, :] - G)
    S_new = jnp.exp(G_last)[..., :, None] * S + _mm(jnp.swapaxes(kdec, -1, -2), delta)
    return S_new, o


def _core(rule, tokens, h0, scale, chunk_size, method, offs=None):
    """Core recurrence on float64 jax arrays, H heads each with its own q, k (the value heads: q and k are
    already repeated to them); ``tokens`` = (q, k, v, g, *gates) [B,T,H,*], ``rule`` the op's
    :class:`DeltaRule` (its update). Returns (o [B,T,H,V], ht [N,H,K,V]); with packed offsets ``offs`` every
    sequence runs alone from its own state (state reset, chunks restarting at its start)."""
    return over_sequences(lambda *xs: _core_one(rule, xs[:-1], xs[-1], scale, chunk_size, method), offs,
                          tuple(tokens), h0)


def _core_one(rule, tokens, h0, scale, chunk_size, method):
    """The recurrence over tokens (q, k, v, g, *gates) [B,T,H,*] from h0 [B,H,K,V] (zeros when None):
    (o, ht)."""
    q, k, v, g, *gates = tokens
    B, T, H, K = q.shape
    V = v.shape[-1]
    S0 = jnp.zeros((B, H, K, V), q.dtype) if h0 is None else h0
    if method == "recurrent":
        return token_recurrence(scale, S0, q, *rule.rank_one(k, v, *gates), g, every=chunk_size)
    C = chunk_size
    pad = (-T) % C
    if pad:  # zero tokens (k = 0, g = 0) leave the state unchanged and are sliced off
        padt = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        tokens = tuple(map(padt, tokens))
    xs = tuple(_to_chunks(x, C) for x in tokens)
    body = jax.checkpoint(lambda S, x: _chunk_step_wy(rule, scale, S, x))
    ht, o = lax.scan(body, S0, xs)
    return _from_chunks(o)[:, :T], ht


# ------------------------------------------------------------------ the driver kda, gdn and gdn2 share
@dataclasses.dataclass(frozen=True)
class DeltaRule:
    """What a gated delta rule op brings to the shared driver (:func:`forward`, :func:`backward`) and core.

    ``check``: its op contract (``op_contract.check_kda``-like: ``(q, k, v, g, *gates, scale, initial_state,
    chunk_size, *, opts, A_log, dt_bias, do, dht, cu_seqlens) -> (dims, scale)``); ``options``: its options
    with fla's defaults filled in (unknown name: TypeError); ``preprocess``: its in-kernel options,
    ``(q, k, g, *gates, A_log, dt_bias, **opts) -> (q, k, g, *gates)``, g the log decay [B,T,HV,K] or, one per
    value head, [B,T,HV] (then broadcast over the K key channels: exact).

    ``gates``: the names of the op's per-token inputs after ``g`` (kda and gdn: ``beta``; gdn2: ``b``, ``w``),
    which name their gradients (``"d" + name``); ``wy_operands`` ``(k, v, G, strict_scores, *gates) -> (Akk, u_rhs,
    w_rhs)`` and ``rank_one`` ``(k, v, *gates) -> (a, m, c)`` are the op's update in the chunked WY form and
    token by token (:func:`kda_wy_operands`, :func:`kda_rank_one`: kda's, which gdn shares): the token update is
    ``S_t = S'_t + a (c - S'_t^T m)^T`` (:mod:`references._rank_one`, which differentiates it by hand; the map
    to ``(a, m, c)`` is differentiated by autodiff). A zero token (k = 0, g = 0) must give ``a = 0`` and so leave
    the state unchanged: packing and padding rely on it."""

    check: Callable
    options: Callable
    preprocess: Callable
    gates: tuple[str, ...] = ("beta",)
    wy_operands: Callable = kda_wy_operands
    rank_one: Callable = kda_rank_one


def _setup(op: DeltaRule, q, k, v, g, gates, initial_state, A_log, dt_bias, scale, chunk_size, method, kw,
           compute_dtype, do=None, dht=None, cu_seqlens=None):
    """The op contract (``op.check``) on the inputs as given, plus the reference's own arguments."""
    check_compute_dtype(compute_dtype)
    if method not in METHODS:
        raise ValueError(f"{method=} must be one of {METHODS}")
    opts = op.options(kw)
    q, k, v, g, initial_state, A_log, dt_bias, do, dht = as_arrays(q, k, v, g, initial_state, A_log, dt_bias, do,
                                                                   dht)
    gates = as_arrays(*gates)
    _, scale = op.check(q, k, v, g, *gates, scale, initial_state, chunk_size, opts=opts, A_log=A_log,
                        dt_bias=dt_bias, do=do, dht=dht, cu_seqlens=cu_seqlens)
    # fla's rules on kda's option combination (safe_gate's lower_bound range, allow_neg_eigval only with the
    # beta sigmoid) are the kernels' rules, written once in kernels_tpu.kda.check_options: the float64
    # maths here is defined without them, and safe_gate only chooses kernel numerics.
    if not use_gate(opts):
        A_log = dt_bias = None  # ignored by fla without the in-kernel gate
    return [q, k, v, g, *gates], opts, scale, A_log, dt_bias, offsets(cu_seqlens)


def use_gate(opts) -> bool:
    return bool(opts["use_gate_in_kernel"])


def _recurrence_inputs(op: DeltaRule, q, k, v, g, gates, A_log, dt_bias, opts):
    """The core recurrence's tokens (q, k, v, g [B,T,HV,K], *gates): the op's in-kernel options, then q and
    k repeated to v's HV value heads (grouped value heads; nothing when HV == H) and a per-head gate
    broadcast over the key channels."""
    q, k, g, *gates = op.preprocess(q, k, g, *gates, A_log, dt_bias, **opts)
    H, HV = q.shape[2], v.shape[2]
    if HV != H:
        q, k = (jnp.repeat(x, HV // H, axis=2) for x in (q, k))
    if g.ndim == 3:  # one decay per value head: [B,T,HV,1], broadcast over the key channels where it acts
        g = g[..., None]
    return (q, k, v, g, *gates)


def forward(op: DeltaRule, q, k, v, g, gates, scale, initial_state, output_final_state, A_log, dt_bias, cu_seqlens,
            method, chunk_size, compute_dtype, options):
    """``op``'s forward (see :func:`chunk_kda`), ``gates`` its per-token inputs after g (a tuple, named by
    ``op.gates``): ``(o, ht)`` float64 numpy, ``ht`` None unless ``output_final_state``."""
    arrs, opts, scale, A_log, dt_bias, offs = _setup(op, q, k, v, g, gates, initial_state, A_log, dt_bias, scale,
                                                     chunk_size, method, options, compute_dtype,
                                                     cu_seqlens=cu_seqlens)
    cd = compute_dtype
    with float64_cpu(cd == "float64"):
        q, k, v, g, *gates = (to_jax(x, cd) for x in arrs)
        h0, A_log, dt_bias = (to_jax(x, cd) for x in (initial_state, A_log, dt_bias))
        tokens = _recurrence_inputs(op, q, k, v, g, gates, A_log, dt_bias, opts)
        o, ht = _core_jit(op, tokens, h0, scale, chunk_size, method, offs)
        o = _to_np(o, cd)
        ht = _to_np(ht, cd) if output_final_state else None
    return o, ht


_core_jit = reference_jit(_core, static_argnums=(0, 3, 4, 5, 6))


def backward(op: DeltaRule, q, k, v, g, gates, do, dht, scale, initial_state, A_log, dt_bias, cu_seqlens, method,
             chunk_size, compute_dtype, options):
    """``op``'s gradients (see :func:`chunk_kda_bwd`), ``gates`` as in :func:`forward`: dict(dq, dk, dv, dg,
    one ``"d" + name`` per name of ``op.gates``, dh0, dA_log, ddt_bias)."""
    arrs, opts, scale, A_log, dt_bias, offs = _setup(op, q, k, v, g, gates, initial_state, A_log, dt_bias, scale,
                                                     chunk_size, method, options, compute_dtype, do, dht,
                                                     cu_seqlens)
    cd = compute_dtype
    with float64_cpu(cd == "float64"):
        primals = dict(zip(("q", "k", "v", "g", *op.gates), (to_jax(x, cd) for x in arrs)))
        for name, x in (("h0", initial_state), ("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None:
                primals[name] = to_jax(x, cd)
        do64 = to_jax(do, cd)
        B, T, H, K = primals["q"].shape
        HV, V = primals["v"].shape[2:]
        dht64 = jnp.zeros((num_states(B, offs), HV, K, V), cd) if dht is None else to_jax(dht, cd)

        out = _grads_jit(op, tuple(opts.items()), scale, chunk_size, method, offs, primals, do64, dht64)
        names = ("q", "k", "v", "g", *op.gates, "h0", "A_log", "dt_bias")
        return {"d" + n: (_to_np(out[n], cd) if n in out else None) for n in names}


def _grads(op: DeltaRule, opts: tuple, scale, chunk_size, method, offs, primals, do, dht):
    """The vjp of (o, ht) w.r.t. the raw ``primals`` (a dict; h0, A_log, dt_bias when given) at (do, dht);
    ``opts`` as (name, value) pairs, static (hashable) like the other arguments before ``primals``."""
    def loss_fn(p):
        tokens = _recurrence_inputs(op, p["q"], p["k"], p["v"], p["g"], [p[n] for n in op.gates], p.get("A_log"),
                                    p.get("dt_bias"), dict(opts))
        return _core(op, tokens, p.get("h0"), scale, chunk_size, method, offs)

    _, vjp = jax.vjp(loss_fn, primals)
    return vjp((do, dht))[0]


_grads_jit = reference_jit(_grads, static_argnums=(0, 1, 2, 3, 4, 5))  # compiled once per op, options and shapes


KDA = DeltaRule(check=check_kda, options=kda_options, preprocess=preprocess)


# ------------------------------------------------------------------ public
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *,
              A_log=None, dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64",
              **options):
    """KDA forward. Returns ``(o [B,T,HV,V], ht [N,HV,K,V])`` float64 numpy; ``ht`` is None unless
    ``output_final_state``.

    q, k [B,T,H,K]; v [B,T,HV,V], g [B,T,HV,K], beta [B,T,HV] (HV a multiple of H: grouped value heads).
    ``cu_seqlens``: N+1 offsets of packed sequences (B = 1); initial_state and ht are then [N,HV,K,V].
    ``options``: use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound (see the module docstring). ``compute_dtype="float32"``
    runs the same maths in float32 (results still returned as float64).
    """
    return forward(KDA, q, k, v, g, (beta,), scale, initial_state, output_final_state, A_log, dt_bias, cu_seqlens,
                   method, chunk_size, compute_dtype, options)


def chunk_kda_bwd(q, k, v, g, beta, do, dht=None, scale=None, initial_state=None, *, A_log=None,
                  dt_bias=None, cu_seqlens=None, method="chunk", chunk_size=64, compute_dtype="float64", **options):
    """Gradients of ``sum(o*do) + sum(ht*dht)`` w.r.t. the raw inputs given, in float64.

    Returns dict(dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias), each shaped as its input (dq, dk [B,T,H,K]
    with grouped value heads); ``dh0`` is None without ``initial_state``, ``dA_log`` / ``ddt_bias`` are None
    unless ``use_gate_in_kernel`` and that parameter is given. With ``cu_seqlens``, dht, initial_state and
    dh0 are [N,HV,K,V].
    """
    return backward(KDA, q, k, v, g, (beta,), do, dht, scale, initial_state, A_log, dt_bias, cu_seqlens, method,
                    chunk_size, compute_dtype, options)
