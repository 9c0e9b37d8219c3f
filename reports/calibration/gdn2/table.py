"""The tables of README.md, from this folder's rows: `python table.py` (pandas; run from this folder)."""

import numpy as np
import pandas as pd

gpu, tpu = (pd.read_csv(f"{leg}.csv.gz") for leg in ("gpu", "tpu"))
gate = pd.read_csv("parity.csv.gz")
rows = gpu.merge(tpu, on=["case_id", "tensor"], suffixes=("_gpu", "_tpu"))
rows["path"] = rows["variant_gpu"]

print("## fla's rows against their bounds (rel_l2 / bound_rel_l2, the largest over cases and draws)\n")
print("| variant | dtype | tensors | fla's largest rel_l2 / bound | tensor | this project's largest / bound |")
print("|---|---|---|---|---|---|")
for (variant, dtype), g in rows.groupby(["path", "dtype_gpu"]):
    f, t = g["rel_l2_gpu"] / g["bound_rel_l2_gpu"], g["rel_l2_tpu"] / g["bound_rel_l2_tpu"]
    worst = g.loc[f.idxmax()]
    print(f"| {variant} | {dtype} | {g['tensor'].nunique()} | {f.max():.3f} | {worst['tensor']} | {t.max():.3f} |")

print("\n## ε_TPU / ε_fla per tensor (rel_l2; geometric mean over cases and draws, max, n)\n")
gated = gate[gate["metric"] == "rel_l2"].copy()
gated["variant"] = gated["case_id"].str.split("/").str[0].str.split(".").str[1]
print("| variant | tensor | ratio (geo. mean) | max | n | verdicts |")
print("|---|---|---|---|---|---|")
for (variant, tensor), g in gated.groupby(["variant", "tensor"], sort=False):
    r = g["ratio"].replace(0, np.nan).dropna()
    verdicts = ", ".join(f"{n} {v}" for v, n in g["verdict"].value_counts().items())
    print(f"| {variant} | {tensor} | {np.exp(np.log(r).mean()):.3g} | {r.max():.3g} | {len(r)} | {verdicts} |")
