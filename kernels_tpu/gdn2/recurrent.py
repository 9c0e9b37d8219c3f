"""Fused-recurrent GDN-2 (Gated DeltaNet-2) on TPU: the decode path, one token at a time, forward only.

Per value head, with the state ``S`` of shape ``[K, V]`` (float32) and, for every token t::

    S'  = Diag(exp g_t) S                      the decay, per key channel (kda's)
    e_t = b_t * k_t                            the erase key: b_t erases per key channel
    dlt = w_t * v_t - S'^T e_t                 the new values: w_t writes per value channel
    S   = S' + k_t dlt^T
    o_t = S^T (scale q_t)

This is kda's fused-recurrent kernel (:mod:`kernels_tpu.kda.recurrent`) given a second key operand: kda erases and
writes along the same key (``e_t = k_t``) and scales the new values by one beta; GDN-2 erases along ``b_t * k_t``
and writes ``w_t * v_t``, so the kernel takes ``e_t`` as its erase keys, ``w_t * v_t`` as its values and beta = 1
(``1 * x`` is exact). The two products are rounded to float32 once each, before the kernel, exactly where fla's
``fused_recurrent_gdn2`` rounds them (``b_bk = b_b * b_k``, ``b_w * b_v``, after q and k are normalised and
before the decay). Everything else is kda's kernel: each state element rounded once per token (the decay's exact
product folded into the write, where fla's contracted ``fma.rn.f32`` rounds twice), ``u`` and ``o`` sums of exact
products. No dots, no MXU work.

Grouped value heads (``v`` with HV heads, a multiple of q's H; fla's ``fused_recurrent_gdn2`` takes them, its chunk
kernels do not): value head j reads q/k head j // (HV // H), so q and k are repeated to HV heads first (exact),
and the contract (:func:`op_contract.check_gdn2`) checks the call as that ungrouped one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_tpu.common import check_limits, chunk_rows, final_state
from kernels_tpu.call_config import head_major, make_config
from kernels_tpu.delta_rule import preprocess
from kernels_tpu.kda.chunk import check_options, kernel_layout
from kernels_tpu.kda.recurrent import BLOCKS, TOKENS, recurrent_pass
from kernels_tpu.varlen import Packing
from op_contract import check_gdn2, gdn2_options

F32 = jnp.float32
_NO_OPTIONS = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False, safe_gate=False, lower_bound=None)
"""kda's options, all off: the layout's own pass of them once gdn2's have been applied (they are kda's functions)."""


def _grouped(q, k, v):
    """q and k repeated to v's value heads when HV is a multiple of H (exact); as given otherwise, for the
    contract to refuse."""
    H, HV = q.shape[2], v.shape[2]
    if HV == H or HV % H:
        return q, k
    return jnp.repeat(q, HV // H, axis=2), jnp.repeat(k, HV // H, axis=2)


@functools.partial(jax.jit, static_argnums=(0, 10))
def _run(cfg, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts_items: tuple):
    opts = dict(opts_items)
    q, k, g, _ = preprocess(q, k, g, jnp.zeros(q.shape[:3], F32), A_log, dt_bias, {**_NO_OPTIONS, **opts})
    k = k.astype(F32)
    erase = b.astype(F32) * k  # fla's b_bk
    written = w.astype(F32) * v.astype(F32)  # fla's b_w * b_v
    pad, (qh, kh, vh, gh, beta_h, h0) = kernel_layout(cfg, q, k, written, g, jnp.ones(v.shape[:3], F32),
                                                      initial_state, None, None, _NO_OPTIONS)
    eh = head_major(cfg.walk.to_rows(pad.keys(erase)))
    qh, kh, vh, gh, eh = (x.astype(F32) for x in (qh, kh, vh, gh, eh))
    o, ht = recurrent_pass(cfg, qh, kh, vh, gh, chunk_rows(beta_h.astype(F32), TOKENS), h0, eh)
    return pad.unpad_values(cfg.walk.to_tokens(jnp.swapaxes(o, 1, 2))), pad.unpad_state(ht)


def fused_recurrent_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False,
                         interpret=None, *, cu_seqlens=None, **options):
    """GDN-2 one token at a time (fla's ``fused_recurrent_gdn2``), forward only: (o, ht or None).

    Args (as fla's): q, k [B,T,H,K]; v, w [B,T,HV,V]; g, b [B,T,HV,K]; scale (K**-0.5 when None);
    initial_state [N,HV,K,V] float32; cu_seqlens (N+1 offsets, B = 1); options use_qk_l2norm_in_kernel,
    use_gate_in_kernel with A_log [HV] and dt_bias [HV*K], lower_bound, safe_gate (fla's numerics switch of its
    chunk kernels: checked, no effect). o is rounded once from float32 to q's dtype, as fla's."""
    options = dict(options)
    A_log, dt_bias = options.pop("A_log", None), options.pop("dt_bias", None)
    opts = gdn2_options(options)
    qg, kg = _grouped(q, k, v)
    dims, scale = check_gdn2(qg, kg, v, g, b, w, scale, initial_state, TOKENS, opts=opts, A_log=A_log,
                             dt_bias=dt_bias, cu_seqlens=cu_seqlens)
    check_options(opts)
    check_limits(qg, dims)
    if not opts["use_gate_in_kernel"]:
        A_log = dt_bias = None  # ignored without the in-kernel gate, as in fla
    cfg = make_config(scale, BLOCKS, interpret, None, q.dtype, Packing.of(cu_seqlens, q))
    o, ht = _run(cfg, qg, kg, v, g, b, w, initial_state, A_log, dt_bias, tuple(sorted(opts.items())))
    return o.astype(q.dtype), final_state(ht if output_final_state else None, initial_state)
