"""Issue 20's before/after table: TPU rows before and after the fp16 policy change, against the GPU leg.

    python reports/fp16-strong-decay/table.py GPU.csv [GPU.csv ...] --before B.csv [..] --after A.csv [..]

Prints, per (case, tensor) of every fp16 case, eps_GPU, eps_TPU before and after (rel_l2 and max_abs) and
the case's modeled MXU cost before and after; then, for every other dtype, whether the TPU rows are
bit-identical before and after (they must be: the policy changed fp16 only)."""

import argparse

import pandas as pd


def read(paths):
    return pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpu", nargs="+")
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    a = ap.parse_args()
    key = ["case_id", "tensor"]
    gpu, before, after = (read(p)[key + ["dtype", "rel_l2", "max_abs", "mxu_cost", "input_sha256"]]
                          for p in (a.gpu, a.before, a.after))
    m = before.merge(after, on=key, suffixes=("_b", "_a")).merge(gpu, on=key, how="left")
    assert (m["input_sha256_b"] == m["input_sha256_a"]).all()
    fp16 = m[m["dtype_b"] == "float16"]
    print("| case | tensor | ε_GPU rel_l2 | ε_TPU before | after | ratio before → after | max_abs ratio before → after "
          "| MXU cost before → after |")
    print("|---|---|---|---|---|---|---|---|")
    for r in fp16.itertuples():
        print(f"| `{r.case_id}` | {r.tensor} | {r.rel_l2:.3g} | {r.rel_l2_b:.3g} | {r.rel_l2_a:.3g} | "
              f"{r.rel_l2_b / r.rel_l2:.3g} → {r.rel_l2_a / r.rel_l2:.3g} | "
              f"{r.max_abs_b / r.max_abs:.3g} → {r.max_abs_a / r.max_abs:.3g} | {r.mxu_cost_b:.3g} → {r.mxu_cost_a:.3g} |")
    rest = m[m["dtype_b"] != "float16"]
    same = ((rest["rel_l2_b"] == rest["rel_l2_a"]) & (rest["max_abs_b"] == rest["max_abs_a"])
            & (rest["mxu_cost_b"] == rest["mxu_cost_a"]))
    print(f"\nbf16 and fp32 rows: {int(same.sum())} of {len(rest)} identical before and after "
          f"(rel_l2, max_abs, MXU cost)")


if __name__ == "__main__":
    main()
