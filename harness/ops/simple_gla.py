"""simple_gla: scalar-gated linear attention (variants ``chunk``, ``fused_chunk`` and ``fused_recurrent``).

    S_t = exp(g_t) S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Gate: ``g`` [B,T,H] per-token log decay, ``g_gamma`` constant (per head [H], or one value for every head []), or
both at once (``g_t + gamma_h``: :mod:`harness.ops.gated`).

Legs:

- reference: ``references.simple_gla`` (float64 CPU JAX; chunked, recurrent cross-check), every gate form.
- GPU: fla's ``chunk_simple_gla``, ``fused_chunk_simple_gla`` and ``fused_recurrent_simple_gla``. A scalar
  ``g_gamma`` is broadcast to [H] (exact; fla returns no gradient for g_gamma in any form: dg_gamma is
  ``not_provided``). Both gates at once run on ``fused_recurrent_simple_gla`` only: fla's chunk entry points take
  one (see :func:`fla_supports`).
- TPU: ``kernels_tpu.simple_gla`` chunk and fused_chunk, a scalar ``g_gamma`` broadcast to [H] (exact, its gradient
  the sum of the kernels' per-head one); the chunk kernels refuse both gates at once themselves.
  ``fused_recurrent``: ``kernels_tpu.gated_recurrent.fused_recurrent_simple_gla``, the decode kernel, forward and
  backward, every gate form (g, g_gamma [] or [H], both at once), h0/ht, packed sequences.
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec

from . import gated
from .base import (LegBinding, OpDescriptor, call_tpu_kernel, fla_state_layout, fla_varlen, qkv_specs,
                   refuse_grouped_values, state_and_cotangent_specs)

VARIANTS = ("chunk", "fused_chunk", gated.RECURRENT)


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v ~ N(0,1) and do ~ N(0,1) in the case dtype; the gates (g [B,T,H], g_gamma [] or [H]), h0 and dht in
    float32."""
    return qkv_specs(case) + gated.gate_specs(case, lambda c: (c.B, c.T, c.H)) + state_and_cotangent_specs(case)


def validate(case: Case) -> None:
    if case.variant not in VARIANTS:
        raise ValueError(f"simple_gla {case.variant=} must be one of {VARIANTS}")
    refuse_grouped_values(case)
    if case.gate is None or case.gate.kind not in ("g", "g_gamma"):
        raise ValueError(f"simple_gla takes a g or g_gamma gate, got {case.gate}")
    if gated.gamma_shape(case) == "H,K":
        raise ValueError("simple_gla decays each head's state by one scalar: a g_gamma[H,K] (one log decay per key "
                         "channel) is gla's; use gla, or g_gamma[] or g_gamma (per head)")
    if case.opt:
        raise ValueError(f"simple_gla takes no options, got {sorted(case.opt)}")


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference: chunked form; the reference leg asks for the recurrent cross-check."""
    from references.simple_gla import chunk_simple_gla, chunk_simple_gla_bwd

    return gated.reference(chunk_simple_gla, chunk_simple_gla_bwd, case, x, method, compute_dtype)


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public entry points, called with the case's tensors (and fla's ``cu_seqlens`` when packed: all three
    take it); a scalar g_gamma broadcast to fla's [H]."""
    from fla.ops import simple_gla as fla_simple_gla

    kwargs = dict(g=t.get("g"), g_gamma=gated.per_head_gamma(t.get("g_gamma"), case.H), scale=case.resolved_scale,
                  initial_state=t.get("h0"), output_final_state=case.final_state, **fla_varlen(case, t["q"]))
    fn = getattr(fla_simple_gla, f"{case.variant}_simple_gla")
    if case.variant == "chunk":
        kwargs["chunk_size"] = case.chunk_size
    if case.variant != "fused_chunk":
        kwargs.update(fla_state_layout(case))
    o, ht = fn(t["q"], t["k"], t["v"], **kwargs)
    return {"o": o, "ht": ht}


def fla_supports(case: Case) -> str | None:
    if case.variant == "fused_chunk" and case.chunk_size != 64:
        return "fla's fused_chunk_simple_gla has a fixed chunk size of 64"
    if case.variant == "fused_chunk" and case.state_v_first:
        return "fla's fused_chunk_simple_gla has no state_v_first (its chunk_simple_gla has)"
    if gated.both_gates(case) and case.variant == "fused_chunk":
        return "fla's fused_chunk_simple_gla raises 'Only one of `g` or `g_gamma` should be provided.'"
    if gated.both_gates(case) and case.variant == "chunk":
        return ("fla's chunk_simple_gla takes one of g and g_gamma ('Only one of `g` or `g_gamma` should be "
                "provided'): given both, fla-core 0.6.0 returns a wrong result (chunk_fwd_h loads g's cumulative "
                "decay over the g_gamma ramp it then reads, and chunk_bwd_dqkwg's dq, dk take the g branch only); "
                "its fused_recurrent_simple_gla takes both")
    return None


def fla_describe(case: Case) -> dict:
    out = {"entry": f"fla.ops.simple_gla.{case.variant}_simple_gla"}
    if gated.gamma_shape(case) == "":
        out["gate_mapping"] = "g_gamma [] broadcast to fla's [H] (exact); fla returns no dg_gamma"
    return out


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    from kernels_tpu import simple_gla as kernels

    if case.variant == gated.RECURRENT:
        from kernels_tpu.gated_recurrent import fused_recurrent_simple_gla

        o, ht = call_tpu_kernel(fused_recurrent_simple_gla, case, a["q"], a["k"], a["v"], g=a.get("g"),
                                g_gamma=a.get("g_gamma"), scale=case.resolved_scale, initial_state=a.get("h0"),
                                output_final_state=case.final_state, interpret=ctx.interpret)
        return {"o": o, "ht": ht}
    fn = kernels.chunk_simple_gla if case.variant == "chunk" else kernels.fused_chunk_simple_gla
    o, ht = call_tpu_kernel(fn, case, a["q"], a["k"], a["v"], g=a.get("g"),
                            g_gamma=gated.per_head_gamma(a.get("g_gamma"), case.H), scale=case.resolved_scale,
                            initial_state=a.get("h0"), output_final_state=case.final_state,
                            chunk_size=case.chunk_size, interpret=ctx.interpret, mxu_model=ctx.mxu_model)
    return {"o": o, "ht": ht}


def pallas_supports(case: Case) -> str | None:
    return None


def pallas_describe(case: Case) -> dict:
    if case.variant == gated.RECURRENT:
        return {"entry": "kernels_tpu.gated_recurrent.fused_recurrent_simple_gla",
                "gate_mapping": "g (broadcast over K) plus g_gamma as given, summed in float32 before the kernel"}
    out = {"entry": f"kernels_tpu.simple_gla.{case.variant}_simple_gla"}
    if gated.gamma_shape(case) == "":
        out["gate_mapping"] = "g_gamma [] broadcast to [H] (exact); dg_gamma the sum of the kernels' per-head one"
    return out


SIMPLE_GLA = OpDescriptor(
    name="simple_gla",
    variants=VARIANTS,
    decode_variant=gated.RECURRENT,
    doc=__doc__,
    inputs=inputs,
    tensors=gated.tensors,
    differentiable=gated.differentiable,
    cotangents={"o": "do", "ht": "dht"},
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports, describe=fla_describe),
    pallas=LegBinding(pallas_forward, pallas_supports, describe=pallas_describe),
    notes={"g_gamma[]": "broadcast to [H] for fla and the TPU kernels (exact)",
           "both gates": "fla's fused_recurrent_simple_gla and the TPU fused_recurrent kernel take them; the chunk "
                         "entry points (fla's and the TPU's) take one"},
)
