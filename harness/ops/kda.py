"""kda: Kimi delta attention, the gated delta rule with a per-key-channel decay.

Variants: ``chunk`` (fla's ``chunk_kda``, forward and backward) and ``fused_recurrent``, the decode path (fla's
``fused_recurrent_kda``; forward only, o and ht; on the TPU its fused-recurrent kernel, kernels_tpu.kda.recurrent).

    S'_t = Diag(exp g_t) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_tᵀ k_t)ᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

Grouped value heads (``Case.HV`` > H, fla's GVA): v, g, beta, A_log, dt_bias and the state have HV heads;
value head j reads q/k head j // (HV // H).

Gate: ``g`` [B,T,HV,K] per-token, per-key-channel log decay (``Gate(kind="g")``; the gate's
``lower_bound`` clamps it from below, i.e. the pre-computed bounded gate fla expects with
``safe_gate``). ``beta`` [B,T,HV].

Case options (``Case.options``), each passed to every leg under fla's keyword of the same name:

- ``use_qk_l2norm_in_kernel`` (bool): q and k are drawn N(0,1) and normalised in the op;
  otherwise they are drawn already L2-normalised.
- ``use_gate_in_kernel`` (bool): ``g`` is the raw gate input ~ N(0,1); ``A_log`` [HV] and
  ``dt_bias`` [HV*K] (float32, N(0,1)) become inputs, and their gradients are compared.
- ``lower_bound`` (float): fla's in-kernel gate ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))``;
  only meaningful with ``use_gate_in_kernel`` (fla ignores it otherwise, so it is refused).
- ``safe_gate`` (bool): fla's bounded-gate fast path (numerics only, same function); with
  ``use_gate_in_kernel`` fla requires ``lower_bound`` in [-5, 0) (``kernels_tpu.kda.check_options``).
- ``use_beta_sigmoid_in_kernel`` (bool): ``beta`` is drawn as logits N(0,1) and passed through
  a sigmoid in the op (otherwise drawn as sigmoid(N(0,1))); ``allow_neg_eigval`` (bool) doubles it.
"""

from __future__ import annotations


import os

from cases.case import Case
from cases.inputs import InputSpec
from kernels_tpu.kda import check_options

from . import delta_rule
from .base import LegBinding, OpDescriptor, fla_float32_state, fla_state_layout, fla_varlen

VARIANTS = delta_rule.VARIANTS
BOOL_OPTIONS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                "allow_neg_eigval", "safe_gate")
OPTIONS = BOOL_OPTIONS + ("lower_bound",)
OPTION_DOCS = {
    "use_qk_l2norm_in_kernel": delta_rule.QK_NORM_DOC,
    "use_gate_in_kernel": "g is the raw gate input ~ N(0,1), made a log decay inside the op with A_log [HV] and "
                          "dt_bias [HV*K] (float32 inputs, their gradients compared)",
    "lower_bound": "the in-kernel gate's floor: lower_bound * sigmoid(exp(A_log) (g + dt_bias)); only with "
                   "use_gate_in_kernel",
    "safe_gate": "fla's bounded-gate fast path (the same function, other numerics); with use_gate_in_kernel fla "
                 "needs lower_bound in [-5, 0)",
    "use_beta_sigmoid_in_kernel": delta_rule.BETA_SIGMOID_DOC,
    "allow_neg_eigval": delta_rule.NEG_EIGVAL_DOC,
    **delta_rule.CONV_OPTION_DOCS,
}
"""Each kda option and what it means in the op (the descriptor's ``options``)."""
FLA_DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"


def options(case: Case) -> dict:
    """The case's kda options with fla's defaults filled in."""
    opts = {name: False for name in BOOL_OPTIONS}
    opts["lower_bound"] = None
    opts.update(delta_rule.kernel_options(case))
    if isinstance(opts["lower_bound"], int) and not isinstance(opts["lower_bound"], bool):
        opts["lower_bound"] = float(opts["lower_bound"])  # an id spells -5.0 as -5: fla and the kernels get a float
    return opts


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v, beta, do in the case dtype; g [B,T,HV,K], A_log, dt_bias [HV*K], h0, dht in float32."""
    return delta_rule.inputs(case, options(case), lambda c: (c.B, c.T, c.HV, c.K), lambda c: (c.HV * c.K,))


def validate(case: Case) -> None:
    delta_rule.validate_variant(case)
    if case.gate is None or case.gate.kind != "g" or case.gate.law != "logsigmoid":
        raise ValueError(f"kda takes a per-token g gate [B,T,HV,K] (Gate(kind='g')), got {case.gate}")
    unknown = set(case.opt) - set(OPTIONS) - set(delta_rule.CONV_OPTIONS)
    if unknown:
        raise ValueError(f"unknown kda options {sorted(unknown)}; known: {OPTIONS + delta_rule.CONV_OPTIONS}")
    delta_rule.validate_conv(case)
    opts = options(case)
    for name in BOOL_OPTIONS:
        if not isinstance(opts[name], bool):
            raise ValueError(f"kda option {name}={opts[name]!r} must be a bool")
    lb = opts["lower_bound"]
    if lb is not None:
        if not isinstance(lb, (int, float)) or not lb < 0:
            raise ValueError(f"kda option lower_bound={lb!r} must be a negative number")
        if not opts["use_gate_in_kernel"]:
            raise ValueError("lower_bound acts only with use_gate_in_kernel=True (fla ignores it otherwise); "
                             "bound a pre-computed gate with Gate(lower_bound=...)")
    check_options(opts)  # fla's option rules, as the TPU kernels write them
    if delta_rule.gate_in_kernel(case) and case.gate.lower_bound is not None:
        raise ValueError("with use_gate_in_kernel g is the raw gate input: use the lower_bound option, "
                         "not Gate(lower_bound=...)")
    if delta_rule.gate_in_kernel(case) and case.gate.mask_p:
        raise ValueError("with use_gate_in_kernel g is the raw gate input, drawn N(0,1): Gate(mask_p=...) "
                         "masks fla's log-sigmoid gate law, drop it")


def _fla_kwargs(case: Case) -> dict:
    return {n: v for n, v in options(case).items()}


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference (references.kda): chunked WY form; the reference leg may ask for the recurrence."""
    from references.kda import chunk_kda, chunk_kda_bwd

    return delta_rule.reference(chunk_kda, chunk_kda_bwd, case, x, method, compute_dtype, _fla_kwargs(case))


def fla_forward(case: Case, t: dict) -> dict:
    """fla's public ``fla.ops.kda.chunk_kda``, or ``fused_recurrent_kda`` for the decode variant (no chunk size,
    no safe_gate), with the case's options (Triton pinned, see fla_supports)."""
    from fla.ops import kda as fla_kda

    t, conv_state = delta_rule.fla_conv(case, t)
    kwargs = _fla_kwargs(case)
    if delta_rule.forward_only(case):
        fn = fla_kda.fused_recurrent_kda
        kwargs.pop("safe_gate")  # a chunk-kernel numerics switch; fla_supports refuses it here
    else:
        fn, kwargs["chunk_size"] = fla_kda.chunk_kda, case.chunk_size
    o, ht = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=case.resolved_scale,
               initial_state=fla_float32_state(t.get("h0")),
               output_final_state=case.final_state, **kwargs, **delta_rule.gate_params(case, t),
               **fla_varlen(case, t["q"]), **fla_state_layout(case))
    return {"o": o, "ht": ht, **conv_state}


def fla_supports(case: Case) -> str | None:
    """fla's own limits for chunk_kda (the GPU leg keeps fla on its Triton kernels: FLA_DISABLE_BACKEND_DISPATCH)."""
    if delta_rule.forward_only(case):
        if options(case)["safe_gate"]:
            return "fla's fused_recurrent_kda has no safe_gate (a chunk-kernel numerics switch)"
        return None
    if case.chunk_size not in (32, 64):
        return f"fla's chunk_kda supports chunk_size 32 or 64, got {case.chunk_size}"
    if case.K > 256:
        return f"fla's chunk_kda supports K <= 256, got K={case.K}"
    return None


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    """The chunk kernels (differentiable); the decode variant runs the fused-recurrent kernel, forward only, as
    fla decodes (``kernels_tpu.kda.fused_recurrent_kda``: no chunks, no dots)."""
    from kernels_tpu import kda as kernels

    return delta_rule.pallas_forward(case, a, ctx, kernels.chunk_kda, kernels.fused_recurrent_kda, _fla_kwargs(case))


KDA = OpDescriptor(
    name="kda",
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
                   describe=lambda c: {"entry": f"fla.ops.kda.{c.variant}_kda",
                                       "dispatch": f"{FLA_DISPATCH_ENV}={os.environ.get(FLA_DISPATCH_ENV)}",
                                       "options": _fla_kwargs(c)}),
    pallas=LegBinding(pallas_forward,
                   describe=lambda c: {"entry": f"kernels_tpu.kda.{c.variant}_kda",
                                       "options": _fla_kwargs(c)}),
    notes={"options": "in-kernel options are applied by the TPU public function with float32 jax ops "
                      "before the Pallas kernels (same function; gradients by autodiff)"},
)
