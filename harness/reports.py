"""Result files: pandas tables written atomically (temp file, then rename).

A leg's result CSV has one row per (case, tensor) with every metric and the
row's provenance (leg, mode, device, versions, git commit, timestamp, input
hash, wall time). Columns are fixed in :data:`RESULT_COLUMNS`; rows are the
only interface between running and judging.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import pandas as pd

from .metrics import METRICS

MXU_COLUMNS = ["mxu_cost", "mxu_macs_fwd", "mxu_macs_bwd", "mxu_pass_macs_fwd", "mxu_pass_macs_bwd"]
"""TPU rows, emulated: modeled MXU work (kernels_tpu.mxu.MxuTally), not a timing."""

RESULT_COLUMNS = [
    "case_id", "op", "variant", "dtype", "tensor", "tensor_dtype", "leg", "status", "reason",
    *METRICS, "nan", "inf", "ref_nonfinite", "worst_index", "ref_at_worst", "got_at_worst", "bound_rel_l2",
    "input_sha256", "mode", "device", "compiled_for", *MXU_COLUMNS, "versions", "settings", "details", "git_commit", "timestamp",
    "suite",
    "wall_s", "repro",
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
