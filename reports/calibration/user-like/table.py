"""The false-alarm table of the user-like sample (README.md here): the verdicts of `parity.csv` (the first
draw's gate) and `redraws/parity.csv` (the deciding draws of the cases the first draw left inconclusive), per
op x dtype, over the gated metrics. Clean kernels, so every `fail` is a false alarm.

    python reports/calibration/user-like/table.py [DIR]
"""

import sys
from pathlib import Path

import pandas as pd


def op_dtype(case_id: str) -> str:
    op_variant, _, dtype = case_id.split("/")[:3]
    return f"{op_variant} {dtype}"


def main(root: Path = Path(__file__).parent) -> None:
    first = pd.read_csv(root / "parity.csv")
    gated = first[first.verdict.isin(["pass", "fail", "inconclusive"])].copy()
    redraws = root / "redraws" / "parity.csv"
    if redraws.exists():  # the pooled verdict replaces the first draw's inconclusive one
        pooled = pd.read_csv(redraws)
        pooled = pooled[pooled.verdict.isin(["pass", "fail", "inconclusive"]) & (pooled.draws > 1)]
        final = pooled.set_index(["case_id", "tensor", "metric"]).verdict
        key = pd.MultiIndex.from_frame(gated[["case_id", "tensor", "metric"]])
        decided = pd.Series(final.reindex(key).to_numpy(), index=gated.index)
        gated["final"] = decided.where(gated.verdict == "inconclusive", gated.verdict).fillna(gated.verdict)
    else:
        gated["final"] = gated.verdict
    gated["op dtype"] = gated.case_id.map(op_dtype)
    gated["rel_l2_ratio"] = gated.ratio.where(gated.metric == "rel_l2")
    table = gated.groupby("op dtype").agg(
        cases=("case_id", "nunique"), comparisons=("verdict", "size"),
        first_draw_fail=("verdict", lambda v: int((v == "fail").sum())),
        first_draw_inconclusive=("verdict", lambda v: int((v == "inconclusive").sum())),
        final_fail=("final", lambda v: int((v == "fail").sum())),
        final_inconclusive=("final", lambda v: int((v == "inconclusive").sum())),
        worst_rel_l2_ratio=("rel_l2_ratio", "max"))
    table.loc["all"] = table.sum(numeric_only=True)
    table.loc["all", "cases"] = gated.case_id.nunique()
    table.loc["all", "worst_rel_l2_ratio"] = gated.rel_l2_ratio.max()
    print("| op dtype | " + " | ".join(table.columns) + " |")
    print("|---" * (len(table.columns) + 1) + "|")
    for name, row in table.iterrows():
        cells = [f"{v:.2f}" if col == "worst_rel_l2_ratio" else str(int(v)) for col, v in row.items()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:]))
