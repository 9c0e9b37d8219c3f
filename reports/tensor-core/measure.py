"""The emulated GPU leg with the tensor-core model against the leg before it, on chunked cases the H200 ran natively:
fidelity against the native H200 rows (cost: ``cost.py``, ratios in one process).

    python reports/tensor-core/measure.py [--reps 1] [--base-commit 86d84cb] [--out /tmp/tc-measure]

Runs ``parity run --backend gpu`` (emulated, ``--no-baseline-cache``, ``-j 1``) on CASES with two trees of this
repository: "before" (``git archive`` of ``--base-commit``, the leg that rounds exact sums once) and "after" (this
working tree: sm_90's tensor core). Both run with ``PARITY_CACHE_DIR`` set to a folder of their own under ``--out``
(the shared baseline and reference caches are neither read nor written); more reps check that the rows repeat bit
for bit. Every run lists a warm-up case first (not compared).

Prints, and writes beside this script (``fidelity.csv``, ``rows.csv.gz``), per tree and path x dtype: rows, worst
element bit-equal to the native H200 row (same index, same value), rel_l2 ratio emulated / native (median, mean
|ln|, min, max); ``rows.csv.gz`` has every compared row of both trees.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import io
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NATIVE = ROOT / "reports" / "h200-native" / "gpu-smoke-regressions.csv.gz"
KEY = ["case_id", "tensor", "input_sha256"]

WARMUP = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64"
CASES = [
    "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "simple_gla.fused_chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0",
    "gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "gla.chunk/B1-T100-H1-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht",
    "kda.chunk/B1-T100-H1-K64-V64/bf16/g=logsigmoid/16,lb-5/C64/h0,dht,use_beta_sigmoid_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "gdn.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/0.1/C64/h0,dht",
    "gdn2.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht,lower_bound=-5,use_gate_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "simple_gla.chunk/B1-T128-H2-K128-V128/fp32/g=logsigmoid/16/C64/dht",
    "gla.chunk/B1-T64-H2-K256-V128/fp32/g=logsigmoid/16/C64/dht",
]


def base_tree(commit: str, dest: Path) -> Path:
    if not (dest / "harness").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        tarfile.open(fileobj=io.BytesIO(blob)).extractall(dest)
    return dest


def run(tree: Path, out: Path, cache: Path) -> pd.DataFrame:
    env = dict(os.environ, PYTHONPATH=str(tree), PARITY_CACHE_DIR=str(cache))
    cmd = [str(Path(sys.executable).parent / "parity"), "run", "--backend", "gpu", "--out", str(out),
           "--no-baseline-cache", "--no-progress", "-j", "1", "--force"]
    for c in [WARMUP] + CASES:
        cmd += ["--case", c]
    subprocess.run(cmd, check=True, cwd=tree, env=env)
    (csv,) = out.glob("gpu*.csv")
    return pd.read_csv(csv, dtype={"input_sha256": str})


def fidelity(rows: pd.DataFrame, native: pd.DataFrame) -> pd.DataFrame:
    m = rows.merge(native, on=KEY, suffixes=("", "_native"))
    m = m[(m.status == "ok") & (m.status_native == "ok")].copy()
    m["ratio"] = m.rel_l2 / m.rel_l2_native
    m["bit_equal"] = (m.worst_index == m.worst_index_native) & (m.got_at_worst == m.got_at_worst_native)
    m["path"] = m.case_id.str.split("/").str[0]
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--base-commit", default="86d84cb")
    ap.add_argument("--out", default="/tmp/tc-measure")
    args = ap.parse_args()
    out = Path(args.out)
    trees = {"before": base_tree(args.base_commit, out / "base-tree"), "after": ROOT}
    rows = {t: [] for t in trees}
    for rep in range(args.reps):
        for name, tree in trees.items():
            d = out / f"rep{rep}-{name}"
            shutil.rmtree(d, ignore_errors=True)
            rows[name].append(run(tree, d, out / f"cache-{name}").assign(rep=rep))
    native = pd.read_csv(NATIVE, dtype={"input_sha256": str})
    lines, fid = [], []
    for name in trees:
        r0 = rows[name][0]
        f = fidelity(r0[r0.case_id != WARMUP], native).assign(tree=name)
        fid.append(f)
        for rep in rows[name][1:]:  # the emulation is deterministic: every rep gives the same numbers
            same = rep.set_index(KEY).rel_l2.reindex(r0.set_index(KEY).index)
            assert np.array_equal(same.to_numpy(), r0.set_index(KEY).rel_l2.to_numpy(), equal_nan=True), name
    fid = pd.concat(fid)
    cols = ["tree", "path", "dtype"]
    table = fid.groupby(cols).apply(lambda s: pd.Series({
        "rows": len(s), "bit_equal": int(s.bit_equal.sum()), "ratio_median": s.ratio.median(),
        "mean_abs_ln": np.abs(np.log(s.ratio)).mean(), "ratio_min": s.ratio.min(), "ratio_max": s.ratio.max()}),
        include_groups=False).reset_index()
    total = fid.groupby("tree").apply(lambda s: pd.Series({
        "rows": len(s), "bit_equal": int(s.bit_equal.sum()), "ratio_median": s.ratio.median(),
        "mean_abs_ln": np.abs(np.log(s.ratio)).mean()}), include_groups=False).reset_index()
    pd.set_option("display.width", 250)
    lines.append("## fidelity against the native H200 rows\n\n" + table.round(4).to_string(index=False))
    lines.append("\n" + total.round(4).to_string(index=False))
    print("\n".join(lines))
    table.to_csv(HERE / "fidelity.csv", index=False)
    changed = fid[["tree", "case_id", "tensor", "dtype", "rel_l2", "rel_l2_native", "ratio", "bit_equal",
                   "worst_index", "got_at_worst", "worst_index_native", "got_at_worst_native"]]
    changed.to_csv(HERE / "rows.csv.gz", index=False)


if __name__ == "__main__":
    main()
