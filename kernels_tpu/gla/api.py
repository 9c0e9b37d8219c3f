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

T not a multiple of chunk_size: zero-padded at the end (zero q, k, v, do and a
zero log gate, i.e. decay 1, for g) and unpadded. On the fused path the
constant gate keeps decaying over padded tokens, so there padding is only
exact without a final state (``output_final_state=False``, no dht).

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
from ..common import check_limits
from .common import PATHS, BlockSizes, Config
from .fused import fused_bwd_impl, fused_fwd_impl

# ------------------------------------------------------------------ dispatch
def gla_dispatch(g, g_gamma, path: str = "auto", *, ragged_with_state: bool = False) -> str:
    """Which kernel path runs: ``"fused"`` or ``"chunk"`` (ValueError if impossible).

    ``ragged_with_state``: T is not a multiple of chunk_size and the final state is
    used (returned, or dht given). The fused kernel keeps decaying over padded
    tokens, so ``"auto"`` then takes the chunk path, which pads exactly.
    """
    if path not in PATHS:
        raise ValueError(f"{path=} must be one of {PATHS}")
    check_gate_choice(g, g_gamma, "BTHK", required=True)
    if path == "auto":
        return "fused" if g_gamma is not None and not ragged_with_state else "chunk"
    if path == "fused" and g is not None:
        raise NotImplementedError(f"{path=} needs a per-head g_gamma [H]; for a per-channel g use path='chunk'")
    return path


def _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path, output_final_state,
              do=None, dht=None):
    """All checks before tracing: the op contract (:func:`op_contract.check_gla`, ValueError), then the
    kernels' limits (NotImplementedError). Returns the path, the blocks and the resolved scale."""
    dims, scale = check_gla(q, k, v, g, g_gamma, scale, initial_state, chunk_size, do=do, dht=dht)
    check_limits(q, dims)
    blocks = BlockSizes(chunk_size=chunk_size)
    which = gla_dispatch(g, g_gamma, path,
                         ragged_with_state=bool(dims.T % chunk_size) and (output_final_state or dht is not None))
    if which == "fused" and dims.T % chunk_size and (output_final_state or dht is not None):
        raise NotImplementedError(f"T={dims.T} is not a multiple of {chunk_size=}, and the fused g_gamma path "
                                  f"cannot pad T exactly when the final state is used: pass T a multiple "
                                  f"of chunk_size, or path='chunk'")
    return which, blocks, scale


def _config(q, scale, blocks, interpret, mxu_model) -> Config:
    interp = resolve_interpret(interpret)
    return Config(scale=scale, blocks=blocks,
                  interpret=interp, mxu_model=resolve_mxu_model(mxu_model, interp), dtype=jnp.dtype(q.dtype).name)


def _pad_t(x, pad):
    return x if x is None or not pad else jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))


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


def _run(q, k, v, g, g_gamma, h0, cfg, which):
    """Widen fp16, pad T, run the path's custom_vjp function, unpad. Differentiable end to end."""
    B, T, H, K = q.shape
    pad = -T % cfg.C
    dtype = q.dtype
    q, k, v = mxu.widen_fp16(q, k, v)  # Mosaic loads no fp16; autodiff rounds dq, dk, dv back
    q, k, v, g = (_pad_t(x, pad) for x in (q, k, v, g))
    h0 = None if h0 is None else h0.astype(jnp.float32)
    if which == "fused":
        o, ht = _fused_path(cfg, q, k, v, g_gamma.astype(jnp.float32), h0)
    else:
        if g is None:  # path="chunk" with g_gamma: a per-channel gate, decay 1 on padded tokens
            gk = jnp.broadcast_to(g_gamma.astype(jnp.float32)[None, None, :, None], (B, T, H, K))
            g = _pad_t(gk, pad)
        o, ht = _chunk_path(cfg, q, k, v, g.astype(jnp.float32), h0)
    return o[:, :T].astype(dtype), ht


# -------------------------------------------------------------------- public
def chunk_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64, interpret=None, mxu_model=None, path="auto"):
    """GLA forward, differentiable (jax.vjp/grad w.r.t. q, k, v, g or g_gamma, initial_state).

    Args:
      q, k: [B,T,H,K]; v: [B,T,H,V]; one dtype of float32/bfloat16/float16.
      g: [B,T,H,K] per-channel log decay (float32), or g_gamma: [H] per-head constant log decay;
        both <= 0 (a concrete positive gate is a ValueError, a traced one is not checked).
      scale: static float, K**-0.5 when None.
      initial_state: [B,H,K,V] (cast to float32).
      output_final_state: return ht [B,H,K,V] float32, else None.
      chunk_size: tokens per chunk (multiple of 16).
      interpret: None -> native TPU; True -> Pallas TPU interpret mode with NaN-filled
        uninitialised memory; a pltpu.InterpretParams is passed through.
      mxu_model: model MXU rounding of dots (kernels_tpu.mxu); None -> True iff interpreting.
      path: "auto" | "fused" | "chunk" (see gla_dispatch).

    Returns: (o [B,T,H,V] in q's dtype, ht [B,H,K,V] float32 or None).
    """
    which, blocks, scale = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path,
                                     output_final_state)
    cfg = _config(q, scale, blocks, interpret, mxu_model)
    o, ht = _run(q, k, v, g, g_gamma, initial_state, cfg, which)
    return o, (ht if output_final_state else None)


def chunk_gla_fwd(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                  chunk_size=64, interpret=None, mxu_model=None, path="auto"):
    """The forward kernels alone (no custom_vjp): (o, ht or None). Same arguments as chunk_gla."""
    which, blocks, scale = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path,
                                     output_final_state)
    cfg = _config(q, scale, blocks, interpret, mxu_model)
    B, T, H, K = q.shape
    pad = -T % cfg.C
    qp, kp, vp, gp = (_pad_t(x, pad) for x in (*mxu.widen_fp16(q, k, v), g))
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    if which == "fused":
        o, ht, _ = fused_fwd_impl(qp, kp, vp, g_gamma.astype(jnp.float32), h0, cfg, emit_states=False)
    else:
        if gp is None:
            gp = _pad_t(jnp.broadcast_to(g_gamma.astype(jnp.float32)[None, None, :, None], q.shape), pad)
        o, ht, _ = chunk_fwd_impl(qp, kp, vp, gp.astype(jnp.float32), h0, cfg)
    return o[:, :T].astype(q.dtype), (ht if output_final_state else None)


def chunk_gla_bwd(q, k, v, do, dht=None, g=None, g_gamma=None, scale=None, initial_state=None, chunk_size=64,
                  interpret=None, mxu_model=None, path="auto"):
    """Gradients of ``sum(o*do) + sum(ht*dht)``, running the forward kernels for the states.

    Returns dict(dq, dk, dv, dg, dg_gamma, dh0): dq/dk/dv in the input dtype, dg
    [B,T,H,K] float32 (g gate) or None, dg_gamma [H] float32 (g_gamma gate) or
    None, dh0 [B,H,K,V] float32 (with initial_state) or None.
    """
    which, blocks, scale = _validate(q, k, v, g, g_gamma, initial_state, scale, chunk_size, path, False,
                                     do=do, dht=dht)
    cfg = _config(q, scale, blocks, interpret, mxu_model)
    B, T, H, K = q.shape
    pad = -T % cfg.C
    qp, kp, vp, gp, dop = (_pad_t(x, pad) for x in (*mxu.widen_fp16(q, k, v), g, do))
    dop = dop.astype(vp.dtype)
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    dht32 = None if dht is None else dht.astype(jnp.float32)
    out = {"dq": None, "dk": None, "dv": None, "dg": None, "dg_gamma": None, "dh0": None}
    if which == "fused":
        gg = g_gamma.astype(jnp.float32)
        _, _, states = fused_fwd_impl(qp, kp, vp, gg, h0, cfg, emit_states=True)
        dq, dk, dv, out["dg_gamma"], out["dh0"] = fused_bwd_impl(qp, kp, vp, gg, states, dop, dht32, cfg,
                                                                 h0 is not None)
    else:
        if gp is None:
            gp = _pad_t(jnp.broadcast_to(g_gamma.astype(jnp.float32)[None, None, :, None], q.shape), pad)
        gp = gp.astype(jnp.float32)
        _, _, states = chunk_fwd_impl(qp, kp, vp, gp, h0, cfg)
        dq, dk, dv, dg, out["dh0"] = chunk_bwd_impl(qp, kp, vp, gp, states, dop, dht32, cfg, h0 is not None)
        if g is not None:
            out["dg"] = dg[:, :T]
        else:
            out["dg_gamma"] = dg[:, :T].sum(axis=(0, 1, 3))
    out["dq"], out["dk"], out["dv"] = (x[:, :T].astype(q.dtype) for x in (dq, dk, dv))
    return out
