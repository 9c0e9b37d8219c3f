"""Per (case, tensor, metric) of the decode cases: draws, geometric mean and worst of eps_TPU / eps_GPU, draws with
the ratio above 1, draws that pass alone (eps_TPU within the policy's allowance on that draw), and the pooled
verdict (README.md quotes its output).

    python reports/calibration/decode-recurrent/table.py [before-fold]
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent


def main(run: str = ""):
    d = pd.read_csv(HERE / run / "parity.csv.gz")
    d = d[d.metric.isin(["rel_l2", "max_abs"]) & (d.eps_gpu > 0)].copy()
    d["case"] = d.case_id.str.replace(r",seed=\d+", "", regex=True)
    d["ratio"] = d.eps_tpu / d.eps_gpu
    d["alone"] = d.eps_tpu <= d.allowed
    t = d.groupby(["case", "tensor", "metric"]).agg(
        draws=("ratio", "size"), geomean=("ratio", lambda r: float(np.exp(np.log(r).mean()))),
        worst=("ratio", "max"), above_1=("ratio", lambda r: int((r > 1).sum())), pass_alone=("alone", "sum"),
        verdict=("verdict", lambda v: "/".join(sorted(set(v))))).reset_index()
    t["case"] = t.case.str.replace("/g=logsigmoid/16", "", regex=False).str.replace("/C64", "", regex=False)
    print("| " + " | ".join(t.columns) + " |\n|" + "---|" * len(t.columns))
    for row in t.itertuples(index=False):
        print("| " + " | ".join(f"{x:.3f}" if isinstance(x, float) else f"`{x}`" if i == 0 else str(x)
                                for i, x in enumerate(row)) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
