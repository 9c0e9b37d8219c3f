"""Benchmarks of where this harness spends its time (issue 25): timed with repeats, reported as min, median
and max. Speed goals live here, never in timed tests.

    python benchmarks/bench.py reference [--repeats 3] [--case ID]
        the float64 reference (the reference binding's forward and backward, exactly as the golden cache
        computes it) in a fresh process per repeat: cold, compilation included; wall seconds and the child's
        peak RSS
    python benchmarks/bench.py smoke [--repeats 1] [--jobs N]
        `parity all --suite smoke` cold (empty reference and baseline caches), then warm after a one-line edit
        in one op's kernel (kernels_tpu/kda) and after one in the shared core (kernels_tpu/common.py); each edit
        is a comment line appended and removed again; --jobs: parity's own (default: its default)
    --csv FILE  also write the rows

Each row names the machine (cores, CPU model) and the commit, so a number checked into reports/ says what it
was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.app.workers import default_jobs

ROOT = Path(__file__).resolve().parents[1]
STRESS_REFERENCE = "simple_gla.chunk/B1-T8192-H16-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0,dht"
EDITS = {"one op's kernel": ROOT / "kernels_tpu/kda/chunk.py", "the shared core": ROOT / "kernels_tpu/common.py"}

CHILD = """
import json, resource, sys, time
from cases.inputs import make_inputs
from harness.app import case_from_id
from harness.ops import get_op
from harness.ops.base import call_k_first
case = case_from_id(sys.argv[1]); op = get_op(case.op)
x = make_inputs(case, op.inputs(case)).as_float64()
start = time.perf_counter()
out = call_k_first(case, op.reference, x)
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "tensors": sorted(out)}))
"""


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    return f"{os.cpu_count()} cores, {model}, commit {commit}"


def summary(name: str, values: list[float], unit: str) -> dict:
    return {"benchmark": name, "unit": unit, "repeats": len(values), "min": min(values),
            "median": statistics.median(values), "max": max(values)}


def bench_reference(args) -> list[dict]:
    walls, rss = [], []
    for _ in range(args.repeats):
        done = subprocess.run([sys.executable, "-c", CHILD, args.case], cwd=ROOT, capture_output=True, text=True,
                              check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        walls.append(result["wall_s"])
        rss.append(result["peak_rss_gib"])
    return [summary(f"reference fwd+bwd, cold: {args.case}", walls, "s"),
            summary(f"reference peak RSS: {args.case}", rss, "GiB")]


@contextlib.contextmanager
def one_line_edit(path: Path):
    original = path.read_text()
    try:
        path.write_text(original + "# benchmarks/bench.py: a one-line edit\n")
        yield
    finally:
        path.write_text(original)


def parity_all(out: Path, env: dict, jobs: str | None) -> float:
    start = time.perf_counter()
    subprocess.run(["parity", "all", "--suite", "smoke", "--out", str(out), "--force", "--no-progress",
                    *(["--jobs", jobs] if jobs else [])], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bench_smoke(args) -> list[dict]:
    cold, warm = [], {label: [] for label in EDITS}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
            env = {**os.environ, "PARITY_CACHE_DIR": cache}
            cold.append(parity_all(Path(out), env, args.jobs))
            for label, path in EDITS.items():
                with one_line_edit(path):
                    warm[label].append(parity_all(Path(out), env, args.jobs))
    jobs = args.jobs or f"default ({default_jobs(os.environ)})"
    return [summary(f"parity all --suite smoke --jobs {jobs}, cold", cold, "s")] + [
        summary(f"parity all --suite smoke --jobs {jobs}, warm after an edit in {label}", values, "s")
        for label, values in warm.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("reference", "smoke"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--case", default=STRESS_REFERENCE, help="the reference benchmark's case id")
    p.add_argument("--csv", type=Path, help="also write the rows here")
    p.add_argument("--jobs", help="smoke: parity's --jobs (default: parity's default, $PARITY_JOBS or the CPUs)")
    args = p.parse_args(argv)
    rows = (bench_reference if args.what == "reference" else bench_smoke)(args)
    where = machine()
    print(f"machine: {where}\n\n| benchmark | unit | repeats | min | median | max |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['benchmark']} | {r['unit']} | {r['repeats']} | {r['min']:.2f} | {r['median']:.2f} | "
              f"{r['max']:.2f} |")
    if args.csv:
        import pandas as pd

        pd.DataFrame([{**r, "machine": where} for r in rows]).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
