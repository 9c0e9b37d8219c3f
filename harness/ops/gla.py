"""gla: gated linear attention with a per-key-channel decay (variants ``chunk`` and ``fused_recurrent``).

    S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Gate: ``g`` [B,T,H,K] per-channel log decay, or ``g_gamma`` constant over the
tokens: per head [H] (``gk_t[c] = g_gamma[h]`` for all t, c), one value for every
head [], or per head and key channel [H,K] (``gk_t[c] = g_gamma[h, c]``); or
both at once (``gk_t = g_t + g_gamma``: :mod:`harness.ops.gated`).

Legs:

- reference: ``references.gla`` (float64 CPU JAX; chunked, recurrent cross-check), every gate form.
- GPU: ``fla.ops.gla.chunk_gla`` and ``fla.ops.gla.fused_recurrent_gla``, which
  only take a per-channel gate (``g``; ``gk`` for fused_recurrent). A
  ``g_gamma`` case, of any shape, is mapped by broadcasting g_gamma to
  ``g [B,T,H,K]`` (exact; detached, so fla's dg is not summed into a gradient
  fla never computes): dg_gamma is ``not_provided`` on that leg. The mapping is
  recorded per row. Both gates at once have no fla form (one per-channel gate):
  ``unsupported``. chunk_gla picks its own chunk size,
  ``min(64, max(16, next_pow2(T)))``; other case chunk sizes are unsupported on
  the GPU leg (fused_recurrent has none).
- TPU: ``kernels_tpu.gla.chunk_gla``; the dispatch (``"fused"`` single-
  pallas_call g_gamma kernels, or the ``"chunk"`` kernels) is recorded per row.
  A scalar g_gamma is broadcast to [H], an [H,K] one to a per-channel ``g``
  [B,T,H,K] (both exact; autodiff sums the kernels' gradient back to
  g_gamma's shape), which the chunk kernels take. The chunk kernels refuse
  both gates at once themselves. ``fused_recurrent``:
  ``kernels_tpu.gated_recurrent.fused_recurrent_gla``, the decode kernel,
  forward and backward, every gate form as given (g, g_gamma [], [H], [H,K],
  both at once), h0/ht, packed sequences.

Case options: ``tpu_path`` in ``auto | fused | chunk`` (default ``auto``), the
TPU kernels' ``path`` keyword (e.g. ``chunk`` runs a g_gamma case through the
per-channel kernels).
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec

from . import gated
from .base import (LegBinding, OpDescriptor, call_tpu_kernel, fla_float32_state, fla_state_layout, fla_varlen,
                   qkv_specs, refuse_grouped_values, state_and_cotangent_specs)

VARIANTS = ("chunk", gated.RECURRENT)
OPTIONS = {"tpu_path": ("auto", "fused", "chunk")}
OPTION_DOCS = {"tpu_path": "which of this project's TPU kernels run it, their path keyword: auto (the default), "
                           "fused (the single-pallas_call g_gamma kernels) or chunk (the per-channel kernels)"}
"""Each gla option and what it means in the op (the descriptor's ``options``)."""


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v ~ N(0,1) and do ~ N(0,1) in the case dtype; the gates (g [B,T,H,K], g_gamma [], [H] or [H,K]), h0
    and dht in float32."""
    return (qkv_specs(case) + gated.gate_specs(case, lambda c: (c.B, c.T, c.H, c.K))
            + state_and_cotangent_specs(case))


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

    return gated.reference(chunk_gla, chunk_gla_bwd, case, x, method, compute_dtype)


def fla_chunk_size(T: int) -> int:
    """The chunk size fla.ops.gla.chunk_gla picks itself (it takes no chunk_size), from q's T: with packed
    sequences the packed length, not a sequence's."""
    return min(64, max(16, 1 << max(T - 1, 0).bit_length()))


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public chunk_gla or fused_recurrent_gla; a g_gamma gate is broadcast (detached) to a per-channel g."""
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    g = t.get("g")
    if g is None:
        g = gated.per_channel_gamma(t["g_gamma"].detach(), t["q"])
    kwargs = dict(scale=case.resolved_scale, initial_state=fla_float32_state(t.get("h0")),
                  output_final_state=case.final_state,
                  **fla_varlen(case, t["q"]), **fla_state_layout(case))
    if case.variant == gated.RECURRENT:
        o, ht = fused_recurrent_gla(t["q"], t["k"], t["v"], gk=g, **kwargs)
    else:
        o, ht = chunk_gla(t["q"], t["k"], t["v"], g, **kwargs)
    return {"o": o, "ht": ht}


def fla_supports(case: Case) -> str | None:
    if gated.both_gates(case):
        return (f"fla's {_fla_entry(case)} takes one per-channel gate and no g_gamma: g with g_gamma (both gates "
                f"at once) has no fla form")
    if case.variant == "chunk" and case.chunk_size != fla_chunk_size(case.T):
        return (f"fla's chunk_gla picks its own chunk size ({fla_chunk_size(case.T)} for T={case.T}); "
                f"the case asks for {case.chunk_size}")
    return None


def _fla_entry(case: Case) -> str:
    return "fused_recurrent_gla" if case.variant == gated.RECURRENT else "chunk_gla"


def fla_describe(case: Case) -> dict:
    out = {"entry": f"fla.ops.gla.{_fla_entry(case)}"}
    if case.variant == "chunk":
        out["chunk_size"] = fla_chunk_size(case.T)
    shape = gated.gamma_shape(case)
    if shape is not None and not gated.both_gates(case):
        out["gate_mapping"] = (f"g_gamma [{shape}] broadcast (detached) to g [B,T,H,K]; dg_gamma not provided by "
                               f"fla (its dg is per-channel)")
    return out


def _tpu_gates(case: Case, a: dict) -> tuple:
    """(g, g_gamma) as the TPU kernels take them: a g_gamma [] broadcast to [H], an [H,K] one to a per-channel g
    [B,T,H,K] (exact); both gates passed as they are (the kernels refuse them)."""
    g, g_gamma = a.get("g"), a.get("g_gamma")
    if g is not None and g_gamma is not None:
        return g, g_gamma  # as given, for the kernels to refuse (an [H,K] g_gamma has no [H] form to map to)
    if g is None and gated.gamma_shape(case) == "H,K":
        return gated.per_channel_gamma(g_gamma, a["q"]), None
    return g, gated.per_head_gamma(g_gamma, case.H)


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    from kernels_tpu.gla import chunk_gla

    if case.variant == gated.RECURRENT:
        from kernels_tpu.gated_recurrent import fused_recurrent_gla

        o, ht = call_tpu_kernel(fused_recurrent_gla, case, a["q"], a["k"], a["v"], g=a.get("g"),
                                g_gamma=a.get("g_gamma"), scale=case.resolved_scale, initial_state=a.get("h0"),
                                output_final_state=case.final_state, interpret=ctx.interpret)
        return {"o": o, "ht": ht}
    g, g_gamma = _tpu_gates(case, a)
    o, ht = call_tpu_kernel(chunk_gla, case, a["q"], a["k"], a["v"], g=g, g_gamma=g_gamma,
                            scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                            chunk_size=case.chunk_size, interpret=ctx.interpret, mxu_model=ctx.mxu_model,
                            path=tpu_path(case))
    return {"o": o, "ht": ht}


def pallas_supports(case: Case) -> str | None:
    if case.variant == gated.RECURRENT and tpu_path(case) != "auto":
        return (f"tpu_path={tpu_path(case)} picks among the chunk variant's kernels; fused_recurrent has one kernel "
                f"(kernels_tpu.gated_recurrent)")
    return None


def _dispatch(case: Case) -> str:
    """The TPU kernel path of a case (``kernels_tpu.gla.gla_dispatch`` on the gates :func:`_tpu_gates` passes);
    a variant without TPU kernels is its own path."""
    from kernels_tpu.gla import gla_dispatch

    if case.variant != "chunk":
        return case.variant
    gate = object()  # only which gate is present matters
    per_channel = case.gate.kind == "g" or gated.gamma_shape(case) == "H,K"
    g = gate if per_channel else None
    g_gamma = gate if gated.both_gates(case) or not per_channel else None
    lens = case.lens or (case.T,)  # packed: a sequence whose length is not a multiple of C is ragged
    return gla_dispatch(g, g_gamma, tpu_path(case), ragged_with_state=any(n % case.chunk_size for n in lens)
                        and case.final_state)


def kernel_path(case: Case) -> str:
    """:func:`_dispatch`, or "refused" for a case the kernels do not take (both gates at once)."""
    try:
        return _dispatch(case)
    except NotImplementedError:
        return "refused"


def pallas_describe(case: Case) -> dict:
    if case.variant == gated.RECURRENT:
        return {"entry": "kernels_tpu.gated_recurrent.fused_recurrent_gla", "path": gated.RECURRENT,
                "gate_mapping": "g plus g_gamma as given, summed in float32 before the kernel"}
    try:
        path = _dispatch(case)
    except (ValueError, NotImplementedError) as e:
        path = f"unsupported: {e}"
    out = {"entry": "kernels_tpu.gla.chunk_gla", "path": path, "path_option": tpu_path(case)}
    shape = gated.gamma_shape(case)
    if shape in ("", "H,K") and not gated.both_gates(case):
        out["gate_mapping"] = ("g_gamma [] broadcast to [H]" if shape == "" else
                               "g_gamma [H,K] broadcast to g [B,T,H,K]") + " (exact); dg_gamma summed back by autodiff"
    return out


GLA = OpDescriptor(
    name="gla",
    variants=VARIANTS,
    decode_variant=gated.RECURRENT,
    options=OPTION_DOCS,
    doc=__doc__,
    inputs=inputs,
    tensors=gated.tensors,
    differentiable=gated.differentiable,
    cotangents={"o": "do", "ht": "dht"},
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports, describe=fla_describe),
    pallas=LegBinding(pallas_forward, pallas_supports, describe=pallas_describe),
    kernel_path=kernel_path,
    notes={"g_gamma on GPU": "fla's gla has no g_gamma: broadcast to a per-channel g, dg_gamma not provided",
           "tpu dispatch": "auto: g_gamma [] or [H] -> fused single-pallas_call kernels, g (or g_gamma [H,K] "
                           "broadcast to g) -> chunk kernels",
           "both gates": "no fla form; the TPU fused_recurrent kernel takes them, the chunk kernels one"},
)
