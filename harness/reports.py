"""Result files and reports: pandas tables written atomically (temp file, then rename), and the gate's
Markdown (``parity.md``, also appended to ``$GITHUB_STEP_SUMMARY``).

A leg's result CSV has one row per (case, tensor) with every metric and the
row's provenance (leg, mode, device, versions, git commit, timestamp, input
hash, wall time). Columns are fixed in :data:`RESULT_COLUMNS`; rows are the
only interface between running and judging.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import pandas as pd

from .metrics import METRICS

if TYPE_CHECKING:
    from .gate import GateResult

MXU_COLUMNS = ["mxu_cost", "mxu_macs_fwd", "mxu_macs_bwd", "mxu_pass_macs_fwd", "mxu_pass_macs_bwd"]
"""TPU rows, emulated: modeled MXU work (kernels_tpu.mxu.MxuTally), not a timing."""

RESULT_COLUMNS = [
    "case_id", "op", "variant", "dtype", "tensor", "tensor_dtype", "leg", "status", "reason",
    *METRICS, "nan", "inf", "ref_nonfinite", "worst_index", "ref_at_worst", "got_at_worst", "bound_rel_l2",
    "input_sha256", "mode", "device", "compiled_for", *MXU_COLUMNS, "versions", "settings", "details", "git_commit",
    "timestamp", "suite", "wall_s", "repro",
]
KEY = ["case_id", "tensor"]


class ReportError(ValueError):
    """A result file is missing, malformed or inconsistent (exit code 2)."""


def rows_to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = pd.NA
    return df[RESULT_COLUMNS]


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    # no float_format: pandas writes the shortest repr that round-trips, so a metric
    # read back from a file compares exactly as it did in memory
    atomic_write_text(Path(path), df.to_csv(index=False))
    return Path(path)


def read_results(path: Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise ReportError(f"result file {str(path)!r} does not exist")
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not a result CSV ({exc})") from None
    missing = [c for c in ("case_id", "tensor", "leg", "status", "input_sha256", "mode", *METRICS)
               if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: not a parity result file, missing columns {missing}")
    dupes = df[df.duplicated(KEY, keep=False)]
    if len(dupes):
        raise ReportError(f"{path}: duplicate (case, tensor) rows, e.g. {dupes.iloc[0]['case_id']} / "
                          f"{dupes.iloc[0]['tensor']}; merge shards with `parity merge`")
    legs = sorted(df["leg"].dropna().unique())
    if len(legs) > 1:
        raise ReportError(f"{path}: rows from several legs {legs}; a result file holds one leg")
    return df


def merge_results(paths: Iterable[Path]) -> pd.DataFrame:
    """Concatenate shard files of one leg; refuses overlapping (case, tensor) rows."""
    frames = [read_results(p) for p in paths]
    if not frames:
        raise ReportError("no result files to merge")
    df = pd.concat(frames, ignore_index=True)
    dupes = df[df.duplicated(KEY, keep=False)]
    if len(dupes):
        raise ReportError(f"shards overlap on {dupes.iloc[0]['case_id']} / {dupes.iloc[0]['tensor']}")
    legs = sorted(df["leg"].dropna().unique())
    if len(legs) > 1:
        raise ReportError(f"cannot merge files of different legs {legs}")
    return df.sort_values(KEY, kind="stable").reset_index(drop=True)


def summarize(df: pd.DataFrame) -> str:
    """One line per status, for the terminal."""
    counts = df.groupby("status").size().to_dict()
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


# ------------------------------------------------------------- the gate's report
def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return ""
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _cost(x) -> str:
    """A modeled MXU cost ratio as ``1.23×``; ``–`` where none was modeled (native TPU, or no run)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(x) else f"{x:.2f}×"


def _provenance(df: pd.DataFrame) -> str:
    if df.empty:
        return "no rows"
    r = df.iloc[0]
    modes = sorted(df["mode"].dropna().unique())
    versions = json.loads(r["versions"]) if isinstance(r.get("versions"), str) else {}
    vtext = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    return f"mode **{'/'.join(modes)}** on {r.get('device', '')}; {vtext}; commit {r.get('git_commit', '')}"


def compiled_note(tpu: pd.DataFrame) -> str:
    """Which real TPU targets the emulated TPU kernels were compiled for, and with which libtpu."""
    emulated = tpu[tpu["mode"] == "emulated"]
    col = emulated["compiled_for"] if "compiled_for" in emulated.columns else pd.Series(dtype=object)
    targets = sorted({t for v in col.dropna() for t in str(v).split(",") if t})
    if not targets:
        return "The TPU kernels were **not** compiled for a real TPU: interpret mode alone is no evidence they build."
    versions = json.loads(emulated["versions"].iloc[0]) if isinstance(emulated["versions"].iloc[0], str) else {}
    uncompiled = emulated[col.fillna("").astype(str) == ""]["case_id"].nunique()
    text = (f"The TPU kernels were compiled with libtpu {versions.get('libtpu', '?')} for "
            f"{', '.join(targets)} (the real Mosaic and XLA:TPU compiler, ahead of time).")
    if uncompiled:
        text += f" {uncompiled} case(s) were not compiled (unsupported, or refused by the compiler: see their rows)."
    return text


def markdown(result: GateResult) -> str:
    p = result.parity
    counts = p.groupby("verdict").size().to_dict()
    emulated = "emulated" in set(result.gpu["mode"].dropna()) | set(result.tpu["mode"].dropna())
    lines = [
        f"## Linear-attention parity: {'PASS' if result.passed else 'FAIL'}",
        "",
        f"Rule: {result.policy.describe()}.",
        "",
        f"- GPU: {_provenance(result.gpu)}",
        f"- TPU: {_provenance(result.tpu)}",
    ]
    if emulated:
        lines += ["", "> Emulated rows ran on CPU (Triton interpreter / Pallas interpret mode with the MXU model); "
                      "they are not hardware numbers."]
        if "emulated" in set(result.tpu["mode"].dropna()):
            lines += [">", f"> {compiled_note(result.tpu)}"]
    lines += ["", "| verdict | rows |", "|---|---|"] + [f"| {v} | {n} |" for v, n in sorted(counts.items())]
    fails = result.failures
    if len(fails):
        lines += ["", "### Failures", "", "| case | tensor | metric | ε_GPU | ε_TPU | ratio | reason | repro |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in fails.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {r['metric']} | {_fmt(r['eps_gpu'])} | "
                         f"{_fmt(r['eps_tpu'])} | {_fmt(r['ratio'])} | {r['reason']} | `{_fmt(r['repro'])}` |")
    rel = p[p["metric"] == "rel_l2"]
    if len(rel):
        lines += ["", "<details><summary>rel_l2 per case and tensor</summary>", "",
                  "TPU MXU cost: the case's modeled bf16-pass multiply-adds over one pass per dot, forward and "
                  "backward (1.0× = every dot one bf16 pass; `HIGHEST` is 6×); modeled in emulation, not timed.",
                  "", "| case | tensor | ε_GPU | ε_TPU | ratio | TPU MXU cost | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for r in rel.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {_fmt(r['eps_gpu'])} | {_fmt(r['eps_tpu'])} | "
                         f"{_fmt(r['ratio'])} | {_cost(r.get('tpu_mxu_cost'))} | {r['verdict']} |")
        lines += ["", "</details>"]
    other = p[(p["metric"] == "status") & (p["verdict"] != "fail")]
    if len(other):
        lines += ["", "<details><summary>rows without a metric comparison</summary>", "",
                  "| case | tensor | verdict | reason |", "|---|---|---|---|"]
        for r in other.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {r['verdict']} | {r['reason']} |")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def write_gate(result: GateResult, out_dir: Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    csv_path = write_csv(result.parity, out_dir / "parity.csv")
    md = markdown(result)
    md_path = out_dir / "parity.md"
    atomic_write_text(md_path, md)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:  # GitHub's own file: append, never replace
            f.write(md)
    return csv_path, md_path
