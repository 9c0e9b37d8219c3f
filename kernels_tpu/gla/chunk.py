"""Chunk GLA kernels for a per-key-channel gate ``g [B,T,H,K]`` (unfused path).

Three pallas_calls: forward states, forward output (as in fla's chunk GLA), and
one backward that walks the chunks in reverse, carrying the state gradient in
VMEM where fla writes every chunk's to HBM before its dq/dk/dv/dg pass.

Stabilised exponentials
-----------------------
Inside chunk n, ``b = cumsum(g)`` over the chunk's rows (inclusive, f32, an
MXU product with a 0/1 lower-triangular matrix at HIGHEST), ``b_L`` its last
row. For a decaying gate ``b`` is non-increasing along rows, and every
exponential below has an exponent ``<= 0``:

- state update and inter-chunk terms factor through the chunk's last
  position or its start: ``exp(b_L - b_j)``, ``exp(b_L)``, ``exp(b_i)``;
- intra-chunk products ``sum_c q_ic k_jc exp(b_ic - b_jc)`` (j <= i) are
  computed in sub-blocks of ``BC`` rows:
  * diagonal ``BC x BC`` blocks exactly, as ``[BC,BC,K]`` with the causal mask
    applied to the exponent before exp (``masked_exp``);
  * off-diagonal blocks factor through a sub-block boundary ``r``: for row
    block I (first row I0) and all earlier columns j < I0, ``r = b_{I0}``:
    ``(q_i exp(b_i - r)) . (k_j exp(r - b_j))`` with ``i >= I0 > j``, so both
    exponents are <= 0; for column block J (last row J1-1) and later rows
    i >= J1, ``r = b_{J1-1}`` likewise.
  No exponent is positive, so nothing overflows for any chunk size; a factor
  that underflows is bounded by the (smaller) true product it belongs to.
  The sub-blocks are a ``fori_loop`` (small code); the off-diagonal operands
  span the whole chunk with the row mask (j < I0, or i >= J1) applied to the
  exponent before exp, so masked rows are exact zeros.

Gate gradient (chunk-local, no global reverse cumsum): with ``x = q*dq - k*dk``
(f32, full gradients) and ``s_c = sum_v (S_{n+1} * dH_n)[c, v]`` (the state after
the chunk against its gradient), ``dg_t = sum_{i>=t in chunk} x_i + s``. Since
``S_{n+1} = exp(b_L) S_n + sum_j (k_j exp(b_L - b_j)) v_j^T``,
``s = exp(b_L) * rowsum_v(S_n * dH_n) + sum_j k_j * dk_inter_j``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..common import Walk, causal_mask, iota, masked_exp, start_state, walk_pass
from .common import NT_T, SQ, TN, Config, f32, index_maps, mm, walk_maps, with_static


def _cumsum(g, policy):
    """Inclusive cumsum over rows of g [C,K] (f32), as L @ g with L lower-triangular ones (f32-exact)."""
    C = g.shape[0]
    return policy.exact(causal_mask(C).astype(f32), g)


def _col_total(g, policy):
    """sum over rows of g [C,K] as a column [K,1] (to scale the rows of a [K,V] state; f32-exact)."""
    return policy.exact(g, jnp.ones((g.shape[0], 1), f32), TN)


def _diag_decay(bI):
    """[BC,BC,K]: exp(b_ic - b_jc) for j <= i, else 0 (exponent masked before exp)."""
    return masked_exp(bI[:, None, :] - bI[None, :, :], causal_mask(bI.shape[0], trailing=1))


def _block(ref, r0, n):
    """Rows r0 .. r0+n of a VMEM ref (dynamic, sublane-aligned start)."""
    return ref[pl.ds(pl.multiple_of(r0, 8), n), :]


def _before(r0, C):
    """[C,1] bool: row j < r0 (the earlier columns of a row block)."""
    return iota((C, 1), 0) < r0


# ------------------------------------------------------------------ forward
def _fwd_h_kernel(slot_ref, edge_ref, k_ref, v_ref, g_ref, *rest, cfg: Config, walk: Walk, has_h0: bool):
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    h_ref, ht_ref, s_scr = rest
    md = cfg.policy
    begins, ends = walk.edges(edge_ref)  # this chunk starts / ends its sequence

    start_state(s_scr, h0_ref, begins)

    h_ref[...] = s_scr[...]  # state before chunk n
    g = g_ref[...].astype(f32)
    b = _cumsum(g, md)
    bL = b[-1:, :]
    k_dec = k_ref[...].astype(f32) * jnp.exp(bL - b)  # exponent <= 0
    s_scr[...] = jnp.exp(_col_total(g, md)) * s_scr[...] + mm(k_dec, v_ref[...], TN, policy=md)

    @pl.when(ends)
    def _final():
        ht_ref[...] = s_scr[...]


def _fwd_o_kernel(q_ref, k_ref, v_ref, g_ref, h_ref, o_ref, b_scr, *, cfg: Config):
    md, BC = cfg.policy, cfg.blocks.sub_chunk
    C = q_ref.shape[0]
    b_scr[...] = _cumsum(g_ref[...].astype(f32), md)
    k_all, v_all, S = k_ref[...].astype(f32), v_ref[...], h_ref[...]

    def row_block(i, carry):  # rows r0..r0+BC of o
        r0 = i * BC
        qI, kI, vI, bI = (_block(r, r0, BC) for r in (q_ref, k_ref, v_ref, b_scr))
        qI, kI = qI.astype(f32), kI.astype(f32)
        ref = _block(b_scr, r0, 1)  # b at the block's first row
        acc = mm(qI * jnp.exp(bI), S, policy=md)  # inter-chunk
        # diagonal block: exact [BC,BC,K] with the exponent masked before exp
        A_II = jnp.sum(qI[:, None, :] * kI[None, :, :] * _diag_decay(bI), axis=-1)
        acc = acc + mm(A_II, vI, policy=md)
        # earlier columns j < r0 through r: exp(b_i - r) * exp(r - b_j), both exponents <= 0
        k_off = k_all * masked_exp(ref - b_scr[...], _before(r0, C))  # zero rows j >= r0
        A_off = mm(qI * jnp.exp(bI - ref), k_off, NT_T, policy=md)  # [BC, C]
        acc = acc + mm(A_off, v_all, policy=md)
        o_ref[pl.ds(pl.multiple_of(r0, 8), BC), :] = (cfg.scale * acc).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, C // BC, row_block, 0)


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnames=("cfg", "emit_states"))
def chunk_fwd_impl(q, k, v, g, h0, cfg: Config, emit_states: bool = True):
    """Kernel rows of the walk (:class:`kernels_tpu.varlen.ChunkWalk`) in: o [R,T,H,V] (q dtype),
    ht [N,H,K,V] f32 (one per sequence), states S_n [R,NT,H,K,V] f32.

    The states are always computed (the output kernel reads them); ``emit_states``
    is accepted so both paths share one signature."""
    del emit_states
    B, T, H, K, V, NT, BV, NV = cfg.dims(q, v)
    C = cfg.C

    N = cfg.packing.N
    walk = Walk(NT, time_axis=3)
    w_qk_map, w_v_map, w_state_map, w_states_map = walk_maps(NV, walk)

    q3, k3, g3, v3 = q.reshape(B, T, H * K), k.reshape(B, T, H * K), g.reshape(B, T, H * K), v.reshape(B, T, H * V)
    in_specs = [pl.BlockSpec((SQ, C, K), w_qk_map), pl.BlockSpec((SQ, C, BV), w_v_map),
                pl.BlockSpec((SQ, C, K), w_qk_map)]
    args = [k3, v3, g3]
    if h0 is not None:
        in_specs.append(pl.BlockSpec((SQ, K, BV), w_state_map))
        args.append(h0.astype(f32).reshape(N, H * K, V))
    states, ht = walk_pass(
        with_static(_fwd_h_kernel, cfg=cfg, walk=walk, has_h0=h0 is not None), tables=cfg.walk.tables(),
        grid=(B, H, NV, NT), in_specs=in_specs,
        out_specs=[pl.BlockSpec((SQ, SQ, K, BV), w_states_map), pl.BlockSpec((SQ, K, BV), w_state_map)],
        out_shape=[jax.ShapeDtypeStruct((B, NT, H * K, V), f32), jax.ShapeDtypeStruct((N, H * K, V), f32)],
        state=(K, BV), interpret=cfg.interpret, name="gla_chunk_fwd_h",
    )(*args)
    qk_map, v_map, _, states_map = index_maps(NV)  # the output pass: every chunk independent

    o = pl.pallas_call(
        with_static(_fwd_o_kernel, cfg=cfg),
        grid=(B, H, NV, NT),
        in_specs=[pl.BlockSpec((SQ, C, K), qk_map), pl.BlockSpec((SQ, C, K), qk_map),
                  pl.BlockSpec((SQ, C, BV), v_map), pl.BlockSpec((SQ, C, K), qk_map),
                  pl.BlockSpec((SQ, SQ, K, BV), states_map)],
        out_specs=pl.BlockSpec((SQ, C, BV), v_map),
        out_shape=jax.ShapeDtypeStruct((B, T, H * V), q.dtype),
        scratch_shapes=[pltpu.VMEM((C, K), f32)],
        compiler_params=cfg.compiler_params("parallel", "parallel", "parallel", "parallel"),
        interpret=cfg.interpret,
        name="gla_chunk_fwd_o",
    )(q3, k3, v3, g3, states)
    return o.reshape(B, T, H, V), ht.reshape(N, H, K, V), states.reshape(B, NT, H, K, V)


# ----------------------------------------------------------------- backward
def _bwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, g_ref, do_ref, h_ref, *rest, cfg: Config, walk: Walk,
                has_dht: bool, want_dh0: bool):
    """One step of the reverse walk: chunk n's dq, dk, dv, dg from its state S_n and dH_n, the gradient of
    the state after it (carried in VMEM), then dH_{n-1} = exp(b_L) * dH_n + scale (q exp(b))^T do."""
    rest = list(rest)
    dht_ref = rest.pop(0) if has_dht else None
    dq_ref, dk_ref, dv_ref, dg_ref = rest[:4]
    del rest[:4]
    dh0_ref = rest.pop(0) if want_dh0 else None
    dh_scr, b_scr, dq_scr, dk_scr, dv_scr = rest
    md = cfg.policy
    begins, ends = walk.edges(edge_ref)  # reverse walk: a sequence begins at its last chunk

    start_state(dh_scr, dht_ref, begins)

    dH = dh_scr[...]
    _chunk_grads(q_ref, k_ref, v_ref, g_ref, do_ref, h_ref[...], dH, dq_ref, dk_ref, dv_ref, dg_ref,
                 b_scr, dq_scr, dk_scr, dv_scr, cfg=cfg)
    qg = q_ref[...].astype(f32) * jnp.exp(b_scr[...])
    dh_scr[...] = (jnp.exp(_col_total(g_ref[...].astype(f32), md)) * dH
                   + cfg.scale * mm(qg, do_ref[...], TN, policy=md))

    if want_dh0:
        @pl.when(ends)
        def _final():
            dh0_ref[...] = dh_scr[...]


def _chunk_grads(q_ref, k_ref, v_ref, g_ref, do_ref, S, dH, dq_ref, dk_ref, dv_ref, dg_ref,
                 b_scr, dq_scr, dk_scr, dv_scr, *, cfg: Config):
    """dq, dk, dv, dg of one chunk, given its state S [K, V] and dH [K, V]; leaves b = cumsum(g) in b_scr."""
    md, scale, BC = cfg.policy, cfg.scale, cfg.blocks.sub_chunk
    C = q_ref.shape[0]
    V = v_ref.shape[-1]
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    qf, kf = q.astype(f32), k.astype(f32)
    b_scr[...] = _cumsum(g_ref[...].astype(f32), md)
    b = b_scr[...]
    bL = b[-1:, :]

    # inter-chunk terms (exponents b <= 0 and b_L - b <= 0)
    k_dec = jnp.exp(bL - b)
    dk_inter = k_dec * mm(v, dH, NT_T, policy=md)
    dq_scr[...] = (scale * jnp.exp(b)) * mm(do, S, NT_T, policy=md)
    dk_scr[...] = dk_inter
    dv_scr[...] = mm(kf * k_dec, dH, policy=md)

    def sub_block(i, carry):  # block I = rows/columns r0..r0+BC
        r0 = i * BC
        rows = pl.ds(pl.multiple_of(r0, 8), BC)
        qI, kI, vI, doI, bI = (_block(r, r0, BC) for r in (q_ref, k_ref, v_ref, do_ref, b_scr))
        qI, kI = qI.astype(f32), kI.astype(f32)
        # diagonal block, exact: E[i,j,c] = exp(b_ic - b_jc) for j <= i (masked before exp)
        E = _diag_decay(bI)
        mask = causal_mask(BC)
        A_d = jnp.where(mask, jnp.sum(qI[:, None, :] * kI[None, :, :] * E, axis=-1), 0.0)
        dA_d = jnp.where(mask, scale * mm(doI, vI, NT_T, policy=md), 0.0)
        dq_blk = jnp.sum(dA_d[:, :, None] * kI[None, :, :] * E, axis=1)
        dk_blk = jnp.sum(dA_d[:, :, None] * qI[:, None, :] * E, axis=0)
        dv_blk = scale * mm(A_d, doI, TN, policy=md)
        # as rows, against earlier columns j < r0, through r = b at the block's first row
        r_row = _block(b_scr, r0, 1)
        k_off = kf * masked_exp(r_row - b, _before(r0, C))  # zero rows j >= r0
        dA_row = scale * mm(doI, v, NT_T, policy=md)  # [BC, C]
        dq_blk = dq_blk + jnp.exp(bI - r_row) * mm(dA_row, k_off, policy=md)
        # as columns, against later rows i >= r0+BC, through r = b at the block's last row
        r_col = _block(b_scr, r0 + BC - 1, 1)
        q_hat = qf * masked_exp(b - r_col, jnp.logical_not(_before(r0 + BC, C)))  # zero rows i < r0+BC
        k_hat = kI * jnp.exp(r_col - bI)
        A_col = mm(q_hat, k_hat, NT_T, policy=md)  # [C, BC]
        dA_col = scale * mm(do, vI, NT_T, policy=md)  # rows i < r0+BC meet zero rows of q_hat
        dv_blk = dv_blk + scale * mm(A_col, do, TN, policy=md)
        dk_blk = dk_blk + jnp.exp(r_col - bI) * mm(dA_col, q_hat, TN, policy=md)
        dq_scr[rows, :] += dq_blk
        dk_scr[rows, :] += dk_blk
        dv_scr[rows, :] += dv_blk
        return carry

    jax.lax.fori_loop(0, C // BC, sub_block, 0)

    dq, dk = dq_scr[...], dk_scr[...]
    x = qf * dq - kf * dk
    rev = (iota((C, C), 1) >= iota((C, C), 0)).astype(f32)  # [t, i]: i >= t
    sdh = mm(jnp.ones((1, V), f32), S * dH, NT_T, policy=md)  # rowsum_v(S*dH) as a [1,K] row
    s = jnp.exp(bL) * sdh + jnp.sum(kf * dk_inter, axis=0, keepdims=True)
    dg_ref[...] = mm(rev, x, policy=md) + s
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnames=("cfg", "want_dh0"))
def chunk_bwd_impl(q, k, v, g, states, do, dht, cfg: Config, want_dh0: bool):
    """(dq, dk, dv) in input dtypes, dg [R,T,H,K] f32, dh0 [N,H,K,V] f32 or None.

    One reverse walk over the chunks, whole V per block, carrying dH in VMEM: no per-chunk state gradients
    in HBM. Each gradient is written over its input in place (dg over the f32 gate): a step reads its chunk
    before writing the chunk's gradient, and the inputs are dead after this pass."""
    B, T, H, K, V, NT, _, _ = cfg.dims(q, v)
    C = cfg.C
    N = cfg.packing.N

    walk = Walk(NT, reverse=True, time_axis=3)
    qk_map, v_map, state_map, states_map = walk_maps(1, walk)  # grid (B, H, 1, NT): all of V per block
    q3, k3, g3 = q.reshape(B, T, H * K), k.reshape(B, T, H * K), g.reshape(B, T, H * K)
    v3, do3 = v.reshape(B, T, H * V), do.reshape(B, T, H * V)
    kspec, vspec = pl.BlockSpec((SQ, C, K), qk_map), pl.BlockSpec((SQ, C, V), v_map)
    sspec = pl.BlockSpec((SQ, K, V), state_map)
    in_specs = [kspec, kspec, vspec, kspec, vspec, pl.BlockSpec((SQ, SQ, K, V), states_map)]
    args = [q3, k3, v3, g3, do3, states.reshape(B, NT, H * K, V)]
    if dht is not None:
        in_specs.append(sspec)
        args.append(dht.astype(f32).reshape(N, H * K, V))
    out_specs = [kspec, kspec, vspec, kspec]
    out_shape = [jax.ShapeDtypeStruct((B, T, H * K), q.dtype), jax.ShapeDtypeStruct((B, T, H * K), k.dtype),
                 jax.ShapeDtypeStruct((B, T, H * V), v.dtype), jax.ShapeDtypeStruct((B, T, H * K), f32)]
    if want_dh0:
        out_specs.append(sspec)
        out_shape.append(jax.ShapeDtypeStruct((N, H * K, V), f32))
    outs = walk_pass(
        with_static(_bwd_kernel, cfg=cfg, walk=walk, has_dht=dht is not None, want_dh0=want_dh0),
        tables=cfg.walk.tables(), grid=(B, H, 1, NT), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, state=(K, V), interpret=cfg.interpret, name="gla_chunk_bwd",
        scratch=[pltpu.VMEM((C, K), f32), pltpu.VMEM((C, K), f32), pltpu.VMEM((C, K), f32),
                 pltpu.VMEM((C, V), f32)],
        aliases={0: 0, 1: 1, 2: 2, 3: 3},
    )(*args)
    dq, dk, dv, dg = outs[:4]
    dh0 = outs[4].reshape(N, H, K, V) if want_dh0 else None
    return (dq.reshape(B, T, H, K), dk.reshape(B, T, H, K), dv.reshape(B, T, H, V),
            dg.reshape(B, T, H, K), dh0)
