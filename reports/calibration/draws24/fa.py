"""False alarms per comparison on clean kernels over many input draws, under the shipped policy (issue 48).

    python reports/calibration/draws24/fa.py DIR [DIR ...]

Each DIR holds one run's baseline and candidate rows (``gpu*.csv`` and ``tpu*.csv``, gzipped or not) of the same
cases over several draws. For each N of 1, 3, 8 and 24 (as far as the draws reach), the gate judges the first N
draws of every case (its N smallest seeds) and each comparison (case, tensor, gated metric) counts once, with the verdict
its rows carry: the sequential test's (docs/definitions.md, "One verdict per comparison"). For contrast, the rule
the gate had before, "any draw failed": a comparison fails if any one of its N draws, gated alone, fails; and how many one-draw verdicts are
not a pass (a failure, or a one-draw ``inconclusive``).
Clean kernels, nothing injected: every ``fail`` is a false alarm.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from harness.judge.gate import apply_gate, undrawn_id
from harness.core.policy import default_policy
from harness.core.results import read_table


def rows(folder: Path, leg: str) -> pd.DataFrame:
    [path] = [p for p in folder.iterdir() if p.name.startswith(leg) and ".csv" in p.name and "partial" not in p.name
              and "redraws" not in p.name]
    return read_table(path)


def verdicts(gpu: pd.DataFrame, tpu: pd.DataFrame, policy) -> pd.DataFrame:
    """One row per comparison (case at draw 0, tensor, metric): its verdict."""
    p = apply_gate(gpu, tpu, policy).parity
    p = p[p["metric"].isin(policy.metrics) & p["verdict"].isin(["pass", "fail", "inconclusive"])].copy()
    p["case"] = p["case_id"].map(undrawn_id)
    return p.groupby(["case", "tensor", "metric"])["verdict"].first()


def main(folders: list[str]) -> None:
    policy = default_policy()
    gpu = pd.concat([rows(Path(f), "gpu") for f in folders], ignore_index=True)
    tpu = pd.concat([rows(Path(f), "tpu") for f in folders], ignore_index=True)
    # each case's draws in seed order: the first N of them are its first N draws (held-out seeds may skip some)
    rank = tpu[["case_id", "draw"]].drop_duplicates()
    rank["nth"] = rank.groupby(rank["case_id"].map(undrawn_id))["draw"].rank(method="dense").astype(int) - 1
    nth = dict(zip(rank["case_id"], rank["nth"]))
    gpu, tpu = gpu[gpu["case_id"].isin(nth)].copy(), tpu.copy()
    gpu["nth"], tpu["nth"] = gpu["case_id"].map(nth), tpu["case_id"].map(nth)
    most = int(tpu["nth"].max()) + 1
    print("| draws | cases | comparisons | fail (sequential test) | inconclusive | fail (any draw failed, before) "
          "| one-draw verdicts not a pass |")
    print("|---|---|---|---|---|---|---|")
    for n in (1, 3, 8, 24):
        if n > most:
            break
        g, t = gpu[gpu["nth"] < n], tpu[tpu["nth"] < n]
        seq = verdicts(g, t, policy)
        alone = pd.concat([verdicts(g[g["nth"] == d], t[t["nth"] == d], policy).rename(d) for d in range(n)],
                          axis=1)
        any_fail = int((alone == "fail").any(axis=1).sum())
        not_pass = f"{int(((alone != 'pass') & alone.notna()).to_numpy().sum())} of {int(alone.notna().to_numpy().sum())}"
        cases = seq.index.get_level_values("case").nunique()
        print(f"| {n} | {cases} | {len(seq)} | {int((seq == 'fail').sum())} | {int((seq == 'inconclusive').sum())} "
              f"| {any_fail} | {not_pass} |")
        for key, verdict in seq[seq != "pass"].items():
            print(f"  {verdict}: {' '.join(key)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
