"""A case id in words (``parity cases --explain ID``): each part of the id, what it sets and what it means in the
case's op, from the case and its op's descriptor alone.

An id packs a lot into a short line: ``kda.chunk/B1-T64-H2-HV4-K128-V128/bf16/g=logsigmoid/16,lb-5/C64/h0,
use_gate_in_kernel=1,lower_bound=-5``. The gate's law and its normalizer (``/16``: the draws divided by 16; ``/0.1``
multiplies them by 10), a lower bound (``lb-5``), a mask (``mask0.5``), the packed lengths, the flags and each
option of the op are explained here once, where the case grammar (:mod:`cases.case`) and the op's descriptor
(:mod:`harness.ops`: its ``options``, its inputs' shapes and its tensors' docs) say them.
"""

from __future__ import annotations

import math

from cases.case import DTYPES, GAMMA_SHAPES, Case, Gate

MEDIAN_LOGSIGMOID = -math.log(2.0)
"""logsigmoid(0): the median of logsigmoid(Z), Z ~ N(0,1) (logsigmoid is increasing and Z's median is 0)."""

MEDIAN_ABS_NORMAL = 0.6744897501960817
"""The median of |Z|, Z ~ N(0,1): the 75th percentile of the standard normal."""


def _decay(log_decay: float) -> str:
    """A log decay per token as the decay and the half-life it gives a state."""
    if log_decay >= 0:
        return "no decay"
    half_life = math.log(0.5) / log_decay
    return f"a decay of {math.exp(log_decay):.4g} per token, half-life {half_life:.3g} tokens"


def gate_words(gate: Gate, shape: tuple | None) -> list[str]:
    """What a gate label says: its kind and shape, how its values are drawn, its bound and its mask."""
    where = f" {list(shape)}" if shape is not None else ""
    if gate.kind == "g":
        kind = f"g{where}: a log decay per token, drawn with the inputs"
    else:
        kind = (f"g_gamma{where}: a constant log decay, the same at every token, "
                f"{GAMMA_SHAPES[gate.gamma_shape]}")
    if gate.law == "logsigmoid":
        median = MEDIAN_LOGSIGMOID / gate.normalizer
        law = (f"logsigmoid/{gate.normalizer:g}: logsigmoid(N(0,1)) / {gate.normalizer:g} per value (the '/x' divides "
               f"the draws by x: /16 is fla's tests' gentle decay, /1 or /0.1 a strong one); median log decay "
               f"{median:.4g}, {_decay(median)}")
    elif gate.law == "halfnormal":
        median = -MEDIAN_ABS_NORMAL / gate.normalizer
        law = (f"halfnormal/{gate.normalizer:g}: -|N(0,1)| / {gate.normalizer:g} per value; median log decay "
               f"{median:.4g}, {_decay(median)}")
    elif gate.law == "const":
        law = f"const({gate.value:g}): every value is {gate.value:g}, {_decay(gate.value)}"
    else:
        scale = 1 - gate.layer_idx / max(gate.num_layers - 1, 1) + 1e-5
        law = (f"alibi(L{gate.num_layers},l{gate.layer_idx}): head h's log decay is -2^(-8(h+1)/H) x {scale:.6g} "
               f"(ALiBi slopes at layer {gate.layer_idx} of {gate.num_layers}; layer 0 decays most)")
    words = [kind, law]
    if gate.lower_bound is not None:
        words.append(f"lb{gate.lower_bound:g}: every log decay clamped from below at {gate.lower_bound:g} "
                     f"(never faster than {_decay(gate.lower_bound)}; fla's safe-gate bound)")
    if gate.mask_p:
        words.append(f"mask{gate.mask_p:g}: each log decay zeroed (no decay at that token) with probability "
                     f"{gate.mask_p:g}, as fla's tests mask their gates")
    return words


def explain(case: Case, op) -> list[str]:
    """``case``'s id, part by part, in words: one line per part (``part: meaning``), the op's options with their
    meaning in ``op`` (its descriptor), then the tensors it compares and the bindings that refuse it."""
    specs = {spec.name: spec for spec in op.inputs(case)}
    lines = [case.id, f"  {case.op}.{case.variant}: {op.doc.strip().splitlines()[0].rstrip('.')}; variant "
                      f"{case.variant!r} (the op's variants: {', '.join(op.variants)})"]
    heads = f"H={case.H} query/key heads"
    if case.grouped_values:
        heads += f", HV={case.HV} value heads (grouped: each q/k head serves {case.HV // case.H})"
    lines.append(f"  B{case.B}-T{case.T}-H{case.H}{case._hv_part}-K{case.K}-V{case.V}: B={case.B} batch rows, "
                 f"T={case.T} tokens, {heads}, K={case.K} key dim, V={case.V} value dim")
    lines.append(f"  {DTYPES[case.dtype]}: {case.dtype}, the dtype of q, k, v, do and of the kernels' o and input "
                 f"gradients (ULPs are counted in it)")
    for gate in case.gates:
        name = "g" if gate.kind == "g" else "g_gamma"
        spec = specs.get(name)
        shape = spec.shape(case) if spec is not None else None
        first, *rest = gate_words(gate, shape)
        lines.append(f"  {gate.label}: {first}")
        lines += [f"      {w}" for w in rest]
    lines.append(f"  C{case.chunk_size}: {case.chunk_size} tokens per chunk (fla's BT); {case.num_chunks} chunk(s)")
    h0 = specs.get("h0")
    lines += [f"  {flag}" for flag in _flag_words(case, h0.shape(case) if h0 is not None else case.state_shape,
                                                  h0.resolve_dtype(case) if h0 is not None else "float32",
                                                  "dh0" in op.tensor_names(case))]
    for name, value in case.options:
        meaning = op.options.get(name)
        lines.append(f"  {name}={value}: " + (meaning or f"not an option {case.op} declares "
                                                         f"(its options: {', '.join(op.options) or 'none'})"))
    tensors = [t.name + (f" ({t.doc})" if t.doc else "") for t in op.tensors(case)]
    lines.append(f"  compares: {', '.join(tensors)}")
    for binding, why in op.binding_refusals(case).items():
        lines.append(f"  refused by the {binding} binding: {why}")
    return lines


def _flag_words(case: Case, state_shape: tuple, state_dtype: str, compares_dh0: bool) -> list[str]:
    """The id's last part, flag by flag (the op's own options apart); ``state_shape`` and ``state_dtype``: h0's
    (a pool's with ``pool=``, the cache's dtype with ``state_dtype=``)."""
    out = []
    if case.lens is not None:
        empty = sum(1 for n in case.lens if n == 0)
        out.append(f"lens={'+'.join(map(str, case.lens))}: {case.num_seqs} sequences packed along T of one batch "
                   f"row (fla's cu_seqlens {list(case.cu_seqlens)})"
                   + (f"; {empty} empty, whose state passes through unchanged" if empty else ""))
    state = "x".join(map(str, state_shape))
    if case.h0:
        out.append(f"h0: an initial state [{state}] is passed ({state_dtype})"
                   + (", and its gradient dh0 compared" if compares_dh0 else ""))
    if case.dht:
        out.append("dht: a non-zero upstream gradient for the final state ht")
    if not case.final_state:
        out.append("noht: no final state is asked for (output_final_state=False)")
    if case.state_v_first:
        out.append(f"state_v_first: the states are laid out [N,HV,V,K] (fla's V-first layout): [{state}]")
    if case.scale is not None:
        out.append(f"scale={case.scale:g}: the attention scale (default K^-0.5 = {case.K ** -0.5:.4g})")
    if case.seed:
        out.append(f"seed={case.seed}: input draw {case.seed} of the case (draw 0 has no seed flag); every draw's "
                   f"inputs come from sha256 of the id")
    return out
