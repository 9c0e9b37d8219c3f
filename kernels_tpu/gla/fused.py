"""Fused GLA kernels for a per-head constant gate ``g_gamma [H]``.

Forward: ONE pallas_call, grid ``(B, H, NV, NT)``, time last and "arbitrary".
The state ``S [K, BV]`` lives in an f32 VMEM scratch across the time axis; the
intra-chunk attention is recomputed inline per chunk, never written to HBM.
With the in-chunk position ``i`` (0-based) and ``gamma <= 0``:

    b_i = gamma * (i + 1)                               (in-chunk cumulative gate)
    D_ij = exp(gamma * (i - j)) for j <= i, else 0      (exponent masked before exp)
    o    = scale * [ (q * exp(b)) @ S + ((q k^T) * D) @ v ]
    S'   = exp(gamma * C) * S + (k * exp(gamma * (C-1-j)))^T @ v

Every exponent is <= 0 (relative to the chunk's last position for k, to the
chunk start for q), so nothing overflows at any chunk size. K is whole in the
block; the contractions over K (``q k^T`` and ``q @ S``) are an explicit
reduction over 128-wide K tiles accumulated in f32, so any K multiple of 128
is exact. V is tiled (parallel axis); each V tile writes its own o columns.

Backward: ONE pallas_call, grid ``(B, H, NT)``, time last and "arbitrary",
walking chunks in reverse through the index maps (``n = NT-1-t``; no array is
flipped in HBM). ``dH`` (gradient of the state after chunk n) is an f32 VMEM
scratch initialised from dht. Per chunk, with ``S`` the state before it (a
forward residual), ``A = (q k^T) * D`` and ``dA = scale (do v^T) * D``:

    dv = scale A^T do + (k * exp(gamma (C-1-j))) @ dH
    dq = dA @ k + scale exp(b) * (do @ S^T)
    dk = dA^T @ q + exp(gamma (C-1-j)) * (v @ dH^T)
    dH <- exp(gamma C) dH + scale (q * exp(b))^T @ do     (dh0 after chunk 0)

Packed sequences (``cu_seqlens``) lie chunk-aligned in one kernel row
(:class:`kernels_tpu.varlen.ChunkWalk`): the state (forward) and its gradient
(backward) restart at each sequence's edge chunk. An empty sequence's chunk
holds no real token: it leaves the carried state, the state gradient and the
dg_gamma accumulator unchanged (each chunk's real tokens are in SMEM), since the
constant gate must not decay them there. A chunk that a sequence (or T) ends *inside* still decays over its
padding, so that padding is exact only without a final state (no ht, no dht;
``kernels_tpu.gla.api`` dispatches such calls to the chunk path).

dg_gamma is real, and computed directly as d/dgamma of every exponent times
what it multiplies (more accurate than summing ``q*dq - k*dk``, whose
position-weighted halves cancel): per chunk,

    sum_ij (i-j) A_ij dA_raw_ij + sum_i (i+1) q_i . dq_inter_i
    + C exp(gamma C) sum(S * dH) + sum_j (C-1-j) k_j . dk_inter_j

with ``dA_raw = scale do v^T`` (no decay), ``dq_inter = scale exp(b) (do S^T)``,
``dk_inter = exp(gamma (C-1-j)) (v dH^T)``. It is accumulated per (row, h) in an
f32 VMEM row over the reverse time walk (every sequence of a packed row); the wrapper sums the rows and lanes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..common import LANES, Walk, causal_mask, iota, masked_exp, start_state, walk_pass
from .common import NT_T, SQ, TN, Config, f32, mm, walk_maps, with_static


def _decays(gamma, C):
    """(exp(b) [C,1], exp(gamma (C-1-i)) [C,1], D [C,C], exp(gamma C)) for one chunk."""
    pos = iota((C, 1), 0).astype(f32)
    rel = (iota((C, C), 0) - iota((C, C), 1)).astype(f32)  # i - j
    D = masked_exp(gamma * rel, causal_mask(C))
    return jnp.exp(gamma * (pos + 1.0)), jnp.exp(gamma * (C - 1.0 - pos)), D, jnp.exp(gamma * C)


# ------------------------------------------------------------------ forward
def k_tile_reduction(q, k, qg, S, *, policy):
    """The two contractions over K of the forward, one 128-wide K tile at a time, accumulated in f32:
    intra-chunk ``scores = q k^T`` [C,C] and inter-chunk ``o_inter = qg S`` [C,V]."""
    C, K = q.shape
    scores = jnp.zeros((C, C), f32)
    o_inter = jnp.zeros((C, S.shape[1]), f32)
    for kt in range(K // LANES):
        ks = slice(kt * LANES, (kt + 1) * LANES)
        scores = scores + mm(q[:, ks], k[:, ks], NT_T, policy=policy)
        o_inter = o_inter + mm(qg[:, ks], S[ks, :], policy=policy)
    return scores, o_inter


def _has_real_tokens(real_ref, walk: Walk):
    """Whether the visited chunk holds real tokens (``real_ref``: each chunk's, in SMEM). An empty
    sequence's chunk holds none, and the constant gate must not decay its state there."""
    return real_ref[pl.program_id(0) * walk.NT + walk.block(pl.program_id(3))] > 0


def _fused_fwd_kernel(slot_ref, edge_ref, gamma_ref, real_ref, q_ref, k_ref, v_ref, *rest, cfg: Config,
                      walk: Walk, has_h0: bool, emit_states: bool):
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref = rest.pop(0)
    ht_ref = rest.pop(0)
    h_ref = rest.pop(0) if emit_states else None
    (s_scr,) = rest
    i_h = pl.program_id(1)
    C, K = q_ref.shape
    md = cfg.policy
    begins, ends = walk.edges(edge_ref)  # this chunk starts / ends its sequence

    start_state(s_scr, h0_ref, begins)

    if emit_states:
        h_ref[...] = s_scr[...]  # state before this chunk, residual for the backward

    gamma = gamma_ref[i_h]
    e_q, e_k, D, e_C = _decays(gamma, C)
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    S = s_scr[...]
    scores, o_inter = k_tile_reduction(q, k, q.astype(f32) * e_q, S, policy=md)
    o = o_inter + mm(scores * D, v, policy=md)
    o_ref[...] = (cfg.scale * o).astype(o_ref.dtype)

    @pl.when(_has_real_tokens(real_ref, walk))  # else identity tokens only: S passes unchanged
    def _update():
        s_scr[...] = e_C * S + mm(k.astype(f32) * e_k, v, TN, policy=md)

    @pl.when(ends)
    def _final():
        ht_ref[...] = s_scr[...]


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnames=("cfg", "emit_states"))
def fused_fwd_impl(q, k, v, g_gamma, h0, cfg: Config, emit_states: bool):
    """Kernel rows of the walk in: o [R,T,H,V] (q dtype), ht [N,H,K,V] f32, and (emit_states)
    S_n [R,NT,H,K,V] f32."""
    B, T, H, K, V, NT, BV, NV = cfg.dims(q, v)
    C, N = cfg.C, cfg.packing.N

    walk = Walk(NT, time_axis=3)
    qk_map, v_map, state_map, states_map = walk_maps(NV, walk)

    in_specs = [
        pl.BlockSpec(memory_space=pltpu.SMEM),  # g_gamma [H]
        pl.BlockSpec(memory_space=pltpu.SMEM),  # real tokens per chunk [R * NT]
        pl.BlockSpec((SQ, C, K), qk_map),
        pl.BlockSpec((SQ, C, K), qk_map),
        pl.BlockSpec((SQ, C, BV), v_map),
    ]
    args = [g_gamma.astype(f32), cfg.walk.real_tokens(), q.reshape(B, T, H * K), k.reshape(B, T, H * K),
            v.reshape(B, T, H * V)]
    if h0 is not None:
        in_specs.append(pl.BlockSpec((SQ, K, BV), state_map))
        args.append(h0.astype(f32).reshape(N, H * K, V))
    out_shape = [jax.ShapeDtypeStruct((B, T, H * V), q.dtype), jax.ShapeDtypeStruct((N, H * K, V), f32)]
    out_specs = [pl.BlockSpec((SQ, C, BV), v_map), pl.BlockSpec((SQ, K, BV), state_map)]
    if emit_states:
        out_shape.append(jax.ShapeDtypeStruct((B, NT, H * K, V), f32))
        out_specs.append(pl.BlockSpec((SQ, SQ, K, BV), states_map))
    kernel = with_static(_fused_fwd_kernel, cfg=cfg, walk=walk, has_h0=h0 is not None, emit_states=emit_states)
    outs = walk_pass(
        kernel, tables=cfg.walk.tables(),
        grid=(B, H, NV, NT), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, state=(K, BV),
        interpret=cfg.interpret, name="gla_fused_g_gamma_fwd",
    )(*args)
    o = outs[0].reshape(B, T, H, V)
    ht = outs[1].reshape(N, H, K, V)
    states = outs[2].reshape(B, NT, H, K, V) if emit_states else None
    return o, ht, states


# ----------------------------------------------------------------- backward
def _fused_bwd_kernel(slot_ref, edge_ref, gamma_ref, real_ref, q_ref, k_ref, v_ref, do_ref, h_ref, *rest,
                      cfg: Config, walk: Walk, has_dht: bool, want_dh0: bool):
    rest = list(rest)
    dht_ref = rest.pop(0) if has_dht else None
    dq_ref, dk_ref, dv_ref, dgg_ref = rest[:4]
    rest = rest[4:]
    dh0_ref = rest.pop(0) if want_dh0 else None
    dh_scr, acc_scr = rest
    i_h, i_t = pl.program_id(1), pl.program_id(3)
    C, K = q_ref.shape
    V = v_ref.shape[-1]
    md, scale = cfg.policy, cfg.scale

    begins, ends = walk.edges(edge_ref)  # reverse walk: a sequence begins at its last chunk

    start_state(dh_scr, dht_ref, begins)  # dH starts from the sequence's dht
    start_state(acc_scr, None, i_t == 0)  # the dg_gamma accumulator from 0, once per row

    gamma = gamma_ref[i_h]
    e_q, e_k, D, e_C = _decays(gamma, C)
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    S, dH = h_ref[...], dh_scr[...]

    A = mm(q, k, NT_T, policy=md) * D
    dA_raw = scale * mm(do, v, NT_T, policy=md)  # scale (do v^T), before the decay
    dA = dA_raw * D
    dv = scale * mm(A, do, TN, policy=md) + mm(k.astype(f32) * e_k, dH, policy=md)
    dq_inter = (scale * e_q) * mm(do, S, NT_T, policy=md)
    dq = mm(dA, k, policy=md) + dq_inter
    dk_inter = e_k * mm(v, dH, NT_T, policy=md)
    dk = mm(dA, q, TN, policy=md) + dk_inter
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)

    # dg_gamma: d/dgamma of each exponent times what it multiplies (no q*dq - k*dk
    # differences, whose large (i+1)-weighted halves cancel), kept per key channel:
    #   intra  sum_ij (i-j) A_ij dA_raw_ij          (a scalar, added to lane 0 of the row)
    #   inter  sum_i (i+1) q_i * dq_inter_i
    #   state  C e^{gamma C} rowsum(S*dH) + sum_j (C-1-j) k_j * dk_inter_j
    pos = iota((C, 1), 0).astype(f32)
    rel = (iota((C, C), 0) - iota((C, C), 1)).astype(f32)  # i - j (A is 0 above the diagonal)
    intra = jnp.sum(jnp.sum(rel * A * dA_raw, axis=1, keepdims=True), axis=0, keepdims=True)  # [1,1]
    sdh = mm(jnp.ones((1, V), f32), S * dH, NT_T, policy=md)  # [1,K] rowsum_v(S*dH) as a row
    per_k = (jnp.sum((pos + 1.0) * q.astype(f32) * dq_inter, axis=0, keepdims=True)
             + (C * e_C) * sdh
             + jnp.sum((C - 1.0 - pos) * k.astype(f32) * dk_inter, axis=0, keepdims=True))
    first_lane = iota((1, K), 1) == 0

    @pl.when(_has_real_tokens(real_ref, walk))  # else identity tokens only
    def _carry():
        acc_scr[...] += per_k + jnp.where(first_lane, intra, 0.0)
        dh_scr[...] = e_C * dH + scale * mm(q.astype(f32) * e_q, do, TN, policy=md)

    if want_dh0:
        @pl.when(ends)  # the sequence's first chunk done
        def _initial_state_grad():
            dh0_ref[...] = dh_scr[...]

    @pl.when(i_t == pl.num_programs(3) - 1)  # the row's first chunk done
    def _final():
        dgg_ref[...] = acc_scr[...]


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnames=("cfg", "want_dh0"))
def fused_bwd_impl(q, k, v, g_gamma, states, do, dht, cfg: Config, want_dh0: bool):
    """(dq, dk, dv) in input dtypes, dg_gamma [H] f32, dh0 [N,H,K,V] f32 or None."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    C, N = cfg.C, cfg.packing.N
    NT = T // C

    walk = Walk(NT, reverse=True, time_axis=3)
    rev_map, _, state_map, rev_state_map = walk_maps(1, walk)  # whole V: grid (R, H, 1, NT)

    def acc_map(b, h, iv, t, *tables):
        del iv, t
        return (b, h, 0, 0)

    in_specs = [
        pl.BlockSpec(memory_space=pltpu.SMEM),  # g_gamma [H]
        pl.BlockSpec(memory_space=pltpu.SMEM),  # real tokens per chunk [R * NT]
        pl.BlockSpec((SQ, C, K), rev_map),  # q
        pl.BlockSpec((SQ, C, K), rev_map),  # k
        pl.BlockSpec((SQ, C, V), rev_map),  # v
        pl.BlockSpec((SQ, C, V), rev_map),  # do
        pl.BlockSpec((SQ, SQ, K, V), rev_state_map),  # S_n
    ]
    args = [g_gamma.astype(f32), cfg.walk.real_tokens(), q.reshape(B, T, H * K), k.reshape(B, T, H * K),
            v.reshape(B, T, H * V), do.reshape(B, T, H * V), states.reshape(B, NT, H * K, V)]
    if dht is not None:
        in_specs.append(pl.BlockSpec((SQ, K, V), state_map))
        args.append(dht.astype(f32).reshape(N, H * K, V))
    out_shape = [jax.ShapeDtypeStruct((B, T, H * K), q.dtype), jax.ShapeDtypeStruct((B, T, H * K), k.dtype),
                 jax.ShapeDtypeStruct((B, T, H * V), v.dtype), jax.ShapeDtypeStruct((B, H, 1, K), f32)]
    out_specs = [pl.BlockSpec((SQ, C, K), rev_map), pl.BlockSpec((SQ, C, K), rev_map),
                 pl.BlockSpec((SQ, C, V), rev_map), pl.BlockSpec((SQ, SQ, 1, K), acc_map)]
    if want_dh0:
        out_shape.append(jax.ShapeDtypeStruct((N, H * K, V), f32))
        out_specs.append(pl.BlockSpec((SQ, K, V), state_map))
    kernel = with_static(_fused_bwd_kernel, cfg=cfg, walk=walk, has_dht=dht is not None, want_dh0=want_dh0)
    outs = walk_pass(
        kernel, tables=cfg.walk.tables(),
        grid=(B, H, 1, NT), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, state=(K, V),
        scratch=[pltpu.VMEM((1, K), f32)],
        interpret=cfg.interpret, name="gla_fused_g_gamma_bwd",
    )(*args)
    dq = outs[0].reshape(B, T, H, K)
    dk = outs[1].reshape(B, T, H, K)
    dv = outs[2].reshape(B, T, H, V)
    dg_gamma = outs[3].sum(axis=(0, 2, 3))
    dh0 = outs[4].reshape(N, H, K, V) if want_dh0 else None
    return dq, dk, dv, dg_gamma, dh0
