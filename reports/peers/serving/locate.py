"""Where a candidate's error sits in a serving case: per request and per pool slot.

Runs one leg (any: ``tpu``, ``sglang-jax``, ``tpu-inference-v3``, ...) on one case, as ``parity run`` does, and
prints, against the float64 reference:

- per request: its tokens' ``o`` rel-L2, and its per-request states' (``conv_ht``);
- per slot of the pool (``ht``): who writes and reads it, and its rel-L2 (0 where the bits are the reference's).

    python reports/peers/serving/locate.py tpu-inference-v3 'CASE_ID'
    python reports/peers/serving/locate.py flywheel-tpu 'CASE_ID' exact   # a candidate's dots left exact

``exact`` runs a candidate leg with every dot at XLA:CPU's float32 instead of the MXU model's rounding: what
remains of its error is not the MXU's passes.
"""

from __future__ import annotations

import sys

import numpy as np


def _rel(got, want) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if np.array_equal(got, want):
        return "0 (bit for bit)"
    scale = np.linalg.norm(want)
    err = np.linalg.norm(got - want)
    return f"{err / scale:.3g}" if scale else f"|err| {err:.3g} (reference all zeros)"


def main(leg_name: str, case_id: str, exact: str = "") -> None:
    import contextlib

    from cases.inputs import make_inputs
    from harness.app import case_from_id
    from harness.legs import external
    from harness.legs.registry import make_leg
    from harness.ops import get_op
    from harness.ops.serving import slots
    from peers.mapping import requests

    case = case_from_id(case_id)
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    want = op.reference(case, inputs.as_float64(), method="chunk")
    leg = make_leg(leg_name, **({"compile_targets": ()} if leg_name == "tpu" else {}))
    saved = external.mxu_rounding
    if exact:
        external.mxu_rounding = contextlib.nullcontext
    try:
        got = leg.run(op, case, inputs).tensors
    finally:
        external.mxu_rounding = saved
    offsets, _ = requests(case)
    print(f"{leg_name} on {case_id}" + (" (every dot exact)" if exact else ""))
    for i, (bos, eos) in enumerate(zip(offsets, offsets[1:])):
        o = _rel(got["o"][:, bos:eos], want["o"][:, bos:eos]) if eos > bos else "(no tokens)"
        conv = f", conv_ht {_rel(got['conv_ht'][i], want['conv_ht'][i])}" if "conv_ht" in got else ""
        print(f"  request {i} ({eos - bos} tokens): o {o}{conv}")
    s = slots(case)
    if s is None or "ht" not in got:
        return
    for k in range(s.size):
        writers = [i for i, w in enumerate(s.write) if w == k]
        readers = [i for i, (r, init) in enumerate(zip(s.read, s.has_initial_state)) if r == k and init]
        role = (f"written by request {writers[0]}" if writers else "kept") + (
            f", read by request {readers[0]}" if readers else "")
        print(f"  slot {k:2d} ({role}): ht {_rel(got['ht'][k], want['ht'][k])}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
