"""Chunked GDN-2 (Gated DeltaNet-2, fla's ``chunk_gdn2``) as Pallas TPU kernels, forward and backward.

Per head, with the state ``S`` of shape ``[K, V]``, a log decay ``g_t`` [K] (<= 0), an erase gate ``b_t`` [K] and
a write gate ``w_t`` [V]::

    S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T
    o_t = scale * S_t^T q_t

``b = w = beta`` (broadcast) is KDA. The kernels are kda's (:mod:`kernels_tpu.kda.chunk`) with two operands
changed: the erase side reads the erase key ``e = b * k`` where kda reads ``beta k``, and the write side the
gated value ``x = w * v`` where kda reads ``beta v``. Chunk form (chunk of ``C`` tokens, ``G`` the chunk-local
inclusive cumsum of ``g``, ``S`` the state entering the chunk, pairwise decays ``exp(G_r - G_s)`` for s <= r)::

    A[r,s] = sum_d e[r,d] k[s,d] exp(G[r,d]-G[s,d])   (s < r: the erase key of row r against the key of s)
    Tm  = (I + A)^{-1}                          unit lower triangular, forward substitution
    U   = Tm x,  W = Tm (e * exp G)
    dlt = U - W S                               the new values w_t v_t - S'_t^T e_t
    Aqk = scale * P,  P[r,s] = sum_d q[r,d] k[s,d] exp(G[r,d]-G[s,d])    (s <= r)
    o   = scale (q * exp G) S + Aqk dlt
    S'  = exp(G_C) * S + (k * exp(G_C - G))^T dlt

The backward is the same chain of transposes as kda's; where kda's ``dbeta`` collects the row-scalar products,
here the gradients of the two products are the chain rule done in the kernel on the chunk's tiles::

    e = b * k :  db = de * k,   dk += de * b          x = w * v :  dw = dx * v,   dv = dx * w

``e`` and ``x`` are formed in f32 in VMEM from the loaded tiles (exact for bf16 and fp16 inputs: a product of
two 8- or 11-bit significands fits f32's 24), so b and w travel from HBM in their own dtype and no [T, K] f32
operand is written for them.

Layering, as kda's: public functions (the op contract :func:`op_contract.check_gdn2`, fla's option rules, the
kernels' limits, all before tracing; then the in-kernel options as float32 jax ops, and kda's layout: K and V
lane-padded, the tokens in the rows of a :class:`kernels_tpu.varlen.ChunkWalk`) -> ``_gdn2``
(``jax.custom_vjp``) -> ``_fwd_impl`` / ``_bwd_impl`` (grid, BlockSpecs, ``pallas_call``) -> ``_fwd_kernel`` /
``_bwd_kernel``. Grid ``(R, H, NT)``, the chunk axis sequential and last, the f32 state (or its gradient) in
VMEM scratch; the forward keeps the chunk-start states ``[R, H, NT, K, V]`` (f32) as the only residual besides
the inputs, the backward walks the chunks in reverse, recomputes the intra-chunk quantities and writes each
gradient over its input in place.

Shared with kda, imported, not repeated: the chunk step (``dlt``, ``o``, ``S'`` from ``W``, ``U``, ``Aqk``:
:func:`kernels_tpu.delta_rule.chunk_step`) and its backward but for the erase side (``chunk_step_grads`` back to
``dA``, ``dx`` and ``d(e exp G)``; ``chunk_qkg_grads`` from there to dq, dk, dG), the pair scores and their two
adjoints (sub-chunked, every exponent <= 0: nothing overflows for any gate), the unit-lower inverse and its
gradient, the configuration, the dot
policy (every in-kernel dot through ``Config.policy``: :mod:`kernels_tpu.mxu`), the in-kernel options (gdn2's
are kda's functions in fla: ``l2norm_fwd`` and ``kda_gate_chunk_cumsum``), the chunk-local cumsum, the layout
helpers and fla's ``safe_gate`` argument check.

Padding tokens (T not a multiple of C, a packed sequence's last chunk, an empty sequence's chunk) are q = k = v
= 0, g = 0, b = w = 0: then e = x = 0, their rows of A, W, U and dlt are 0 and the decay is 1, so the state
passes through bit for bit. fla's gdn2 has no grouped value heads: the contract refuses v with another head
count than q (NotImplementedError, saying the fix).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from kernels_tpu.common import BlockSizes, HeadPadding, Walk, check_limits, final_state, start_state, walk_pass
from kernels_tpu.call_config import Config, head_major, make_config, public_o
from kernels_tpu.delta_rule import (chunk_cumsum, chunk_qkg_grads, chunk_step, chunk_step_grads, dot, load, pair_cols,
                                    pair_rows, pair_scores, preprocess, unit_lower_inverse)
from kernels_tpu.kda.chunk import check_options
from kernels_tpu.varlen import Packing
from op_contract import check_gdn2, gdn2_options, kda_options

F32 = jnp.float32


# ============================================================ in-kernel maths
def _intra(q, k, e, x, G, *, scale, bc, policy):
    """Intra-chunk quantities shared by forward and backward: e the erase key b*k, x the gated value w*v."""
    A = pair_scores(e, k, G, strict=True, bc=bc, policy=policy)  # erase key of row r against key of row s
    Tm = unit_lower_inverse(A, policy=policy)
    eG = jnp.exp(G)
    eg = e * eG
    W = dot(Tm, eg, policy=policy)
    U = dot(Tm, x, policy=policy)
    Aqk = scale * pair_scores(q, k, G, strict=False, bc=bc, policy=policy)
    return A, Tm, eG, eg, W, U, Aqk


# ============================================================ kernels
def _fwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, b_ref, w_ref, *refs, cfg: Config, walk: Walk,
                has_h0: bool):
    if has_h0:
        h0_ref, o_ref, hs_ref, ht_ref, S_scr = refs
    else:
        h0_ref = None
        o_ref, hs_ref, ht_ref, S_scr = refs
    pol = cfg.policy
    bc = cfg.blocks.sub_chunk
    begins, ends = walk.edges(edge_ref)  # this chunk starts / ends its sequence

    start_state(S_scr, h0_ref, begins)

    q, k, v, G, b, w = map(load, (q_ref, k_ref, v_ref, G_ref, b_ref, w_ref))
    S = S_scr[...]
    hs_ref[...] = S
    _, _, eG, _, W, U, Aqk = _intra(q, k, b * k, w * v, G, scale=cfg.scale, bc=bc, policy=pol)
    o, S_new = chunk_step(q, k, G, S, eG, W, U, Aqk, scale=cfg.scale, policy=pol)
    o_ref[...] = o.astype(o_ref.dtype)
    S_scr[...] = S_new

    @pl.when(ends)
    def _final_state():
        ht_ref[...] = S_new


def _bwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, b_ref, w_ref, hs_ref, do_ref, dht_ref,
                dq_ref, dk_ref, dv_ref, dG_ref, db_ref, dw_ref, dh0_ref, dS_scr, *, cfg: Config, walk: Walk):
    pol = cfg.policy
    bc = cfg.blocks.sub_chunk
    pairs = dict(bc=bc, policy=pol)
    begins, ends = walk.edges(edge_ref)  # reverse walk: a sequence begins at its last chunk

    start_state(dS_scr, dht_ref, begins)

    q, k, v, G, b, w, do = map(load, (q_ref, k_ref, v_ref, G_ref, b_ref, w_ref, do_ref))
    e, x = b * k, w * v
    S = hs_ref[...]
    dS = dS_scr[...]
    _, Tm, eG, eg, W, U, Aqk = _intra(q, k, e, x, G, scale=cfg.scale, bc=bc, policy=pol)
    st = chunk_step_grads(q, k, G, S, dS, do, Tm, eG, eg, x, W, U, Aqk, scale=cfg.scale, policy=pol)
    # A = pairs(e, k): row r reads the erase key, column s the key
    xe = pair_rows(st.dL, k, G, strict=True, **pairs)
    yk = pair_cols(st.dL, e, G, strict=True, **pairs)
    de = xe + st.dkw * eG  # eg = e * exp G
    # e = b * k: dk += de * b
    dq, dk, dG = chunk_qkg_grads(q, k, G, S, dS, eG, eg, st, dk_L=yk, dk_kw=de * b, dG_L=e * xe - k * yk,
                                 scale=cfg.scale, **pairs)
    db = de * k
    dv = st.dx * w  # x = w * v
    dw = st.dx * v

    for ref, val in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv), (dG_ref, dG), (db_ref, db), (dw_ref, dw)):
        ref[...] = val.astype(ref.dtype)  # the input's dtype: each gradient overwrites its input (_bwd_impl)
    dS_scr[...] = st.dS_prev

    @pl.when(ends)
    def _initial_state_grad():
        dh0_ref[...] = st.dS_prev


# ============================================================ pallas_call wrappers
# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnums=(0,))
def _fwd_impl(cfg: Config, q, k, v, G, b, w, h0):
    """Head-major kernel rows (:class:`kernels_tpu.varlen.ChunkWalk`): q, k, G, b [R,H,T,K]; v, w [R,H,T,V];
    h0 [N,H,K,V] or None (one state per sequence). Returns o [R,H,T,V] (q.dtype), chunk-start states
    [R,H,NT,K,V] f32, ht [N,H,K,V] f32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    C = cfg.blocks.chunk_size
    NT = T // C
    walk = Walk(NT)
    kspec = pl.BlockSpec((None, None, C, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, C, V), walk.chunk_map)
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    in_specs = [kspec, kspec, vspec, kspec, kspec, vspec] + ([sspec] if h0 is not None else [])
    args = (q, k, v, G, b, w) + ((h0,) if h0 is not None else ())
    o, hs, ht = walk_pass(
        functools.partial(_fwd_kernel, cfg=cfg, walk=walk, has_h0=h0 is not None), tables=cfg.walk.tables(),
        grid=(R, H, NT), in_specs=in_specs,
        out_specs=[vspec, pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map), sspec],
        out_shape=[jax.ShapeDtypeStruct((R, H, T, V), q.dtype),
                   jax.ShapeDtypeStruct((R, H, NT, K, V), F32),
                   jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="gdn2_fwd",
    )(*args)
    return o, hs, ht


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnums=(0,))
def _bwd_impl(cfg: Config, q, k, v, G, b, w, hs, do, dht):
    """Reverse chunk pass. Returns dq, dk, dG, db [R,H,T,K], dv, dw [R,H,T,V], each in its input's dtype and
    written over that input in place (each step reads its chunk before writing the chunk's gradient; the inputs
    are dead after this pass), and dh0 [N,H,K,V] f32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    C = cfg.blocks.chunk_size
    NT = T // C
    walk = Walk(NT, reverse=True)
    kspec = pl.BlockSpec((None, None, C, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, C, V), walk.chunk_map)
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    hspec = pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map)
    grads_of = (q, k, v, G, b, w)
    specs = [kspec, kspec, vspec, kspec, kspec, vspec]
    outs = walk_pass(
        functools.partial(_bwd_kernel, cfg=cfg, walk=walk), tables=cfg.walk.tables(),
        grid=(R, H, NT), in_specs=specs + [hspec, vspec, sspec],
        out_specs=specs + [sspec],
        out_shape=[*(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in grads_of),
                   jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="gdn2_bwd", aliases={i: i for i in range(len(grads_of))},
    )(q, k, v, G, b, w, hs, do, dht)
    return tuple(outs)


# ============================================================ custom_vjp core
def _core_fwd(cfg: Config, q, k, v, G, b, w, h0):
    o, hs, ht = _fwd_impl(cfg, q, k, v, G, b, w, h0)
    return (o, ht), (q, k, v, G, b, w, h0, hs)


def _core_bwd(cfg: Config, res, cts):
    q, k, v, G, b, w, h0, hs = res
    do, dht = cts
    dq, dk, dv, dG, db, dw, dh0 = _bwd_impl(cfg, q, k, v, G, b, w, hs, do, dht.astype(F32))
    return dq, dk, dv, dG, db, dw, None if h0 is None else dh0.astype(h0.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gdn2(cfg: Config, q, k, v, G, b, w, h0):
    """Head-major padded core: (o [R,H,T,V], ht [N,H,K,V] f32)."""
    o, _, ht = _fwd_impl(cfg, q, k, v, G, b, w, h0)
    return o, ht


_gdn2.defvjp(_core_fwd, _core_bwd)


# ============================================================ validation, options and layout
def _validate(q, k, v, g, b, w, scale, initial_state, chunk_size, opts: dict, A_log, dt_bias, *, do=None,
              dht=None, cu_seqlens=None) -> float:
    """All checks before tracing: the op contract (:func:`op_contract.check_gdn2`: ValueError, and
    NotImplementedError for grouped value heads, which fla's gdn2 does not take), fla's option rules (kda's
    :func:`kernels_tpu.kda.check_options`: gdn2's ``safe_gate`` rule is kda's), then the kernels' limits
    (NotImplementedError). Returns the resolved scale (from the true K)."""
    dims, scale = check_gdn2(q, k, v, g, b, w, scale, initial_state, chunk_size, opts=opts, A_log=A_log,
                             dt_bias=dt_bias, do=do, dht=dht, cu_seqlens=cu_seqlens)
    check_options(opts)
    check_limits(q, dims)
    return scale


NO_BETA = np.zeros((), np.float32)
"""kda's :func:`~kernels_tpu.delta_rule.preprocess` also maps kda's beta; gdn2 has none, so it gets this scalar and
its result is dropped (b and w are used as given, as in fla)."""


def _kernel_operands(cfg: Config, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts: dict):
    """The chunk kernels' operands: the in-kernel options applied (kda's, on the public tokens and the true K),
    K and V lane-padded (g, b with 0 on the padded key channels, w on the padded value channels), the tokens in
    the walk's rows (zero tokens: the identity), head-major, and G the chunk-local cumulative gate. Returns the
    HeadPadding and (q, k, v, G, b, w, h0)."""
    q, k, g, _ = preprocess(q, k, g, NO_BETA, A_log, dt_bias, kda_options(opts))
    pad = HeadPadding.of(q, v)
    rows = cfg.walk.to_rows
    qh, kh, gh, bh = (head_major(rows(pad.keys(x))) for x in (q, k, g, b))
    vh, wh = (head_major(rows(pad.values(x))) for x in (v, w))
    h0 = None if initial_state is None else pad.state(initial_state.astype(F32))
    return pad, (qh, kh, vh, chunk_cumsum(gh, cfg.blocks.chunk_size), bh, wh, h0)


@functools.partial(jax.jit, static_argnums=(0, 10))
def _run(cfg: Config, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts_items: tuple):
    """Options, layout and the custom-VJP core, jitted (cfg and options static)."""
    pad, operands = _kernel_operands(cfg, q, k, v, g, b, w, initial_state, A_log, dt_bias, dict(opts_items))
    o, ht = _gdn2(cfg, *operands)
    return public_o(cfg, pad, o, q), pad.unpad_state(ht)


@functools.partial(jax.jit, static_argnums=(0, 10))
def _fwd_only(cfg: Config, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts_items: tuple):
    pad, operands = _kernel_operands(cfg, q, k, v, g, b, w, initial_state, A_log, dt_bias, dict(opts_items))
    o, _, ht = _fwd_impl(cfg, *operands)
    return public_o(cfg, pad, o, q), pad.unpad_state(ht)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _bwd_only(cfg: Config, opts_items: tuple, primals: dict, do, dht):
    def f(p):
        return _run(cfg, p["q"], p["k"], p["v"], p["g"], p["b"], p["w"], p.get("h0"), p.get("A_log"),
                    p.get("dt_bias"), opts_items)

    (o, _), vjp = jax.vjp(f, primals)
    return vjp((do.astype(o.dtype), dht))[0]


# ============================================================ public API
def setup(q, k, v, g, b, w, scale, initial_state, chunk_size, interpret, mxu_model, cu_seqlens, options,
           f32_precision=None, **grads):
    """Validated config and options; ``grads`` are the backward's cotangents (do, dht) to check too."""
    options = dict(options)
    A_log, dt_bias = options.pop("A_log", None), options.pop("dt_bias", None)
    opts = gdn2_options(options)
    scale = _validate(q, k, v, g, b, w, scale, initial_state, chunk_size, opts, A_log, dt_bias,
                      cu_seqlens=cu_seqlens, **grads)
    if not opts["use_gate_in_kernel"]:
        A_log = dt_bias = None  # ignored without the in-kernel gate, as in fla
    cfg = make_config(scale, BlockSizes(chunk_size=chunk_size), interpret, mxu_model, q.dtype,
                       Packing.of(cu_seqlens, q), f32_precision)
    return cfg, tuple(sorted(opts.items())), A_log, dt_bias


def chunk_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
               interpret=None, mxu_model=None, *, cu_seqlens=None, **options):
    """Chunked GDN-2, differentiable (jax.vjp / jax.grad) through a custom VJP of Pallas kernels.

    Args:
      q, k: [B, T, H, K]; v: [B, T, H, V] (bf16, fp16 or fp32); any K, V (zero-padded to multiples of 128
        internally, exact: kernels_tpu.common.HeadPadding). No grouped value heads (as fla's gdn2).
      g: [B, T, H, K] log decay (<= 0: a concrete positive g is a ValueError, a traced one is not checked), or
        the raw gate input (any sign) with ``use_gate_in_kernel``.
      b: [B, T, H, K] erase gate; w: [B, T, H, V] write gate (any float dtype; used as given).
      scale: K**-0.5 when None.
      initial_state: [N, H, K, V] float32, optional (N = B, or the number of packed sequences).
      output_final_state: also return ht [N, H, K, V] in initial_state's dtype (float32 without one).
      chunk_size: a multiple of 16 (fla's gdn2 takes 64 only); T need not be a multiple (zero-padded
        internally, exact).
      interpret: None/False -> native TPU; True -> pltpu.InterpretParams(uninitialized_memory="nan");
        a pltpu.InterpretParams is passed through.
      mxu_model: model MXU rounding in every dot; None means "iff interpreting".
      options (as fla.ops.gdn2.chunk_gdn2): use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log [H],
        dt_bias [H*K], safe_gate, lower_bound. Applied with float32 jax ops before the kernels.
      cu_seqlens: packed variable-length sequences (fla): N+1 static int offsets with B = 1; sequence i starts
        from initial_state[i] and ends in ht[i] (an empty one's ht[i] is its initial_state[i]).

    Returns:
      (o [B, T, H, V] in q's dtype, ht [N, H, K, V] float32 or None).
    """
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, b, w, scale, initial_state, chunk_size, interpret, mxu_model,
                                       cu_seqlens, options)
    o, ht = _run(cfg, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts)
    return o, final_state(ht if output_final_state else None, initial_state)


def chunk_gdn2_fwd(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
                   interpret=None, mxu_model=None, *, cu_seqlens=None, dot_precision=None, **options):
    """Forward only: (o, ht or None), the forward kernel without the VJP machinery. Args as chunk_gdn2, plus
    ``dot_precision`` (one of ``kernels_tpu.mxu.PRECISIONS``, as :func:`kernels_tpu.kda.chunk_kda_fwd`): the
    precision of every f32-operand dot in place of the policy's table."""
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, b, w, scale, initial_state, chunk_size, interpret, mxu_model,
                                       cu_seqlens, options, f32_precision=dot_precision)
    o, ht = _fwd_only(cfg, q, k, v, g, b, w, initial_state, A_log, dt_bias, opts)
    return o, final_state(ht if output_final_state else None, initial_state)


def chunk_gdn2_bwd(q, k, v, g, b, w, do, dht=None, scale=None, initial_state=None, chunk_size=64, interpret=None,
                   mxu_model=None, *, cu_seqlens=None, **options):
    """Backward of ``loss = sum(o * do) + sum(ht * dht)`` (forward kernel, then backward kernel).

    do: [B, T, H, V]; dht: [N, H, K, V] or None (zero). Other args as chunk_gdn2.
    Returns dict(dq, dk, dv, dg, db, dw, dh0, dA_log, ddt_bias), each in its input's dtype; dh0 is None without
    initial_state, dA_log / ddt_bias None unless use_gate_in_kernel and given.
    """
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, b, w, scale, initial_state, chunk_size, interpret, mxu_model,
                                       cu_seqlens, options, do=do, dht=dht)
    K = q.shape[-1]
    H, V = v.shape[2:]
    primals = dict(q=q, k=k, v=v, g=g, b=b, w=w, h0=initial_state, A_log=A_log, dt_bias=dt_bias)
    primals = {n: x for n, x in primals.items() if x is not None}
    dht = jnp.zeros((cfg.packing.N, H, K, V), F32) if dht is None else jnp.asarray(dht, F32)
    grads = _bwd_only(cfg, opts, primals, jnp.asarray(do), dht)
    names = ("q", "k", "v", "g", "b", "w", "h0", "A_log", "dt_bias")
    return {"d" + n: grads.get(n) for n in names}
