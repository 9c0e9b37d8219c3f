"""Result files: the schema every leg's rows follow, reading and checking them, merging, and writing pandas
tables atomically (temp file, then rename).

A leg's result CSV has one row per (case, tensor) with every metric and the
row's provenance (leg, mode, device, versions, git commit, timestamp, input
hash, wall time). Columns are fixed in :data:`RESULT_COLUMNS`; rows are the
only interface between running and judging. The gate reads files through this module; rendering them
(:mod:`harness.report.reports`, :mod:`harness.report.html_report`, :mod:`harness.report.junit`) sits above the gate.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from harness.core.metrics import parse_blocks
from harness.core.schema import (KEY, METRICS, MODES, MXU_COLUMNS, REQUIRED_COLUMNS, RESULT_COLUMNS,  # noqa: F401
                                 RESULT_STATUSES, well_formed)
from harness.core.status import Status




PARTIAL_SUFFIX = ".partial.csv"
"""The end of the name of a leg's result file while its run has not finished (harness.run.result_file): the gate
refuses such a file unless told ``--allow-partial``."""


def unfinished(path) -> bool:
    """Whether ``path`` names the partial file of a run that did not finish."""
    return str(path).endswith(PARTIAL_SUFFIX)


class ReportError(ValueError):
    """A result file is missing, malformed or inconsistent (exit code 2)."""


TRACEBACK = "traceback"
"""The key under which an ``error`` row carries the full traceback of the exception that made it. It is no column
of the result file: :func:`tracebacks_text` writes it to the file's traceback file (:func:`tracebacks_path`), one
entry per case draw, under the case's repro command."""

TRACEBACKS_SUFFIX = ".tracebacks.txt"


def tracebacks_path(result_path) -> Path:
    """The file beside a result file (``tpu.csv``, or its ``tpu.partial.csv``) that keeps its error rows' full
    tracebacks: ``tpu.tracebacks.txt``."""
    path = Path(result_path)
    stem = path.name[:-len(PARTIAL_SUFFIX)] if unfinished(path) else path.stem
    return path.with_name(stem + TRACEBACKS_SUFFIX)


def tracebacks_text(rows: Iterable[dict]) -> str:
    """The traceback entries of ``rows`` (one case draw's, or several): per case draw whose rows carry a
    :data:`TRACEBACK`, a header with the case id and the leg, its repro command, then each distinct traceback once
    with the tensors whose rows it made. '' when no row carries one."""
    entries: dict[tuple, dict[str, list[str]]] = {}
    heads: dict[tuple, dict] = {}
    for row in rows:
        text = row.get(TRACEBACK)
        if not text:
            continue
        key = (row.get("case_id"), row.get("leg"))
        heads.setdefault(key, row)
        entries.setdefault(key, {}).setdefault(text, []).append(str(row.get("tensor")))
    out = []
    for key, by_text in entries.items():
        head = heads[key]
        out.append(f"=== {head.get('case_id')} [{head.get('leg')} leg]\nrepro: {head.get('repro')}\n")
        for text, tensors in by_text.items():
            out.append(f"--- the error rows of {', '.join(tensors)}:\n{text.rstrip()}\n")
        out.append("\n")
    return "".join(out)


def rows_to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = pd.NA
    return df[RESULT_COLUMNS]


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


_MEASURED = (Status.OK, Status.BOUND)  # statuses whose metrics must be finite numbers >= 0
_HASH = re.compile(r"[0-9a-f]{64}")


def _where(path: Path, index, column: str) -> str:
    """``file:line: column 'c'`` of a data row (line 1 is the header; fields hold no newlines)."""
    return f"{path}:{int(index) + 2}: column {column!r}"


_LEADING_ZEROS = "0.00034456638728446663"
"""A max_abs a native run wrote (17 significant digits behind three zeros): the value read_csv's default parser
returns 6.7e-17 away, 1.9e-13 relative, under pandas 3.0.6."""


@functools.cache
def exact_float_keywords() -> dict:
    """``read_csv``'s keywords that make each field read back as the double whose repr it is. pandas' default C
    parser ("high") loses up to about 1e-13 relative on fields with leading zeros (pandas-dev/pandas#39514: pandas
    2.x and 3.0.x; 3.1 reads them exactly and deprecates the keyword); Python's own parser ("round_trip") is exact.
    Asked of the installed parser, not of its version: a row must read back as it was written, or the three
    columns of its worst element disagree and the row is refused as edited."""
    default = pd.read_csv(io.StringIO(f"x\n{_LEADING_ZEROS}\n"))["x"].iloc[0]
    return {} if default == float(_LEADING_ZEROS) else {"float_precision": "round_trip"}


def read_table(path: Path) -> pd.DataFrame:
    """A CSV as pandas reads it, unchecked (ReportError if it is not a readable CSV); see :func:`read_results`."""
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{path} is a directory, not a result CSV")
    if not path.exists():
        raise ReportError(f"result file {str(path)!r} does not exist")
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"input_sha256": str},
                           **exact_float_keywords())
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise ReportError(f"{path}: not a result CSV ({str(exc).splitlines()[0]})") from None


def check_results(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Every rule a result file must meet, row by row; the first violation is a :class:`ReportError`
    naming the file, the line and the column. Returns ``df`` with the metric columns as floats."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: not a parity result file, missing columns {missing}")
    for column in ("case_id", "tensor"):
        blank = df[df[column].isna()]
        if len(blank):
            raise ReportError(f"{_where(path, blank.index[0], column)}: empty")
    for column, allowed in (("status", RESULT_STATUSES), ("mode", MODES)):
        bad = df[~df[column].isin(allowed)]
        if len(bad):
            raise ReportError(f"{_where(path, bad.index[0], column)}: unknown value {bad[column].iloc[0]!r}; "
                              f"one of {', '.join(allowed)}")
    bad = df[~df["leg"].map(well_formed)]  # any leg's: an implementation's rows gate where it is not installed
    if len(bad):
        raise ReportError(f"{_where(path, bad.index[0], 'leg')}: {bad['leg'].iloc[0]!r} is not a leg name "
                          f"(lower-case letters, digits, '-' or '_')")
    df = df.copy()
    for metric in METRICS:
        values = pd.to_numeric(df[metric], errors="coerce")
        text = df[metric].notna() & values.isna()
        if text.any():
            i = text[text].index[0]
            raise ReportError(f"{_where(path, i, metric)}: {df.at[i, metric]!r} is not a number")
        negative = values < 0
        if negative.any():
            i = negative[negative].index[0]
            raise ReportError(f"{_where(path, i, metric)}: {float(values[i])!r} is negative; an error is >= 0")
        unmeasured = df["status"].isin(_MEASURED) & ~np.isfinite(values.astype(float))
        if metric == "rel_l2":  # an all-zero reference and a nonzero result: rel_l2 is +inf, beyond any bound
            unmeasured &= ~((df["status"] == Status.BOUND) & (values == np.inf))
        if unmeasured.any():
            i = unmeasured[unmeasured].index[0]
            raise ReportError(f"{_where(path, i, metric)}: a {df.at[i, 'status']} row needs a finite value, "
                              f"got {float(values[i])!r}")
        df[metric] = values.astype(float)
    _check_blocks(df, path)
    _check_worst(df, path)
    _check_native(df, path)
    hashes = df["input_sha256"].astype("string")
    needs = df["status"] != Status.ERROR  # an invalid case errors before its inputs exist
    bad = (hashes.notna() | needs) & ~hashes.fillna("").str.fullmatch(_HASH)
    if bad.any():
        i = bad[bad].index[0]
        raise ReportError(f"{_where(path, i, 'input_sha256')}: {df.at[i, 'input_sha256']!r} is not a sha256 "
                          f"(64 hex digits); only an error row may leave it blank")
    per_case = df.dropna(subset=["input_sha256"]).groupby("case_id")["input_sha256"].nunique()
    if (per_case > 1).any():
        case = per_case[per_case > 1].index[0]
        lines = [int(i) + 2 for i in df.index[df["case_id"] == case]]
        raise ReportError(f"{path}: the rows of case {case} (lines {lines}) disagree on input_sha256")
    dupes = df[df.duplicated(KEY, keep=False)]
    if len(dupes):
        raise ReportError(f"{path}: duplicate (case, tensor) rows, e.g. {dupes.iloc[0]['case_id']} / "
                          f"{dupes.iloc[0]['tensor']} (lines {[int(i) + 2 for i in dupes.index[:2]]}); "
                          f"merge shards with `parity merge`")
    legs = sorted(df["leg"].unique())
    if len(legs) > 1:
        raise ReportError(f"{path}: rows from several legs {legs}; a result file holds one leg")
    return df


WORST_RTOL = 1e-13
"""How far ``max_abs`` may sit from ``|ref_at_worst - got_at_worst|``, relative to the larger of the three: the
columns as a file keeps them (16 significant digits in the oldest committed rows, reports/h100-native)."""


def _check_worst(df: pd.DataFrame, path: Path) -> None:
    """``max_abs`` is the error at the worst element, whose reference and result the row also keeps: a row whose
    three columns disagree was edited (or made by something else than this harness)."""
    if not {"ref_at_worst", "got_at_worst"} <= set(df.columns):
        return
    ref, got = (pd.to_numeric(df[c], errors="coerce").astype(float) for c in ("ref_at_worst", "got_at_worst"))
    claimed = df["max_abs"]
    known = np.isfinite(ref) & np.isfinite(got) & np.isfinite(claimed)
    scale = np.maximum(np.maximum(ref.abs(), got.abs()), claimed.abs())
    off = known & ((ref - got).abs() - claimed).abs().gt(WORST_RTOL * scale)
    if off.any():
        i = off[off].index[0]
        raise ReportError(f"{_where(path, i, 'max_abs')}: {claimed[i]!r} is not |ref_at_worst - got_at_worst| = "
                          f"|{ref[i]!r} - {got[i]!r}| = {abs(ref[i] - got[i])!r}: the row was edited")


def _check_native(df: pd.DataFrame, path: Path) -> None:
    """A ``native`` row ran on the device its ``device`` column names; an interpreter there (the emulated legs
    write ``cpu (Triton interpreter)``, ``cpu (Pallas TPU interpret mode)``) means its mode was edited."""
    if "device" not in df.columns:
        return
    off = (df["mode"] == "native") & df["device"].astype("string").str.contains("interpret", case=False, na=False)
    if off.any():
        i = off[off].index[0]
        raise ReportError(f"{_where(path, i, 'mode')}: 'native', but its device is {df.at[i, 'device']!r}: an "
                          f"emulated run's row whose mode was edited")


BLOCKS_RTOL = 1e-5
"""How closely sqrt(sum of rel_l2_blocks) must equal rel_l2 (the blocks carry 7 significant digits)."""


def _check_blocks(df: pd.DataFrame, path: Path) -> None:
    """A measured row's ``rel_l2_blocks`` are numbers >= 0 whose sum is rel_l2² (empty only when rel_l2 is 0):
    the gate's noise estimate and the reported error must describe the same tensor."""
    for i in df.index[df["status"].isin(_MEASURED)]:
        cell = df.at[i, "rel_l2_blocks"]
        try:
            blocks = parse_blocks(cell)
        except ValueError:
            raise ReportError(f"{_where(path, i, 'rel_l2_blocks')}: {cell!r} is not ';'-joined numbers") from None
        rel = float(df.at[i, "rel_l2"])
        if blocks is None:
            if rel != 0 and rel != math.inf:  # no blocks: rel_l2 is 0, or +inf (an all-zero reference)
                raise ReportError(f"{_where(path, i, 'rel_l2_blocks')}: empty, but rel_l2 is {rel!r}")
            continue
        if not (np.all(np.isfinite(blocks)) and np.all(blocks >= 0)):
            raise ReportError(f"{_where(path, i, 'rel_l2_blocks')}: blocks must be finite and >= 0")
        total = math.sqrt(float(blocks.sum()))
        if abs(total - rel) > BLOCKS_RTOL * rel:
            raise ReportError(f"{_where(path, i, 'rel_l2_blocks')}: the blocks give rel_l2 {total!r}, the row says "
                              f"{rel!r}")


def read_results(path: Path) -> pd.DataFrame:
    """A result CSV, checked by :func:`check_results` (ReportError, exit 2, on any violation)."""
    return check_results(read_table(path), Path(path))


def column_values(df: pd.DataFrame, column: str) -> list[str]:
    """The distinct non-empty values of a column, as sorted text ([] when the column is absent)."""
    return sorted(str(v) for v in df[column].dropna().unique()) if column in df.columns else []


def settings_values(df: pd.DataFrame, key: str) -> list:
    """The values ``key`` takes in the rows' ``settings`` (JSON text), distinct settings in the order the rows first
    give them; a row whose settings do not parse, or lack the key, gives none."""
    out = []
    for text in (df["settings"].dropna().unique() if "settings" in df.columns else ()):
        try:
            settings = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(settings, dict) and key in settings:
            out.append(settings[key])
    return out


def package_versions(df: pd.DataFrame) -> dict[str, str]:
    """Every package the rows' ``versions`` (JSON text) name, with its version, the distinct ones joined by ", "
    when rows disagree; a row whose versions do not parse gives none."""
    found: dict[str, set[str]] = {}
    for text in column_values(df, "versions"):
        try:
            versions = json.loads(text)
        except ValueError:
            continue
        for package, version in (versions.items() if isinstance(versions, dict) else ()):
            found.setdefault(package, set()).add(str(version))
    return {package: ", ".join(sorted(v)) for package, v in found.items()}


def mixed_provenance(df: pd.DataFrame) -> dict[str, list]:
    """Provenance columns whose rows disagree (suite, commit, mode, device), with their values."""
    values = {c: column_values(df, c) for c in ("suite", "git_commit", "mode", "device")}
    return {c: v for c, v in values.items() if len(v) > 1}


def merge_results(paths: Iterable[Path], allow_mixed: bool = False) -> pd.DataFrame:
    """Concatenate shard files of one leg; refuses overlapping (case, tensor) rows, and rows of
    different suites, commits, modes or devices unless ``allow_mixed``."""
    paths = list(paths)
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
    mixed = mixed_provenance(df)
    if mixed and not allow_mixed:
        what = "; ".join(f"{c}: {', '.join(v)}" for c, v in mixed.items())
        raise ReportError(f"the files were made by different runs ({what}); pass --allow-mixed to merge them anyway")
    return df.sort_values(KEY, kind="stable").reset_index(drop=True)


def summarize(df: pd.DataFrame) -> str:
    """One line per status, for the terminal."""
    counts = df.groupby("status").size().to_dict()
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def provenance_line(df: pd.DataFrame) -> str:
    """Mode, device, versions and commit of a file's rows; every distinct value, and **mixed** when they differ."""
    if df.empty:
        return "no rows"

    versions = sorted({", ".join(f"{k} {v}" for k, v in sorted(json.loads(text).items()))
                       for text in column_values(df, "versions")})
    parts = [f"mode **{'/'.join(column_values(df, 'mode'))}** on {' / '.join(column_values(df, 'device'))}",
             " / ".join(versions), f"commit {' / '.join(column_values(df, 'git_commit'))}"]
    mixed = mixed_provenance(df)
    if len(versions) > 1:
        mixed["versions"] = versions
    text = "; ".join(p for p in parts if p)
    if mixed:
        text += f" (**mixed**: the rows differ in {', '.join(mixed)})"
    return text
