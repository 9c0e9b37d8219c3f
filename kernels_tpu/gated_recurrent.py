"""Fused-recurrent simple_gla and gla on TPU: the decode path, one token at a time from a carried state, forward
and backward (fla's ``fused_recurrent_simple_gla`` and ``fused_recurrent_gla``).

Per head, with the state ``S`` of shape ``[K, V]`` (float32) and, for every token t::

    S   = Diag(exp G_t) S + k_t v_t^T          the decay and the write; one rounding per element
    o_t = S^T (scale q_t)
    ht  = S_T

``G_t`` [K] is the token's total log decay, formed in float32 before the kernel: gla's per-channel ``g_t``, or
simple_gla's scalar ``g_t`` broadcast over K, plus a constant ``g_gamma`` ([] one for every head, [H] per head,
[H,K] per head and key channel, broadcast); both gates at once add (``G = g + g_gamma``, one float32 rounding of
the log, where fla's kernels add them too). A missing gate is 0 (no decay).

Rounding (the discipline of :mod:`kernels_tpu.kda.recurrent`): fla's kernels compute ``h = h * exp(g)`` then
``h += k v^T``, which its PTX contracts into ``fma.rn.f32``: two roundings per state element per token. The TPU's
VPU has no fused multiply-add, so here the decayed state is an exact product (:func:`kernels_tpu.eft.two_product`)
and the write :func:`kernels_tpu.eft.fma` with that product's error folded in: each state element rounds ONCE per
token, from float32 adds and multiplies alone. o's reduction sums exact products (:func:`kernels_tpu.eft.dot_rows`):
only the sum's own roundings remain, as in fla's ``tl.sum``; o is rounded once, from float32 to q's dtype, outside
the kernel (as fla stores it).

Backward (a ``jax.custom_vjp``, both passes Pallas): with ``dS_t`` the gradient of the loss with respect to the
state after token t (``dS_T = dht``)::

    dS_t    = Diag(exp G_{t+1}) dS_{t+1} + scale q_t do_t^T      the decay folded into the write: one rounding
    dq_t    = scale (S_t do_t)
    dk_t    = dS_t v_t,        dv_t = dS_t^T k_t
    dG_t[c] = exp(G_t[c]) sum_v S_{t-1}[c, v] dS_t[c, v]          (d/dG_t of Diag(exp G_t) S_{t-1})
    dh0     = Diag(exp G_1) dS_1                                   (the exact product, rounded once)

The gate gradient is the direct form, not fla's reverse cumulative sum of ``q dq - k dk`` (whose terms cancel
where the state is large against its updates): each step's states ``S_{t-1}`` are recomputed, bit for bit as the
forward computed them, from the checkpoint the forward wrote at the step's start (``hs``: one state per grid
step). All reductions sum exact products. ``dG`` is then reduced by autodiff of the float32 gate sum to each
gate's shape: simple_gla's ``dg`` sums K, ``dg_gamma`` sums the tokens (and K, and H for a scalar).

Layout: K and V lane-padded (:class:`kernels_tpu.common.HeadPadding`; padded channels have k = q = 0 and G = 0),
the packed sequences in the rows of a :class:`kernels_tpu.varlen.ChunkWalk`, head-major, float32 (fp16 widened:
exact), in steps of ``TOKENS`` tokens: grid ``(R, H, steps)``, the step axis sequential and carrying the state in
VMEM, a sequence's first step starting it from its h0 and its last writing its ht (the backward walks in reverse,
from dht to dh0). The identity tokens that fill a sequence's last step (q = k = v = 0, G = 0), and the one step an
empty sequence takes, leave the state as it is: ``S exp(0) = S`` exactly (error 0), ``fma(0, 0, S) = S``; in the
backward they come before the sequence's real tokens, where ``dS = dht`` exactly (so an empty sequence's dh0 is its
dht). Their gradients are discarded. Every product here is either exact or has several uses, so no compiler
contracts one into an add: Pallas interpret mode on a CPU computes the bits a TPU computes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from op_contract import check_gla, check_simple_gla
from kernels_tpu import eft
from kernels_tpu.common import (SUBLANES, BlockSizes, HeadPadding, Walk, check_limits, column_to_row, final_state,
                                row_to_column, start_state, walk_pass)
from kernels_tpu.call_config import Config, head_major, make_config
from kernels_tpu.varlen import Packing

F32 = jnp.float32
TOKENS = SUBLANES
"""Tokens per grid step: one float32 tile of rows (as kda's decode kernel)."""
BLOCKS = BlockSizes(chunk_size=TOKENS, sub_chunk=TOKENS)


# ============================================================ in-kernel maths
def _advance(S, k, v, g):
    """One token's state update: ``Diag(exp g) S + k v^T`` rounded once per element (k, g [K,1]; v [1,V])."""
    decayed, decay_err = eft.two_product(S, jnp.exp(g))
    return eft.fma(k, v, decayed, c_err=decay_err)


def _columns(row, *refs):
    return tuple(row_to_column(ref[row, :]) for ref in refs)


def _fwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, *refs, scale: float, walk: Walk, has_h0: bool,
                save_states: bool):
    refs = list(refs)
    h0_ref = refs.pop(0) if has_h0 else None
    o_ref, ht_ref = refs[:2]
    hs_ref = refs[2] if save_states else None
    S_scr = refs[-1]
    begins, ends = walk.edges(edge_ref)
    start_state(S_scr, h0_ref, begins)
    S0 = S_scr[...]
    if save_states:
        hs_ref[...] = S0  # the step's starting state: the backward recomputes the step from it

    def step(t, S):
        row = pl.ds(t, 1)
        q, k, g = _columns(row, q_ref, k_ref, G_ref)
        S = _advance(S, k, v_ref[row, :], g)
        o_ref[row, :] = eft.dot_rows(S, q * scale, axis=0)
        return S

    S = lax.fori_loop(0, TOKENS, step, S0)
    S_scr[...] = S

    @pl.when(ends)
    def _final_state():
        ht_ref[...] = S


def _bwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, hs_ref, do_ref, dht_ref,
                dq_ref, dk_ref, dv_ref, dG_ref, dh0_ref, P_scr, E_scr, Ss_scr, *, scale: float, walk: Walk):
    """Reverse walk. The carried cotangent is ``P + E`` exactly: ``Diag(exp G_{t+1}) dS_{t+1}`` as its rounding
    and the rest, folded into the next write."""
    begins, ends = walk.edges(edge_ref)  # reverse walk: a sequence begins at its last step
    start_state(P_scr, dht_ref, begins)

    @pl.when(begins)
    def _no_error():
        E_scr[...] = jnp.zeros(E_scr.shape, F32)

    def recompute(t, S):  # the forward's states, bit for bit: Ss[j] is the state before token j of the step
        row = pl.ds(t, 1)
        k, g = _columns(row, k_ref, G_ref)
        S = _advance(S, k, v_ref[row, :], g)
        Ss_scr[t + 1] = S
        return S

    S0 = hs_ref[...]
    Ss_scr[0] = S0
    lax.fori_loop(0, TOKENS, recompute, S0)

    def step(i, carry):
        P, E = carry
        t = TOKENS - 1 - i
        row = pl.ds(t, 1)
        q, k, g = _columns(row, q_ref, k_ref, G_ref)
        v, do = v_ref[row, :], do_ref[row, :]
        dS = eft.fma(q * scale, do, P, c_err=E)
        dq_ref[row, :] = column_to_row(eft.dot_rows(Ss_scr[t + 1], do, axis=1) * scale)
        dk_ref[row, :] = column_to_row(eft.dot_rows(dS, v, axis=1))
        dv_ref[row, :] = eft.dot_rows(dS, k, axis=0)
        decay = jnp.exp(g)
        dG_ref[row, :] = column_to_row(decay * eft.dot_rows(Ss_scr[t], dS, axis=1))
        return eft.two_product(dS, decay)

    P, E = lax.fori_loop(0, TOKENS, step, (P_scr[...], E_scr[...]))
    P_scr[...] = P
    E_scr[...] = E

    @pl.when(ends)
    def _initial_state_grad():
        dh0_ref[...] = P + E


# ============================================================ pallas_call wrappers
def _specs(walk: Walk, K: int, V: int):
    kspec = pl.BlockSpec((None, None, TOKENS, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, TOKENS, V), walk.chunk_map)
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    hspec = pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map)
    return kspec, vspec, sspec, hspec


@functools.partial(jax.jit, static_argnums=(0, 6))
def recurrent_pass(cfg: Config, q, k, v, G, h0, save_states: bool):
    """Head-major float32 kernel rows: q, k, G [R,H,T,K]; v [R,H,T,V]; h0 [N,H,K,V] or None. Returns o [R,H,T,V],
    ht [N,H,K,V] and, with ``save_states``, each step's starting state hs [R,H,steps,K,V] (else None)."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    walk = Walk(T // TOKENS)
    kspec, vspec, sspec, hspec = _specs(walk, K, V)
    has_h0 = h0 is not None
    out_specs = [vspec, sspec] + ([hspec] if save_states else [])
    out_shape = [jax.ShapeDtypeStruct((R, H, T, V), F32), jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)]
    if save_states:
        out_shape.append(jax.ShapeDtypeStruct((R, H, walk.NT, K, V), F32))
    outs = walk_pass(
        functools.partial(_fwd_kernel, scale=cfg.scale, walk=walk, has_h0=has_h0, save_states=save_states),
        tables=cfg.walk.tables(), grid=(R, H, walk.NT),
        in_specs=[kspec, kspec, vspec, kspec] + ([sspec] if has_h0 else []), out_specs=out_specs,
        out_shape=out_shape, state=(K, V), interpret=cfg.interpret, name="gated_fused_recurrent_fwd",
    )(q, k, v, G, *((h0,) if has_h0 else ()))
    return outs[0], outs[1], (outs[2] if save_states else None)


@functools.partial(jax.jit, static_argnums=(0,))
def _bwd_impl(cfg: Config, q, k, v, G, hs, do, dht):
    """Reverse pass: dq, dk, dG [R,H,T,K], dv [R,H,T,V], dh0 [N,H,K,V], float32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    walk = Walk(T // TOKENS, reverse=True)
    kspec, vspec, sspec, hspec = _specs(walk, K, V)
    outs = walk_pass(
        functools.partial(_bwd_kernel, scale=cfg.scale, walk=walk), tables=cfg.walk.tables(),
        grid=(R, H, walk.NT), in_specs=[kspec, kspec, vspec, kspec, hspec, vspec, sspec],
        out_specs=[kspec, kspec, vspec, kspec, sspec],
        out_shape=[jax.ShapeDtypeStruct(x.shape, F32) for x in (q, k, v, G)]
        + [jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), scratch=(pltpu.VMEM((K, V), F32), pltpu.VMEM((TOKENS + 1, K, V), F32)),
        interpret=cfg.interpret, name="gated_fused_recurrent_bwd",
    )(q, k, v, G, hs, do, dht)
    return tuple(outs)


# ============================================================ custom_vjp core
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg: Config, q, k, v, G, h0):
    o, ht, _ = recurrent_pass(cfg, q, k, v, G, h0, False)
    return o, ht


def _core_fwd(cfg: Config, q, k, v, G, h0):
    o, ht, hs = recurrent_pass(cfg, q, k, v, G, h0, True)
    return (o, ht), (q, k, v, G, h0, hs)


def _core_bwd(cfg: Config, res, cts):
    q, k, v, G, h0, hs = res
    do, dht = cts
    dq, dk, dv, dG, dh0 = _bwd_impl(cfg, q, k, v, G, hs, do.astype(F32), dht.astype(F32))
    return dq, dk, dv, dG, None if h0 is None else dh0


_core.defvjp(_core_fwd, _core_bwd)


# ============================================================ layout and public API
def total_log_decay(q, g, g_gamma, per_channel: bool):
    """G [B,T,H,K] float32: g (gla's [B,T,H,K], or simple_gla's [B,T,H] broadcast over K) plus g_gamma ([], [H] or
    [H,K], broadcast), or 0 where a gate is missing. Differentiable: autodiff sums dG back to each gate's shape."""
    B, T, H, K = q.shape
    G = None
    if g is not None:
        G = g.astype(F32) if per_channel else g.astype(F32)[..., None]
    if g_gamma is not None:
        gamma = g_gamma.astype(F32)
        gamma = gamma[:, None] if gamma.ndim == 1 else gamma  # [H] -> [H,1]; [] and [H,K] align at the end
        G = gamma if G is None else G + gamma
    return jnp.zeros((B, T, H, K), F32) if G is None else jnp.broadcast_to(G, (B, T, H, K))


@functools.partial(jax.jit, static_argnums=(0, 7))
def _run(cfg: Config, q, k, v, g, g_gamma, initial_state, per_channel: bool):
    G = total_log_decay(q, g, g_gamma, per_channel)
    pad = HeadPadding.of(q, v)
    rows = cfg.walk.to_rows
    qh, kh, vh, Gh = (head_major(rows(x)).astype(F32)
                      for x in (pad.keys(q), pad.keys(k), pad.values(v), pad.keys(G)))
    h0 = None if initial_state is None else pad.state(initial_state.astype(F32))
    o, ht = _core(cfg, qh, kh, vh, Gh, h0)
    o = pad.unpad_values(cfg.walk.to_tokens(jnp.swapaxes(o, 1, 2))).astype(q.dtype)
    return o, pad.unpad_state(ht)


def _call(check, per_channel, q, k, v, g, g_gamma, scale, initial_state, output_final_state, interpret,
          cu_seqlens):
    dims, scale = check(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens=cu_seqlens)
    check_limits(q, dims)
    cfg = make_config(scale, BLOCKS, interpret, None, q.dtype, Packing.of(cu_seqlens, q))
    o, ht = _run(cfg, q, k, v, g, g_gamma, initial_state, per_channel)
    return o, final_state(ht if output_final_state else None, initial_state)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, interpret=None, *, cu_seqlens=None):
    """simple_gla one token at a time (fla's ``fused_recurrent_simple_gla``), differentiable (jax.vjp) through
    Pallas kernels: (o [B,T,H,V] in q's dtype, ht [N,H,K,V] float32 or None).

    q, k [B,T,H,K], v [B,T,H,V] (bf16, fp16, fp32; any K, V); g [B,T,H] per-token log decay, g_gamma [] or [H]
    constant log decay, both (they add), or neither (no decay); initial_state [N,H,K,V] float32; cu_seqlens:
    N+1 static offsets of packed sequences (B = 1; empty sequences allowed: ht = h0)."""
    return _call(check_simple_gla, False, q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                 interpret, cu_seqlens)


def fused_recurrent_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                        interpret=None, *, cu_seqlens=None):
    """gla one token at a time (fla's ``fused_recurrent_gla``, whose ``gk`` is ``g`` here), differentiable:
    as :func:`fused_recurrent_simple_gla` with g [B,T,H,K] per-channel and g_gamma [], [H] or [H,K] (at least
    one gate)."""
    return _call(check_gla, True, q, k, v, g, g_gamma, scale, initial_state, output_final_state, interpret,
                 cu_seqlens)
