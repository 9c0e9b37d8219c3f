"""The emulated GPU leg before and after it followed Triton's PTX (harness/emulation/ptx_arith.py), each against the
rows a real H100 wrote (reports/h100-native), on the rows all three have `ok` with the same case, tensor and input.

    python reports/ptx/compare_native.py BEFORE.csv[.gz] AFTER.csv[.gz]

Per dtype: the range of rel_l2 emulated / native, the mean |ln| of that ratio, how many rows put their largest error
on the same element with the same value bit for bit (worst_index and got_at_worst, the closest the rows come to a
bitwise comparison: the two references were computed on different hosts), and how many rows moved closer to the
hardware, farther from it, or not at all."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

NATIVE = Path(__file__).resolve().parents[1] / "h100-native"
KEY = ["case_id", "tensor", "input_sha256"]
COLS = KEY + ["dtype", "status", "rel_l2", "worst_index", "got_at_worst"]


def main(before: str, after: str) -> None:
    native = pd.concat([pd.read_csv(NATIVE / f)[COLS] for f in ("gpu-smoke.csv", "gpu-regressions.csv")])
    m = native.merge(pd.read_csv(before)[COLS], on=KEY, suffixes=("", "_b")).merge(
        pd.read_csv(after)[COLS], on=KEY, suffixes=("", "_a"))
    m = m[(m.status == "ok") & (m.status_b == "ok") & (m.status_a == "ok")]
    print("| dtype | rows | before: rel_l2 / native | mean abs ln | worst element bit-equal | after: rel_l2 / native "
          "| mean abs ln | worst element bit-equal | after closer / farther / same |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dt in ["all"] + sorted(m.dtype.unique()):
        sub = m if dt == "all" else m[m.dtype == dt]
        cells = []
        for e in ("_b", "_a"):
            r = sub["rel_l2" + e] / sub.rel_l2
            same = ((sub["worst_index" + e] == sub.worst_index) & (sub["got_at_worst" + e] == sub.got_at_worst)).sum()
            cells += [f"{r.min():.4f} – {r.max():.4f}", f"{np.abs(np.log(r)).mean():.2e}", f"{same}"]
        db, da = (np.abs(np.log(sub["rel_l2" + e] / sub.rel_l2)) for e in ("_b", "_a"))
        moved = f"{(da < db).sum()} / {(da > db).sum()} / {(sub.rel_l2_a == sub.rel_l2_b).sum()}"
        print(f"| {dt} | {len(sub)} | " + " | ".join(cells) + f" | {moved} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
