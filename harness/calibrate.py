"""Calibration: how the gate's policy behaves on clean kernels over many input draws.

Calibration runs the legs as they are, with no faults, so every gate failure it sees is a false
alarm. :func:`calibration_table` groups the paired (case, draw) comparisons of a GPU and a TPU
result file by op × dtype × tensor × metric and reports, for each group:

- ``n``: the (case, draw) pairs where both legs have numbers;
- the noise band of ``ratio = ε_TPU / ε_GPU``: min, median, p95 and max over those pairs;
- ``false_alarms`` and ``false_alarm_rate``: the pairs the policy fails (metrics the policy does
  not gate are judged as if they were, and flagged ``gated = False``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .gate import apply_gate
from .metrics import METRICS
from .policy import Policy

CALIBRATION_COLUMNS = ["op", "dtype", "tensor", "metric", "gated", "n", "ratio_min", "ratio_median", "ratio_p95",
                       "ratio_max", "false_alarms", "false_alarm_rate"]


def calibration_table(gpu: pd.DataFrame, tpu: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """The false-alarm rate and the ratio noise band of ``policy`` per op × dtype × tensor × metric."""
    parity = apply_gate(gpu, tpu, policy, allow_missing=True).parity
    measured = parity[parity["metric"].isin(METRICS) & parity["eps_tpu"].notna()].copy()
    facts = tpu.drop_duplicates("case_id").set_index("case_id")[["op", "dtype"]]
    measured = measured.join(facts, on="case_id")
    measured["alarm"] = [not policy.passes(m, t, g) for m, t, g in
                         zip(measured["metric"], measured["eps_tpu"].astype(float), measured["eps_gpu"].astype(float))]
    rows = []
    for (op, dtype, tensor, metric), group in measured.groupby(["op", "dtype", "tensor", "metric"], sort=True):
        ratio = group["ratio"].astype(float).to_numpy()
        alarms = int(group["alarm"].sum())
        rows.append({"op": op, "dtype": dtype, "tensor": tensor, "metric": metric, "gated": metric in policy.metrics,
                     "n": len(group), "ratio_min": ratio.min(), "ratio_median": float(np.median(ratio)),
                     "ratio_p95": float(np.quantile(ratio, 0.95)), "ratio_max": ratio.max(),
                     "false_alarms": alarms, "false_alarm_rate": alarms / len(group)})
    return pd.DataFrame(rows, columns=CALIBRATION_COLUMNS)


def summary(table: pd.DataFrame) -> dict:
    """Totals over the gated metrics: pairs judged, false alarms and their rate."""
    gated = table[table["gated"]]
    n, alarms = int(gated["n"].sum()), int(gated["false_alarms"].sum())
    return {"n": n, "false_alarms": alarms, "rate": alarms / n if n else float("nan")}


def markdown(table: pd.DataFrame, policy: Policy, provenance: str) -> str:
    """``calibration.md``: the policy, the totals, and the table (worst ratio first)."""
    total = summary(table)
    lines = ["## Gate calibration on clean kernels", "", f"Policy: {policy.describe()}.", "", provenance, "",
             f"Gated metrics: **{total['false_alarms']} false alarm(s) in {total['n']} paired comparisons** "
             f"(rate {total['rate']:.3g}). Every failure here is a false alarm: nothing was injected.", "",
             "| op | dtype | tensor | metric | gated | n | ratio min | median | p95 | max | false alarms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.sort_values("ratio_max", ascending=False).to_dict("records"):
        lines.append(f"| {r['op']} | {r['dtype']} | {r['tensor']} | {r['metric']} | {'yes' if r['gated'] else 'no'} "
                     f"| {r['n']} | {r['ratio_min']:.3f} | {r['ratio_median']:.3f} | {r['ratio_p95']:.3f} | "
                     f"{r['ratio_max']:.3f} | {r['false_alarms']} |")
    return "\n".join(lines) + "\n"
