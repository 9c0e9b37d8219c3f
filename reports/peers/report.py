"""A peer report: candidates against fla per case and forward tensor, their compile results, and the rule of a
peer's own tests applied to the same numbers.

    python reports/peers/report.py --baseline gpu.csv --candidate tpu.csv --candidate tpu-inference.csv \\
        --compile compile.csv --compile compile.tpu-inference.csv --out reports/peers/tpu-inference

Reads result files of ``parity run`` (one baseline, several candidates, each of its own leg) and the compile
files of ``parity compile [--backend LEG]``, gates each candidate with the shipped policy (as ``parity gate``
does) and writes ``peers.csv`` (one row per case x forward tensor x candidate) and ``peers.md``.

"Own tests' rule" is ``allclose(got, ref, atol=1e-2, rtol=1e-2)``, the rule of tpu-inference's kernel tests,
decided from the rows: it holds for sure when max_abs <= atol, and fails for sure when the worst element
(by absolute error) breaks it; otherwise the rows cannot say (``undecided``). Those tests compare with an fp32
JAX reference, this harness with float64: at a tolerance of 1e-2 the difference does not matter.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.gate import apply_gate
from harness.policy import default_policy
from harness.reports import atomic_write_text, read_results, write_csv

ATOL = RTOL = 1e-2
FORWARD = ("o", "ht")


def own_rule(row) -> str:
    if pd.isna(row["max_abs"]):
        return ""
    if row["max_abs"] <= ATOL:
        return "pass"
    if abs(row["got_at_worst"] - row["ref_at_worst"]) > ATOL + RTOL * abs(row["ref_at_worst"]):
        return "FAIL"
    return "undecided"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--candidate", action="append", required=True)
    ap.add_argument("--compile", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    base = read_results(Path(args.baseline))
    policy = default_policy()
    compiled = pd.concat([pd.read_csv(p).assign(leg=Path(p).stem.split(".", 1)[1] if "." in Path(p).stem else "tpu")
                          for p in args.compile]) if args.compile else pd.DataFrame()
    rows = []
    for path in args.candidate:
        cand = read_results(Path(path))
        leg = cand["leg"].iloc[0]
        verdicts = apply_gate(base, cand, policy, candidate_leg=leg, allow_missing=True).parity
        status = verdicts[verdicts["metric"] == "status"].set_index(["case_id", "tensor"])["verdict"]
        gated = verdicts[verdicts["metric"].isin(policy.metrics)]
        worst = gated.groupby(["case_id", "tensor"])["verdict"].agg(lambda v: "fail" if (v == "fail").any() else "pass")
        for r in cand[cand["tensor"].isin(FORWARD)].to_dict("records"):
            key = (r["case_id"], r["tensor"])
            g = base[(base["case_id"] == key[0]) & (base["tensor"] == key[1])].iloc[0]
            comp = compiled[(compiled.get("leg") == leg) & (compiled["case_id"] == key[0])] if len(compiled) else []
            rows.append({
                "case_id": key[0], "tensor": key[1], "candidate": leg, "status": r["status"],
                "eps_fla": g["rel_l2"], "eps": r["rel_l2"], "ratio": r["rel_l2"] / g["rel_l2"],
                "max_abs_fla": g["max_abs"], "max_abs": r["max_abs"], "ulp_max": r["ulp_max"],
                "ulp_mean": r["ulp_mean"], "verdict": worst.get(key, status.get(key, "")),
                "own_tests_rule": own_rule(r),
                "compiles": ", ".join(f"{c['target']} {c['status']}" for c in comp.to_dict("records"))
                if len(comp) else "",
                "mxu_cost": r.get("mxu_cost")})
    table = pd.DataFrame(rows)
    out = Path(args.out)
    write_csv(table, out / "peers.csv")
    lines = ["| case | tensor | ε_fla | " + " | ".join(f"ε {c}, verdict, own rule" for c in table["candidate"].unique())
             + " |", "|---|---|---|" + "---|" * table["candidate"].nunique()]
    for (case_id, tensor), group in table.groupby(["case_id", "tensor"], sort=False):
        cells = [f"{g.eps:.3g} ({g.ratio:.2f}×), **{g.verdict}**, {g.own_tests_rule}" if g.status != "unsupported"
                 else "unsupported" for g in group.itertuples()]
        lines.append(f"| `{case_id}` | {tensor} | {group['eps_fla'].iloc[0]:.3g} | " + " | ".join(cells) + " |")
    atomic_write_text(out / "peers.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
