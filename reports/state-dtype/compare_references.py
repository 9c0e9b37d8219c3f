"""The two readings of a low-precision state cache's reference, on one serving case, against both legs.

``exact``: the float64 reference the harness computes (harness.ops.serving): the same rounded inputs (h0 in the
cache's dtype), the state exact from the first token to the last.
``rounded``: the float64 maths run call by call as the legs' chain runs (a prefill, then each decode step:
harness.ops.serving.chain), the state rounded to the cache's dtype (nearest even) after every call, as the
engine writes it back; then the pool's scatter.

For each case it prints rel_l2 of o and ht of the fla (gpu) and kernels_tpu (tpu) legs against each, the
distance between the two references, and the ratio eps_TPU / eps_GPU under each. Usage (from the repository root):

    python reports/state-dtype/compare_references.py CASE_ID [CASE_ID ...]
"""

from __future__ import annotations

import sys

import numpy as np

from cases.inputs import make_inputs, quantize
from harness.app import case_from_id
from harness.core.metrics import rel_l2
from harness.legs.registry import make_leg
from harness.ops import get_op
from harness.ops.base import per_token
from harness.ops.serving import chain, gather, inner, scatter, slots, split, state_dtype


def rounded_reference(op, case, x: dict) -> dict:
    """The float64 chain with the state rounded to the cache's dtype after each call (see the module doc)."""
    base, dtype = inner(case), state_dtype(case)
    s, x = slots(case), dict(x)
    pool = x.get("h0")
    state = gather(pool, s) if s is not None else pool
    raw = op  # the served descriptor's chain reads only decode_variant and the case
    pieces, order = [], []
    calls = chain(raw, case) if "decode" in split(case)[1] else ()
    if not calls:  # no decode steps: one call, its final state rounded
        out = op.reference(base, {**x, "h0": state})
        o, state = out["o"], quantize(out["ht"], dtype).astype(np.float64)
    else:
        for call in calls:
            arrays = {n: a[:, list(call.positions)] if a is not None and per_token(base, a.shape) else a
                      for n, a in x.items() if n not in ("h0", "dht")}
            if call.case.h0:
                arrays["h0"] = state
            out = op.reference(call.case, arrays)
            pieces.append(out["o"])
            order.extend(call.positions)
            state = quantize(out["ht"], dtype).astype(np.float64)
        o = np.concatenate(pieces, 1)[:, list(np.argsort(order, kind="stable"))]
    return {"o": o, "ht": scatter(pool, state, s) if s is not None else state}


def main(ids: list[str]) -> None:
    legs = {"gpu": make_leg("gpu"), "tpu": make_leg("tpu", compile_targets=())}
    for text in ids:
        case = case_from_id(text)
        op = get_op(case.op)
        inputs = make_inputs(case, op.inputs(case))
        x = inputs.as_float64()
        refs = {"exact": op.reference(case, x), "rounded": rounded_reference(op, case, x)}
        got = {name: leg.run(op, case, inputs).tensors for name, leg in legs.items()}
        print(case.id)
        for tensor in ("o", "ht"):
            between = rel_l2(refs["rounded"][tensor], refs["exact"][tensor])
            print(f"  {tensor}: rel_l2(rounded reference, exact reference) = {between:.3e}")
            for ref_name, ref in refs.items():
                eps = {leg: rel_l2(np.asarray(y[tensor], np.float64), ref[tensor]) for leg, y in got.items()}
                print(f"    vs {ref_name:7s}: eps_GPU {eps['gpu']:.3e}  eps_TPU {eps['tpu']:.3e}  "
                      f"ratio {eps['tpu'] / eps['gpu']:.3f}")
            if tensor == "ht":  # where the legs' cache differs from the rounded reference's: whole-ulp flips
                ref = refs["rounded"]["ht"]
                for leg, y in got.items():
                    off = np.argwhere(np.asarray(y["ht"], np.float64) != ref)
                    print(f"    {leg}: {len(off)} of {ref.size} ht elements differ from the rounded reference "
                          f"(slots {sorted(set(off[:, 0].tolist()))})")


if __name__ == "__main__":
    main(sys.argv[1:])
