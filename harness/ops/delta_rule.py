"""What the gated delta rule ops (kda, gdn) share: their inputs, compared tensors and reference binding.

Both ops run ``S_t = S'_t + beta_t k_t (v_t - S'_tᵀ k_t)ᵀ`` after a decay ``S'_t``; they differ in the gate's
shape (kda: one log decay per key channel, [B,T,HV,K]; gdn: one per head, [B,T,HV]) and in the in-kernel gate's
parameters. Each descriptor says those differences and asks these helpers for the rest.
"""

from __future__ import annotations

from typing import Callable

from cases.case import Case
from cases.inputs import InputSpec, gate_law, l2normed_normal, normal, sigmoid_normal

from .base import forward_tensors, grad_tensors, qkv_specs, state_and_cotangent_specs

Shape = Callable[[Case], tuple]
DECODE = "fused_recurrent"
VARIANTS = ("chunk", DECODE)
"""``chunk``: fla's chunk kernels, forward and backward. ``fused_recurrent``: the decode path, forward only (fla's
``fused_recurrent_*`` kernels raise in backward: serving never differentiates), token by token on fla's side."""
DTYPES = {"q": "case", "k": "case", "v": "case", "g": "float32", "beta": "case", "h0": "float32",
          "A_log": "float32", "dt_bias": "float32"}


def forward_only(case: Case) -> bool:
    """The decode variant compares o and ht only."""
    return case.variant == DECODE


def validate_variant(case: Case) -> None:
    """The variant, the decode variant's forward-only rule, and the one gate both ops take (no second gate)."""
    if case.variant not in VARIANTS:
        raise ValueError(f"{case.op} {case.variant=} must be one of {VARIANTS}")
    if case.gamma is not None:
        raise ValueError(f"{case.op} takes one gate, a per-token g; it has no g_gamma: drop {case.gamma.label}")
    if forward_only(case) and case.dht:
        raise ValueError(f"{case.op}.{DECODE} is forward only (fla's fused_recurrent kernels have no backward): "
                         f"drop dht")


def gate_in_kernel(case: Case) -> bool:
    return bool(case.opt.get("use_gate_in_kernel", False))


def inputs(case: Case, opts: dict, g_shape: Shape, dt_bias_shape: Shape) -> list[InputSpec]:
    """q, k, v, beta, do in the case dtype; g (``g_shape``), A_log [HV], dt_bias (``dt_bias_shape``), h0, dht in
    float32. With the in-kernel options the raw inputs are drawn: q, k ~ N(0,1) (else already L2-normalised),
    g ~ N(0,1) (else fla's log-sigmoid gate law), beta as logits (else sigmoid(N(0,1)))."""
    g_law = normal() if opts["use_gate_in_kernel"] else gate_law
    specs = qkv_specs(case, qk_law=normal() if opts["use_qk_l2norm_in_kernel"] else l2normed_normal) + [
        InputSpec("g", g_shape, "float32", g_law),
        InputSpec("beta", lambda c: (c.B, c.T, c.HV), "case",
                  normal() if opts["use_beta_sigmoid_in_kernel"] else sigmoid_normal),
    ]
    if opts["use_gate_in_kernel"]:
        specs.append(InputSpec("A_log", lambda c: (c.HV,), "float32", normal()))
        specs.append(InputSpec("dt_bias", dt_bias_shape, "float32", normal()))
    return specs + state_and_cotangent_specs(case)


def differentiable(case: Case) -> list[str]:
    """q, k, v, g, beta; A_log and dt_bias with the in-kernel gate; h0 when given. None for the decode variant."""
    if forward_only(case):
        return []
    names = ["q", "k", "v", "g", "beta"]
    if gate_in_kernel(case):
        names += ["A_log", "dt_bias"]
    return names + (["h0"] if case.h0 else [])


def tensors(case: Case):
    return forward_tensors(case) + grad_tensors(case, differentiable(case), DTYPES)


def reference(fwd, bwd, case: Case, x: dict, method: str, compute_dtype: str, opts: dict) -> dict:
    """The float64 reference binding: ``fwd`` (o, ht) and ``bwd`` (a dict of gradients) of a references module,
    called with the case's options; the compared gradients of :func:`differentiable`."""
    common = dict(scale=case.resolved_scale, initial_state=x.get("h0"), chunk_size=case.chunk_size,
                  method=method, compute_dtype=compute_dtype, A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
                  cu_seqlens=case.cu_seqlens, **opts)
    qkvgb = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, ht = fwd(*qkvgb, output_final_state=True, **common)
    names = differentiable(case)
    grads = bwd(*qkvgb, x["do"], x.get("dht"), **common) if names else {}
    return {"o": o, "ht": ht, **{"d" + n: grads["d" + n] for n in names}}


def gate_params(case: Case, t: dict) -> dict:
    """A_log and dt_bias, as keywords, when the case gates in the kernel."""
    return dict(A_log=t["A_log"], dt_bias=t["dt_bias"]) if gate_in_kernel(case) else {}
