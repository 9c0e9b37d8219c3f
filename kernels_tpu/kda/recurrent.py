"""Fused-recurrent KDA on TPU: the decode path, one token at a time from a carried state, forward only.

Per head, with the state ``S`` of shape ``[K, V]`` (float32) and, for every token t::

    S'  = Diag(exp g_t) S                      the decay
    u   = S'^T e_t                             what the state holds along the erase key (kda: e_t = k_t)
    dlt = beta_t (v_t - u)                     the new values
    S   = S' + k_t dlt^T                       the delta-rule write; with the decay, one rounding per element
    o_t = S^T (scale q_t)

The erase key ``e_t`` is a second key operand for the ops whose erase direction is not the write's: GDN-2 erases
along ``b_t * k_t`` and writes ``w_t * v_t`` (:mod:`kernels_tpu.gdn2.recurrent` passes those, with beta = 1).

fla's ``fused_recurrent_kda`` / ``fused_recurrent_gated_delta_rule`` compute exactly these steps in float32,
and their PTX contracts the write into ``fma.rn.f32``: each state element rounds twice per token, once for the
decay and once for the write. The TPU's VPU has no fused multiply-add, so ``S' + k dlt^T`` written as a multiply
and an add rounds three times, an error that grows with every token (reports/ptx: this project's previous decode
path, kda's chunk forward, lost to fla by up to 1.59x on o and 1.17x on ht). Here the decayed state is an exact
product (:func:`kernels_tpu.eft.two_product`) and the write :func:`kernels_tpu.eft.fma` with that product's error
folded in: each state element rounds ONCE per token, from float32 adds and multiplies alone. Rounding once where
fla rounds twice matters where a state is one update from its h0 (a one-token decode step): there the two
kernels would otherwise make the same two roundings, and neither would be more accurate. The two reductions
(``u`` and ``o``) sum exact products (:func:`kernels_tpu.eft.dot_rows`): only the sums' own roundings remain, as
in fla's ``tl.sum``. The cost is VPU work, nearly 60 float32 operations per state element per token where fla's
kernel has five (docs/precision.md: measured in the compiled bundles). Every product here is either exact or has several uses,
so no compiler contracts one into an add: Pallas interpret mode on a CPU (whose XLA contracts a lone product into
the add that receives it) computes the bits a TPU computes.

Layout: :func:`kernels_tpu.kda.chunk.kernel_layout` (the in-kernel options as float32 jax ops, K and V
lane-padded, packed sequences in the rows of a :class:`kernels_tpu.varlen.ChunkWalk`, grouped value heads), in
float32, in steps of ``TOKENS`` tokens: grid ``(R, H, steps)``, the step axis sequential and carrying the state
in VMEM, a sequence's first step starting it from its h0 and its last writing its ht. A step walks its tokens
with a loop; the identity tokens that fill a sequence's last step (q = k = v = 0, g = 0, beta = 0) leave the
state bit for bit as it is: ``S exp(0) = S`` exactly (error 0), ``dlt = 0``, ``fma(k, 0, S') = S'``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels_tpu import eft
from kernels_tpu.common import (SUBLANES, BlockSizes, Walk, chunk_rows, final_state, iota, row_to_column, start_state,
                                walk_pass)
from kernels_tpu.call_config import Config
from kernels_tpu.kda.chunk import kernel_layout, setup

F32 = jnp.float32
TOKENS = SUBLANES
"""Tokens per grid step: one float32 tile of rows. Decode sequences are one to a few tokens, and every sequence
takes whole steps, so a small step wastes little on filling tokens."""
BLOCKS = BlockSizes(chunk_size=TOKENS, sub_chunk=TOKENS)


def _token_step(t, S, *, q_ref, k_ref, e_ref, v_ref, g_ref, beta_row, o_ref, scale: float):
    """One token of the recurrence (module doc) on the carried state S [K, V]; writes o's row t. ``e_ref``: the
    erase keys, None where they are the keys (kda, gdn)."""
    row = pl.ds(t, 1)
    q, k, g = (row_to_column(ref[row, :]) for ref in (q_ref, k_ref, g_ref))  # [K, 1]
    v = v_ref[row, :]  # [1, V]
    beta = jnp.sum(jnp.where(iota(beta_row.shape, 1) == t, beta_row, 0.0), axis=1, keepdims=True)  # [1, 1]
    k_parts = eft.split(k)
    decayed, decay_err = eft.two_product(S, jnp.exp(g))  # S' exactly, as its rounding and the rest
    if e_ref is None:
        held = eft.dot_rows(decayed, k, axis=0, y_parts=k_parts)
    else:
        held = eft.dot_rows(decayed, row_to_column(e_ref[row, :]), axis=0)
    dlt = beta * (v - held)
    S = eft.fma(k, dlt, decayed, a_parts=k_parts, c_err=decay_err)  # S' + k dlt^T, rounded once
    o_ref[row, :] = eft.dot_rows(S, q * scale, axis=0)
    return S


def _fwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, *refs, cfg: Config, walk: Walk,
                has_h0: bool, has_e: bool):
    refs = list(refs)
    e_ref = refs.pop(0) if has_e else None
    h0_ref = refs.pop(0) if has_h0 else None
    o_ref, ht_ref, S_scr = refs
    begins, ends = walk.edges(edge_ref)
    start_state(S_scr, h0_ref, begins)
    step = functools.partial(_token_step, q_ref=q_ref, k_ref=k_ref, e_ref=e_ref, v_ref=v_ref, g_ref=g_ref,
                             beta_row=beta_ref[...], o_ref=o_ref, scale=cfg.scale)
    S = lax.fori_loop(0, TOKENS, step, S_scr[...])
    S_scr[...] = S

    @pl.when(ends)
    def _final_state():
        ht_ref[...] = S


@functools.partial(jax.jit, static_argnums=(0,))
def recurrent_pass(cfg: Config, q, k, v, g, beta, h0, e=None):
    """Head-major float32 kernel rows: q, k, g [R,H,T,K]; v [R,H,T,V]; beta [R,H,NT,1,TOKENS]; h0 [N,H,K,V] or
    None; e [R,H,T,K], the erase keys, or None (the keys). Returns o [R,H,T,V] and ht [N,H,K,V], float32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    walk = Walk(T // TOKENS)
    kspec = pl.BlockSpec((None, None, TOKENS, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, TOKENS, V), walk.chunk_map)
    bspec = pl.BlockSpec((None, None, None, 1, TOKENS), walk.chunk_states_map)
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    optional = [(x, spec) for x, spec in ((e, kspec), (h0, sspec)) if x is not None]
    in_specs = [kspec, kspec, vspec, kspec, bspec] + [spec for _, spec in optional]
    args = (q, k, v, g, beta) + tuple(x for x, _ in optional)
    o, ht = walk_pass(
        functools.partial(_fwd_kernel, cfg=cfg, walk=walk, has_h0=h0 is not None, has_e=e is not None),
        tables=cfg.walk.tables(),
        grid=(R, H, walk.NT), in_specs=in_specs, out_specs=[vspec, sspec],
        out_shape=[jax.ShapeDtypeStruct((R, H, T, V), F32), jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="kda_fused_recurrent_fwd",
    )(*args)
    return o, ht


@functools.partial(jax.jit, static_argnums=(0, 9))
def _run(cfg: Config, q, k, v, g, beta, initial_state, A_log, dt_bias, opts_items: tuple):
    pad, (qh, kh, vh, gh, beta_h, h0) = kernel_layout(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias,
                                                      dict(opts_items))
    qh, kh, vh, gh = (x.astype(F32) for x in (qh, kh, vh, gh))
    o, ht = recurrent_pass(cfg, qh, kh, vh, gh, chunk_rows(beta_h.astype(F32), TOKENS), h0)
    return pad.unpad_values(cfg.walk.to_tokens(jnp.swapaxes(o, 1, 2))).astype(q.dtype), pad.unpad_state(ht)


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        interpret=None, *, cu_seqlens=None, **options):
    """KDA one token at a time (fla's ``fused_recurrent_kda``), forward only: (o, ht or None).

    Args as :func:`kernels_tpu.kda.chunk_kda` (q, k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV,K]; beta [B,T,HV];
    initial_state [N,HV,K,V] (float32, or a state cache's bf16/fp16: ht comes back in its dtype,
    kernels_tpu.common.final_state); cu_seqlens; fla's in-kernel options), without a chunk size or an MXU
    model: the kernel has no chunks and no dots. o is rounded once from float32 to q's dtype, as fla's."""
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, beta, scale, initial_state, TOKENS, interpret, None,
                                       cu_seqlens, options, blocks=BLOCKS)
    o, ht = _run(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, opts)
    return o, final_state(ht if output_final_state else None, initial_state)
