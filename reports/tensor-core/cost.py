"""What the tensor-core model costs the emulated GPU leg: ratios measured in one process.

    PARITY_CACHE_DIR=/tmp/some-empty-dir python reports/tensor-core/cost.py [--reps 5] [--out /tmp/tc-cost]

In one process, alternately ``--reps`` times, ``parity run --backend gpu --no-baseline-cache -j 1`` on COST_CASES
(after one warm-up run) with

- "model": the leg as shipped (every tensor-core dot through ``tensor_core.mma_chain``, sm_90);
- "exact": ``dots.mma_chain`` replaced, from this script, by what the leg did before the model: the exact products
  summed in float64 and rounded once to binary32.

Everything else (the interpreter, the kernels, the other patches, the machine's load at that minute) is shared, so
the per-case ratio model / exact of the leg's ``wall_s`` is the model's cost; per token-head it is the same ratio.
Writes ``cost.csv`` beside this script and prints it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

WARMUP = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64"
COST_CASES = [
    "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "gdn.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/0.1/C64/h0,dht",
    "kda.chunk/B1-T100-H1-K64-V64/bf16/g=logsigmoid/16,lb-5/C64/h0,dht,use_beta_sigmoid_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0",
    "simple_gla.chunk/B1-T128-H2-K128-V128/fp32/g=logsigmoid/16/C64/dht",
]


def exact_once(a, b, c, model):
    """The dot arithmetic of the leg before the tensor-core model: exact products, one rounding."""
    return (np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)) + np.asarray(c, np.float64)
            ).astype(np.float32)


def token_heads(case_id: str) -> int:
    dims = dict((p[0], int(p[1:])) for p in case_id.split("/")[1].split("-") if p[0] in "BTH" and p[1:].isdigit())
    return dims["B"] * dims["T"] * dims["H"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="/tmp/tc-cost")
    args = ap.parse_args()
    if not os.environ.get("PARITY_CACHE_DIR"):
        sys.exit("cost.py: set PARITY_CACHE_DIR to a folder of its own (the shared caches stay untouched)")
    from harness.cli import main as parity
    from harness.emulation import dots

    model_chain = dots.mma_chain
    out = Path(args.out)

    def run(tag: str, cases: list[str]) -> pd.DataFrame:
        d = out / tag
        shutil.rmtree(d, ignore_errors=True)
        argv = ["run", "--backend", "gpu", "--out", str(d), "--no-baseline-cache", "--no-progress", "-j", "1"]
        for c in cases:
            argv += ["--case", c]
        assert parity(argv) in (0, 1), tag
        (csv,) = d.glob("gpu*.csv")
        return pd.read_csv(csv)

    run("warmup", [WARMUP] + COST_CASES)
    walls = []
    for rep in range(args.reps):
        for variant, chain in (("model", model_chain), ("exact", exact_once)) if rep % 2 == 0 else \
                (("exact", exact_once), ("model", model_chain)):
            dots.mma_chain = chain
            try:
                rows = run(f"rep{rep}-{variant}", COST_CASES)
            finally:
                dots.mma_chain = model_chain
            walls.append(rows.groupby("case_id").wall_s.first().rename("wall_s").reset_index()
                         .assign(variant=variant, rep=rep))
    w = pd.concat(walls)
    per_rep = w.pivot_table(index=["case_id", "rep"], columns="variant", values="wall_s")
    per_rep["ratio"] = per_rep["model"] / per_rep["exact"]
    cost = per_rep.groupby("case_id").agg(exact_s=("exact", "median"), model_s=("model", "median"),
                                          ratio_median=("ratio", "median"), ratio_min=("ratio", "min"),
                                          ratio_max=("ratio", "max"))
    cost["token_heads"] = [token_heads(c) for c in cost.index]
    cost["exact_ms_per_token_head"] = 1e3 * cost.exact_s / cost.token_heads
    cost["model_ms_per_token_head"] = 1e3 * cost.model_s / cost.token_heads
    pd.set_option("display.width", 250)
    print(cost.round(3).to_string())
    total = per_rep.groupby("rep")[["model", "exact"]].sum()
    print(f"\nall cases per rep, sum model / sum exact: median {(total.model / total.exact).median():.3f} "
          f"(min {(total.model / total.exact).min():.3f}, max {(total.model / total.exact).max():.3f})")
    cost.to_csv(HERE / "cost.csv")


if __name__ == "__main__":
    main()
