"""How far each engine's state drifts from the exact one over a long decode, per cache dtype (README.md, "The
serving peers").

For each case of ``drift-cases.toml`` (24 decode steps after a prefill, a bf16, an fp16 or a float32 cache) it
prints ``ht``'s rel-L2 against the exact float64 state (what the harness's reference computes) of every leg whose
rows are given (``parity run`` / ``parity all`` result files: the row's own ``rel_l2``), beside two floors computed
here from the reference alone:

- **once**: the exact final state rounded once to the cache's dtype (nearest even): the least any cache of that
  dtype can show;
- **chain**: the float64 chain with the state rounded to the cache's dtype after every call, as the engine writes
  it back (``compare_references.rounded_reference``): what 25 roundings cost an engine with exact arithmetic.

    python reports/state-dtype/drift.py ROWS.csv [ROWS.csv ...]
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def floors(case_id: str) -> tuple[float, float]:
    from cases.inputs import make_inputs, quantize
    from harness.app import case_from_id
    from harness.ops import get_op
    from harness.ops.serving import state_dtype

    sys.path.insert(0, str(HERE))
    from compare_references import rounded_reference

    case = case_from_id(case_id)
    op = get_op(case.op)
    x = make_inputs(case, op.inputs(case)).as_float64()
    exact = op.reference(case, x, method="chunk")["ht"]
    chained = rounded_reference(op, case, x)["ht"]
    return rel(quantize(exact, state_dtype(case)), exact), rel(chained, exact)


def main(paths: list[str]) -> None:
    rows = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    rows = rows[(rows.tensor == "ht") & (rows.draw == 0)]
    ids = [c["id"] for c in tomllib.loads((HERE / "drift-cases.toml").read_text())["case"]]
    for case_id in ids:
        once, chain = floors(case_id)
        print(case_id)
        print(f"  floor once {once:.3e}, chain {chain:.3e}")
        for r in rows[rows.case_id == case_id].itertuples():
            value = f"{r.rel_l2:.3e}" if r.status in ("ok", "bound") else r.status
            print(f"  {r.leg:14s} {value}" + (f"  ({r.status})" if r.status not in ("ok",) else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
