"""Chunked gated delta rule (GDN) on TPU: kda's chunk kernels, with GDN's scalar decay on every key channel.

Per value head, with S [K, V]::

    S'_t = exp(g_t) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_tᵀ k_t)ᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

GDN is KDA whose per-channel decay ``Diag(exp g_t)`` is one scalar per token and head: the same chunk
recurrence, WY form (``Akk``, its unit-lower inverse, ``w``, ``u``), masks and precision policy. So this
module adds no kernel of its own. It applies GDN's own in-kernel gate with float32 jax ops (:func:`log_decay`),
broadcasts the log decay over the K channels (exact), and runs :func:`kernels_tpu.kda.chunk_kda`, whose
Pallas forward and backward kernels do the work. ``dg`` is the sum over K of kda's per-channel gradient,
taken by autodiff of the broadcast in float32. The in-kernel l2norm and beta options are kda's, the same
functions (fla shares them between ``chunk_kda`` and ``chunk_gated_delta_rule``).

The cost of sharing: a kernel written for the scalar gate would skip the per-channel sub-chunk rescaling,
and read g once per token rather than K times. The numerics are kda's, which the gate already holds to fla.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_tpu import kda
from op_contract import check_gdn, gdn_options

F32 = jnp.float32
SHARED_OPTIONS = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")
"""GDN options that are kda's own (same function in fla): passed through to the kda kernels."""


@functools.partial(jax.jit, static_argnums=(3,))
def log_decay(g, A_log, dt_bias, gate_in_kernel: bool):
    """The per-token log decay [B,T,HV,K]: ``g`` itself, or fla's in-kernel GDN gate
    ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` (A_log, dt_bias [HV]) in float32; broadcast over K by the
    caller. Differentiable in g, A_log and dt_bias."""
    g = g.astype(F32)
    if gate_in_kernel:
        x = g if dt_bias is None else g + dt_bias.astype(F32)
        g = -jnp.exp(A_log.astype(F32)) * jax.nn.softplus(x)
    return g


def _kda_call(fn, q, k, v, g, beta, scale, initial_state, checked_chunk_size, cu_seqlens, options, **kernel_args):
    """``fn`` (a kda public function) on GDN's inputs: the contract checked as GDN's (with ``checked_chunk_size``), the gate applied and broadcast to [B,T,HV,K], the shared options passed through;
    ``kernel_args`` are the kda function's own (interpret, its chunk size, ...)."""
    options = dict(options)
    A_log, dt_bias = options.pop("A_log", None), options.pop("dt_bias", None)
    opts = gdn_options(options)
    check_gdn(q, k, v, g, beta, scale, initial_state, checked_chunk_size, opts=opts, A_log=A_log, dt_bias=dt_bias,
              cu_seqlens=cu_seqlens)
    gate = log_decay(g, A_log, dt_bias, bool(opts["use_gate_in_kernel"]))
    G = jnp.broadcast_to(gate[..., None], (*gate.shape, q.shape[-1]))
    kw = {} if cu_seqlens is None else dict(cu_seqlens=cu_seqlens)
    return fn(q, k, v, G, beta, scale=scale, initial_state=initial_state, **kw, **kernel_args,
              **{n: opts[n] for n in SHARED_OPTIONS})


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           chunk_size=64, interpret=None, mxu_model=None, *, cu_seqlens=None, **options):
    """Chunked GDN, differentiable (jax.vjp / jax.grad): the gate's float32 jax ops, then kda's custom-VJP
    Pallas kernels.

    Args (as fla.ops.gated_delta_rule.chunk_gated_delta_rule):
      q, k: [B, T, H, K]; v: [B, T, HV, V] (bf16, fp16 or fp32), HV a multiple of H (grouped value heads);
        any K, V.
      g: [B, T, HV] log decay (<= 0), or the raw gate input with ``use_gate_in_kernel``.
      beta: [B, T, HV] (or raw logits with ``use_beta_sigmoid_in_kernel``).
      scale: K**-0.5 when None.
      initial_state: [N, HV, K, V] float32, optional (N = B, or the number of packed sequences).
      output_final_state: also return ht [N, HV, K, V] in initial_state's dtype (float32 without one; kda's).
      chunk_size, interpret, mxu_model, cu_seqlens: as :func:`kernels_tpu.kda.chunk_kda`.
      options: use_qk_l2norm_in_kernel, use_gate_in_kernel with A_log [HV] and dt_bias [HV] (optional),
        use_beta_sigmoid_in_kernel, allow_neg_eigval.

    Returns:
      (o [B, T, HV, V] in q's dtype, ht [N, HV, K, V] float32 or None).
    """
    return _kda_call(kda.chunk_kda, q, k, v, g, beta, scale, initial_state, chunk_size, cu_seqlens, options,
                     chunk_size=chunk_size, interpret=interpret, mxu_model=mxu_model,
                     output_final_state=output_final_state)


def chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               chunk_size=64, interpret=None, mxu_model=None, *, cu_seqlens=None, dot_precision=None,
                               **options):
    """Forward only: (o, ht or None), kda's forward kernel without the VJP machinery. Args as above, plus
    ``dot_precision`` as :func:`kernels_tpu.kda.chunk_kda_fwd` takes it (the decode path: ``HIGHEST``)."""
    return _kda_call(kda.chunk_kda_fwd, q, k, v, g, beta, scale, initial_state, chunk_size, cu_seqlens, options,
                     chunk_size=chunk_size, interpret=interpret, mxu_model=mxu_model,
                     output_final_state=output_final_state, dot_precision=dot_precision)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                     interpret=None, *, cu_seqlens=None, **options):
    """GDN one token at a time (fla's ``fused_recurrent_gated_delta_rule``), forward only: (o, ht or None). The
    gate as above, then kda's fused-recurrent kernel (:func:`kernels_tpu.kda.fused_recurrent_kda`: its write
    rounded once per state element, as fla's contracted one). Args as :func:`chunk_gated_delta_rule`, without a
    chunk size or an MXU model."""
    return _kda_call(kda.fused_recurrent_kda, q, k, v, g, beta, scale, initial_state, kda.recurrent.TOKENS,
                     cu_seqlens, options, interpret=interpret, output_final_state=output_final_state)


def chunk_gated_delta_rule_bwd(q, k, v, g, beta, do, dht=None, scale=None, initial_state=None, chunk_size=64,
                               interpret=None, mxu_model=None, *, cu_seqlens=None, **options):
    """Backward of ``loss = sum(o * do) + sum(ht * dht)``: dict(dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias),
    each in its input's dtype (dg [B,T,HV] float32); dh0 is None without initial_state, dA_log and ddt_bias
    None unless use_gate_in_kernel and given. Args as :func:`chunk_gated_delta_rule`."""
    options = dict(options)
    params = {n: options.pop(n) for n in ("A_log", "dt_bias") if options.get(n) is not None}
    opts = gdn_options(options)
    check_gdn(q, k, v, g, beta, scale, initial_state, chunk_size, opts=opts, do=do, dht=dht,
              cu_seqlens=cu_seqlens, **params)
    if not opts["use_gate_in_kernel"]:
        params = {}  # ignored without the in-kernel gate, as in fla
    primals = dict(q=q, k=k, v=v, g=g, beta=beta, **params, **({} if initial_state is None else
                                                                 dict(h0=initial_state)))

    def f(p):
        o, ht = chunk_gated_delta_rule(p["q"], p["k"], p["v"], p["g"], p["beta"], scale, p.get("h0"), True,
                                       chunk_size, interpret, mxu_model, cu_seqlens=cu_seqlens,
                                       A_log=p.get("A_log"), dt_bias=p.get("dt_bias"), **opts)
        return o, ht

    (o, ht), vjp = jax.vjp(f, primals)
    dht = jnp.zeros_like(ht) if dht is None else jnp.asarray(dht, F32)
    grads = vjp((jnp.asarray(do).astype(o.dtype), dht))[0]
    names = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
    return {"d" + n: grads.get(n) for n in names}
