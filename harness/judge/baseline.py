"""The baseline of record: the fla rows a candidate is judged against, one rule for every report.

fla's kernels run natively on a GPU give the GPU's own error; the emulated GPU leg (the Triton interpreter on a CPU)
gives an estimate of it, which on some paths is not the hardware's (issue 76; ``parity fidelity`` measures how far).
So where the repository holds native rows of a case (``reports/h200-native``), those judge it:

    for each baseline row (case_id, tensor): the native row with the same case_id, tensor and input_sha256 if there
    is one, else the row itself.

Rows are matched one by one, so a tensor the native run lacks keeps its emulated row, and a native row made from
other inputs (another ``input_sha256``: the case's inputs changed since) is never used: it measured something else.
Each row keeps its ``mode`` column, so the gate's ``gpu_mode`` (parity.csv) and the peer table's cells say which
baseline judged it. Native rows are read from result files whose rows all come from the baseline leg in ``native``
mode (:func:`native_rows`); the first file holding a row wins.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.core.results import KEY, ReportError, read_results, read_table
from harness.legs.registry import default_leg

NATIVE = "native"
EMULATED = "emulated"
DEFAULT_NATIVE_DIRS = (Path("reports") / "h200-native",)
"""Where the repository keeps fla's native rows: every baseline-leg, native result file there."""


def _result_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.name.endswith((".csv", ".csv.gz")))


def native_rows(folders) -> pd.DataFrame:
    """The baseline leg's native rows of every result file in ``folders`` (files of another leg, or holding any row
    that is not ``native``, are left out: an emulated copy beside them is a measurement, not a baseline). One row per
    (case_id, tensor, input_sha256), the first file's (folders in order, files by name). ReportError if a folder does
    not exist; an empty frame when no file qualifies."""
    frames = []
    for folder in folders:
        if not Path(folder).is_dir():
            raise ReportError(f"{folder}: no such folder of native rows")
        for path in _result_files(folder):
            head = read_table(path)
            if not {"leg", "mode"} <= set(head.columns):
                continue
            if set(head["leg"]) != {default_leg("baseline")} or set(head["mode"]) != {NATIVE}:
                continue
            frames.append(read_results(path).assign(_source=str(path)))
    if not frames:
        return pd.DataFrame(columns=[*KEY, "input_sha256", "mode", "_source"])
    rows = pd.concat(frames, ignore_index=True)
    return rows.drop_duplicates([*KEY, "input_sha256"], keep="first").reset_index(drop=True)


def baseline_of_record(rows: pd.DataFrame, native: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (a report's baseline rows) with each row replaced by the native row of the same case_id, tensor and
    input_sha256 where ``native`` has one (see the module doc). Same length and order as ``rows``; the columns are
    ``rows``' (a column only the native rows have is dropped). ``attrs["native"]`` counts the rows replaced."""
    if native.empty or rows.empty:
        out = rows.copy()
        out.attrs["native"] = 0
        return out
    join = [*KEY, "input_sha256"]
    rows = rows.reset_index(drop=True)
    native = native.dropna(subset=["input_sha256"]).drop_duplicates(join, keep="first")
    index = pd.MultiIndex.from_frame(native[join].astype(str))
    where = pd.MultiIndex.from_frame(rows[join].astype(str))
    found = index.get_indexer(where)  # position of each row's native twin, -1 when none
    hit = (found >= 0) & (rows["mode"].astype(str) != NATIVE).to_numpy()
    replaced = native.iloc[found[hit]].set_axis(rows.index[hit]).reindex(columns=rows.columns)
    out = pd.concat([rows[~hit], replaced]).loc[rows.index] if hit.any() else rows.copy()
    out.attrs["native"] = int(hit.sum())
    return out


def rows_made_elsewhere(paths, base: str, case_ids) -> pd.DataFrame:
    """Leg ``base``'s rows of the cases ``case_ids`` and of their further draws, pooled from result files made on
    another machine (``--baseline-rows``; a ValueError when a file is not the baseline's or the files lack a selected
    case). A (case draw, tensor) in several files is taken from the first."""
    from harness.judge.gate import of_cases

    frames = []
    for path in paths:
        rows = read_results(path)
        legs = sorted(rows["leg"].dropna().unique())
        if legs != [base]:
            raise ValueError(f"--baseline-rows {path} holds rows of {', '.join(legs) or 'no leg'}, not of the {base} "
                             f"leg")
        frames.append(rows)
    rows = pd.concat(frames, ignore_index=True).drop_duplicates(["case_id", "tensor"])
    wanted = list(case_ids)
    missing = [i for i in wanted if i not in set(rows["case_id"])]
    if missing:
        named = " ".join(map(str, paths))
        raise ValueError(f"--baseline-rows {named} lacks {len(missing)} of the {len(wanted)} selected cases (first: "
                         f"{missing[0]}); make them where fla runs: parity run --backend {base} with the same "
                         "selection")
    return rows[of_cases(rows, wanted)].reset_index(drop=True)
