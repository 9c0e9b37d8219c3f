"""Candidates side by side against the baseline: per case and forward tensor, each candidate's ε, its verdict,
where it compiled, and the rule of a peer's own tests applied to the same numbers (``parity all --candidate``
writes ``peers.csv`` and ``peers.md`` with it).

"Own tests' rule" is ``allclose(got, ref, atol=1e-2, rtol=1e-2)``, the rule of tpu-inference's kernel tests,
decided from the rows: it holds for sure when max_abs <= atol, and fails for sure when the element of the
largest absolute error breaks it; otherwise the rows cannot say (``undecided``). Those tests compare with an
fp32 JAX reference, this harness with float64; at a tolerance of 1e-2 that difference does not matter.
"""

from __future__ import annotations

import pandas as pd

from .gate import apply_gate
from .policy import Policy

ATOL = RTOL = 1e-2
FORWARD = ("o", "ht")


def own_rule(row: dict) -> str:
    if pd.isna(row.get("max_abs")):
        return ""
    if row["max_abs"] <= ATOL:
        return "pass"
    if abs(row["got_at_worst"] - row["ref_at_worst"]) > ATOL + RTOL * abs(row["ref_at_worst"]):
        return "FAIL"
    return "undecided"


def peer_table(baseline: pd.DataFrame, candidates: list[pd.DataFrame], policy: Policy) -> pd.DataFrame:
    """One row per (case, forward tensor, candidate)."""
    base = baseline.set_index(["case_id", "tensor"])
    rows = []
    for cand in candidates:
        leg = str(cand["leg"].iloc[0])
        parity = apply_gate(baseline, cand, policy, candidate_leg=leg, allow_missing=True).parity
        verdict = {}
        for key, group in parity.groupby(["case_id", "tensor"]):
            judged = group[group["metric"].isin(policy.metrics)]
            worst = next((v for v in ("fail", "inconclusive") if (group["verdict"] == v).any()), "pass")
            verdict[key] = worst if len(judged) else str(group["verdict"].iloc[0])
        for r in cand[cand["tensor"].isin(FORWARD)].to_dict("records"):
            key = (r["case_id"], r["tensor"])
            g = base.loc[key] if key in base.index else None
            eps_fla = None if g is None else g["rel_l2"]
            rows.append({"case_id": key[0], "tensor": key[1], "candidate": leg, "status": r["status"],
                         "reason": r.get("reason"), "eps_fla": eps_fla, "eps": r.get("rel_l2"),
                         "ratio": (r.get("rel_l2") / eps_fla) if eps_fla else None,
                         "max_abs_fla": None if g is None else g["max_abs"], "max_abs": r.get("max_abs"),
                         "ulp_max": r.get("ulp_max"), "ulp_mean": r.get("ulp_mean"),
                         "verdict": verdict.get(key, ""), "own_tests_rule": own_rule(r),
                         "compiled_for": r.get("compiled_for"), "mxu_cost": r.get("mxu_cost")})
    return pd.DataFrame(rows)


def _cell(r) -> str:
    if r.status == "unsupported":
        return f"unsupported: {r.reason}"
    if pd.isna(r.eps):
        return f"{r.status}: {r.reason}"
    return (f"{r.eps:.3g} ({r.ratio:.2f}×, max_abs {r.max_abs:.2g}), **{r.verdict}**, own rule {r.own_tests_rule or '–'}"
            f", compiled for {r.compiled_for if isinstance(r.compiled_for, str) else '–'}")


def peer_markdown(table: pd.DataFrame, title: str) -> str:
    legs = list(dict.fromkeys(table["candidate"]))
    lines = [f"## {title}", "", "ε is rel_l2 against the float64 reference; the ratio is to fla's ε; the verdict "
             "is the shipped policy's; 'own rule' is allclose(atol = rtol = 1e-2).", "",
             "| case | tensor | ε fla | " + " | ".join(legs) + " |", "|---|---|---|" + "---|" * len(legs)]
    for (case_id, tensor), group in table.groupby(["case_id", "tensor"], sort=False):
        cells = {r.candidate: _cell(r) for r in group.itertuples()}
        eps_fla = group["eps_fla"].dropna()
        lines.append(f"| `{case_id}` | {tensor} | {eps_fla.iloc[0]:.3g} | " if len(eps_fla) else
                     f"| `{case_id}` | {tensor} | – | ")
        lines[-1] += " | ".join(cells.get(leg, "–") for leg in legs) + " |"
    return "\n".join(lines) + "\n"
