"""fla's native H200 rows against the emulated GPU leg (Triton interpreter) and against the H100's native rows, on the
rows both sides have `ok` with the same case, tensor and input.

    python reports/h200-native/compare.py

Emulated rows: the smoke and regressions suites emulated at the commit the native rows name
(gpu-smoke-regressions.emulated.csv.gz) and, for the peers' cases, each peer folder's gpu.csv(.gz) (emulated when
those reports were made; the jax-linear-attention folder's, native since 2026-11-28, is left out). A ratio is
emulated rel_l2 / native rel_l2: above 1, the emulation overstates fla's error. "Worst element bit-equal": the row's
largest error sits on the same element with the same value bit for bit."""

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KEY = ["case_id", "tensor", "input_sha256"]
COLS = KEY + ["dtype", "status", "rel_l2", "worst_index", "got_at_worst"]


def read(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"input_sha256": str})[COLS]


def paired(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    m = a.merge(b, on=KEY, suffixes=("", "_b"))
    m = m[(m.status == "ok") & (m.status_b == "ok")].copy()
    m["ratio"] = m.rel_l2_b / m.rel_l2
    m["bit_equal"] = (m.worst_index == m.worst_index_b) & (m.got_at_worst == m.got_at_worst_b)
    m["path"] = m.case_id.str.split("/").str[0]
    return m


def table(m: pd.DataFrame, by: list[str]) -> str:
    lines = ["| " + " | ".join(by) + " | rows | ratio min – max | median | mean abs ln | worst element bit-equal |",
             "|" + "---|" * (len(by) + 5)]
    for keys, s in m.groupby(by):
        keys = keys if isinstance(keys, tuple) else (keys,)
        lines.append("| " + " | ".join(map(str, keys)) + f" | {len(s)} | {s.ratio.min():.3f} – {s.ratio.max():.3f} | "
                     f"{s.ratio.median():.3f} | {np.abs(np.log(s.ratio)).mean():.2e} | {s.bit_equal.sum()} |")
    return "\n".join(lines)


def main() -> None:
    native = pd.concat([read(HERE / "gpu-smoke-regressions.csv.gz"), read(HERE / "gpu-peers.csv.gz")])
    folders = [p for p in sorted((ROOT / "reports" / "peers").glob("*/gpu.csv*")) if "jax-linear-attention" not in str(p)]
    emulated = pd.concat([read(HERE / "gpu-smoke-regressions.emulated.csv.gz")] + [read(p) for p in folders])
    emulated = emulated.drop_duplicates(KEY)
    m = paired(native, emulated)
    print(f"## Emulated / native H200: {len(m)} rows\n")
    print(table(m, ["path", "dtype"]))
    fr = m[m.path.str.endswith("fused_recurrent") & (m.dtype == "float32")]
    print("\n## fused_recurrent, float32: median emulated / native per tensor\n")
    print(fr.pivot_table(index="path", columns="tensor", values="ratio", aggfunc="median").round(2).to_string())
    h100 = pd.concat([read(ROOT / "reports" / "h100-native" / f) for f in ("gpu-smoke.csv", "gpu-regressions.csv")])
    h = paired(read(HERE / "gpu-smoke-regressions.csv.gz"), h100)
    print(f"\n## H100 (2026-11-23) / H200 (2026-11-28), both native, triton 3.7.1: {len(h)} rows\n")
    print(f"rel_l2 ratio {h.ratio.min():.13f} – {h.ratio.max():.13f}; rel_l2 equal on {(h.ratio == 1).sum()}; worst "
          f"element bit-equal on {h.bit_equal.sum()}")


if __name__ == "__main__":
    main()
