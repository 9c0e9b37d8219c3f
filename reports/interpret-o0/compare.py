"""The TPU leg's rows before and after interpret-mode programs were compiled at XLA:CPU level 0.

    python reports/interpret-o0/compare.py OLD_TPU.csv NEW_TPU.csv OLD_PARITY.csv NEW_PARITY.csv

For every (case, tensor) row ok in both: how far each ε moved (new / old), and how the gate's ratios and
verdicts moved (parity.csv of `parity gate` on each, against the same GPU rows).
"""

import sys

import numpy as np
import pandas as pd

old, new, gate_old, gate_new = (pd.read_csv(p, low_memory=False) for p in sys.argv[1:5])
key = ["case_id", "tensor"]
both = old[old.status == "ok"].merge(new[new.status == "ok"], on=key, suffixes=("_old", "_new"))
print(f"(case, tensor) rows ok in both: {len(both)} of {len(old)} old, {len(new)} new")
print(f"bit-identical tensors (same max_abs, rel_l2 and ulp_max): "
      f"{int(((both.max_abs_old == both.max_abs_new) & (both.rel_l2_old == both.rel_l2_new) & (both.ulp_max_old == both.ulp_max_new)).sum())}")
for metric in ("rel_l2", "max_abs"):
    a, b = both[f"{metric}_old"], both[f"{metric}_new"]
    moved = np.abs(np.log(b / a))[(a > 0) & (b > 0)]
    print(f"{metric}: |log(new/old)| median {np.median(moved):.2e}, 99th pct {np.quantile(moved, 0.99):.2e}, "
          f"max {moved.max():.2e} (x{np.exp(moved.max()):.3f})")
    worst = both.loc[moved.sort_values().index[-3:]]
    for _, r in worst.iterrows():
        print(f"   {r.case_id} {r.tensor}: {r[f'{metric}_old']:.4g} -> {r[f'{metric}_new']:.4g}")
g = gate_old.merge(gate_new, on=key + ["metric"], suffixes=("_old", "_new"))
g = g[g.verdict_old.isin(["pass", "fail", "inconclusive"]) | g.verdict_new.isin(["pass", "fail", "inconclusive"])]
print(f"gated comparisons: {len(g)}; verdicts old: {g.verdict_old.value_counts().to_dict()}; "
      f"new: {g.verdict_new.value_counts().to_dict()}")
changed = g[g.verdict_old != g.verdict_new]
print(f"verdicts that changed: {len(changed)}")
for _, r in changed.iterrows():
    print(f"   {r.case_id} {r.tensor} {r.metric}: {r.verdict_old} (ratio {r.ratio_old:.3g}) -> "
          f"{r.verdict_new} (ratio {r.ratio_new:.3g})")
ratio = np.abs(np.log(g.ratio_new / g.ratio_old)).replace([np.inf], np.nan).dropna()
print(f"gate ratio |log(new/old)|: median {np.median(ratio):.2e}, max {ratio.max():.2e}")
