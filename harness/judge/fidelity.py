"""Fidelity: how closely fla's emulated rows (the GPU leg under the Triton interpreter, ``mode`` emulated) reproduce
its native rows (the same kernels on a GPU, ``mode`` native) of the same cases and inputs, and which verdicts move
when a candidate is judged against one or the other (``parity fidelity``; definitions: docs/definitions.md,
"Fidelity: emulated against native rows").

- **Pair**: an emulated row and a native row with the same ``case_id``, ``tensor`` and ``input_sha256``. Rows of the
  same (case_id, tensor) whose ``input_sha256`` differ are refused (:class:`FidelityInputError`): they measured
  different inputs. A pair is *compared* when both rows are ``ok``; a pair whose statuses differ is listed apart.
- **Ratio** = rel_l2(emulated) / rel_l2(native): above 1 the emulation overstates fla's error. Both 0: 1 (equal);
  only the native 0: +inf; only the emulated 0: 0.
- **|ln ratio|**: its absolute natural log (0 for equal errors, ln 2 = 0.693 for a factor 2 either way); a group's
  **mean |ln ratio|** is the mean over its compared pairs (+inf if any ratio is 0 or +inf).
- **Median ratio**: the median of a group's ratios (the mean of the two middle ones on an even count).
- **Worst element bit-equal**: both rows' largest error |y − r| sits on the same element (``worst_index``, the
  index tuple) and the leg's value there (``got_at_worst``, the output upcast exactly to float64) has the same 64
  bits on both sides (so 0.0 and −0.0 differ). The reference's value is not compared: the float64 references of
  the two runs were computed on different hosts and may differ in their last bits.

Groups: path (``op.variant``) × dtype (the case's) × tensor; path × dtype; everything. The targets (issue 76's
"done when", per path × dtype): mean |ln ratio| ≤ 0.05; worst element bit-equal on ≥ 90 % of the compared rows; on
fp32 decode paths (``fused_recurrent``) the median ratio of ``o`` and of ``dv`` within 1.00 ± 0.05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.core.policy import Policy
from harness.core.results import KEY, ReportError
from harness.core.status import Status
from harness.judge.baseline import EMULATED, NATIVE, baseline_of_record
from harness.judge.gate import apply_gate

JOIN = [*KEY, "input_sha256"]
SIDES = (EMULATED, NATIVE)

MEAN_ABS_LN_MAX = 0.05
BIT_EQUAL_MIN = 0.90
DECODE_MEDIAN_BAND = (0.95, 1.05)
DECODE_VARIANT = "fused_recurrent"
"""fla's decode kernels: the variant the fp32 median target names."""
DECODE_DTYPE = "float32"
DECODE_TENSORS = ("o", "dv")

MET, MISSED = "met", "MISSED"
SAME_RTOL = 1e-9
"""Two rows of the same case, tensor and inputs on one side are the same measurement when their rel_l2 agree this
closely: the float64 references of runs on different hosts differ in their last bits (1e-16 to 1e-12 measured)."""


class FidelityInputError(ReportError):
    """The files cannot be compared (exit 2)."""


def split_by_mode(frames: list[tuple[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Each file's rows (``(name, rows)``, checked result files) by their ``mode``: every row of a file must have
    one mode, and both modes must be given. One row per (case_id, tensor, input_sha256) on each side, the first
    file's; ``attrs["conflicts"]`` counts the later rows whose rel_l2 is more than :data:`SAME_RTOL` from the one
    kept (rows made by another version of the leg)."""
    sides: dict[str, list[pd.DataFrame]] = {EMULATED: [], NATIVE: []}
    for name, rows in frames:
        modes = sorted(rows["mode"].astype(str).unique())
        if len(modes) != 1:
            raise FidelityInputError(f"{name}: rows of modes {', '.join(modes) or 'none'}; give each mode's rows "
                                     f"in files of their own")
        sides[modes[0]].append(rows)
    for mode, other in ((EMULATED, NATIVE), (NATIVE, EMULATED)):
        if not sides[mode]:
            raise FidelityInputError(f"every file given holds {other} rows: give {mode} rows of the same cases too")
    out = {}
    for mode, parts in sides.items():
        rows = pd.concat(parts, ignore_index=True)
        kept = rows.drop_duplicates(JOIN, keep="first")
        again = rows[rows.duplicated(JOIN, keep="first")].merge(kept[JOIN + ["rel_l2"]], on=JOIN,
                                                                suffixes=("", "_kept"))
        kept = kept.reset_index(drop=True)
        a, b = again["rel_l2"].astype(float), again["rel_l2_kept"].astype(float)
        apart = ((a - b).abs() > SAME_RTOL * np.maximum(a.abs(), b.abs())) | (a.isna() != b.isna())
        kept.attrs["conflicts"] = int(apart.sum())
        out[mode] = kept
    return out


def path_of(rows: pd.DataFrame) -> pd.Series:
    """``op.variant`` of each row: the first part of its case id."""
    return rows["case_id"].astype(str).str.split("/", n=1).str[0]


def ratio(emulated: float, native: float) -> float:
    """rel_l2(emulated) / rel_l2(native), with the module doc's values at zero."""
    if native == 0:
        return 1.0 if emulated == 0 else math.inf
    return emulated / native


def abs_ln(r: float) -> float:
    return math.inf if r == 0 or math.isinf(r) else abs(math.log(r))


def bits_equal(a, b) -> np.ndarray:
    """Element-wise: the float64 values have the same 64 bits (NaN of one payload equals itself; 0.0 is not -0.0)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return a.view(np.int64) == b.view(np.int64)


def pairs(emulated: pd.DataFrame, native: pd.DataFrame) -> pd.DataFrame:
    """Every (case_id, tensor) both sides hold, one row per pair with both sides' status, rel_l2 and worst element,
    its path and dtype, and (when both are ``ok``) its ratio, |ln ratio| and whether the worst element is
    bit-equal. FidelityInputError when a pair's input_sha256 differ. ``attrs["only"]`` counts each side's rows
    without a twin."""
    cols = [*JOIN, "status", "rel_l2", "worst_index", "got_at_worst"]
    e = emulated.reindex(columns=cols + ["dtype"])
    n = native.reindex(columns=cols)
    both = e.merge(n, on=KEY, suffixes=("_e", "_n"))
    stale = both[both["input_sha256_e"].astype(str) != both["input_sha256_n"].astype(str)]
    if len(stale):
        r = stale.iloc[0]
        raise FidelityInputError(f"{len(stale)} row(s) of different inputs (input_sha256 differs), e.g. "
                                 f"{r['case_id']} / {r['tensor']}: {str(r['input_sha256_e'])[:12]} (emulated) vs "
                                 f"{str(r['input_sha256_n'])[:12]} (native); make both sides from the same inputs")
    both = both.drop(columns="input_sha256_n").rename(columns={"input_sha256_e": "input_sha256"})
    both.insert(0, "path", path_of(both))
    ok = (both["status_e"] == Status.OK) & (both["status_n"] == Status.OK)
    both["compared"] = ok
    both["ratio"] = [ratio(float(a), float(b)) if k else math.nan
                     for a, b, k in zip(both["rel_l2_e"], both["rel_l2_n"], ok)]
    both["abs_ln"] = [abs_ln(r) if k else math.nan for r, k in zip(both["ratio"], ok)]
    same_place = both["worst_index_e"].astype(str).to_numpy() == both["worst_index_n"].astype(str).to_numpy()
    same_value = bits_equal(pd.to_numeric(both["got_at_worst_e"], errors="coerce"),
                            pd.to_numeric(both["got_at_worst_n"], errors="coerce"))
    both["bit_equal"] = ok.to_numpy() & same_place & same_value
    keys = lambda f: set(map(tuple, f[KEY].astype(str).to_numpy()))  # noqa: E731
    joined = keys(both)
    both.attrs["only"] = {EMULATED: len(keys(emulated) - joined), NATIVE: len(keys(native) - joined)}
    return both.reset_index(drop=True)


def _figures(group: pd.DataFrame) -> dict:
    c = group[group["compared"]]
    n = len(c)
    return {"rows": n,
            "median": float(np.median(c["ratio"])) if n else math.nan,
            "mean_abs_ln": float(c["abs_ln"].mean()) if n else math.nan,
            "bit_equal": int(c["bit_equal"].sum()),
            "bit_equal_frac": float(c["bit_equal"].mean()) if n else math.nan}


def by_tensor(p: pd.DataFrame) -> pd.DataFrame:
    """One row per path × dtype × tensor with compared pairs: rows, median ratio, mean |ln ratio|, bit-equal count
    and fraction."""
    out = [{"path": path, "dtype": dtype, "tensor": tensor, **_figures(g)}
           for (path, dtype, tensor), g in p[p["compared"]].groupby(["path", "dtype", "tensor"], sort=True)]
    return pd.DataFrame(out, columns=["path", "dtype", "tensor", "rows", "median", "mean_abs_ln", "bit_equal",
                                      "bit_equal_frac"])


def targets(path: str, dtype: str, figures: dict, tensor_medians: dict[str, float]) -> dict[str, str]:
    """The issue's targets for one path × dtype: ``met``, ``MISSED`` (with the figure) or '' where none applies."""
    out = {"target_ln": "", "target_bits": "", "target_decode": ""}
    if not figures["rows"]:
        return out
    ln = figures["mean_abs_ln"]
    out["target_ln"] = MET if ln <= MEAN_ABS_LN_MAX else f"{MISSED} ({ln:.3g})"
    frac = figures["bit_equal_frac"]
    out["target_bits"] = MET if frac >= BIT_EQUAL_MIN else f"{MISSED} ({frac:.1%})"
    if path.endswith("." + DECODE_VARIANT) and dtype == DECODE_DTYPE:
        lo, hi = DECODE_MEDIAN_BAND
        found = {t: tensor_medians[t] for t in DECODE_TENSORS if t in tensor_medians}
        off = {t: m for t, m in found.items() if not lo <= m <= hi}
        if found:
            out["target_decode"] = (MET if not off else
                                    f"{MISSED} ({', '.join(f'{t} {m:.3g}' for t, m in off.items())})")
    return out


def by_path(p: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """One row per path × dtype: the figures over all its tensors, and each target's status (:func:`targets`)."""
    out = []
    for (path, dtype), g in p[p["compared"]].groupby(["path", "dtype"], sort=True):
        figures = _figures(g)
        t = tensors[(tensors["path"] == path) & (tensors["dtype"] == dtype)]
        out.append({"path": path, "dtype": dtype, **figures,
                    **targets(path, dtype, figures, dict(zip(t["tensor"], t["median"])))})
    return pd.DataFrame(out, columns=["path", "dtype", "rows", "median", "mean_abs_ln", "bit_equal", "bit_equal_frac",
                                      "target_ln", "target_bits", "target_decode"])


def overall(p: pd.DataFrame) -> dict:
    return _figures(p)


def status_differs(p: pd.DataFrame) -> pd.DataFrame:
    """The pairs whose statuses differ (e.g. a row within its bound on one side and over it on the other)."""
    return p[p["status_e"] != p["status_n"]][["case_id", "tensor", "status_e", "status_n", "rel_l2_e", "rel_l2_n"]]


def missed(paths: pd.DataFrame) -> pd.DataFrame:
    """The path × dtype rows with a target missed."""
    cols = ["target_ln", "target_bits", "target_decode"]
    return paths[paths[cols].apply(lambda r: any(str(v).startswith(MISSED) for v in r), axis=1)]


# ------------------------------------------------------------------------------- verdicts that move
NO_VERDICT = "–"
"""A (case, tensor, metric) one of the two gates did not judge: e.g. an ``ok`` baseline row's metrics on one side, a
``bound`` row's single status verdict on the other."""
MOVE_COLUMNS = ["candidate", "case_id", "tensor", "metric", "verdict_emulated", "verdict_native", "ratio_emulated",
                "ratio_native", "eps_gpu_emulated", "eps_gpu_native", "gpu_mode_native", "reason_emulated",
                "reason_native"]


@dataclass
class Moves:
    """A candidate judged twice: ``both`` every (case, tensor, metric) with its two verdicts, ``moved`` those whose
    verdict differs (each with both reasons)."""
    candidate: str
    both: pd.DataFrame
    moved: pd.DataFrame

    def counts(self, side: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.both[f"verdict_{side}"].value_counts().sort_index().items()}


def verdict_moves(emulated: pd.DataFrame, native: pd.DataFrame, candidate: pd.DataFrame, policy: Policy,
                  baseline_leg: str | None = None) -> Moves:
    """The candidate's rows judged by the gate (:func:`harness.judge.gate.apply_gate`, the policy given) against the
    emulated baseline rows and against the baseline of record (:func:`harness.judge.baseline.baseline_of_record`:
    native rows where they exist for the case, tensor and inputs), both cut to the cases the candidate and the
    emulated rows share, so that both gates judge the same comparisons."""
    leg = str(candidate["leg"].iloc[0])
    cases = set(candidate["case_id"]) & set(emulated["case_id"])
    cand = candidate[candidate["case_id"].isin(cases)].reset_index(drop=True)
    base = emulated[emulated["case_id"].isin(cases)].reset_index(drop=True)
    empty = pd.DataFrame(columns=MOVE_COLUMNS)
    if cand.empty:
        return Moves(leg, empty, empty)
    record = baseline_of_record(base, native)
    judged = {}
    for side, rows in ((EMULATED, base), (NATIVE, record)):
        parity = apply_gate(rows, cand, policy, baseline_leg=baseline_leg, candidate_leg=leg,
                            names=(f"fla ({side} baseline)", f"{leg} rows")).parity
        judged[side] = parity[["case_id", "tensor", "metric", "verdict", "ratio", "eps_gpu", "gpu_mode", "reason"]]
    both = judged[EMULATED].merge(judged[NATIVE], on=["case_id", "tensor", "metric"], how="outer",
                                  suffixes=("_emulated", "_native"))
    both.insert(0, "candidate", leg)
    for side in SIDES:  # a metric judged on one side only (a row ok on one side, out of bounds on the other)
        both[f"verdict_{side}"] = both[f"verdict_{side}"].fillna(NO_VERDICT)
    moved = both[both["verdict_emulated"] != both["verdict_native"]]
    return Moves(leg, both, moved.reindex(columns=MOVE_COLUMNS).reset_index(drop=True))
