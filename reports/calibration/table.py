"""Per (case, tensor, metric) of a gate's per-draw rows (``parity gate --out D``: ``D/parity.csv[.gz]``): the draws,
the geometric mean and worst of eps_TPU / eps_GPU, the draws with the ratio above 1, the draws that pass alone
(eps_TPU within the policy's allowance on that draw), and the pooled verdict. Tensors that only the candidate
computes (fla returns no dg_gamma) are judged by the absolute bound alone: a row per draw whose TPU status is not
``ok`` is listed with the bound it broke.

    python reports/calibration/table.py reports/calibration/decode-recurrent/parity.csv.gz
    python reports/calibration/table.py reports/calibration/fresh24/parity.csv.gz --not-passing

``--not-passing``: only the comparisons that do not pass pooled or fail alone on some draw (the READMEs quote it).
"""

import argparse

import numpy as np
import pandas as pd

SHORTEN = ("/g=logsigmoid/16", "/C64")  # the suites' commonest id parts, left out of the printed case


def comparisons(d: pd.DataFrame) -> pd.DataFrame:
    d = d[d.metric.isin(["rel_l2", "max_abs"]) & (d.eps_gpu > 0)].copy()
    d["case"] = d.case_id.str.replace(r"(?<=[,/])seed=\d+,?", "", regex=True).str.rstrip(",/")  # a draw's id
    d["ratio"] = d.eps_tpu / d.eps_gpu
    d["alone"] = d.eps_tpu <= d.allowed
    return d.groupby(["case", "tensor", "metric"]).agg(
        draws=("ratio", "size"), geomean=("ratio", lambda r: float(np.exp(np.log(r).mean()))),
        worst=("ratio", "max"), above_1=("ratio", lambda r: int((r > 1).sum())), pass_alone=("alone", "sum"),
        verdict=("verdict", lambda v: "/".join(sorted(set(v))))).reset_index()


def bound_breaks(d: pd.DataFrame) -> pd.DataFrame:
    """The candidate's status rows that are not ``ok`` where fla gave no number (verdict ``bounds_only`` passes)."""
    s = d[(d.metric == "status") & d.gpu_status.eq("not_provided")]
    return s[s.tpu_status.ne("ok") & s.tpu_status.ne("not_provided")][["case_id", "tensor", "tpu_status", "reason"]]


def _print(t: pd.DataFrame) -> None:
    t = t.copy()
    for part in SHORTEN:
        t[t.columns[0]] = t[t.columns[0]].str.replace(part, "", regex=False)
    print("| " + " | ".join(t.columns) + " |\n|" + "---|" * len(t.columns))
    for row in t.itertuples(index=False):
        print("| " + " | ".join(f"{x:.3f}" if isinstance(x, float) else f"`{x}`" if i == 0 else str(x)
                                for i, x in enumerate(row)) + " |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("parity_csv")
    p.add_argument("--not-passing", action="store_true")
    args = p.parse_args(argv)
    d = pd.read_csv(args.parity_csv, low_memory=False)
    t = comparisons(d)
    if args.not_passing:
        t = t[(t.verdict != "pass") | (t.pass_alone < t.draws)]
    _print(t)
    breaks = bound_breaks(d)
    if len(breaks):
        print()
        _print(breaks)


if __name__ == "__main__":
    main()
