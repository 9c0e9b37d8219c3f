"""Chunked KDA (Kimi delta attention) as Pallas TPU kernels, forward and backward.

Per head, with the state ``S`` of shape ``[K, V]``::

    S_t = Diag(exp g_t) S_{t-1} + beta_t k_t (v_t - (Diag(exp g_t) S_{t-1})^T k_t)^T
    o_t = scale * S_t^T q_t

Chunk form (chunk of ``C`` tokens, ``G`` the chunk-local inclusive cumsum of ``g``, ``S`` the
state entering the chunk; all products of pairwise decays ``exp(G_r - G_s)`` are for s <= r)::

    L   = Diag(beta) M,  M[r,s] = sum_d k[r,d] k[s,d] exp(G[r,d]-G[s,d])   (s < r; Akk)
    Tm  = (I + L)^{-1}                           unit lower triangular, forward substitution
    u   = Tm (beta * v),  w = Tm (beta * k * exp G)
    dlt = u - w S                                the new values beta_t (v_t - S'_t^T k_t)
    Aqk = scale * P,  P[r,s] = sum_d q[r,d] k[s,d] exp(G[r,d]-G[s,d])    (s <= r)
    o   = scale (q * exp G) S + Aqk dlt
    S'  = exp(G_C) * S + (k * exp(G_C - G))^T dlt

Layering: public functions (validate before tracing, unset arguments filled in, in-kernel options as jax ops,
then the layout: K and V lane-padded (:class:`kernels_tpu.common.HeadPadding`), the tokens in the rows of
a :class:`kernels_tpu.varlen.ChunkWalk`: packed sequences chunk-aligned in one row, no padding rows)
-> ``_kda`` (``jax.custom_vjp``) -> ``_fwd_impl`` / ``_bwd_impl`` (grid, BlockSpecs, ``pallas_call``)
-> ``_fwd_kernel`` / ``_bwd_kernel``. Grid ``(R, H, NT)`` over the walk's rows (B, or one when packed),
its tables scalar-prefetched: a sequence's first chunk starts the state from its h0, its last writes its
ht (:class:`kernels_tpu.common.Walk`). The chunk axis is sequential (``"arbitrary"``, last) and carries
the f32 state (or its gradient) in VMEM scratch. The forward also writes the chunk-start states
``[R, H, NT, K, V]`` (f32), the only residual besides the inputs; the backward walks the chunks in
reverse through its index maps and recomputes the intra-chunk quantities. The chunk step and its backward but
for the erase side (:func:`~kernels_tpu.delta_rule.chunk_step`, ``chunk_step_grads``, ``chunk_qkg_grads``) are
gdn2's too (:mod:`kernels_tpu.gdn2.chunk`): only how ``L`` is made from the keys differs. They, the pairwise
scores and the triangular inverse live in :mod:`kernels_tpu.delta_rule`; the call's configuration and head-major
layout in :mod:`kernels_tpu.call_config`.

Gate stability (``g <= 0``): every exponential is of a non-positive number. ``exp G``,
``exp(G_C - G)`` are <= 1. Pairwise decays are evaluated on sub-chunks of ``sub_chunk`` rows:
off-diagonal blocks (s in an earlier sub-chunk than r) factor through the first row ``G_ref``
of r's sub-chunk, ``exp(G_r - G_ref) * exp(G_ref - G_s)``, both factors <= 1, and go through
the MXU; diagonal blocks form ``G_r - G_s`` directly, mask the exponent to 0 above the diagonal
*before* ``exp`` and zero it after. Nothing overflows for any chunk size or gate magnitude.

In-kernel options of fla's ``chunk_kda`` (``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel``
with ``A_log``/``dt_bias``/``lower_bound``, ``use_beta_sigmoid_in_kernel``/``allow_neg_eigval``)
are applied by the public function with jax ops (float32) before the kernels, on the public tokens and the
true K, so padding comes after them: a padding token is then q = k = v = 0, g = 0 and beta = 0 (the identity),
where the raw inputs' zeros would not be (sigmoid(0) = 1/2, softplus(0) > 0); gradients flow through the
options and the layout by ordinary autodiff. ``safe_gate`` is a numerics switch of fla's GPU kernel
and does not change the function; its argument checks are mirrored. The chunk-local cumsum of
the gate is also a jax op (its gradient, a reverse cumsum, comes from autodiff).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from op_contract import check_kda, kda_options
from kernels_tpu.call_config import Config, head_major, make_config, public_o
from kernels_tpu.common import (BlockSizes, HeadPadding, Walk, check_limits, chunk_rows, column_to_row, final_state,
                                row_to_column, start_state, value_heads, walk_pass)
from kernels_tpu.delta_rule import (F32, chunk_cumsum, chunk_qkg_grads, chunk_step,
                                    chunk_step_grads, dot, load, pair_cols, pair_rows, pair_scores,
                                    preprocess, unit_lower_inverse)
from kernels_tpu.varlen import Packing

# ============================================================ kda's intra-chunk quantities
def _intra(q, k, v, G, beta, *, scale, bc, policy):
    """Intra-chunk quantities shared by forward and backward."""
    M = pair_scores(k, k, G, strict=True, bc=bc, policy=policy)
    Tm = unit_lower_inverse(beta * M, policy=policy)
    eG = jnp.exp(G)
    kbg = beta * k * eG
    vb = beta * v
    w = dot(Tm, kbg, policy=policy)
    u = dot(Tm, vb, policy=policy)
    Aqk = scale * pair_scores(q, k, G, strict=False, bc=bc, policy=policy)
    return M, Tm, eG, kbg, vb, w, u, Aqk


# ============================================================ kernels
def _fwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, beta_ref, *refs, cfg: Config, walk: Walk,
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

    q, k, v, G, beta = map(load, (q_ref, k_ref, v_ref, G_ref, beta_ref))
    beta = row_to_column(beta)
    S = S_scr[...]
    hs_ref[...] = S
    _, _, eG, _, _, w, u, Aqk = _intra(q, k, v, G, beta, scale=cfg.scale, bc=bc, policy=pol)
    o, S_new = chunk_step(q, k, G, S, eG, w, u, Aqk, scale=cfg.scale, policy=pol)
    o_ref[...] = o.astype(o_ref.dtype)
    S_scr[...] = S_new

    @pl.when(ends)
    def _final_state():
        ht_ref[...] = S_new


def _bwd_kernel(slot_ref, edge_ref, q_ref, k_ref, v_ref, G_ref, beta_ref, hs_ref, do_ref, dht_ref,
                dq_ref, dk_ref, dv_ref, dG_ref, dbeta_ref, dh0_ref, dS_scr, *, cfg: Config, walk: Walk):
    pol = cfg.policy
    bc = cfg.blocks.sub_chunk
    pairs = dict(bc=bc, policy=pol)
    begins, ends = walk.edges(edge_ref)  # reverse walk: a sequence begins at its last chunk

    start_state(dS_scr, dht_ref, begins)

    q, k, v, G, beta, do = map(load, (q_ref, k_ref, v_ref, G_ref, beta_ref, do_ref))
    beta = row_to_column(beta)
    S = hs_ref[...]
    dS = dS_scr[...]
    M, Tm, eG, kbg, vb, w, u, Aqk = _intra(q, k, v, G, beta, scale=cfg.scale, bc=bc, policy=pol)
    st = chunk_step_grads(q, k, G, S, dS, do, Tm, eG, kbg, vb, w, u, Aqk, scale=cfg.scale, policy=pol)
    # L = beta M
    dbeta = jnp.sum(st.dL * M, axis=1, keepdims=True)
    dM = beta * st.dL
    # M = pairs(k, k): k is both sides of every pair
    xk = pair_rows(dM, k, G, strict=True, **pairs)
    yk = pair_cols(dM, k, G, strict=True, **pairs)
    # kbg = beta * k * exp G: dk gets beta exp G dkbg (its beta and G sides: dbeta below, dG in chunk_qkg_grads)
    dq, dk, dG = chunk_qkg_grads(q, k, G, S, dS, eG, kbg, st, dk_L=xk + yk, dk_kw=beta * eG * st.dkw,
                                 dG_L=k * (xk - yk), scale=cfg.scale, **pairs)
    dv = beta * st.dx
    dbeta = dbeta + jnp.sum(st.dx * v, axis=1, keepdims=True) + jnp.sum(st.dkw * k * eG, axis=1, keepdims=True)

    for ref, x in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv), (dG_ref, dG), (dbeta_ref, column_to_row(dbeta))):
        ref[...] = x.astype(ref.dtype)  # the input's dtype: each gradient overwrites its input (_bwd_impl)
    dS_scr[...] = st.dS_prev

    @pl.when(ends)
    def _initial_state_grad():
        dh0_ref[...] = st.dS_prev


# ============================================================ pallas_call wrappers
# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnums=(0,))
def _fwd_impl(cfg: Config, q, k, v, G, beta, h0):
    """Head-major kernel rows (:class:`kernels_tpu.varlen.ChunkWalk`): q, k, G [R,H,T,K]; v [R,H,T,V];
    beta [R,H,NT,1,C] (chunk rows: :func:`kernels_tpu.common.chunk_rows`); h0 [N,H,K,V] or None (one state per
    sequence). Returns o [R,H,T,V] (q.dtype),
    chunk-start states [R,H,NT,K,V] f32, ht [N,H,K,V] f32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    C = cfg.blocks.chunk_size
    NT = T // C
    walk = Walk(NT)
    kspec = pl.BlockSpec((None, None, C, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, C, V), walk.chunk_map)
    bspec = pl.BlockSpec((None, None, None, 1, C), walk.chunk_states_map)  # beta's chunk rows
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    in_specs = [kspec, kspec, vspec, kspec, bspec] + ([sspec] if h0 is not None else [])
    args = (q, k, v, G, beta) + ((h0,) if h0 is not None else ())
    o, hs, ht = walk_pass(
        functools.partial(_fwd_kernel, cfg=cfg, walk=walk, has_h0=h0 is not None), tables=cfg.walk.tables(),
        grid=(R, H, NT), in_specs=in_specs,
        out_specs=[vspec, pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map), sspec],
        out_shape=[jax.ShapeDtypeStruct((R, H, T, V), q.dtype),
                   jax.ShapeDtypeStruct((R, H, NT, K, V), F32),
                   jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="kda_fwd",
    )(*args)
    return o, hs, ht


# jitted with its static settings: eager calls would retrace and recompile the kernels every time
@functools.partial(jax.jit, static_argnums=(0,))
def _bwd_impl(cfg: Config, q, k, v, G, beta, hs, do, dht):
    """Reverse chunk pass. Returns dq, dk, dG [R,H,T,K], dv [R,H,T,V], dbeta [R,H,NT,1,C], each in its input's
    dtype and written over that input in place (each step reads its chunk before writing the chunk's
    gradient; the inputs are dead after this pass), and dh0 [N,H,K,V] f32."""
    R, H, T, K = q.shape
    V = v.shape[-1]
    C = cfg.blocks.chunk_size
    NT = T // C
    walk = Walk(NT, reverse=True)
    kspec = pl.BlockSpec((None, None, C, K), walk.chunk_map)
    vspec = pl.BlockSpec((None, None, C, V), walk.chunk_map)
    bspec = pl.BlockSpec((None, None, None, 1, C), walk.chunk_states_map)  # beta's chunk rows
    sspec = pl.BlockSpec((None, None, K, V), walk.slot_map)
    hspec = pl.BlockSpec((None, None, None, K, V), walk.chunk_states_map)
    outs = walk_pass(
        functools.partial(_bwd_kernel, cfg=cfg, walk=walk), tables=cfg.walk.tables(),
        grid=(R, H, NT), in_specs=[kspec, kspec, vspec, kspec, bspec, hspec, vspec, sspec],
        out_specs=[kspec, kspec, vspec, kspec, bspec, sspec],
        out_shape=[*(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, G, beta)),
                   jax.ShapeDtypeStruct((cfg.packing.N, H, K, V), F32)],
        state=(K, V), interpret=cfg.interpret, name="kda_bwd", aliases={i: i for i in range(5)},
    )(q, k, v, G, beta, hs, do, dht)
    return tuple(outs)


# ============================================================ custom_vjp core
def _core_fwd(cfg: Config, q, k, v, G, beta, h0):
    o, hs, ht = _fwd_impl(cfg, q, k, v, G, beta, h0)
    return (o, ht), (q, k, v, G, beta, h0, hs)


def _core_bwd(cfg: Config, res, cts):
    q, k, v, G, beta, h0, hs = res
    do, dht = cts
    dq, dk, dv, dG, dbeta, dh0 = _bwd_impl(cfg, q, k, v, G, beta, hs, do, dht.astype(F32))
    return dq, dk, dv, dG, dbeta, None if h0 is None else dh0.astype(h0.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kda(cfg: Config, q, k, v, G, beta, h0):
    """Head-major padded core: (o [B,H,T,V], ht [B,H,K,V] f32)."""
    o, _, ht = _fwd_impl(cfg, q, k, v, G, beta, h0)
    return o, ht


_kda.defvjp(_core_fwd, _core_bwd)


# ============================================================ validation and options
def _validate(q, k, v, g, beta, scale, initial_state, chunk_size, opts: dict, A_log, dt_bias, *, do=None,
              dht=None, cu_seqlens=None) -> float:
    """All checks before tracing: the op contract (:func:`op_contract.check_kda`, ValueError), fla's option
    rules (ValueError), then the kernels' limits (NotImplementedError). Returns the resolved scale (from
    the true K)."""
    dims, scale = check_kda(q, k, v, g, beta, scale, initial_state, chunk_size, opts=opts, A_log=A_log,
                            dt_bias=dt_bias, do=do, dht=dht, cu_seqlens=cu_seqlens)
    check_options(opts)
    check_limits(q, dims)
    return scale


SAFE_GATE_LOWER_BOUND = (-5.0, 0.0)  # fla's safe_gate: lower_bound in [-5, 0) bounds every chunk's decay


def check_options(opts: dict) -> None:
    """fla's rules on ``chunk_kda``'s option combination, from the options alone (ValueError).

    The float64 reference computes the same function without them (``safe_gate`` only picks
    kernel numerics); the op descriptor asks this check when it validates a case.
    """
    lo, hi = SAFE_GATE_LOWER_BOUND
    lb = opts.get("lower_bound")
    if opts.get("safe_gate") and opts.get("use_gate_in_kernel") and (lb is None or not lo <= lb < hi):
        raise ValueError(f"safe_gate with use_gate_in_kernel needs lower_bound in [{lo:g}, {hi:g}), got {lb}")
    if opts.get("allow_neg_eigval") and not opts.get("use_beta_sigmoid_in_kernel"):
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")


def kernel_layout(cfg: Config, q, k, v, g, beta, initial_state, A_log, dt_bias, opts: dict):
    """Options applied (public tokens, true K), then the layout every kda kernel walks: K and V lane-padded (g
    with 0: decay 1), the tokens in the walk's rows (whole chunks; zero tokens with g = 0 and beta = 0 leave the
    state unchanged, so the padding is exact), head-major. Returns the HeadPadding that slices results back and
    (q, k, v, g [R,H,T,K|V], beta [R,H,T], h0)."""
    q, k, g, beta = preprocess(q, k, g, beta, A_log, dt_bias, opts)
    q, k = (value_heads(x, v) for x in (q, k))
    pad = HeadPadding.of(q, v)
    rows = cfg.walk.to_rows
    qh, kh, vh, gh = (head_major(rows(x)) for x in (pad.keys(q), pad.keys(k), pad.values(v), pad.keys(g)))
    h0 = None if initial_state is None else pad.state(initial_state.astype(F32))
    return pad, (qh, kh, vh, gh, head_major(rows(beta)), h0)


def _kernel_operands(cfg: Config, q, k, v, g, beta, initial_state, A_log, dt_bias, opts: dict):
    """The chunk kernels' operands (:func:`kernel_layout`), G the chunk-local cumulative gate and beta in chunk
    rows: the HeadPadding and (q, k, v, G, beta, h0)."""
    C = cfg.blocks.chunk_size
    pad, (qh, kh, vh, gh, beta_h, h0) = kernel_layout(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, opts)
    return pad, (qh, kh, vh, chunk_cumsum(gh, C), chunk_rows(beta_h, C), h0)


@functools.partial(jax.jit, static_argnums=(0, 9))
def _run(cfg: Config, q, k, v, g, beta, initial_state, A_log, dt_bias, opts_items: tuple):
    """Options, layout and the custom-VJP core, jitted (cfg and options static)."""
    pad, operands = _kernel_operands(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, dict(opts_items))
    o, ht = _kda(cfg, *operands)
    return public_o(cfg, pad, o, q), pad.unpad_state(ht)


# ============================================================ public API
def setup(q, k, v, g, beta, scale, initial_state, chunk_size, interpret, mxu_model, cu_seqlens, options,
           f32_precision=None, blocks=None, **grads):
    """Validated config and options; ``grads`` are the backward's cotangents (do, dht) to check too; ``blocks``
    the tiling when it is not the chunk kernels' (chunk_size then gives the tokens per grid step)."""
    options = dict(options)
    A_log, dt_bias = options.pop("A_log", None), options.pop("dt_bias", None)
    opts = kda_options(options)
    scale = _validate(q, k, v, g, beta, scale, initial_state, chunk_size, opts, A_log, dt_bias,
                      cu_seqlens=cu_seqlens, **grads)
    if not opts["use_gate_in_kernel"]:
        A_log = dt_bias = None  # ignored without the in-kernel gate, as in fla
    blocks = BlockSizes(chunk_size=chunk_size) if blocks is None else blocks
    cfg = make_config(scale, blocks, interpret, mxu_model, q.dtype, Packing.of(cu_seqlens, q), f32_precision)
    return cfg, tuple(sorted(opts.items())), A_log, dt_bias


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
              interpret=None, mxu_model=None, *, cu_seqlens=None, **options):
    """Chunked KDA, differentiable (jax.vjp / jax.grad) through a custom VJP of Pallas kernels.

    Args:
      q, k: [B, T, H, K]; v: [B, T, HV, V] (bf16, fp16 or fp32); any K, V (zero-padded to multiples of
        128 internally, exact: kernels_tpu.common.HeadPadding). HV a multiple of H: grouped value heads,
        q and k repeated to HV (kernels_tpu.common.value_heads); g, beta, A_log, dt_bias and the state
        then have HV heads.
      g: [B, T, HV, K] log decay (<= 0: a concrete positive g is a ValueError, a traced one is not
        checked), or the raw gate input (any sign) with ``use_gate_in_kernel``.
      beta: [B, T, HV] (or raw logits with ``use_beta_sigmoid_in_kernel``).
      scale: K**-0.5 when None.
      initial_state: [N, HV, K, V] float32, optional (N = B, or the number of packed sequences); a state cache's
        bf16 or fp16 is taken too: carried in float32 inside, ht returned in its dtype (common.final_state).
      output_final_state: also return ht [N, HV, K, V] in initial_state's dtype (float32 without one).
      chunk_size: a multiple of 16; T need not be a multiple (zero-padded internally, exact).
      interpret: None/False -> native TPU; True -> pltpu.InterpretParams(uninitialized_memory="nan");
        a pltpu.InterpretParams is passed through.
      mxu_model: model MXU rounding in every dot; None means "iff interpreting".
      options (as fla.ops.kda.chunk_kda): use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log [HV],
        dt_bias [HV*K], use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound.
        Applied with float32 jax ops before the kernels (same function, autodiff gradients).
      cu_seqlens: packed variable-length sequences (fla): N+1 static int offsets (tuple, list or numpy
        array) 0 < ... < T with B = 1; sequence i starts from initial_state[i] and ends in ht[i]
        (kernels_tpu.varlen).

    Returns:
      (o [B, T, HV, V] in q's dtype (as fla), ht [N, HV, K, V] float32 or None).
    """
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, beta, scale, initial_state, chunk_size, interpret,
                                       mxu_model, cu_seqlens, options)
    o, ht = _run(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, opts)
    return o, final_state(ht if output_final_state else None, initial_state)


def chunk_kda_fwd(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
                  interpret=None, mxu_model=None, *, cu_seqlens=None, dot_precision=None, **options):
    """Forward only: (o, ht or None), the forward kernel without the VJP machinery. Args as chunk_kda, plus
    ``dot_precision`` (one of ``kernels_tpu.mxu.PRECISIONS``): the precision of every f32-operand dot in place
    of the policy's table. The decode path asks for ``HIGHEST``: fla decodes with float32 elementwise products,
    which a bf16x3 dot of the carried state does not match (docs/precision.md)."""
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, beta, scale, initial_state, chunk_size, interpret,
                                       mxu_model, cu_seqlens, options, f32_precision=dot_precision)
    o, ht = _fwd_only(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, opts)
    return o, final_state(ht if output_final_state else None, initial_state)


@functools.partial(jax.jit, static_argnums=(0, 9))
def _fwd_only(cfg: Config, q, k, v, g, beta, initial_state, A_log, dt_bias, opts_items: tuple):
    pad, operands = _kernel_operands(cfg, q, k, v, g, beta, initial_state, A_log, dt_bias, dict(opts_items))
    o, _, ht = _fwd_impl(cfg, *operands)
    return public_o(cfg, pad, o, q), pad.unpad_state(ht)


def chunk_kda_bwd(q, k, v, g, beta, do, dht=None, scale=None, initial_state=None, chunk_size=64,
                  interpret=None, mxu_model=None, *, cu_seqlens=None, **options):
    """Backward of ``loss = sum(o * do) + sum(ht * dht)`` (forward kernel, then backward kernel).

    do: [B, T, HV, V]; dht: [N, HV, K, V] or None (zero). Other args as chunk_kda.
    Returns dict(dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias), each in its input's dtype;
    dh0 is None without initial_state, dA_log / ddt_bias None unless use_gate_in_kernel and given.
    """
    cfg, opts, A_log, dt_bias = setup(q, k, v, g, beta, scale, initial_state, chunk_size, interpret,
                                       mxu_model, cu_seqlens, options, do=do, dht=dht)
    K = q.shape[-1]
    HV, V = v.shape[2:]
    primals = dict(q=q, k=k, v=v, g=g, beta=beta, h0=initial_state, A_log=A_log, dt_bias=dt_bias)
    primals = {n: x for n, x in primals.items() if x is not None}

    dht = jnp.zeros((cfg.packing.N, HV, K, V), F32) if dht is None else jnp.asarray(dht, F32)
    grads = _bwd_only(cfg, opts, primals, jnp.asarray(do), dht)
    names = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
    return {"d" + n: grads.get(n) for n in names}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _bwd_only(cfg: Config, opts_items: tuple, primals: dict, do, dht):
    def f(p):
        return _run(cfg, p["q"], p["k"], p["v"], p["g"], p["beta"], p.get("h0"), p.get("A_log"),
                    p.get("dt_bias"), opts_items)

    (o, _), vjp = jax.vjp(f, primals)
    return vjp((do.astype(o.dtype), dht))[0]
