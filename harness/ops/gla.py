"""gla: gated linear attention with a per-key-channel decay (variant ``chunk``).

    S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Gate: ``g`` [B,T,H,K] per-channel log decay, or ``g_gamma`` [H] per-head
constant (``gk_t[c] = g_gamma`` for all t, c).

Legs:

- reference: ``references.gla`` (float64 CPU JAX; chunked, recurrent cross-check).
- GPU: ``fla.ops.gla.chunk_gla``, which only takes a per-channel ``g``. A
  ``g_gamma`` case is mapped by broadcasting g_gamma to ``g [B,T,H,K]``
  (detached, so fla's dg is not summed into a gradient fla never computes):
  dg_gamma is ``not_provided`` on that leg. The mapping is recorded per row.
  fla picks its own chunk size, ``min(64, max(16, next_pow2(T)))``; other
  case chunk sizes are unsupported on the GPU leg.
- TPU: ``kernels_tpu.gla.chunk_gla``; the dispatch (``"fused"`` single-
  pallas_call g_gamma kernels, or the ``"chunk"`` kernels) is recorded per row.

Case options: ``tpu_path`` in ``auto | fused | chunk`` (default ``auto``), the
TPU kernels' ``path`` keyword (e.g. ``chunk`` runs a g_gamma case through the
per-channel kernels).
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec

from .base import (LegBinding, OpDescriptor, call_tpu_kernel, fla_state_layout, fla_varlen, gate_spec,
                   gated_differentiable, gated_reference, gated_tensors, qkv_specs, refuse_grouped_values,
                   state_and_cotangent_specs)

VARIANTS = ("chunk",)
OPTIONS = {"tpu_path": ("auto", "fused", "chunk")}


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v ~ N(0,1) and do ~ N(0,1) in the case dtype; the gate [B,T,H,K] or [H], h0 and dht in float32."""
    return qkv_specs(case) + [gate_spec(case, lambda c: (c.B, c.T, c.H, c.K))] + state_and_cotangent_specs(case)


def tpu_path(case: Case) -> str:
    return case.opt.get("tpu_path", "auto")


def validate(case: Case) -> None:
    if case.variant not in VARIANTS:
        raise ValueError(f"gla {case.variant=} must be one of {VARIANTS}")
    refuse_grouped_values(case)
    if case.gate is None or case.gate.kind not in ("g", "g_gamma"):
        raise ValueError(f"gla takes a g or g_gamma gate, got {case.gate}")
    unknown = set(case.opt) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown gla options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    if tpu_path(case) not in OPTIONS["tpu_path"]:
        raise ValueError(f"gla option tpu_path={tpu_path(case)!r} must be one of {OPTIONS['tpu_path']}")


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference: chunked form; the reference leg asks for the recurrent cross-check."""
    from references.gla import chunk_gla, chunk_gla_bwd

    return gated_reference(chunk_gla, chunk_gla_bwd, case, x, method, compute_dtype)


def fla_chunk_size(T: int) -> int:
    """The chunk size fla.ops.gla.chunk_gla picks itself (it takes no chunk_size), from q's T: with packed
    sequences the packed length, not a sequence's."""
    return min(64, max(16, 1 << max(T - 1, 0).bit_length()))


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public chunk_gla; a g_gamma gate is broadcast (detached) to a per-channel g."""
    from fla.ops.gla import chunk_gla

    g = t.get("g")
    if g is None:
        B, T, H, K = t["q"].shape
        g = t["g_gamma"].detach()[None, None, :, None].expand(B, T, H, K).contiguous()
    o, ht = chunk_gla(t["q"], t["k"], t["v"], g, scale=case.resolved_scale, initial_state=t.get("h0"),
                      output_final_state=case.final_state, **fla_varlen(case, t["q"]), **fla_state_layout(case))
    return {"o": o, "ht": ht}


def fla_supports(case: Case) -> str | None:
    if case.chunk_size != fla_chunk_size(case.T):
        return (f"fla's chunk_gla picks its own chunk size ({fla_chunk_size(case.T)} for T={case.T}); "
                f"the case asks for {case.chunk_size}")
    return None


def fla_describe(case: Case) -> dict:
    out = {"entry": "fla.ops.gla.chunk_gla", "chunk_size": fla_chunk_size(case.T)}
    if case.gate.kind == "g_gamma":
        out["gate_mapping"] = ("g_gamma [H] broadcast (detached) to g [B,T,H,K]; dg_gamma not provided by "
                               "fla (its dg is per-channel)")
    return out


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    from kernels_tpu.gla import chunk_gla

    o, ht = call_tpu_kernel(chunk_gla, case, a["q"], a["k"], a["v"], g=a.get("g"), g_gamma=a.get("g_gamma"),
                            scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                            chunk_size=case.chunk_size, interpret=ctx.interpret, mxu_model=ctx.mxu_model,
                            path=tpu_path(case))
    return {"o": o, "ht": ht}


def _dispatch(case: Case) -> str:
    from kernels_tpu.gla import gla_dispatch

    gate = object()  # only which gate is present matters
    g, g_gamma = (gate, None) if case.gate.kind == "g" else (None, gate)
    lens = case.lens or (case.T,)  # packed: a sequence whose length is not a multiple of C is ragged
    return gla_dispatch(g, g_gamma, tpu_path(case), ragged_with_state=any(n % case.chunk_size for n in lens)
                        and case.final_state)


def pallas_describe(case: Case) -> dict:
    try:
        path = _dispatch(case)
    except (ValueError, NotImplementedError) as e:
        path = f"unsupported: {e}"
    return {"entry": "kernels_tpu.gla.chunk_gla", "path": path, "path_option": tpu_path(case)}


GLA = OpDescriptor(
    name="gla",
    variants=VARIANTS,
    doc=__doc__,
    inputs=inputs,
    tensors=gated_tensors,
    differentiable=gated_differentiable,
    cotangents={"o": "do", "ht": "dht"},
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports, describe=fla_describe),
    pallas=LegBinding(pallas_forward, describe=pallas_describe),
    kernel_path=_dispatch,
    notes={"g_gamma on GPU": "fla's chunk_gla has no g_gamma: broadcast to a per-channel g, dg_gamma not provided",
           "tpu dispatch": "auto: g_gamma -> fused single-pallas_call kernels, g -> chunk kernels"},
)
