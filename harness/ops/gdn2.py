"""gdn2: Gated DeltaNet-2, the delta rule with its erase and write decoupled (fla-core 0.6.0's ``fla.ops.gdn2``).

    S'_t = Diag(exp g_t) S_{t-1}
    S_t  = S'_t + k_t (w_t * v_t - S'_tᵀ (b_t * k_t))ᵀ,   o_t = scale · S_tᵀ q_t,   ht = S_T

With ``b_t = w_t = beta_t`` on every channel this is kda; a gate the same on every key channel as well gives gdn.

Variants: ``chunk`` (fla's ``chunk_gdn2``, forward and backward: dq, dk, dv, dg, db, dw, dh0, and dA_log, ddt_bias
with the in-kernel gate) and ``fused_recurrent``, the decode path (fla's ``fused_recurrent_gdn2``; forward only, o
and ht; on the TPU :func:`kernels_tpu.gdn2.fused_recurrent_gdn2`, kda's fused-recurrent kernel with a second key
operand).

Inputs, with fla's names: ``g`` [B,T,HV,K] the per-key-channel log decay (kda's gate, ``Gate(kind="g")``, fla's
log-sigmoid law); ``b`` [B,T,HV,K] the erase gate, drawn sigmoid(N(0,1)) in [0, 1], or 2 sigmoid(N(0,1)) in [0, 2]
with ``allow_neg_eigval`` (the layer's negative eigenvalues); ``w`` [B,T,HV,V] the write gate, sigmoid(N(0,1)). b and
w are in the case dtype, as q, k, v. fla's gdn2 takes them as given: there is no in-kernel sigmoid of either.

Grouped value heads (``Case.HV`` > H) for ``fused_recurrent`` only: fla's ``fused_recurrent_gdn2`` takes them
(value head j reads q/k head j // (HV // H)); its ``chunk_gdn2`` asserts v [B,T,H,V], so a chunk case is refused.

Case options (``Case.options``); each of fla's is passed to every leg under fla's keyword of the same name:

- ``use_qk_l2norm_in_kernel`` (bool), ``use_gate_in_kernel`` (bool, with ``A_log`` [HV] and ``dt_bias`` [HV*K]),
  ``lower_bound`` (float, with the in-kernel gate), ``safe_gate`` (bool, chunk only): kda's (:mod:`harness.ops.kda`),
  the same functions in fla.
- ``allow_neg_eigval`` (bool): b drawn in [0, 2]. Not a keyword of fla's op: the range the layer gives b.
- ``conv1d`` (int W) and ``conv1d_bias`` (bool): the layer's short convolution in front of the op
  (:data:`harness.ops.delta_rule.CONV_OPTIONS`).
"""

from __future__ import annotations

import functools
import os

from cases.case import Case
from cases.inputs import InputSpec, sigmoid_normal

from . import delta_rule
from .base import LegBinding, OpDescriptor, fla_float32_state, fla_state_layout, fla_varlen
from .kda import FLA_DISPATCH_ENV

VARIANTS = delta_rule.VARIANTS
GATES = ("b", "w")
BOOL_OPTIONS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "safe_gate")
FLA_OPTIONS = BOOL_OPTIONS + ("lower_bound",)
DRAW_OPTIONS = ("allow_neg_eigval",)
OPTIONS = FLA_OPTIONS + DRAW_OPTIONS
OPTION_DOCS = {
    "use_qk_l2norm_in_kernel": delta_rule.QK_NORM_DOC,
    "use_gate_in_kernel": "g is the raw gate input ~ N(0,1), made a log decay inside the op as kda's is, with "
                          "A_log [HV] and dt_bias [HV*K] (float32 inputs, their gradients compared)",
    "lower_bound": "the in-kernel gate's floor, as kda's; only with use_gate_in_kernel",
    "safe_gate": "fla's bounded-gate fast path, as kda's (chunk only)",
    "allow_neg_eigval": "the erase gate b drawn in [0, 2] (2 sigmoid(N(0,1))): the layer's range; not a keyword of "
                        "fla's op",
    **delta_rule.CONV_OPTION_DOCS,
}
"""Each gdn2 option and what it means in the op (the descriptor's ``options``)."""
FLA_CHUNK_SIZE = 64  # fla's chunk_gdn2 raises for any other


def options(case: Case) -> dict:
    """The case's fla options with fla's defaults filled in (the draw options are not fla's)."""
    opts = {name: False for name in BOOL_OPTIONS}
    opts["lower_bound"] = None
    opts.update({n: v for n, v in delta_rule.kernel_options(case).items() if n in FLA_OPTIONS})
    if isinstance(opts["lower_bound"], int) and not isinstance(opts["lower_bound"], bool):
        opts["lower_bound"] = float(opts["lower_bound"])  # an id spells -5.0 as -5: fla and the kernels get a float
    return opts


def _doubled_sigmoid_normal(case, rng, shape):
    """2 sigmoid(N(0,1)): an erase gate in [0, 2], the layer's negative eigenvalues."""
    return 2.0 * sigmoid_normal(case, rng, shape)


def inputs(case: Case) -> list[InputSpec]:
    """q, k, v, b, w, do in the case dtype; g [B,T,HV,K], A_log [HV], dt_bias [HV*K], h0, dht in float32."""
    b_law = _doubled_sigmoid_normal if case.opt.get("allow_neg_eigval") else sigmoid_normal
    gates = [InputSpec("b", lambda c: (c.B, c.T, c.HV, c.K), "case", b_law),
             InputSpec("w", lambda c: (c.B, c.T, c.HV, c.V), "case", sigmoid_normal)]
    return delta_rule.inputs(case, options(case), lambda c: (c.B, c.T, c.HV, c.K), lambda c: (c.HV * c.K,),
                             gates=gates)


def validate(case: Case) -> None:
    from kernels_tpu.kda import check_options

    delta_rule.validate_variant(case)
    if case.gate is None or case.gate.kind != "g" or case.gate.law != "logsigmoid":
        raise ValueError(f"gdn2 takes a per-token g gate [B,T,HV,K] (Gate(kind='g')), got {case.gate}")
    unknown = set(case.opt) - set(OPTIONS) - set(delta_rule.CONV_OPTIONS)
    if unknown:
        raise ValueError(f"unknown gdn2 options {sorted(unknown)}; known: {OPTIONS + delta_rule.CONV_OPTIONS}")
    if case.grouped_values and not delta_rule.forward_only(case):
        raise ValueError(f"gdn2.chunk has no grouped value heads (HV={case.HV} > H={case.H}): fla's chunk_gdn2 "
                         f"asserts v [B,T,H,V]; drop HV, or use gdn2.{delta_rule.DECODE}, which takes them")
    delta_rule.validate_conv(case)
    opts = options(case)
    for name in BOOL_OPTIONS + DRAW_OPTIONS:
        value = case.opt.get(name, False)
        if not isinstance(value, bool):
            raise ValueError(f"gdn2 option {name}={value!r} must be a bool")
    lb = opts["lower_bound"]
    if lb is not None:
        if not isinstance(lb, (int, float)) or not lb < 0:
            raise ValueError(f"gdn2 option lower_bound={lb!r} must be a negative number")
        if not opts["use_gate_in_kernel"]:
            raise ValueError("lower_bound acts only with use_gate_in_kernel=True (fla ignores it otherwise); "
                             "bound a pre-computed gate with Gate(lower_bound=...)")
    check_options(opts)  # fla's safe_gate rule, kda's (the same function in fla's gdn2)
    if delta_rule.forward_only(case) and opts["safe_gate"]:
        raise ValueError(f"gdn2.{delta_rule.DECODE} has no safe_gate (a numerics switch of fla's chunk kernels; "
                         f"fused_recurrent_gdn2 would swallow it in **kwargs): drop it")
    if delta_rule.gate_in_kernel(case) and (case.gate.lower_bound is not None or case.gate.mask_p):
        raise ValueError("with use_gate_in_kernel g is the raw gate input, drawn N(0,1): use the lower_bound option, "
                         "not Gate(lower_bound=...), and drop Gate(mask_p=...)")


# ----------------------------------------------------------------- bindings
def reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    """float64 reference (references.gdn2): chunked WY form; the reference leg may ask for the recurrence. With
    grouped value heads (the decode variant, forward only) q and k are first repeated to the HV value heads (exact),
    as fla's fused_recurrent_gdn2 reads them."""
    import numpy as np

    from references.gdn2 import chunk_gdn2, chunk_gdn2_bwd

    fwd = chunk_gdn2
    if case.grouped_values:  # after the convolution, which convolves the H heads of q and k
        def fwd(q, k, *rest, **kw):
            return chunk_gdn2(*(np.repeat(y, case.HV // case.H, axis=2) for y in (q, k)), *rest, **kw)
    return delta_rule.reference(fwd, chunk_gdn2_bwd, case, x, method, compute_dtype, options(case), gates=GATES)


def fla_forward(case: Case, t: dict) -> dict:
    """fla's ``fla.ops.gdn2.chunk_gdn2`` (chunk size 64, its only one), or ``fused_recurrent_gdn2`` for the decode
    variant, with the case's options (Triton pinned, as for kda)."""
    from fla.ops import gdn2 as fla_gdn2

    t, conv_state = delta_rule.fla_conv(case, t)
    kwargs = options(case)
    if delta_rule.forward_only(case):
        fn = fla_gdn2.fused_recurrent_gdn2
        kwargs.pop("safe_gate")  # validate refuses it here
    else:
        fn = fla_gdn2.chunk_gdn2
    o, ht = fn(t["q"], t["k"], t["v"], t["g"], t["b"], t["w"], scale=case.resolved_scale,
               initial_state=fla_float32_state(t.get("h0")), output_final_state=case.final_state, **kwargs,
               **delta_rule.gate_params(case, t), **fla_varlen(case, t["q"]), **fla_state_layout(case))
    return {"o": o, "ht": ht, **conv_state}


def fla_supports(case: Case) -> str | None:
    """fla's own limits for chunk_gdn2 (the decode variant has no chunks)."""
    if delta_rule.forward_only(case):
        return None
    if case.chunk_size != FLA_CHUNK_SIZE:
        return f"fla's chunk_gdn2 supports chunk_size {FLA_CHUNK_SIZE} only, got {case.chunk_size}"
    if case.K > 256:
        return f"fla's chunk_gdn2 supports K <= 256, got K={case.K}"
    return None


def pallas_forward(case: Case, a: dict, ctx) -> dict:
    """The chunk kernels (differentiable); the decode variant runs the fused-recurrent kernel, forward only, as
    fla decodes (``kernels_tpu.gdn2.fused_recurrent_gdn2``: no chunks, no dots)."""
    from kernels_tpu import gdn2 as kernels

    return delta_rule.pallas_forward(case, a, ctx, kernels.chunk_gdn2, kernels.fused_recurrent_gdn2, options(case),
                                     gates=GATES)


GDN2 = OpDescriptor(
    name="gdn2",
    variants=VARIANTS,
    decode_variant=delta_rule.DECODE,
    options=OPTION_DOCS,
    doc=__doc__,
    inputs=inputs,
    tensors=functools.partial(delta_rule.tensors, gates=GATES),
    differentiable=functools.partial(delta_rule.differentiable, gates=GATES),
    cotangents={"o": "do", "ht": "dht"},
    per_sequence=delta_rule.per_sequence,
    gradient_lookahead=delta_rule.gradient_lookahead,
    validate=validate,
    reference=reference,
    fla=LegBinding(fla_forward, fla_supports,
                   describe=lambda c: {"entry": f"fla.ops.gdn2.{c.variant}_gdn2",
                                       "dispatch": f"{FLA_DISPATCH_ENV}={os.environ.get(FLA_DISPATCH_ENV)}",
                                       "options": options(c)}),
    pallas=LegBinding(pallas_forward,
                      describe=lambda c: {"entry": f"kernels_tpu.gdn2.{c.variant}_gdn2", "options": options(c)}),
    notes={"options": "in-kernel options are applied by the TPU public function with float32 jax ops before the "
                      "Pallas kernels (same function; gradients by autodiff)"},
)
