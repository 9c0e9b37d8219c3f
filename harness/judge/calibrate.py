"""Calibration: how the gate's policy behaves on clean kernels over many input draws.

Calibration runs the legs as they are, with no faults, so every gate failure it sees is a false
alarm. :func:`calibration_table` groups the paired (case, draw) comparisons of a GPU and a TPU
result file by op × dtype × tensor × metric and reports, for each group:

- ``n``: the (case, draw) pairs where both legs have numbers;
- the noise band of ``ratio = ε_TPU / ε_GPU``: min, median, p95 and max over those pairs;
- ``false_alarms`` and ``false_alarm_rate``: the pairs the policy fails (metrics the policy does
  not gate are judged as if they were, and flagged ``gated = False``);
- ``judged_max``: the worst value of the statistic the policy compares with ``1 + margin``: the ratio,
  or for a bootstrapped metric (rel_l2) the smaller of the ratio and its bootstrap lower bound.

:func:`derive_policy` turns the table into a policy file's margins: twice the worst excess over 1
of the judged statistic on clean kernels (``HEADROOM``), rounded up to ``STEP``, as a margin rule
where that is wider than the configured margin; per op × dtype × tensor for rel_l2, per op × dtype
for the other metrics. The shipped ``harness/policy.toml`` is that derivation on the
calibration checked in under ``reports/calibration/`` (docs/definitions.md, "Calibration").
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from harness.judge.gate import apply_gate
from harness.core.metrics import METRICS, parse_blocks
from harness.core.noise import ratio_lower_bound
from harness.core.policy import MarginRule, Policy

CALIBRATION_COLUMNS = ["op", "dtype", "tensor", "metric", "gated", "n", "ratio_min", "ratio_median", "ratio_p95",
                       "ratio_max", "judged_max", "false_alarms", "false_alarm_rate"]

HEADROOM = 2.0
"""A derived margin is this multiple of the worst excess (judged statistic − 1) seen on clean kernels."""
STEP = 0.05
"""Derived margins are rounded up to a multiple of this."""


def _judged(policy: Policy, metric: str, ratio: float, baseline_blocks, candidate_blocks) -> float:
    """The statistic ``policy`` compares with 1 + margin (floors aside): the ratio, or for a bootstrapped
    metric the smaller of the ratio and its bootstrap lower bound."""
    if not policy.bootstraps(metric) or baseline_blocks is None or candidate_blocks is None:
        return ratio
    return min(ratio, ratio_lower_bound(baseline_blocks, candidate_blocks, policy.alpha))


def calibration_table(baseline: pd.DataFrame, candidate: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """The false-alarm rate and the ratio noise band of ``policy`` per op × dtype × tensor × metric."""
    parity = apply_gate(baseline, candidate, policy, allow_missing=True).parity
    measured = parity[parity["metric"].isin(METRICS) & parity["eps_tpu"].notna()].copy()
    facts = candidate.drop_duplicates("case_id").set_index("case_id")[["op", "dtype"]]
    measured = measured.join(facts, on="case_id")
    blocks = [{(c, t): parse_blocks(b) for c, t, b in zip(df["case_id"], df["tensor"], df["rel_l2_blocks"])}
              for df in (baseline, candidate)]  # baseline, candidate
    alarms, judged = [], []
    for r in measured.to_dict("records"):
        key = (r["case_id"], r["tensor"])
        pair = blocks[0].get(key), blocks[1].get(key)
        where = {"op": r["op"], "dtype": r["dtype"], "tensor": r["tensor"]}
        alarms.append(not policy.judge(r["metric"], float(r["eps_tpu"]), float(r["eps_gpu"]), *pair, **where)[0])
        judged.append(_judged(policy, r["metric"], float(r["ratio"]), *pair))
    measured["alarm"], measured["judged"] = alarms, judged
    rows = []
    for (op, dtype, tensor, metric), group in measured.groupby(["op", "dtype", "tensor", "metric"], sort=True):
        ratio = group["ratio"].astype(float).to_numpy()
        alarms = int(group["alarm"].sum())
        rows.append({"op": op, "dtype": dtype, "tensor": tensor, "metric": metric, "gated": metric in policy.metrics,
                     "n": len(group), "ratio_min": ratio.min(), "ratio_median": float(np.median(ratio)),
                     "ratio_p95": float(np.quantile(ratio, 0.95)), "ratio_max": ratio.max(),
                     "judged_max": float(group["judged"].max()), "false_alarms": alarms, "false_alarm_rate": alarms / len(group)})
    return pd.DataFrame(rows, columns=CALIBRATION_COLUMNS)


def derived_margin(judged_max: float) -> float:
    """HEADROOM × the worst excess over 1, rounded up to a multiple of STEP (0 when there is no excess)."""
    excess = HEADROOM * (float(judged_max) - 1.0)
    return round(math.ceil(round(excess / STEP, 9)) * STEP, 6) if excess > 0 else 0.0


def derive_policy(table: pd.DataFrame, base: Policy) -> Policy:
    """``base`` plus a :class:`MarginRule` wherever the calibration's derived margin (:func:`derived_margin` of
    the worst judged statistic) exceeds the margin ``base`` gives there. A bootstrapped metric (rel_l2) gets
    one rule per op × dtype × tensor: its noise beyond the bootstrap's is a property of the tensor (a
    cancelling gradient). Any other metric (max_abs) gets one rule per op × dtype, over all its tensors:
    the spread of an extreme is heavy-tailed, a property of the dtype's rounding and the op's kernels, and
    five draws of one tensor are too few to bound it (measured: per-tensor max_abs margins from seeds 0-4
    missed a ratio of 1.51 on seed 5-9). Every other margin stays the base's, per metric."""
    rules = list(base.rules)
    for metric, rows in table.groupby("metric", sort=False):
        keys = ["op", "dtype", "tensor"] if base.bootstraps(metric) else ["op", "dtype"]
        for key, group in rows.groupby(keys, sort=True):
            where = dict(zip(keys, key))
            margin = derived_margin(group["judged_max"].max())
            if margin > base.margin(metric, **where):
                rules.append(MarginRule(metric, margin, **where))
    margins = {m: base.margin(m) for m in METRICS}
    return replace(base, margins=margins, rel_margin=0.0, rules=tuple(rules), source="derived by parity calibrate")


def summary(table: pd.DataFrame) -> dict:
    """Totals over the gated metrics: pairs judged, false alarms and their rate."""
    gated = table[table["gated"]]
    n, alarms = int(gated["n"].sum()), int(gated["false_alarms"].sum())
    return {"n": n, "false_alarms": alarms, "rate": alarms / n if n else float("nan")}


def markdown(table: pd.DataFrame, policy: Policy, provenance: str, derived: Policy | None = None) -> str:
    """``calibration.md``: the policy, the totals, the derived margins and the table (worst ratio first)."""
    total = summary(table)
    lines = ["## Gate calibration on clean kernels", "", f"Policy: {policy.describe()}.", "", provenance, "",
             f"Gated metrics: **{total['false_alarms']} false alarm(s) in {total['n']} paired comparisons** "
             f"(rate {total['rate']:.3g}). Every failure here is a false alarm: nothing was injected.", ""]
    if derived is not None:
        lines += [f"Derived policy (`policy.toml`): {HEADROOM:g} × the worst excess over 1 of the judged statistic "
                  f"(per op × dtype × tensor for rel_l2, per op × dtype otherwise), rounded up to {STEP:g}, where "
                  f"that exceeds the "
                  f"default margin ({', '.join(f'{m} {derived.margin(m):g}' for m in METRICS)}): "
                  f"{len(derived.rules)} wider margin(s), in the last column.", ""]
    lines += ["| op | dtype | tensor | metric | gated | n | ratio min | median | p95 | max | judged max "
              "| false alarms | derived margin |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.sort_values("ratio_max", ascending=False).to_dict("records"):
        margin = "" if derived is None else f"{derived.margin(r['metric'], r['op'], r['dtype'], r['tensor']):g}"
        lines.append(f"| {r['op']} | {r['dtype']} | {r['tensor']} | {r['metric']} | {'yes' if r['gated'] else 'no'} "
                     f"| {r['n']} | {r['ratio_min']:.3f} | {r['ratio_median']:.3f} | {r['ratio_p95']:.3f} | "
                     f"{r['ratio_max']:.3f} | {r['judged_max']:.3f} | {r['false_alarms']} | {margin} |")
    return "\n".join(lines) + "\n"
