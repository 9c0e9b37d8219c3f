"""Packed sequences before and after the chunk walk (kernels_tpu.varlen.ChunkWalk): the tables of README.md.

    python reports/varlen/table.py COMPILE_BEFORE COMPILE_AFTER TPU_BEFORE TPU_AFTER

e.g. compile-before.v6e.csv compile-after.csv tpu-before.csv.gz tpu-after.csv.gz (the chunk walk), or
compile-before.v6e.csv compile-in-place.csv ../interpret-emitters/tpu-loop-emitters.csv.gz tpu-in-place.csv.gz
(the in-place backwards and chunk rows, against the same baseline footprints).

Per packed case: its work (tokens the kernels process per real token: the padded batch rows it replaced,
N * L_pad / T, and the walk's sum_i ceil(len_i / C) * C / T), its compiled HBM footprint per target, and
(on the cases run in interpret mode) the modeled MXU work and whether every result row is unchanged.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from cases.case import Case
from kernels_tpu.varlen import ChunkWalk, Packing

MIB = 2**20


def work(case_id: str) -> tuple[float, float]:
    """(padded rows, walk) tokens processed per real token of a packed case."""
    case = Case.from_id(case_id)
    lens, C = case.lens, case.chunk_size
    rows = len(lens) * -(-max(lens) // C) * C / sum(lens)
    q = jax.ShapeDtypeStruct((1, sum(lens), 1, 128), jnp.float32)
    return rows, ChunkWalk(Packing.of(np.cumsum((0,) + tuple(lens)), q), C).work_ratio()


def footprints(before: pd.DataFrame, after: pd.DataFrame) -> str:
    """Compiled HBM footprint per case: before (v6e) and after, per target, in MiB."""
    b = before[before.status == "ok"].set_index(["case_id", "target"]).hbm_bytes / MIB
    a = after[after.status == "ok"].set_index(["case_id", "target"]).hbm_bytes / MIB
    others = [t for t in sorted(after.target.unique()) if t != "v6e"]
    head = "| case | work: rows → walk | v6e MiB: before → after | " + " | ".join(f"{t} MiB after" for t in others)
    lines = [head + " |", "|---|---|---|" + "---|" * len(others)]
    for case_id in after.case_id.unique():
        rows, walk = work(case_id)
        was, now = b.get((case_id, "v6e"), np.nan), a.get((case_id, "v6e"), np.nan)
        lines.append(f"| `{case_id}` | {rows:.2f} → {walk:.3f} | {was:.1f} → {now:.1f} ({now / was:.2f}×) | "
                     + " | ".join(f"{a.get((case_id, t), np.nan):.1f}" for t in others) + " |")
    status = after.groupby("target").status.value_counts().unstack(fill_value=0)
    lines += ["", "After, per target: " + "; ".join(
        f"{t}: " + ", ".join(f"{int(n)} {s}" for s, n in status.loc[t].items()) for t in status.index)]
    return "\n".join(lines)


def breakdown(before: pd.DataFrame, after: pd.DataFrame, target: str = "v6e") -> str:
    """Where the footprint is, per case on ``target``: arguments, outputs and temporaries, before → after, MiB."""
    cols = {"arguments": "mem_argument_bytes", "outputs": "mem_output_bytes", "temporaries": "mem_temp_bytes",
            "total": "hbm_bytes"}
    b, a = (df[(df.status == "ok") & (df.target == target)].set_index("case_id") for df in (before, after))
    lines = [f"| case ({target}, MiB: before → after) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for case_id in a.index.intersection(b.index):
        cells = [f"{b.at[case_id, c] / MIB:.0f} → {a.at[case_id, c] / MIB:.0f}" for c in cols.values()]
        cells[-1] += f" ({_ratio(a.at[case_id, 'hbm_bytes'], b.at[case_id, 'hbm_bytes'])})"
        lines.append(f"| `{case_id}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(new, old) -> str:
    return f"{new / old:.2f}×" if old else "–"


def results(before: pd.DataFrame, after: pd.DataFrame) -> str:
    key = ["case_id", "tensor"]
    both = before.merge(after, on=key, suffixes=("_b", "_a"))
    same = ((both.status_b == both.status_a) & (both.max_abs_b == both.max_abs_a)
            & (both.rel_l2_b == both.rel_l2_a) & (both.ulp_max_b == both.ulp_max_a))
    lines = [f"Result rows: {len(both)} (case, tensor) rows in both of {len(before)} before and {len(after)} after; "
             f"{int(same.sum())} identical in status, max_abs, rel_l2 and ulp_max.", ""]
    macs = both.drop_duplicates("case_id")
    lines += ["| case | work: rows → walk | modeled MXU MACs fwd: before → after | bwd: before → after |",
              "|---|---|---|---|"]
    for _, r in macs.iterrows():
        rows, walk = work(r.case_id)
        lines.append(f"| `{r.case_id}` | {rows:.2f} → {walk:.3f} | {r.mxu_macs_fwd_b:.3g} → {r.mxu_macs_fwd_a:.3g} "
                     f"({_ratio(r.mxu_macs_fwd_a, r.mxu_macs_fwd_b)}) | {r.mxu_macs_bwd_b:.3g} → "
                     f"{r.mxu_macs_bwd_a:.3g} ({_ratio(r.mxu_macs_bwd_a, r.mxu_macs_bwd_b)}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    compile_before, compile_after, tpu_before, tpu_after = (pd.read_csv(p, low_memory=False) for p in sys.argv[1:5])
    print(footprints(compile_before, compile_after))
    print()
    print(breakdown(compile_before, compile_after))
    print()
    print(results(tpu_before, tpu_after))
