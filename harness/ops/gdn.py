"""gdn: the gated delta rule (Qwen3-Next's linear attention), a scalar decay per token and head (variant ``chunk``).

    S'_t = exp(g_t) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_tᵀ k_t)ᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Variants: ``chunk`` (fla's ``chunk_gated_delta_rule``, forward and backward) and ``fused_recurrent``, the decode
path (fla's ``fused_recurrent_gated_delta_rule``; forward only, o and ht; on the TPU kda's fused-recurrent kernel).
Grouped value heads (``Case.HV`` > H): v, g, beta, A_log, dt_bias and the state
have HV heads; value head j reads q/k head j // (HV // H).

Gate: ``g`` [B,T,HV] per-token log decay (``Gate(kind="g")``, fla's log-sigmoid law). ``beta`` [B,T,HV].

Case options (``Case.options``), each passed to every leg under fla's keyword of the same name:

- ``use_qk_l2norm_in_kernel`` (bool): q and k are drawn N(0,1) and normalised in the op; otherwise they are
  drawn already L2-normalised.
- ``use_gate_in_kernel`` (bool): ``g`` is the raw gate input ~ N(0,1) and the op computes
  ``-exp(A_log) * softplus(g + dt_bias)`` with ``A_log`` [HV] and ``dt_bias`` [HV] (float32, N(0,1)), whose
  gradients are compared.
- ``use_beta_sigmoid_in_kernel`` (bool): ``beta`` is drawn as logits N(0,1) and passed through a sigmoid in
  the op; ``allow_neg_eigval`` (bool) doubles it (fla requires the sigmoid with it).
- ``conv1d`` (int W) and ``conv1d_bias`` (bool): the layer's short causal convolution in front of the op
  (:data:`harness.ops.delta_rule.CONV_OPTIONS`), with its inputs ``conv_weight``, ``conv_bias``, ``conv_h0`` and
  its final state ``conv_ht``; not an option of fla's op function.
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec

from . import delta_rule
from .base import LegBinding, OpDescriptor, fla_state_layout, fla_varlen

VARIANTS = delta_rule.VARIANTS
OPTIONS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")
OPTION_DOCS = {
    "use_qk_l2norm_in_kernel": delta_rule.QK_NORM_DOC,
    "use_gate_in_kernel": "g is the raw gate input ~ N(0,1); the op's log decay is -exp(A_log) * softplus(g + "
                          "dt_bias), with A_log [HV] and dt_bias [HV] (float32 inputs, their gradients compared)",
    "use_beta_sigmoid_in_kernel": delta_rule.BETA_SIGMOID_DOC,
    "allow_neg_eigval": delta_rule.NEG_EIGVAL_DOC,
    **delta_rule.CONV_OPTION_DOCS,
}
"""Each gdn option and what it means in the op (the descriptor's ``options``)."""
FLA_CHUNK_SIZES = (16, 32, 64)


def options(case: Case) -> dict:
    """The case's gdn options with fla's defaults (all False) filled in."""
    return {name: bool(case.opt.get(name, False)) for name in OPTIONS}


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v, beta, do in the case dtype; g [B,T,HV], A_log [HV], dt_bias [HV], h0, dht in float32."""
    return delta_rule.inputs(case, options(case), lambda c: (c.B, c.T, c.HV), lambda c: (c.HV,))


def validate(case: Case) -> None:
    delta_rule.validate_variant(case)
    if case.gate is None or case.gate.kind != "g" or case.gate.law != "logsigmoid":
        raise ValueError(f"gdn takes a per-token g gate [B,T,HV] (Gate(kind='g')), got {case.gate}")
    unknown = set(case.opt) - set(OPTIONS) - set(delta_rule.CONV_OPTIONS)
    if unknown:
        raise ValueError(f"unknown gdn options {sorted(unknown)}; known: {OPTIONS + delta_rule.CONV_OPTIONS}")
    delta_rule.validate_conv(case)
    for name, value in delta_rule.kernel_options(case).items():
        if not isinstance(value, bool):
            raise ValueError(f"gdn option {name}={value!r} must be a bool")
    opts = options(case)
    if opts["allow_neg_eigval"] and not opts["use_beta_sigmoid_in_kernel"]:
        raise ValueError("gdn option allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in fla)")
    if opts["use_gate_in_kernel"] and (case.gate.lower_bound is not None or case.gate.mask_p):
        raise ValueError("with use_gate_in_kernel g is the raw gate input: drop Gate(lower_bound=...) and "
                         "Gate(mask_p=...)")


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference (references.gdn): chunked WY form; the reference leg may ask for the recurrence."""
    from references.gdn import chunk_gdn, chunk_gdn_bwd

    return delta_rule.reference(chunk_gdn, chunk_gdn_bwd, case, x, method, compute_dtype, options(case))


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public ``chunk_gated_delta_rule``, or ``fused_recurrent_gated_delta_rule`` for the decode variant (no
    chunk size), with the case's options."""
    from fla.ops import gated_delta_rule as fla_gdn

    t, conv_state = delta_rule.fla_conv(case, t)
    if delta_rule.forward_only(case):
        fn, chunking = fla_gdn.fused_recurrent_gated_delta_rule, {}
    else:
        fn, chunking = fla_gdn.chunk_gated_delta_rule, dict(chunk_size=case.chunk_size)
    o, ht = fn(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], scale=case.resolved_scale,
               initial_state=t.get("h0"), output_final_state=case.final_state, **chunking, **options(case),
               **delta_rule.gate_params(case, t), **fla_varlen(case, t["q"]), **fla_state_layout(case))
    return {"o": o, "ht": ht, **conv_state}


def fla_supports(case: Case) -> str | None:
    """fla's own limits for chunk_gated_delta_rule (the decode variant has no chunks)."""
    if delta_rule.forward_only(case):
        return None
    if case.chunk_size not in FLA_CHUNK_SIZES:
        return f"fla's chunk_gated_delta_rule supports chunk_size {FLA_CHUNK_SIZES}, got {case.chunk_size}"
    if case.K > 256:
        return f"fla's chunk_gated_delta_rule supports K <= 256, got K={case.K}"
    return None


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    """The chunk kernels (differentiable); the decode variant runs the fused-recurrent kernel, forward only, as
    fla decodes (``kernels_tpu.gdn.fused_recurrent_gated_delta_rule``: no chunks, no dots)."""
    from kernels_tpu import gdn as kernels

    return delta_rule.pallas_forward(case, a, ctx, kernels.chunk_gated_delta_rule,
                                     kernels.fused_recurrent_gated_delta_rule, options(case))


GDN = OpDescriptor(
    name="gdn",
    variants=VARIANTS,
    decode_variant=delta_rule.DECODE,
    options=OPTION_DOCS,
    doc=__doc__,
    inputs=inputs,
    tensors=delta_rule.tensors,
    differentiable=delta_rule.differentiable,
    cotangents={"o": "do", "ht": "dht"},
    per_sequence=delta_rule.per_sequence,
    gradient_lookahead=delta_rule.gradient_lookahead,
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports,
                   describe=lambda c: {"entry": f"fla.ops.gated_delta_rule.{c.variant}_gated_delta_rule",
                                       "options": options(c)}),
    pallas=LegBinding(pallas_forward,
                      describe=lambda c: {"entry": f"kernels_tpu.gdn.{c.variant}_gated_delta_rule",
                                          "options": options(c)}),
    notes={"kernels": "kda's Pallas kernels with the scalar decay broadcast over K (exact); the in-kernel gate is "
                      "applied with float32 jax ops before them (same function; gradients by autodiff)"},
)
