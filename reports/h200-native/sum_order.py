"""Is the emulated GPU leg's excess on fp32 fused_recurrent `o` and `dv` the order of `tl.sum`? The Triton interpreter
sums a float32 block with `np.sum`, which adds a strided axis (axis 0 of a [BK, BV] tile: `o = sum_k h[k, v] q[k]`)
row by row, sequentially; on the GPU a block reduction is a tree across threads. This runs the 15 fp32
fused_recurrent cases of smoke and regressions emulated twice, as the leg runs them and with `np.sum` of float32
replaced by a halving tree on the reduced axis, and prints each tensor's median emulated / native (H200) rel_l2.

    TRITON_INTERPRET=1 python reports/h200-native/sum_order.py

(An experiment from the outside: nothing of the leg is changed; the baseline cache is a temporary folder.)"""

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


def tree_sum(self, input):
    """``tl.sum`` of float32 as pairwise halving on the reduced axis (odd lengths carry their last element)."""
    x = input.handle.data
    if x.dtype != np.float32:
        return self.to_tensor(np.sum(x, axis=self.axis, keepdims=self.keep_dims), input.dtype)
    axis = 0 if self.axis is None else self.axis
    y = np.moveaxis(x.ravel() if self.axis is None else x, axis, -1)
    while y.shape[-1] > 1:
        n, h = y.shape[-1], y.shape[-1] // 2
        s = y[..., :h] + y[..., h:2 * h]
        y = np.concatenate([s, y[..., 2 * h:]], axis=-1) if n % 2 else s
    out = y[..., 0]
    if self.keep_dims:
        out = np.expand_dims(out, axis) if self.axis is not None else out.reshape((1,) * x.ndim)
    return self.to_tensor(out, input.dtype)


def main() -> None:
    import triton.runtime.interpreter as interp
    from harness.cli import main as parity

    native = pd.read_csv(HERE / "gpu-smoke-regressions.csv.gz", dtype={"input_sha256": str})
    ids = sorted(set(native.case_id[native.case_id.str.contains("fused_recurrent/")
                                    & native.case_id.str.contains("/fp32/")]))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["PARITY_CACHE_DIR"] = str(tmp / "cache")
        (tmp / "cases.toml").write_text("".join(f'[[case]]\nid = "{i}"\n' for i in ids))
        rows = {}
        for name in ("as_run", "tree"):
            if name == "tree":
                interp.ReduceOps.sum = tree_sum
            parity(["run", "--backend", "gpu", "--cases-file", str(tmp / "cases.toml"), "--out", str(tmp / name),
                    "--no-progress", "--jobs", "1", "--no-baseline-cache"])
            [path] = (tmp / name).glob("gpu*.csv")
            rows[name] = pd.read_csv(path, dtype={"input_sha256": str})
    key = ["case_id", "tensor", "input_sha256"]
    m = native.merge(rows["as_run"], on=key, suffixes=("", "_as_run")).merge(rows["tree"], on=key,
                                                                             suffixes=("", "_tree"))
    m = m[(m.status == "ok") & (m.status_as_run == "ok") & (m.status_tree == "ok")].copy()
    for name in ("as_run", "tree"):
        m[name] = m[f"rel_l2_{name}"] / m.rel_l2
    m["path"] = m.case_id.str.split("/").str[0]
    print(f"{len(ids)} cases, {len(m)} rows; median emulated / native rel_l2 per tensor, as run | tree-ordered tl.sum")
    print(m.groupby(["path", "tensor"])[["as_run", "tree"]].median().round(3).to_string())
    print("mean |ln(ratio)| as run", f"{np.abs(np.log(m.as_run)).mean():.3f}", "tree", f"{np.abs(np.log(m.tree)).mean():.3f}")


if __name__ == "__main__":
    main()
