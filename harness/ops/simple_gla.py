"""simple_gla: scalar-gated linear attention (variants ``chunk`` and ``fused_chunk``).

    S_t = exp(g_t) S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Gate: ``g`` [B,T,H] per-token log decay, or ``g_gamma`` [H] per-head constant.
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec

from .base import (LegBinding, OpDescriptor, call_tpu_kernel, fla_state_layout, fla_varlen, gate_spec,
                   gated_differentiable, gated_reference, gated_tensors, qkv_specs, refuse_grouped_values,
                   state_and_cotangent_specs)

VARIANTS = ("chunk", "fused_chunk")


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v ~ N(0,1) and do ~ N(0,1) in the case dtype; the gate [B,T,H] or [H], h0 and dht in float32."""
    return qkv_specs(case) + [gate_spec(case, lambda c: (c.B, c.T, c.H))] + state_and_cotangent_specs(case)


def validate(case: Case) -> None:
    if case.variant not in VARIANTS:
        raise ValueError(f"simple_gla {case.variant=} must be one of {VARIANTS}")
    refuse_grouped_values(case)
    if case.gate is None or case.gate.kind not in ("g", "g_gamma"):
        raise ValueError(f"simple_gla takes a g or g_gamma gate, got {case.gate}")
    if case.opt:
        raise ValueError(f"simple_gla takes no options, got {sorted(case.opt)}")


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference: chunked form; the reference leg asks for the recurrent cross-check."""
    from references.simple_gla import chunk_simple_gla, chunk_simple_gla_bwd

    return gated_reference(chunk_simple_gla, chunk_simple_gla_bwd, case, x, method, compute_dtype)


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public entry points, called with the case's tensors (and fla's ``cu_seqlens`` when packed: both
    entry points take it)."""
    from fla.ops.simple_gla import chunk_simple_gla, fused_chunk_simple_gla

    kwargs = dict(g=t.get("g"), g_gamma=t.get("g_gamma"), scale=case.resolved_scale,
                  initial_state=t.get("h0"), output_final_state=case.final_state, **fla_varlen(case, t["q"]))
    if case.variant == "chunk":
        o, ht = chunk_simple_gla(t["q"], t["k"], t["v"], chunk_size=case.chunk_size, **kwargs,
                                 **fla_state_layout(case))
    else:
        o, ht = fused_chunk_simple_gla(t["q"], t["k"], t["v"], **kwargs)
    return {"o": o, "ht": ht}


def fla_supports(case: Case) -> str | None:
    if case.variant == "fused_chunk" and case.chunk_size != 64:
        return "fla's fused_chunk_simple_gla has a fixed chunk size of 64"
    if case.variant == "fused_chunk" and case.state_v_first:
        return "fla's fused_chunk_simple_gla has no state_v_first (its chunk_simple_gla has)"
    return None


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    from kernels_tpu import simple_gla as kernels

    fn = kernels.chunk_simple_gla if case.variant == "chunk" else kernels.fused_chunk_simple_gla
    o, ht = call_tpu_kernel(fn, case, a["q"], a["k"], a["v"], g=a.get("g"), g_gamma=a.get("g_gamma"),
                            scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                            chunk_size=case.chunk_size, interpret=ctx.interpret, mxu_model=ctx.mxu_model)
    return {"o": o, "ht": ht}


SIMPLE_GLA = OpDescriptor(
    name="simple_gla",
    variants=VARIANTS,
    doc=__doc__,
    inputs=inputs,
    tensors=gated_tensors,
    differentiable=gated_differentiable,
    cotangents={"o": "do", "ht": "dht"},
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports,
                   describe=lambda c: {"entry": f"fla.ops.simple_gla.{c.variant}_simple_gla"}),
    pallas=LegBinding(pallas_forward,
                   describe=lambda c: {"entry": f"kernels_tpu.simple_gla.{c.variant}_simple_gla"}),
)
