"""Where a candidate's error against the float64 reference sits, beside fla's on the same inputs: rel-L2 of ``o``
per request and per value head, and of ``ht`` per request and per value head. An error spread evenly over
requests, tokens and heads is the signature of a precision choice (every dot rounded alike); one that sits in
a few requests or heads is a mapping or indexing defect.

    python reports/peers/tpu-inference/v2-v3/locate_error.py tpu-inference-v3 'CASE_ID'
"""

from __future__ import annotations

import sys

import numpy as np

from harness.app.analysis import golden, rel_l2 as rel, run_case


def spread(values) -> str:
    values = np.atleast_1d(values)
    return f"{values.min():.2e}..{values.max():.2e} (max/min {values.max() / values.min():.2f})"


def main(leg: str, case_id: str) -> None:
    g = golden(case_id)
    case, gold = g.case, g.tensors
    offsets = case.cu_seqlens if case.cu_seqlens is not None else tuple(range(0, case.B * case.T + 1, case.T))
    runs = {"fla (gpu)": run_case(g, "gpu").tensors, leg: run_case(g, leg).tensors}
    print(case_id)
    print(f"  request lengths {np.diff(offsets).tolist()}")
    for name, out in runs.items():
        o = np.asarray(out["o"], np.float64).reshape((-1,) + gold["o"].shape[2:])  # [tokens, HV, V]
        want = np.asarray(gold["o"], np.float64).reshape(o.shape)
        per_request = [rel(o[a:b], want[a:b], None) for a, b in zip(offsets, offsets[1:])]
        print(f"  {name}")
        print(f"    o  all {rel(o, want, None):.3e}; per request {spread(per_request)}; "
              f"per head {spread(rel(o, want, (0, 2)))}")
        print(f"       per request: " + " ".join(f"{v:.2e}" for v in per_request))
        if "ht" in out:
            ht, hwant = np.asarray(out["ht"], np.float64), np.asarray(gold["ht"], np.float64)
            print(f"    ht all {rel(ht, hwant, None):.3e}; per request {spread(rel(ht, hwant, (1, 2, 3)))}; "
                  f"per head {spread(rel(ht, hwant, (0, 2, 3)))}")
            print(f"       per request: " + " ".join(f"{v:.2e}" for v in rel(ht, hwant, (1, 2, 3))))
            print(f"       request x head:\n" + "\n".join(
                "         " + " ".join(f"{v:.2e}" for v in row) for row in rel(ht, hwant, (2, 3))))


if __name__ == "__main__":
    main(*sys.argv[1:3])
