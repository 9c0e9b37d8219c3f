"""The gate's power: the smallest graded precision regression (tests/faults.py) the shipped policy catches.

For each regression class, the TPU kernels keep ``bits`` fraction bits where a correct kernel keeps more
(23: f32, so no regression; 7: bf16). The study runs the TPU leg with the fault on the cases of smoke and
regressions (seed 0) the class can reach, gates each case against the GPU rows of the same draws with the
shipped policy, and raises ``bits`` from 7 until the gate first misses: the grade before is the smallest
regression caught, assuming fewer bits never make a kernel more accurate. A grade stops at the first
caught case. Caught means the gate, decided as ``parity all`` decides it, does not pass: a comparison one
draw leaves inconclusive is decided by harness.core.noise's sequential test at 3, 8, then 24 draws of both
legs (the GPU leg's extra draws come from its baseline cache, or are run once and kept there), and counts
as caught only if it fails, or is still undecided at the cap. So a comparison that is inconclusive on
clean kernels too (a draw-0 ratio within its noise) catches nothing unless the fault moves it.

    python tests/power.py --gpu-results GPU.csv --out reports/power

writes ``power.csv`` (one row per class and grade tried) and ``power.md``. Faults stay on the test side:
this is a test tool, never imported by the harness.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faults import REGRESSIONS, apply_regression, unsettled  # noqa: E402

from cases.suites import get_suite  # noqa: E402
from harness.app import gate_case  # noqa: E402
from harness.core.cache_dir import default_cache_dir  # noqa: E402
from harness.run.baseline_cache import for_leg  # noqa: E402
from harness.core.policy import Policy, default_policy  # noqa: E402
from harness.run.reference_cache import ReferenceCache  # noqa: E402
from harness.core.results import atomic_write_text, read_results, write_csv  # noqa: E402
from harness.run.runner import Runner  # noqa: E402
from harness.legs import make_leg

REACHES = {"fp16 inputs at fewer bits": {"float16"}}
"""Case dtypes a class can reach (default: every dtype)."""

TOP = 23  # f32's fraction bits: no regression


def cases_for(regression: str, suites=("smoke", "regressions")):
    dtypes = REACHES.get(regression)
    return [c for s in suites for c in get_suite(s) if dtypes is None or c.dtype in dtypes]


def caught_at(regression: str, bits: int, cases, gpu: pd.DataFrame, policy: Policy, cache,
              gpu_runner: Runner | None = None) -> dict:
    """Run the TPU leg with the regression at ``bits`` case by case; stop at the first case the gate, decided
    over draws where one draw does not decide it (harness.app.gate_case, with ``gpu_runner`` giving the GPU's
    draws the baseline lacks; None: only the draws ``gpu`` holds), does not pass."""
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        jax.clear_caches()
        patched = apply_regression(mp.setattr, regression, bits)
        runner = Runner(make_leg("tpu", compile_targets=()), cache)
        try:
            for n, case in enumerate(cases, 1):
                result, _ = gate_case(case, runner.run_case, gpu, policy, "tpu",
                                      gpu_runner.run_case if gpu_runner is not None else None)
                failures = unsettled(result)
                # a case with no GPU number to compare ("coverage") measures nothing: it catches nothing
                failures = failures[failures["metric"] != "coverage"]
                if len(failures):
                    worst = failures.sort_values("ratio", ascending=False).iloc[0]
                    return {"regression": regression, "bits": bits, "caught": True, "cases_run": n,
                            "case_id": case.id, "tensor": worst["tensor"], "metric": worst["metric"],
                            "verdict": worst["verdict"], "draws": worst["draws"],
                            "ratio": worst["ratio"], "reason": worst["reason"], "patched": ", ".join(patched),
                            "wall_s": round(time.perf_counter() - t0, 1)}
        finally:
            jax.clear_caches()
    return {"regression": regression, "bits": bits, "caught": False, "cases_run": len(cases), "case_id": "",
            "tensor": "", "metric": "", "verdict": "", "draws": float("nan"), "ratio": float("nan"), "reason": "",
            "patched": ", ".join(patched), "wall_s": round(time.perf_counter() - t0, 1)}


def smallest_caught(regression: str, gpu, policy, cache, gpu_runner=None, log=print, start: int = 7) -> list[dict]:
    """Try bits = start, start + 1, ... (ever smaller regressions) until the gate first misses one; every
    grade tried is a row. A caught grade stops at its first failing case, so only the final miss runs every
    case. ``start`` above 7 resumes a study whose coarser grades were already caught."""
    cases = cases_for(regression)
    tried = []
    for bits in range(start, TOP):
        row = caught_at(regression, bits, cases, gpu, policy, cache, gpu_runner)
        tried.append(row)
        log(f"  {regression} at {bits} bits: {'caught' if row['caught'] else 'not caught'} "
            f"({row['cases_run']} cases, {row['wall_s']} s) {row['case_id']} {row['tensor']} {row['metric']} "
            + (f"{row['verdict']} at {row['draws']:g} draw(s)" if row["caught"] else ""))
        if not row["caught"]:
            break
    return tried


def markdown(table: pd.DataFrame, policy: Policy, gpu_file: str) -> str:
    lines = ["## Power: the smallest precision regression the shipped gate catches", "",
             f"Policy: {policy.describe()}.", f"Baseline: {gpu_file} (draw 0). Suites: smoke, regressions.", "",
             "| regression | smallest caught (fraction bits kept) | first missed | first catch at the smallest |",
             "|---|---|---|---|"]
    for name, group in table.groupby("regression", sort=False):
        caught = group[group["caught"]]
        missed = group[~group["caught"]]
        best = caught.sort_values("bits").iloc[-1] if len(caught) else None
        lines.append(f"| {name} | {int(best['bits']) if best is not None else 'none (not even 7)'} | "
                     f"{int(missed['bits'].min()) if len(missed) else '–'} | "
                     + (f"{best['case_id']} {best['tensor']} {best['metric']} ratio {best['ratio']:.3g} "
                        f"({best['verdict']}, {best['draws']:g} draw{'s' if best['draws'] > 1 else ''})"
                        if best is not None else "") + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-results", required=True, help="GPU rows of smoke and regressions (draw 0 is used)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--regression", action="append", choices=list(REGRESSIONS),
                        help="only this class (repeatable)")
    parser.add_argument("--start-bits", type=int, default=7, choices=range(7, TOP), metavar="N",
                        help="first grade to try (default 7); resume a study whose grades below N were caught")
    args = parser.parse_args(argv)
    gpu = read_results(Path(args.gpu_results))
    gpu = gpu[gpu["draw"].fillna(0).astype(int) == 0]
    root = default_cache_dir(os.environ)
    policy, cache = default_policy(), ReferenceCache(root)
    gpu_leg = make_leg("gpu")
    gpu_runner = Runner(gpu_leg, cache, leg_cache=for_leg(gpu_leg, cache_dir=root))  # the deciding draws, on disk
    rows, out = [], Path(args.out)
    for name in args.regression or list(REGRESSIONS):
        print(f"{name}:")
        rows.extend(smallest_caught(name, gpu, policy, cache, gpu_runner, start=args.start_bits))
        table = pd.DataFrame(rows)  # written after each class: a study of an hour keeps what it finished
        write_csv(table, out / "power.csv")
        atomic_write_text(out / "power.md", markdown(table, policy, args.gpu_results))
    print(markdown(table, policy, args.gpu_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
