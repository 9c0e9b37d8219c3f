"""Candidates side by side against the baseline: per case and forward tensor, each candidate's ε, its verdict,
where it compiled, and the rule of a peer's own tests applied to the same numbers (``parity all --candidate``
writes ``peers.csv`` and ``peers.md`` with it).

"Own tests' rule" is the tolerance a peer's own kernel tests hold its outputs to. An implementation declares it
(its object's ``tests_rule``, recorded in its rows' settings by :class:`harness.legs.external.ExternalLeg`), and
this module reads it from the rows: a mapping with

- ``summary``: how the table's heading names it (e.g. ``allclose(atol = rtol = 1e-2)``);
- ``default``: the rule of every op, variant and tensor not named below (absent: none);
- ``by_variant``: ``{"op.variant": {"test": "the test it comes from", "o": RULE, "ht": RULE, "*": RULE}}``;
- ``relative_to``: ``"reference"`` (``|got - ref| <= atol + rtol |ref|``, ``np.allclose(got, ref)``) or
  ``"candidate"`` (``+ rtol |got|``, ``np.allclose(ref, got)``);

a RULE being ``{"atol", "rtol"}``, optionally ``atol_per_chunk`` and ``atol_max`` (atol = min(atol_max, atol +
atol_per_chunk * max(T // C, 1)), T and C the case's) and ``max_ulp`` with ``ulp_dtype`` (an element also passes
within ``max_ulp`` units in the last place of that dtype at max(|ref|, |got|)).

The verdict is decided from the rows: it holds for sure when max_abs <= atol, and fails for sure when the element
of the largest absolute error breaks it; otherwise the rows cannot say (``undecided``). The rule of the one peer
that declares one is applied to every candidate of the table (this project's kernels included, for comparison);
when several declare different rules, each candidate's rows get its own, and the others none. No rule declared:
no value. Peers' tests compare with an fp32 reference, this harness with float64: at the tolerances such tests
use, that difference does not matter.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from harness.judge.gate import apply_gate
from harness.core.policy import Policy
from harness.core.results import settings_values

FORWARD = ("o", "ht")
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
"""Explicit mantissa bits of the dtypes a rule's ``max_ulp`` may be counted in."""


def declared_rule(frame: pd.DataFrame) -> dict | None:
    """The ``tests_rule`` recorded in a candidate's rows' settings, or None."""
    return next((rule for rule in settings_values(frame, "tests_rule") if rule), None)


def rule_for(declared: dict | None, case_id: str, tensor: str) -> dict | None:
    """The rule (atol resolved for the case's chunk count) that ``declared`` sets for this case and tensor."""
    if not declared:
        return None
    variant = (declared.get("by_variant") or {}).get(case_id.split("/", 1)[0])
    rule = (variant.get(tensor) or variant.get("*")) if variant else declared.get("default")
    if not rule:
        return None
    atol = float(rule["atol"])
    if rule.get("atol_per_chunk"):
        T, C = re.search(r"-T(\d+)-", case_id), re.search(r"/C(\d+)(?:/|$)", case_id)
        chunks = max(int(T.group(1)) // int(C.group(1)), 1) if T and C else 1
        atol = atol + float(rule["atol_per_chunk"]) * chunks
    if rule.get("atol_max") is not None:
        atol = min(atol, float(rule["atol_max"]))
    return {**rule, "atol": atol, "rtol": float(rule["rtol"]),
            "relative_to": declared.get("relative_to", "reference")}


def _ulp(x: float, dtype: str) -> float:
    """One unit in the last place of ``dtype`` at |x| (tops' tests' compute_ulp: 2^(frexp exponent - nmant - 1))."""
    bits = MANTISSA_BITS[dtype]
    if x == 0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.frexp(abs(x))[1] - bits - 1)


def own_rule(row: dict, rule: dict | None) -> str:
    if rule is None or pd.isna(row.get("max_abs")):
        return ""
    if row["max_abs"] <= rule["atol"]:
        return "pass"
    got, ref = row["got_at_worst"], row["ref_at_worst"]
    scale = abs(got) if rule["relative_to"] == "candidate" else abs(ref)
    tolerance = rule["atol"] + rule["rtol"] * scale
    if rule.get("max_ulp"):
        tolerance = max(tolerance, rule["max_ulp"] * _ulp(max(abs(got), abs(ref)), rule.get("ulp_dtype", "bfloat16")))
    if abs(got - ref) > tolerance:
        return "FAIL"
    return "undecided"


def _rules(candidates: list[pd.DataFrame]) -> dict[str, dict | None]:
    """Each candidate leg's rule: the one declared rule for all when one is declared, else each its own."""
    declared = {str(c["leg"].iloc[0]): declared_rule(c) for c in candidates}
    distinct = {json.dumps(r, sort_keys=True) for r in declared.values() if r}
    if len(distinct) == 1:
        only = json.loads(distinct.pop())
        return {leg: only for leg in declared}
    return declared


def peer_table(baseline: pd.DataFrame, candidates: list[pd.DataFrame], policy: Policy) -> pd.DataFrame:
    """One row per (case, forward tensor, candidate)."""
    base = baseline.set_index(["case_id", "tensor"])
    rules = _rules(candidates)
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
                         "verdict": verdict.get(key, ""),
                         "baseline": None if g is None else g.get("mode"),  # native or emulated fla judged it
                         "own_tests_rule": own_rule(r, rule_for(rules.get(leg), *key)),
                         "compiled_for": r.get("compiled_for"), "mxu_cost": r.get("mxu_cost")})
    table = pd.DataFrame(rows)
    table.attrs["own_rules"] = {leg: rule.get("summary", "declared") for leg, rule in rules.items() if rule}
    return table


def _cell(r) -> str:
    if r.status == "unsupported":
        return f"unsupported: {r.reason}"
    if pd.isna(r.eps):
        return f"{r.status}: {r.reason}"
    return (f"{r.eps:.3g} ({r.ratio:.2f}×, max_abs {r.max_abs:.2g}), **{r.verdict}**, own rule {r.own_tests_rule or '–'}"
            f", compiled for {r.compiled_for if isinstance(r.compiled_for, str) else '–'}")


def _rule_words(table: pd.DataFrame) -> str:
    summaries = table.attrs.get("own_rules") or {}
    distinct = list(dict.fromkeys(summaries.values()))
    if not distinct:
        return "no candidate declares its own tests' rule ('own rule' –)."
    if len(distinct) == 1:
        return f"'own rule' is {distinct[0]}."
    return "'own rule' is each candidate's own: " + "; ".join(f"{leg}: {s}" for leg, s in summaries.items()) + "."


def peer_markdown(table: pd.DataFrame, title: str) -> str:
    legs = list(dict.fromkeys(table["candidate"]))
    lines = [f"## {title}", "", "ε is rel_l2 against the float64 reference; the ratio is to fla's ε; the verdict "
             f"is the shipped policy's; {_rule_words(table)}", "",
             "| case | tensor | ε fla | " + " | ".join(legs) + " |", "|---|---|---|" + "---|" * len(legs)]
    for (case_id, tensor), group in table.groupby(["case_id", "tensor"], sort=False):
        cells = {r.candidate: _cell(r) for r in group.itertuples()}
        eps_fla = group["eps_fla"].dropna()
        lines.append(f"| `{case_id}` | {tensor} | {eps_fla.iloc[0]:.3g} | " if len(eps_fla) else
                     f"| `{case_id}` | {tensor} | – | ")
        lines[-1] += " | ".join(cells.get(leg, "–") for leg in legs) + " |"
    return "\n".join(lines) + "\n"
