"""What the gated ops (simple_gla, gla) share: their gates as inputs, their compared tensors, their reference
binding, and the gate forms each leg's binding maps onto what its implementation takes.

A case's gates (``Case.gates``): a per-token ``g``, a constant ``g_gamma``, or both at once (``Case.gamma``: their
log decays add, as fla's ``chunk_simple_gla(q, k, v, g, g_gamma)`` and tops' ``fused_recurrent_*`` take them). A
``g_gamma`` is one value for every head ([], ``g_gamma[]=``), one per head ([H], the default) or, for gla, one per
head and key channel ([H,K], ``g_gamma[H,K]=``): ``Gate.gamma_shape``.

The mappings below are exact (a broadcast copies values, it rounds nothing); a form an implementation does not take
and that no exact mapping reaches is refused by that leg with the reason.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from cases.case import Case
from cases.inputs import InputSpec, g_gamma_shape, gamma_law, gate_law

from .base import TensorSpec, forward_tensors, grad_tensors
from .reductions import Reduction, ReductionSpec, trailing

DTYPES = {"q": "case", "k": "case", "v": "case", "g": "float32", "g_gamma": "float32", "h0": "float32"}
RECURRENT = "fused_recurrent"
"""fla's token-by-token variant of both ops (``fused_recurrent_simple_gla``, ``fused_recurrent_gla``): forward and
backward, no chunk size (the case's C only names the float64 reference's chunking)."""


def gate_specs(case: Case, per_token_shape) -> list[InputSpec]:
    """The case's gates in float32, in ``Case.gates`` order (g, then g_gamma): ``g`` with the op's per-token shape,
    ``g_gamma`` [], [H] or [H,K] (:func:`cases.inputs.g_gamma_shape`). A case with one gate draws exactly what it
    always drew."""
    specs = []
    for gate, law in zip(case.gates, (gate_law, gamma_law)):
        shape = per_token_shape if gate.kind == "g" else (lambda c, gate=gate: g_gamma_shape(gate, c))
        specs.append(InputSpec(gate.kind, shape, "float32", law))
    return specs


def differentiable(case: Case) -> list[str]:
    """Inputs whose gradients the gated ops compare: q, k, v, each gate, h0."""
    return ["q", "k", "v", *(gate.kind for gate in case.gates)] + (["h0"] if case.h0 else [])


def tensors(case: Case) -> list[TensorSpec]:
    """o, ht, and the gradient of every gated-op input, in its input's dtype (a gate's gradient has its shape);
    dg_gamma is declared a sum (:data:`GAMMA_SUM`)."""
    specs = forward_tensors(case) + grad_tensors(case, differentiable(case), DTYPES)
    return [ReductionSpec(s.name, s.dtype, s.kind, s.doc, reduction=GAMMA_SUM) if s.name == "dg_gamma" else s
            for s in specs]


def gamma_terms(op, case: Case, x: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray]) -> np.ndarray:
    """The terms dg_gamma sums: the gradient of each token's log decay. The op's reference runs again on the same
    function with the total log decay (g_gamma broadcast to the per-token gate's shape, plus g when the case has
    both) as its one per-token gate ``g``; its ``dg`` holds a term per token (and head, channel), and the axes
    g_gamma does not have are summed."""
    from cases.case import Gate

    one_gate = case.replace(gate=Gate(kind="g"), gamma=None)
    shape = next(s.shape(one_gate) for s in op.inputs(one_gate) if s.name == "g")
    gamma = np.asarray(x["g_gamma"], dtype=np.float64)
    ndim = gamma.ndim  # [] , [H] or [H,K]: axes 2.. of the per-token shape [B,T,H(,K)]
    total = np.broadcast_to(gamma.reshape((1, 1) + gamma.shape + (1,) * (len(shape) - 2 - ndim)), shape)
    if "g" in x:
        total = total + x["g"]
    rest = {n: v for n, v in x.items() if n not in ("g", "g_gamma")}
    dg = np.asarray(op.reference(one_gate, {**rest, "g": np.ascontiguousarray(total)})["dg"])
    return trailing(dg, range(2, 2 + ndim))


GAMMA_SUM = Reduction("the gradient of each token's log decay, over the tokens (B, T) and the axes g_gamma is "
                      "broadcast over (H for g_gamma[], K for gla's g_gamma and g_gamma[])", gamma_terms)


def reference(fwd, bwd, case: Case, x: Mapping[str, np.ndarray], method: str, compute_dtype: str) -> dict:
    """Reference binding for ops with fla's ``(q, k, v, g=, g_gamma=, scale, initial_state)`` signature: forward
    ``fwd`` (o, ht) and backward ``bwd`` (a dict of gradients, None where not applicable), every gate given."""
    gates = {gate.kind: x[gate.kind] for gate in case.gates}
    common = dict(scale=case.resolved_scale, initial_state=x.get("h0"), chunk_size=case.chunk_size,
                  method=method, compute_dtype=compute_dtype, cu_seqlens=case.cu_seqlens)
    o, ht = fwd(x["q"], x["k"], x["v"], **gates, output_final_state=True, **common)
    grads = bwd(x["q"], x["k"], x["v"], x["do"], x.get("dht"), **gates, **common)
    return {"o": o, "ht": ht, **{n: a for n, a in grads.items() if a is not None}}


def gamma_shape(case: Case) -> str | None:
    """The case's g_gamma form (``Gate.gamma_shape``: "", "H" or "H,K"), None without a g_gamma."""
    gamma = next((gate for gate in case.gates if gate.kind == "g_gamma"), None)
    return None if gamma is None else gamma.gamma_shape


def both_gates(case: Case) -> bool:
    return case.gamma is not None


def per_head_gamma(g_gamma, H: int):
    """A g_gamma [] or [H] as [H] (a scalar broadcast to every head: exact); jax and torch alike. The result is
    contiguous, as Triton kernels that index ``g_gamma + i_h`` need."""
    if g_gamma is None or len(g_gamma.shape) == 1:
        return g_gamma
    if hasattr(g_gamma, "expand"):  # torch: expand is a strided view, contiguous() copies it
        return g_gamma.expand(H).contiguous()
    import jax.numpy as jnp

    return jnp.broadcast_to(g_gamma, (H,))


def per_channel_gamma(g_gamma, like):
    """A g_gamma [], [H] or [H,K] broadcast to ``like``'s [B,T,H,K] (gla's per-channel g: exact); jax and torch."""
    x = g_gamma[None, None, :, None] if len(g_gamma.shape) == 1 else g_gamma  # [H]; [] and [H,K] align at the end
    if hasattr(x, "expand"):
        return x.expand(*like.shape).contiguous()
    import jax.numpy as jnp

    return jnp.broadcast_to(x, like.shape)
