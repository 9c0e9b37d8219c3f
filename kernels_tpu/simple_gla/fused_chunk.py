"""fused_chunk_simple_gla: multi-step forward and two-pass backward (Pallas TPU).

Same maths as :mod:`.chunk` (see its docstring for the chunk recurrence).

Forward: one pallas_call; each grid step processes ``num_steps`` consecutive
chunks (a static loop), carrying the f32 state in VMEM scratch across the
sequential time axis. When ``NT`` is not divisible by ``num_steps`` the
largest divisor of ``NT`` below it is used (see ``BlockSizes.for_chunks``).

Backward, after recomputing the per-chunk states ``H_c``:

- pass 1 (:func:`_dv_dh_kernel`): reverse time, sequential ("arbitrary"):
  dV of each chunk and the dH recurrence; writes ``dH_{c+1}`` of every chunk
  ([B, H, NT, K, V] f32) and dh0.
- pass 2 (:func:`_dq_dk_kernel`): every chunk independent ("parallel" time
  axis): dQ, dK and the gate gradient from ``H_c`` and ``dH_{c+1}``.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

from kernels_tpu import mxu
from kernels_tpu.common import Walk, chunk_map, chunk_states_map, final_state, start_state, walk_pass

from .chunk import (PARALLEL, dh_chunk, differentiable, dq_dk_dg_chunk, dv_chunk, finish_grads, forward, fwd_impl,
                    resolve_config)
from .common import F32, Config, causal_decay, chunk_gates, gate_specs, kernel_operands, split_refs


# ============================================================ pass 1: dv + dh
def _dv_dh_kernel(slot_ref, edge_ref, *refs, cfg: Config, walk: Walk, policy: mxu.Policy, has_dht: bool):
    """Grid step (b, h, t) handles chunk c = NT-1-t (reverse time; a sequence begins at its last chunk).

    q_ref, k_ref [BT, K], do_ref [BT, V], gate refs, dht_ref [K, V]; outputs
    dv_ref [BT, V], dh_states_ref [K, V] (dH_{c+1}, read by pass 2), dh0_ref
    [K, V]; dstate_ref [K, V] f32 scratch carries dH along the reverse time axis.
    """
    (q_ref, k_ref, do_ref), gate_refs, refs = split_refs(refs, 3, cfg.kernel_gate)
    dht_ref = refs.pop(0) if has_dht else None
    dv_ref, dh_states_ref, dh0_ref, dstate_ref = refs

    BT, scale = cfg.blocks.chunk_size, cfg.scale
    chunk = walk.block(pl.program_id(2))
    begins, ends = walk.edges(edge_ref)

    start_state(dstate_ref, dht_ref, begins)

    q, k, do = q_ref[...], k_ref[...], do_ref[...]
    b_col, b_row, b_last = chunk_gates(gate_refs, gate=cfg.kernel_gate, BT=BT, NT=walk.NT, chunk=chunk, step=0)
    D = causal_decay(b_col, b_row)
    dh = dstate_ref[...]  # dH_{c+1}
    dh_states_ref[...] = dh
    dv_ref[...] = dv_chunk(q, k, do, dh, D, b_col, b_last, scale, policy).astype(dv_ref.dtype)
    dstate_ref[...] = dh_chunk(dh, q, do, b_col, b_last, scale, policy)  # dH_c

    @pl.when(ends)
    def _initial_state_grad():
        dh0_ref[...] = dstate_ref[...]


# ============================================================ pass 2: dq + dk (+ dg)
def _dq_dk_kernel(*refs, cfg: Config, policy: mxu.Policy):
    """Grid step (b, h, t) handles chunk t; no carried state, so t is parallel.

    q_ref, k_ref [BT, K], v_ref, do_ref [BT, V], gate refs, h_ref [K, V] (H_c),
    dh_ref [K, V] (dH_{c+1}); outputs dq_ref, dk_ref [BT, K], dg_ref [BT, 1].
    """
    (q_ref, k_ref, v_ref, do_ref), gate_refs, refs = split_refs(refs, 4, cfg.kernel_gate)
    h_ref, dh_ref, dq_ref, dk_ref = refs[:4]
    with_dg = cfg.gate != "none"
    dg_ref = refs[4] if with_dg else None

    BT = cfg.blocks.chunk_size
    b_col, b_row, b_last = chunk_gates(gate_refs, gate=cfg.kernel_gate, BT=BT, NT=cfg.walk.NT, chunk=pl.program_id(2),
                                       step=0)
    D = causal_decay(b_col, b_row)
    dq, dk, dg = dq_dk_dg_chunk(q_ref[...], k_ref[...], v_ref[...], do_ref[...], h_ref[...], dh_ref[...], D,
                                b_col, b_last, cfg.scale, policy, with_dg)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    if with_dg:
        dg_ref[...] = dg  # a column: see chunk.chunk_bwd_impl


def fused_bwd_impl(cfg: Config, q, k, v, do, gates, states, dht):
    """Two-pass backward on head-major padded inputs (shapes as chunk.chunk_bwd_impl)."""
    R, H, Tp, K = q.shape
    V = v.shape[-1]
    BT = cfg.blocks.chunk_size
    NT = Tp // BT
    policy = mxu.policy_for(cfg.dtype, cfg.mxu_model)
    with_dg = cfg.gate != "none"

    # ---- pass 1: reverse time, sequential
    walk = Walk(NT, reverse=True)
    state_spec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    rev_state_spec = pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map)
    rev = walk.chunk_map
    in_specs = [pl.BlockSpec((None, None, BT, K), rev), pl.BlockSpec((None, None, BT, K), rev),
                pl.BlockSpec((None, None, BT, V), rev),
                *gate_specs(cfg.kernel_gate, BT, 1, walk.chunk_states_map)]
    operands = [q, k, do, *gates]
    if dht is not None:
        in_specs.append(state_spec)
        operands.append(dht)
    dv, dh_states, dh0 = walk_pass(
        functools.partial(_dv_dh_kernel, cfg=cfg, walk=walk, policy=policy, has_dht=dht is not None),
        tables=cfg.walk.tables(), grid=(R, H, NT), in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, BT, V), rev), rev_state_spec, state_spec],
        out_shape=[jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct((R, H, NT, K, V), F32),
                   jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="fused_chunk_simple_gla_bwd_dv_dh",
    )(*operands)

    # ---- pass 2: chunks independent given H_c and dH_{c+1}
    def qkv_spec(X):
        return pl.BlockSpec((None, None, BT, X), chunk_map)

    chunk_state_spec = pl.BlockSpec((None, None, None, K, V), chunk_states_map)
    out_specs = [qkv_spec(K), qkv_spec(K)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype)]
    if with_dg:
        out_specs.append(qkv_spec(1))
        out_shape.append(jax.ShapeDtypeStruct((R, H, Tp, 1), F32))
    outs = pl.pallas_call(
        functools.partial(_dq_dk_kernel, cfg=cfg, policy=policy),
        grid=(R, H, NT),
        in_specs=[qkv_spec(K), qkv_spec(K), qkv_spec(V), qkv_spec(V), *gate_specs(cfg.kernel_gate, BT, 1),
                  chunk_state_spec, chunk_state_spec],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=cfg.compiler_params(PARALLEL, PARALLEL, PARALLEL),
        interpret=cfg.interpret,
        name="fused_chunk_simple_gla_bwd_dq_dk",
        # dq, dk over q, k, in place: a step reads its chunk before writing it (dg: see chunk.chunk_bwd_impl)
        input_output_aliases={0: 0, 1: 1},
    )(q, k, v, do, *gates, states, dh_states)
    dq, dk = outs[0], outs[1]
    dg = outs[2] if with_dg else None
    return dq, dk, dv, dg, dh0


@functools.partial(jax.jit, static_argnums=(0,))
def backward(cfg: Config, q, k, v, g, g_gamma, h0, do, dht):
    pad, (qh, kh, vh, doh), gates, h0p, dht = kernel_operands(cfg, q, k, v, g, g_gamma, h0, do, dht)
    # recompute H_c with the multi-step forward (no o): cheaper than storing it
    _, _, states = fwd_impl(cfg, qh, kh, vh, gates, h0p, num_steps=cfg.blocks.num_steps, emit_o=False,
                            emit_states=True)
    dq, dk, dv, dg, dh0 = fused_bwd_impl(cfg, qh, kh, vh, doh, gates, states, dht)
    return finish_grads(cfg, pad, dq, dk, dv, dg, dh0, g, g_gamma, h0)


# ============================================================ custom_vjp
_fused_chunk_simple_gla = differentiable(lambda cfg: cfg.blocks.num_steps, backward)


# ============================================================ public API
def fused_chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                           chunk_size=64, interpret=None, mxu_model=None, num_steps=2, *, cu_seqlens=None):
    """Fused-chunk simple GLA, differentiable through a custom VJP.

    Args and returns as :func:`kernels_tpu.simple_gla.chunk_simple_gla` (cu_seqlens included), plus
    num_steps: chunks per forward grid step (falls back to the largest divisor of NT = ceil(T /
    chunk_size) not above it; packed sequences walk one chunk per step).
    """
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, output_final_state, interpret,
                         mxu_model, num_steps=num_steps, cu_seqlens=cu_seqlens)
    o, ht = _fused_chunk_simple_gla(cfg, q, k, v, g, g_gamma, initial_state)
    return o, final_state(ht, initial_state)


def fused_chunk_simple_gla_fwd(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, chunk_size=64, interpret=None, mxu_model=None, num_steps=2,
                               *, cu_seqlens=None):
    """Forward only: (o [B, T, H, V], ht [N, H, K, V] f32 or None)."""
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, output_final_state, interpret,
                         mxu_model, num_steps=num_steps, cu_seqlens=cu_seqlens)
    o, ht = forward(cfg, cfg.blocks.num_steps, q, k, v, g, g_gamma, initial_state)
    return o, final_state(ht, initial_state)


def fused_chunk_simple_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None,
                               chunk_size=64, interpret=None, mxu_model=None, num_steps=2, *, cu_seqlens=None):
    """Two-pass backward; args and returned dict as chunk_simple_gla_bwd."""
    cfg = resolve_config(q, k, v, g, g_gamma, scale, initial_state, chunk_size, dht is not None, interpret,
                         mxu_model, do=do, dht=dht, num_steps=num_steps, cu_seqlens=cu_seqlens)
    return backward(cfg, q, k, v, g, g_gamma, initial_state, do, dht)
