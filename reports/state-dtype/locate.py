"""Where a leg's error sits on a low-precision state cache case (``state_dtype=``): per request and per state.

Runs one leg (``gpu``, ``tpu``, or a candidate: ``sglang-jax``, ``tpu-inference``, ``ejkernel``, ...) on one case
as ``parity run`` does and prints, against the float64 reference the harness computes (the state exact from the
cache's rounded ``h0``: docs/definitions.md, "A low-precision state cache"):

- per request: its tokens' ``o`` rel-L2, its final state's rel-L2 (``ht``; with ``pool=S`` the slot it writes),
  and the floor a bf16/fp16 cache sets there: the rel-L2 of the exact final state rounded to the cache's dtype.
  A state whose error is that floor is the cache's rounding and nothing else;
- for a state far off (rel-L2 > 0.5): whether it came back all zeros, else which request's exact (nonzero) state
  it holds instead, if any (a state written to another request's slot), else the largest error's place (head, key
  row, value column);
- per pool slot no request writes: whether it came back bit for bit.

    python reports/state-dtype/locate.py tpu-inference 'CASE_ID'
    python reports/state-dtype/locate.py sglang-jax 'CASE_ID' exact    # a candidate's dots left exact

``exact`` runs a candidate leg with every dot at XLA:CPU's float32 instead of the MXU model's rounding.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / scale) if scale else float(np.linalg.norm(got - want))


def main(leg_name: str, case_id: str, exact: str = "") -> None:
    from cases.inputs import quantize
    from harness.app.analysis import golden, make
    from harness.legs import external
    from harness.ops.serving import slots, state_dtype
    from peers.mapping import requests

    g0 = golden(case_id)  # the case's inputs and the harness's float64 golden, in memory
    case, inputs, want = g0.case, g0.inputs, g0.tensors
    leg = make(leg_name)  # as parity run makes it, a candidate compiling for no real TPU
    saved = external.mxu_rounding
    if exact:
        external.mxu_rounding = contextlib.nullcontext
    try:
        got = leg.run(g0.op, case, inputs).tensors
    finally:
        external.mxu_rounding = saved
    cache = state_dtype(case)
    offsets, _ = requests(case)
    s = slots(case)
    n = len(offsets) - 1
    where = list(s.write) if s is not None else list(range(n))  # the ht index of request i's final state
    print(f"{leg_name} on {case_id}" + (" (every dot exact)" if exact else "") + f"; state cache {cache}")
    print(f"  whole: o {rel(got['o'], want['o']):.3e}, ht {rel(got['ht'], want['ht']):.3e}")
    for i, (bos, eos) in enumerate(zip(offsets, offsets[1:])):
        o = f"{rel(got['o'][:, bos:eos], want['o'][:, bos:eos]):.3e}" if eos > bos else "(no tokens)"
        g, w = np.asarray(got["ht"][where[i]], np.float64), np.asarray(want["ht"][where[i]], np.float64)
        floor = rel(quantize(w, cache), w)
        line = f"  request {i} ({eos - bos} tokens, ht[{where[i]}]): o {o}, ht {rel(g, w):.3e} (cache floor {floor:.3e})"
        if rel(g, w) > 0.5 and not g.any():
            line += "; comes back all zeros"
        elif rel(g, w) > 0.5:
            others = {j: rel(g, want["ht"][where[j]]) for j in range(n)
                      if j != i and np.any(want["ht"][where[j]])}
            j = min(others, key=others.get) if others else None
            if j is not None and others[j] < 0.1:
                line += f"; holds request {j}'s state (rel-L2 {others[j]:.3e} to it)"
            else:
                idx = np.unravel_index(np.argmax(np.abs(g - w)), g.shape)
                line += f"; largest error at {tuple(int(x) for x in idx)}"
        print(line)
    if s is not None:
        kept = [k for k in s.kept if not np.array_equal(np.asarray(got["ht"][k]), np.asarray(inputs.arrays["h0"][k]))]
        print(f"  slots no request writes: {len(s.kept)}, changed: {kept or 'none (bit for bit)'}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
