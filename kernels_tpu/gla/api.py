"""Public GLA entry points: validation, dispatch, custom_vjp.

Layering: public function (validate before tracing, unset arguments, dispatch, T
padding) -> ``jax.custom_vjp`` per path (``_chunk_path`` / ``_fused_path``)
-> ``*_impl`` (grid, BlockSpecs, pallas_call) -> ``_*_kernel`` bodies.

Dispatch (``path``), reported by :func:`gla_dispatch`:

- ``"auto"``: ``"fused"`` for a g_gamma gate, ``"chunk"`` for a per-channel g
  (and for g_gamma when T is not a multiple of chunk_size and the final state
  is used: the chunk path pads that exactly, the fused one cannot).
- ``"fused"``: the single-pallas_call g_gamma kernels (g_gamma only).
- ``"chunk"``: the four-kernel chunk path; a g_gamma gate is broadcast to a
  per-channel ``g [B,T,H,K]`` (outside the custom_vjp, so autodiff sums dg into
  dg_gamma).

Layout (:func:`_operands`, :func:`_public`), the same for every entry point:
K and V are zero-padded to lane multiples (:class:`kernels_tpu.common.HeadPadding`;
a per-channel gate with 0, decay 1), and the tokens are laid in the rows of a
:class:`kernels_tpu.varlen.ChunkWalk`: whole chunks, packed sequences
(``cu_seqlens``) chunk-aligned in one row, each sequence's last chunk filled
with zero tokens (zero q, k, v, do and a zero log gate, i.e. decay 1, for g);
results are gathered back. On the fused path the constant gate keeps decaying
over those filling tokens, so there padding in time is only exact without a
final state (``output_final_state=False``, no dht): "auto" then takes the chunk
path.

Gates are log decays (``g <= 0``, ``g_gamma <= 0``): the overflow-safety
argument (every exponent <= 0) relies on it. A concrete positive gate is a
ValueError (:mod:`op_contract`); a gate traced inside jit/vjp cannot be inspected
and is not checked (it is computed with the same formulas, whose exponentials
can then overflow).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from op_contract import check_gate_choice, check_gla

from .chunk import chunk_bwd_impl, chunk_fwd_impl
from .. import mxu
from ..interpret import resolve_interpret, resolve_mxu_model
from ..common import HeadPadding, check_limits, check_one_gate, check_per_head_gamma, final_state
from ..varlen import Packing
from .common import PATHS, BlockSizes, Config
from .fused import fused_bwd_impl, fused_fwd_impl

f32 = jnp.float32


# ------------------------------------------------------------------ dispatch
def gla_dispatch(g, g_gamma, path: str = "auto", *, ragged_with_state: bool = False) -> str:
    """Which kernel path runs: ``"fused"`` or ``"chunk"`` (ValueError if impossible).

    ``ragged_with_state``: T, or a packed sequence's length, is not a multiple of chunk_size and the
    final state is used (returned, or dht given). The fused kernel keeps decaying over the padding
    tokens of a chunk that a sequence ends inside, so ``"auto"`` then takes the chunk path, which
    pads exactly.
    """
    if path not in PATHS:
        raise ValueError(f"{path=} must be one of {PATHS}")
    check_gate_choice(g, g_gamma, "BTHK", required=True)
    check_one_gate(g, g_gamma)
    if path == "auto":
        return "fused" if g_gamma is not None and not ragged_with_state else "chunk"
    if path == "fused" and g is not None:
        raise NotImplementedError(f"{path=} needs a per-head g_gamma [H]; for a per-channel g use path='chunk'")
    return path


def _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path, output_final_state,
              do=None, dht=None, cu_seqlens=None):
    """All checks before tracing: the op contract (:func:`op_contract.check_gla`, ValueError), then the
    kernels' limits (NotImplementedError). Returns the path, the blocks, the resolved scale (from the
    true K) and the packing."""
    dims, scale = check_gla(q, k, v, g, g_gamma, scale, initial_state, chunk_size, do=do, dht=dht,
                            cu_seqlens=cu_seqlens)
    check_limits(q, dims)
    check_one_gate(g, g_gamma)
    check_per_head_gamma(g_gamma)
    blocks = BlockSizes(chunk_size=chunk_size)
    packing = Packing.of(cu_seqlens, q)
    ragged_with_state = packing.ends_inside_a_chunk(chunk_size) and (output_final_state or dht is not None)
    which = gla_dispatch(g, g_gamma, path, ragged_with_state=ragged_with_state)
    if which == "fused" and ragged_with_state:
        if packing.packed:
            rows = f"the packed sequences' lengths {packing.lengths} are not all multiples of {chunk_size=}"
            fix = "sequences of whole chunks, or path='chunk'"
        else:
            rows, fix = f"T={dims.T} is not a multiple of {chunk_size=}", "T a multiple of chunk_size, or path='chunk'"
        raise NotImplementedError(f"{rows}, and the fused g_gamma path cannot pad T exactly when the final state "
                                  f"is used: pass {fix}")
    return which, blocks, scale, packing


def _config(q, scale, blocks, packing, interpret, mxu_model) -> Config:
    interp = resolve_interpret(interpret)
    return Config(scale=scale, blocks=blocks, interpret=interp, mxu_model=resolve_mxu_model(mxu_model, interp),
                  dtype=jnp.dtype(q.dtype).name, packing=packing)


# ------------------------------------------------------------------ layout
def _rows(cfg: Config, x):
    """Public tokens [B,T,H,X] -> kernel rows [R,NT*C,H,X] of the walk: whole chunks, packed sequences
    chunk-aligned in one row, zero (identity) tokens filling each sequence's last chunk."""
    return cfg.walk.to_rows(x)


def _operands(cfg: Config, which: str, q, k, v, g, g_gamma, h0, do=None, dht=None):
    """The public arrays as path ``which`` takes them: fp16 widened (Mosaic loads no fp16; autodiff and
    :func:`_public` round dq, dk, dv back), K and V lane-padded, the tokens in the walk's rows; the gate
    as g_gamma [H] (fused) or a per-channel g (chunk: g_gamma broadcast to the real tokens' channels,
    outside any custom_vjp so autodiff sums dg into dg_gamma), f32. Returns
    ``(pad, (q, k, v), gate, h0, do, dht)``; ``pad`` slices the results back."""
    pad = HeadPadding.of(q, v)
    q, k, v = mxu.widen_fp16(q, k, v)
    if which == "fused":
        gate = g_gamma.astype(f32)
    else:
        if g is None:  # decay 1 on padding channels and tokens, as for a per-channel g
            g = jnp.broadcast_to(g_gamma.astype(f32)[None, None, :, None], k.shape)
        gate = _rows(cfg, pad.keys(g.astype(f32)))
    tokens = (_rows(cfg, pad.keys(q)), _rows(cfg, pad.keys(k)), _rows(cfg, pad.values(v)))
    do = None if do is None else _rows(cfg, pad.values(do.astype(v.dtype)))
    h0, dht = (None if x is None else pad.state(x.astype(f32)) for x in (h0, dht))
    return pad, tokens, gate, h0, do, dht


def _public(cfg: Config, x, unpad, dtype):
    """Kernel rows [R,NT*C,H,X] -> the public [B,T,H,X]: real tokens, true K or V (``unpad``), ``dtype``."""
    return unpad(cfg.walk.to_tokens(x)).astype(dtype)


# ---------------------------------------------------------------- custom_vjp
def _differentiable(fwd_impl, bwd_impl):
    """One path as a ``jax.custom_vjp``: ``f(cfg, q, k, v, gate, h0) -> (o, ht)``; the forward keeps
    the per-chunk states as residuals and the backward kernels return every input's gradient."""

    def primal(cfg, q, k, v, gate, h0):
        o, ht, _ = fwd_impl(q, k, v, gate, h0, cfg, emit_states=False)
        return o, ht

    def fwd(cfg, q, k, v, gate, h0):
        o, ht, states = fwd_impl(q, k, v, gate, h0, cfg, emit_states=True)
        return (o, ht), (q, k, v, gate, h0, states)

    def bwd(cfg, res, cotangents):
        q, k, v, gate, h0, states = res
        do, dht = cotangents
        dq, dk, dv, dgate, dh0 = bwd_impl(q, k, v, gate, states, do.astype(v.dtype), dht, cfg, h0 is not None)
        return dq, dk, dv, dgate.astype(gate.dtype), dh0

    f = jax.custom_vjp(primal, nondiff_argnums=(0,))
    f.defvjp(fwd, bwd)
    return f


_chunk_path = _differentiable(chunk_fwd_impl, chunk_bwd_impl)  # per-channel g [B,T,H,K]
_fused_path = _differentiable(fused_fwd_impl, fused_bwd_impl)  # per-head g_gamma [H]
_IMPLS = {"chunk": (chunk_fwd_impl, chunk_bwd_impl), "fused": (fused_fwd_impl, fused_bwd_impl)}


def _run(q, k, v, g, g_gamma, h0, cfg, which):
    """Layout in, the path's custom_vjp function, layout out. Differentiable end to end (the padding
    and the packing gathers transpose to slices and scatter-adds)."""
    pad, (qp, kp, vp), gate, h0p, _, _ = _operands(cfg, which, q, k, v, g, g_gamma, h0)
    o, ht = (_fused_path if which == "fused" else _chunk_path)(cfg, qp, kp, vp, gate, h0p)
    return _public(cfg, o, pad.unpad_values, q.dtype), pad.unpad_state(ht)


# -------------------------------------------------------------------- public
def chunk_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64, interpret=None, mxu_model=None, path="auto", *, cu_seqlens=None):
    """GLA forward, differentiable (jax.vjp/grad w.r.t. q, k, v, g or g_gamma, initial_state).

    Args:
      q, k: [B,T,H,K]; v: [B,T,H,V]; one dtype of float32/bfloat16/float16; any K, V (zero-padded to
        multiples of 128 internally, exact: kernels_tpu.common.HeadPadding).
      g: [B,T,H,K] per-channel log decay (float32), or g_gamma: [H] per-head constant log decay;
        both <= 0 (a concrete positive gate is a ValueError, a traced one is not checked).
      scale: static float, K**-0.5 when None.
      initial_state: [N,H,K,V] (cast to float32); N = B, or the number of packed sequences.
      output_final_state: return ht [N,H,K,V] in initial_state's dtype (float32 without one: a bf16 state cache
        comes back in bf16, common.final_state), else None.
      chunk_size: tokens per chunk (multiple of 16).
      interpret: None -> native TPU; True -> Pallas TPU interpret mode with NaN-filled
        uninitialised memory; a pltpu.InterpretParams is passed through.
      mxu_model: model MXU rounding of dots (kernels_tpu.mxu); None -> True iff interpreting.
      path: "auto" | "fused" | "chunk" (see gla_dispatch).
      cu_seqlens: packed variable-length sequences (fla): N+1 static int offsets (tuple, list or numpy
        array) 0 < ... < T with B = 1; sequence i starts from initial_state[i] and ends in ht[i]
        (kernels_tpu.varlen).

    Returns: (o [B,T,H,V] in q's dtype, ht [N,H,K,V] float32 or None).
    """
    which, blocks, scale, packing = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path,
                                              output_final_state, cu_seqlens=cu_seqlens)
    cfg = _config(q, scale, blocks, packing, interpret, mxu_model)
    o, ht = _run(q, k, v, g, g_gamma, initial_state, cfg, which)
    return o, final_state(ht if output_final_state else None, initial_state)


def chunk_gla_fwd(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                  chunk_size=64, interpret=None, mxu_model=None, path="auto", *, cu_seqlens=None):
    """The forward kernels alone (no custom_vjp): (o, ht or None). Same arguments as chunk_gla."""
    which, blocks, scale, packing = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path,
                                              output_final_state, cu_seqlens=cu_seqlens)
    cfg = _config(q, scale, blocks, packing, interpret, mxu_model)
    pad, (qp, kp, vp), gate, h0, _, _ = _operands(cfg, which, q, k, v, g, g_gamma, initial_state)
    o, ht, _ = _IMPLS[which][0](qp, kp, vp, gate, h0, cfg, emit_states=False)
    return (_public(cfg, o, pad.unpad_values, q.dtype),
            final_state(pad.unpad_state(ht) if output_final_state else None, initial_state))


def chunk_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None, chunk_size=64,
                  interpret=None, mxu_model=None, path="auto", *, cu_seqlens=None):
    """Gradients of ``sum(o*do) + sum(ht*dht)``, running the forward kernels for the states.

    Returns dict(dq, dk, dv, dg, dg_gamma, dh0): dq/dk/dv in the input dtype, dg
    [B,T,H,K] float32 (g gate) or None, dg_gamma [H] float32 (g_gamma gate) or
    None, dh0 [N,H,K,V] float32 (with initial_state) or None. dht is [N,H,K,V].
    """
    which, blocks, scale, packing = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path, False,
                                              do=do, dht=dht, cu_seqlens=cu_seqlens)
    cfg = _config(q, scale, blocks, packing, interpret, mxu_model)
    pad, (qp, kp, vp), gate, h0, dop, dhtp = _operands(cfg, which, q, k, v, g, g_gamma, initial_state, do, dht)
    fwd_impl, bwd_impl = _IMPLS[which]
    _, _, states = fwd_impl(qp, kp, vp, gate, h0, cfg, emit_states=True)
    dq, dk, dv, dgate, dh0 = bwd_impl(qp, kp, vp, gate, states, dop, dhtp, cfg, h0 is not None)
    out = {"dq": _public(cfg, dq, pad.unpad_keys, q.dtype), "dk": _public(cfg, dk, pad.unpad_keys, q.dtype),
           "dv": _public(cfg, dv, pad.unpad_values, q.dtype), "dg": None, "dg_gamma": None,
           "dh0": pad.unpad_state(dh0)}
    if which == "fused":
        out["dg_gamma"] = dgate
    else:
        dg = _public(cfg, dgate, pad.unpad_keys, f32)  # real tokens and channels only
        if g is not None:
            out["dg"] = dg
        else:
            out["dg_gamma"] = dg.sum(axis=(0, 1, 3))
    return out
