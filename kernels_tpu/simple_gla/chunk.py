"""chunk_simple_gla: chunked simple GLA forward and backward as Pallas TPU kernels.

Per head, with log decay ``g_t`` (per token, or ``g_gamma`` per head)::

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t,   S_0 = h0,  ht = S_T

Chunk recurrence (chunk ``c`` of ``BT`` tokens, ``H_c`` the state entering it,
``b`` the chunk-local cumulative gate, ``D[i, j] = exp(b_i - b_j) [i >= j]``)::

    O_c     = scale * (exp(b) * (Q H_c) + (Q K^T * D) V)
    H_{c+1} = exp(b_last) H_c + (K * exp(b_last - b))^T V

Backward, with ``dH_c = dL/dH_c`` carried from ``dH_NT = dht`` back to ``dh0``::

    dH_c = exp(b_last) dH_{c+1} + scale * (Q * exp(b))^T dO
    dQ   = scale * (exp(b) * (dO H_c^T) + (dO V^T * D) K)
    dK   = scale * (dO V^T * D)^T Q + exp(b_last - b) * (V dH_{c+1}^T)
    dV   = scale * (Q K^T * D)^T dO + exp(b_last - b) * (K dH_{c+1})
    db_i = sum_K (Q dQ - K dK)_i, plus exp(b_last) <H_c, dH_{c+1}> + sum(K * dK_inter) at i = last
    dg   = reverse cumsum of db within the chunk

Kernels: :func:`_fwd_kernel` (sequential over chunks, state in an f32 VMEM
scratch, ``num_steps`` chunks per grid step; shared with fused_chunk) and
:func:`_chunk_bwd_kernel` (reverse-time, dH in an f32 VMEM scratch, all
gradients of one chunk per grid step, the forward states recomputed first).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_tpu import mxu
from kernels_tpu.common import Walk, final_state, start_state, walk_pass

from .common import (F32, NT_T, TN, BlockSizes, Config, causal_decay, chunk_gates, gate_specs, kernel_operands,
                     make_config, mm, mm_f32, public_tokens, split_refs, validate)

# grid axis semantics (jax 0.10: pltpu.GridDimensionSemantics members)
PARALLEL, ARBITRARY = pltpu.PARALLEL, pltpu.ARBITRARY


# ============================================================ chunk maths
def intra_scores(q, k, D, policy: mxu.Policy):
    """``Q K^T * D`` [BT, BT] f32: decayed causal scores (unscaled)."""
    return mm(q, k, policy, NT_T) * D


def dv_chunk(q, k, do, dh, D, b_col, b_last, scale, policy):
    """dV = scale (Q K^T * D)^T dO + exp(b_last - b) * (K dH_{c+1}); the decay is a
    row scale of the result, applied after the dot so k stays exact."""
    return (scale * mm(intra_scores(q, k, D, policy), do, policy, TN)
            + jnp.exp(b_last - b_col) * mm(k, dh, policy))


def dh_chunk(dh, q, do, b_col, b_last, scale, policy):
    """dH_c = exp(b_last) dH_{c+1} + scale (Q * exp(b))^T dO."""
    return jnp.exp(b_last) * dh + scale * mm(q * jnp.exp(b_col), do, policy, TN)


def dq_dk_dg_chunk(q, k, v, do, h, dh, D, b_col, b_last, scale, policy, with_dg: bool):
    """dQ, dK [BT, K] f32 and dg [BT, 1] f32 (None unless with_dg) of one chunk,
    from the state entering it (h = H_c) and the state gradient leaving it (dh = dH_{c+1})."""
    BT = q.shape[0]
    dscores = mm(do, v, policy, NT_T) * D  # dL/d(QK^T) / scale, decayed and causal
    dq = scale * (jnp.exp(b_col) * mm(do, h, policy, NT_T) + mm(dscores, k, policy))
    dk_inter = jnp.exp(b_last - b_col) * mm(v, dh, policy, NT_T)
    dk = scale * mm(dscores, q, policy, TN) + dk_inter
    if not with_dg:
        return dq, dk, None
    # db_i = q_i.dq_i - k_i.dk_i; dg_t = sum_{i >= t} db_i, a reverse cumsum done as
    # one dot with the upper-triangular ones matrix U[t, i] = [i >= t] (exact in bf16).
    t_idx = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 0)
    i_idx = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 1)
    rev_cumsum = (i_idx >= t_idx).astype(F32)
    db = q.astype(F32) * dq - k.astype(F32) * dk
    dg = jnp.sum(mm_f32(rev_cumsum, db, policy), axis=1, keepdims=True)
    # b_last also decays the carried state and the chunk's own k v^T: its gradient
    # reaches every token of the chunk (all t <= last)
    dg_last = (jnp.exp(b_last) * jnp.sum(h * dh, axis=(0, 1), keepdims=True)
               + jnp.sum(k.astype(F32) * dk_inter, axis=(0, 1), keepdims=True))
    return dq, dk, dg + dg_last


# ============================================================ forward kernel
def _fwd_kernel(slot_ref, edge_ref, *refs, cfg: Config, walk: Walk, policy: mxu.Policy, NS: int, has_h0: bool,
                emit_o: bool, emit_ht: bool, emit_states: bool):
    """One grid step (b, h, t): chunks ``t*NS .. t*NS+NS-1`` of head (b, h), in one sequence (:class:`Walk`).

    q_ref [NS*BT, K], k_ref [NS*BT, K], v_ref [NS*BT, V], gate refs (see
    chunk_gates), h0_ref [K, V]; outputs o_ref [NS*BT, V], ht_ref [K, V],
    states_ref [NS, K, V] (H_c entering each chunk, for the backward);
    state_ref [K, V] f32 scratch carries the state along the sequential t axis.
    """
    (q_ref, k_ref, v_ref), gate_refs, refs = split_refs(refs, 3, cfg.kernel_gate)
    h0_ref = refs.pop(0) if has_h0 else None
    o_ref = refs.pop(0) if emit_o else None
    ht_ref = refs.pop(0) if emit_ht else None
    states_ref = refs.pop(0) if emit_states else None
    (state_ref,) = refs

    BT, scale = cfg.blocks.chunk_size, cfg.scale
    i_t = pl.program_id(2)
    begins, ends = walk.edges(edge_ref)  # these chunks start / end their sequence

    start_state(state_ref, h0_ref, begins)

    for step in range(NS):  # static unroll over the chunks of this grid step
        rows = pl.ds(step * BT, BT)
        q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
        b_col, b_row, b_last = chunk_gates(gate_refs, gate=cfg.kernel_gate, BT=BT, NT=walk.NT,
                                           chunk=i_t * NS + step, step=step)
        h = state_ref[...]  # H_c
        if emit_states:
            states_ref[step] = h
        if emit_o:
            D = causal_decay(b_col, b_row)
            # inter-chunk: exp(b_i) <= 1 scales row i of Q H_c after the dot (q stays exact)
            o_inter = jnp.exp(b_col) * mm(q, h, policy)
            o_intra = mm(intra_scores(q, k, D, policy), v, policy)
            o_ref[rows, :] = (scale * (o_inter + o_intra)).astype(o_ref.dtype)
        # H_{c+1} = exp(b_last) H_c + (K * exp(b_last - b))^T V, both exponents <= 0
        state_ref[...] = jnp.exp(b_last) * h + mm(k * jnp.exp(b_last - b_col), v, policy, TN)

    if emit_ht:
        @pl.when(ends)
        def _final_state():
            ht_ref[...] = state_ref[...]


def fwd_impl(cfg: Config, q, k, v, gates, h0, *, num_steps: int, emit_o: bool = True, emit_ht: bool = False,
             emit_states: bool = False):
    """Forward pallas_call on head-major kernel rows (:class:`kernels_tpu.varlen.ChunkWalk`).

    q, k [R, H, Tp, K], v [R, H, Tp, V], gates from prepare_gates, h0 [N, H, K, V] or None (one per sequence).
    Returns (o [R, H, Tp, V] | None, ht [N, H, K, V] f32 | None, states [R, H, NT, K, V] f32 | None).
    """
    R, H, Tp, K = q.shape
    V = v.shape[-1]
    BT = cfg.blocks.chunk_size
    NT = Tp // BT
    # a grid step holds chunks of one sequence: packed sequences walk one chunk per step
    NS = 1 if cfg.packing.packed else BlockSizes(chunk_size=BT, num_steps=num_steps).for_chunks(NT).num_steps
    walk = Walk(NT, steps=NS)
    policy = mxu.policy_for(cfg.dtype, cfg.mxu_model)

    def qkv_spec(X):
        return pl.BlockSpec((None, None, NS * BT, X), walk.chunk_map)

    state_spec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    in_specs = [qkv_spec(K), qkv_spec(K), qkv_spec(V),
                *gate_specs(cfg.kernel_gate, BT, NS, walk.chunk_states_map)]
    operands = [q, k, v, *gates]
    if h0 is not None:
        in_specs.append(state_spec)
        operands.append(h0)
    out_specs, out_shape = [], []
    if emit_o:
        out_specs.append(qkv_spec(V))
        out_shape.append(jax.ShapeDtypeStruct((R, H, Tp, V), q.dtype))
    if emit_ht:
        out_specs.append(state_spec)
        out_shape.append(jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32))
    if emit_states:
        out_specs.append(pl.BlockSpec((None, None, NS, K, V), walk.chunk_states_map))
        out_shape.append(jax.ShapeDtypeStruct((R, H, NT, K, V), F32))
    kernel = functools.partial(_fwd_kernel, cfg=cfg, walk=walk, policy=policy, NS=NS, has_h0=h0 is not None,
                               emit_o=emit_o, emit_ht=emit_ht, emit_states=emit_states)
    outs = walk_pass(  # the state recurrence makes time sequential: the last, "arbitrary" axis
        kernel, tables=cfg.walk.tables(),
        grid=(R, H, NT // NS), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, state=(K, V),
        interpret=cfg.interpret, name="simple_gla_fwd",
    )(*operands)
    outs = list(outs)
    o = outs.pop(0) if emit_o else None
    ht = outs.pop(0) if emit_ht else None
    states = outs.pop(0) if emit_states else None
    return o, ht, states


# ============================================================ backward kernel
def _chunk_bwd_kernel(slot_ref, edge_ref, *refs, cfg: Config, walk: Walk, policy: mxu.Policy, has_dht: bool):
    """One grid step (b, h, t) handles chunk c = NT-1-t (reverse time; a sequence begins at its last chunk).

    q_ref, k_ref [BT, K], v_ref, do_ref [BT, V], gate refs, h_ref [K, V] (H_c from
    the recomputed forward), dht_ref [K, V]; outputs dq_ref, dk_ref [BT, K],
    dv_ref [BT, V], dg_ref [BT, 1] (per-token gate gradient, gated kernels only),
    dh0_ref [K, V]; dstate_ref [K, V] f32 scratch holds dH_{c+1}.
    """
    (q_ref, k_ref, v_ref, do_ref), gate_refs, refs = split_refs(refs, 4, cfg.kernel_gate)
    h_ref = refs.pop(0)
    dht_ref = refs.pop(0) if has_dht else None
    dq_ref, dk_ref, dv_ref = refs[:3]
    del refs[:3]
    with_dg = cfg.gate != "none"
    dg_ref = refs.pop(0) if with_dg else None
    dh0_ref, dstate_ref = refs

    BT, scale = cfg.blocks.chunk_size, cfg.scale
    chunk = walk.block(pl.program_id(2))
    begins, ends = walk.edges(edge_ref)

    start_state(dstate_ref, dht_ref, begins)

    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    b_col, b_row, b_last = chunk_gates(gate_refs, gate=cfg.kernel_gate, BT=BT, NT=walk.NT, chunk=chunk, step=0)
    D = causal_decay(b_col, b_row)
    h, dh = h_ref[...], dstate_ref[...]

    dv = dv_chunk(q, k, do, dh, D, b_col, b_last, scale, policy)
    dq, dk, dg = dq_dk_dg_chunk(q, k, v, do, h, dh, D, b_col, b_last, scale, policy, with_dg)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    if with_dg:
        dg_ref[...] = dg  # a column: see chunk_bwd_impl
    dstate_ref[...] = dh_chunk(dh, q, do, b_col, b_last, scale, policy)  # dH_c

    @pl.when(ends)
    def _initial_state_grad():
        dh0_ref[...] = dstate_ref[...]


def chunk_bwd_impl(cfg: Config, q, k, v, do, gates, states, dht):
    """Chunk backward pallas_call on head-major kernel rows (reverse time).

    q, k [R, H, Tp, K], v, do [R, H, Tp, V], states [R, H, NT, K, V] f32 (H_c),
    dht [N, H, K, V] or None. Returns dq, dk [R, H, Tp, K], dv [R, H, Tp, V],
    dg [R, H, Tp, 1] f32 (None without a gate), dh0 [N, H, K, V] f32. dq, dk and dv are written over q, k
    and v in place: a step reads its chunk before writing the chunk's gradient, and the inputs are dead after
    this pass.

    dg stays a column, unlike the gate: written as a chunk row (``kernels_tpu.common.column_to_row``, exact) it
    changed how XLA:CPU compiles the interpret-mode program around it, and dq, which dg is computed from, moved
    by up to 1.7e-5 relative between two programs that differ only outside the kernels
    (tests/test_state_layout.py's V-first against K-first case). On a TPU it would cost nothing but the
    conversion; in interpret mode it would break bit-exactness that the harness promises.
    """
    R, H, Tp, K = q.shape
    V = v.shape[-1]
    BT = cfg.blocks.chunk_size
    NT = Tp // BT
    policy = mxu.policy_for(cfg.dtype, cfg.mxu_model)
    walk = Walk(NT, reverse=True)

    def qkv_spec(X):
        return pl.BlockSpec((None, None, BT, X), walk.chunk_map)

    state_spec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    in_specs = [qkv_spec(K), qkv_spec(K), qkv_spec(V), qkv_spec(V),
                *gate_specs(cfg.kernel_gate, BT, 1, walk.chunk_states_map),
                pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map)]
    operands = [q, k, v, do, *gates, states]
    if dht is not None:
        in_specs.append(state_spec)
        operands.append(dht)
    out_specs = [qkv_spec(K), qkv_spec(K), qkv_spec(V)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)]
    with_dg = cfg.gate != "none"
    if with_dg:
        out_specs.append(qkv_spec(1))
        out_shape.append(jax.ShapeDtypeStruct((R, H, Tp, 1), F32))
    out_specs.append(state_spec)
    out_shape.append(jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32))
    kernel = functools.partial(_chunk_bwd_kernel, cfg=cfg, walk=walk, policy=policy, has_dht=dht is not None)
    outs = list(walk_pass(
        # dH flows from the last chunk to the first: sequential, last axis
        kernel, tables=cfg.walk.tables(),
        grid=(R, H, NT), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, state=(K, V), interpret=cfg.interpret, name="chunk_simple_gla_bwd",
        aliases={0: 0, 1: 1, 2: 2},  # dq, dk, dv over q, k, v
    )(*operands))
    dq, dk, dv = outs[:3]
    dg = outs[3] if with_dg else None
    return dq, dk, dv, dg, outs[-1]


# ============================================================ wrappers
@functools.partial(jax.jit, static_argnums=(0, 1))
def forward(cfg: Config, num_steps: int, q, k, v, g, g_gamma, h0):
    """[B, T, H, *] in, (o [B, T, H, V], ht [N, H, K, V] f32 | None) out."""
    pad, (qh, kh, vh, _), gates, h0, _ = kernel_operands(cfg, q, k, v, g, g_gamma, h0)
    o, ht, _ = fwd_impl(cfg, qh, kh, vh, gates, h0, num_steps=num_steps, emit_ht=cfg.output_final_state)
    return pad.unpad_values(public_tokens(cfg, o, cfg.dtype)), pad.unpad_state(ht)


def finish_grads(cfg: Config, pad, dq, dk, dv, dg, dh0, g, g_gamma, h0):
    """Head-major kernel gradients -> the public layout (real tokens, true K and V) and the gate's gradient."""
    grads = dict(dq=pad.unpad_keys(public_tokens(cfg, dq, cfg.dtype)),
                 dk=pad.unpad_keys(public_tokens(cfg, dk, cfg.dtype)),
                 dv=pad.unpad_values(public_tokens(cfg, dv, cfg.dtype)),
                 dg=None, dg_gamma=None, dh0=None if h0 is None else pad.unpad_state(dh0).astype(h0.dtype))
    if cfg.gate == "g":
        grads["dg"] = public_tokens(cfg, dg, g.dtype)[..., 0]
    elif cfg.gate == "g_gamma":
        # g_t = gamma for every real token: dgamma = sum over the real tokens (padding excluded)
        grads["dg_gamma"] = jnp.sum(public_tokens(cfg, dg, F32)[..., 0], axis=(0, 1)).astype(g_gamma.dtype)
    return grads


@functools.partial(jax.jit, static_argnums=(0,))
def backward(cfg: Config, q, k, v, g, g_gamma, h0, do, dht):
    pad, (qh, kh, vh, doh), gates, h0p, dht = kernel_operands(cfg, q, k, v, g, g_gamma, h0, do, dht)
    # recompute the per-chunk states H_c instead of keeping them from the forward (memory)
    _, _, states = fwd_impl(cfg, qh, kh, vh, gates, h0p, num_steps=1, emit_o=False, emit_states=True)
    dq, dk, dv, dg, dh0 = chunk_bwd_impl(cfg, qh, kh, vh, doh, gates, states, dht)
    return finish_grads(cfg, pad, dq, dk, dv, dg, dh0, g, g_gamma, h0)


# ============================================================ custom_vjp
GRAD_NAMES = ("dq", "dk", "dv", "dg", "dg_gamma", "dh0")  # the gradients of (q, k, v, g, g_gamma, h0)


def differentiable(steps, backward_fn):
    """A variant as a ``jax.custom_vjp`` of ``(cfg, q, k, v, g, g_gamma, h0) -> (o, ht)``: the forward
    runs ``steps(cfg)`` chunks per grid step; the backward is ``backward_fn(cfg, *inputs, do, dht)``."""

    def primal(cfg: Config, q, k, v, g, g_gamma, h0):
        return forward(cfg, steps(cfg), q, k, v, g, g_gamma, h0)

    def fwd(cfg: Config, *inputs):
        return primal(cfg, *inputs), inputs

    def bwd(cfg: Config, inputs, cotangents):
        grads = backward_fn(cfg, *inputs, *cotangents)
        return tuple(grads[name] for name in GRAD_NAMES)

    f = jax.custom_vjp(primal, nondiff_argnums=(0,))
    f.defvjp(fwd, bwd)
    return f


_chunk_simple_gla = differentiable(lambda cfg: 1, backward)


# ============================================================ public API
def resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, output_final_state, interpret, mxu_model,
                   *, do=None, dht=None, num_steps=1, cu_seqlens=None):
    scale, blocks = validate(q, k, v, g, g_gamma, scale, initial_state, chunk_size, num_steps=num_steps, do=do,
                             dht=dht, cu_seqlens=cu_seqlens)
    return make_config(q, g, g_gamma, scale, blocks, output_final_state, interpret, mxu_model, cu_seqlens)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=64, interpret=None, mxu_model=None, *, cu_seqlens=None):
    """Chunked simple GLA, differentiable (jax.grad / jax.vjp) through a custom VJP.

    Args:
      q, k: [B, T, H, K]; v: [B, T, H, V]; bf16, fp16 or fp32 (one dtype); any K, V (zero-padded
        to multiples of 128 internally, exact: kernels_tpu.common.HeadPadding).
      g: [B, T, H] per-token log decay (<= 0), or g_gamma: [H] per-head log decay
        (<= 0); at most one (neither: no decay). A concrete positive gate is a ValueError
        (op_contract.check_log_decay); a gate traced inside jit/vjp is not checked.
      scale: K**-0.5 when None.
      initial_state: [N, H, K, V] float32 h0, optional (N = B, or the number of packed sequences).
      output_final_state: also return ht = S_T [N, H, K, V] in initial_state's dtype (float32 without one: a
        bf16 state cache comes back in bf16, kernels_tpu.common.final_state).
      chunk_size: BT, a multiple of 16 (T need not be a multiple: padded internally, exact).
      interpret: None -> native TPU; True or a pltpu.InterpretParams -> Pallas TPU interpret mode.
      mxu_model: model MXU rounding in the dots; None means "iff interpreting".
      cu_seqlens: packed variable-length sequences (fla): N+1 static int offsets (tuple, list or
        numpy array) 0 < ... < T with B = 1; each sequence starts from its own initial_state[i] and
        ends in ht[i] (kernels_tpu.varlen).

    Returns:
      (o [B, T, H, V] in the input dtype, ht [N, H, K, V] float32 or None).
    """
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, output_final_state, interpret,
                         mxu_model, cu_seqlens=cu_seqlens)
    o, ht = _chunk_simple_gla(cfg, q, k, v, g, g_gamma, initial_state)
    return o, final_state(ht, initial_state)


def chunk_simple_gla_fwd(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                         chunk_size=64, interpret=None, mxu_model=None, *, cu_seqlens=None):
    """Forward only (no VJP): (o [B, T, H, V], ht [N, H, K, V] f32 or None). Args as chunk_simple_gla."""
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, output_final_state, interpret,
                         mxu_model, cu_seqlens=cu_seqlens)
    o, ht = forward(cfg, 1, q, k, v, g, g_gamma, initial_state)
    return o, final_state(ht, initial_state)


def chunk_simple_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None,
                         chunk_size=64, interpret=None, mxu_model=None, *, cu_seqlens=None):
    """Backward of ``loss = sum(o * do) + sum(ht * dht)``.

    do: [B, T, H, V]; dht: [N, H, K, V] or None (zero). Other args as chunk_simple_gla.
    Returns dict(dq, dk [B, T, H, K], dv [B, T, H, V] in the input dtype,
    dg [B, T, H] f32 (g only), dg_gamma [H] f32 (g_gamma only), dh0 [N, H, K, V] f32
    (initial_state only)); entries that do not apply are None.
    """
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, dht is not None, interpret,
                         mxu_model, do=do, dht=dht, cu_seqlens=cu_seqlens)
    return backward(cfg, q, k, v, g, g_gamma, initial_state, do, dht)
