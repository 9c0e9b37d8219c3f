"""GPU-leg rows of the sequential interpreter against the batched grid executor's: every metric, bit for bit.

Takes two result files of ``parity run --backend gpu`` over the same cases and draws, one made with
``PARITY_BATCHED_GRID=0`` (the interpreter's stock loop) and one with the default (harness/emulation/batched_grid.py),
and says, per (case, draw, tensor), whether the input hash, the status and every metric column are identical
(floats compared as written, NaN equal to NaN). Writes ``rows-<name>.md`` into ``--out`` with the counts, the
launches by mode read from the batched rows' details, and every row that differs; exit 1 when one does.

    PARITY_BATCHED_GRID=0 parity run --backend gpu --suite regressions --out /tmp/seq --no-baseline-cache
    parity run --backend gpu --suite regressions --out /tmp/bat --no-baseline-cache
    python benchmarks/batched_grid_rows.py /tmp/seq/gpu.csv /tmp/bat/gpu.csv --name regressions \\
        --out reports/bench/2026-11-26-batched-grid
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

KEY = ["case_id", "draw", "tensor"]
# everything a row measures; not compared: when and how long it ran, the commit, and the settings and details that
# name the executor (the batched rows' details carry their launches)
COMPARED = ["input_sha256", "status", "reason", "tensor_dtype", "max_abs", "rel_l2", "ulp_max", "ulp_mean", "ulp_p99",
            "rel_l2_blocks", "numel", "nan", "inf", "ref_nonfinite", "worst_index", "ref_at_worst", "got_at_worst",
            "bound_rel_l2", "bound_over", "kappa"]


def launches(details: pd.Series) -> dict:
    total: dict = {}
    seen = set()
    for case_id, text in details.items():
        if case_id in seen:
            continue
        seen.add(case_id)
        try:
            grid = json.loads(text).get("emulation", {}).get("grid_launches", {})
        except (TypeError, ValueError):
            continue
        for mode in ("batched", "split", "sequential"):
            total[mode] = total.get(mode, 0) + int(grid.get(mode, 0))
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sequential")
    ap.add_argument("batched")
    ap.add_argument("--name", required=True, help="what the rows are (a suite name): rows-<name>.md")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    seq, bat = (pd.read_csv(p, dtype=str, keep_default_na=False) for p in (args.sequential, args.batched))
    cols = [c for c in COMPARED if c in seq.columns and c in bat.columns]
    both = seq[KEY + cols].merge(bat[KEY + cols + ["details"]], on=KEY, how="outer", suffixes=("_seq", "_bat"),
                                 indicator=True)
    only = both[both["_merge"] != "both"]
    paired = both[both["_merge"] == "both"]
    differs = pd.Series(False, index=paired.index)
    which = {i: [] for i in paired.index}
    for c in cols:
        d = paired[f"{c}_seq"] != paired[f"{c}_bat"]
        differs |= d
        for i in paired.index[d]:
            which[i].append(c)
    bad = paired[differs]
    modes = launches(bat.set_index("case_id")["details"]) if "details" in bat.columns else {}
    lines = [f"# GPU-leg rows, sequential interpreter against the batched grid: {args.name}", "",
             f"`benchmarks/batched_grid_rows.py {Path(args.sequential).name} {Path(args.batched).name}`: "
             f"{paired['case_id'].nunique()} cases, {len(paired)} rows (case, draw, tensor) in both files; "
             f"compared: {', '.join(cols)}.", "",
             f"- rows identical on every compared column: **{len(paired) - len(bad)} of {len(paired)}**",
             f"- rows in one file only: {len(only)}",
             f"- statuses: {({k: int(v) for k, v in paired['status_seq'].value_counts().sort_index().items()})}",
             f"- the batched rows' launches: {modes}", ""]
    if len(bad):
        lines += ["| case | draw | tensor | columns that differ |", "|---|---|---|---|"]
        lines += [f"| `{r.case_id}` | {r.draw} | {r.tensor} | {', '.join(which[i])} |" for i, r in bad.iterrows()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rows-{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))
    return 1 if len(bad) or len(only) else 0


if __name__ == "__main__":
    sys.exit(main())
