"""How each kernel launch of GPU-leg cases ran under the batched grid executor (batched, split, sequential, why).

    .venv/bin/python benchmarks/batched_grid_launches.py --out reports/bench/2026-11-26-batched-grid/launches.csv \\
        CASE_ID [CASE_ID ...]

Runs each case's fla binding (forward and backward, as the GPU leg does) inside ``triton_emulation()`` and writes one
row per launch: case, kernel, grid, programs, mode, groups (passes that completed), read_tracked, reason, seconds.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args(argv)
    from cases.inputs import make_inputs
    from harness.app import case_from_id
    from harness.legs import make_leg
    from harness.ops import get_op

    leg = make_leg("gpu", batched_grid=True)
    import harness.legs.gpu as gpu_mod

    records = []
    scope_orig = leg._scope

    def scope():
        cm = scope_orig()

        class Wrap:

            def __enter__(self):
                self.session = cm.__enter__()
                return self.session

            def __exit__(self, *exc):
                records.extend(self.session.grid_launches)
                return cm.__exit__(*exc)

        return Wrap()

    leg._scope = scope
    fields = ["case", "kernel", "grid", "programs", "mode", "groups", "read_tracked", "reason", "seconds"]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for cid in args.cases:
            case = case_from_id(cid)
            op = get_op(case.op)
            records.clear()
            leg.run(op, case, make_inputs(case, op.inputs(case)))
            for r in records:
                w.writerow({"case": cid, **{k: r.get(k, "") for k in fields[1:]},
                            "grid": "x".join(map(str, r["grid"]))})
            modes = {}
            for r in records:
                modes[r["mode"]] = modes.get(r["mode"], 0) + 1
            print(cid, modes, flush=True)
    del gpu_mod
    return 0


if __name__ == "__main__":
    sys.exit(main())
