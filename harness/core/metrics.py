"""Error metrics of one tensor against its float64 reference. Never raises on data.

Definitions (docs/definitions.md states them with examples; tests check them on
hand-computed values):

- ``max_abs``  = max_i |y_i − r_i|
- ``rel_l2``   = ‖y − r‖₂ / ‖r‖₂  (0 when both are all-zero, inf when only r is)
- ``ulp``      per element, in the tensor's declared dtype D (precision p = D's
  fraction bits, minimum normal exponent e_min, maximum exponent e_max):

      ulp_D(r) = 2^(clamp(⌊log₂|r|⌋, e_min, e_max) − p)      (ulp_D(0) = 2^(e_min − p))
      ulp_err  = |y − r| / ulp_D(r)

  so the error is counted in steps of D's grid at the *reference* value. A
  kernel that returns r correctly rounded to D has ulp_err ≤ 0.5. Subnormals
  share the fixed spacing 2^(e_min − p); ±0 are equal (error 0); a NaN
  matches only a NaN and an infinity only the same infinity (error 0),
  anything else against a NaN or an infinity is ``inf`` ULP.
- ``ulp_max``, ``ulp_mean``, ``ulp_p99`` summarise ulp_err over elements
  (p99: the smallest element value not exceeded by 99 % of elements, numpy's
  ``method="higher"``, so it is always an element's value, never interpolated).
- ``nan`` / ``inf``: counts in y; ``ref_nonfinite``: non-finite count in r.
- A NaN or Inf in y where r is finite makes ``max_abs`` and ``rel_l2`` ``inf``:
  such a result always fails, whatever the tolerances.
- ``rel_l2_blocks``: the flattened (C-order) tensor cut into M = min(32, n)
  contiguous blocks of near-equal size (``numpy.array_split``); block b holds
  ``‖y_b − r_b‖₂² / ‖r‖₂²``, so the blocks sum to ``rel_l2²``. Two legs run on
  the same inputs share the blocks element for element, which is what lets the
  gate resample them in pairs (:mod:`harness.core.noise`). Written as M numbers
  joined by ``;`` with 7 significant digits; empty when ``rel_l2`` is not finite
  or 0/0.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from cases.inputs import NP_DTYPES
from harness.core.schema import METRICS  # noqa: F401  (the metrics' names, declared with every column)


"""The error metrics compared by the gate, in report order."""

ERROR_BLOCKS = 32
"""Blocks of ``rel_l2_blocks``: enough for a resampling estimate, few enough to keep rows short."""


def _finfo(dtype: str):
    info = ml_dtypes.finfo(NP_DTYPES[dtype])
    return int(info.nmant), int(info.minexp), int(info.maxexp) - 1


def ulp(r: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype``'s grid at each (float64) value ``r``; see the module doc."""
    p, e_min, e_max = _finfo(dtype)
    r = np.abs(np.asarray(r, dtype=np.float64))
    _, e = np.frexp(r)  # r = m 2^e with 0.5 <= m < 1, so floor(log2 r) = e - 1
    exp = np.clip(e.astype(np.int64) - 1, e_min, e_max)
    exp = np.where(r == 0, e_min, exp)
    return np.ldexp(1.0, (exp - p).astype(np.int64))


def ulp_error(y: np.ndarray, r: np.ndarray, dtype: str) -> np.ndarray:
    """Per-element error of ``y`` in units of ``ulp_D(r)``; NaN/Inf rules in the module doc."""
    y = np.asarray(y, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    finite = np.isfinite(y) & np.isfinite(r)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(y - r) / ulp(np.where(finite, r, 0.0), dtype), np.inf)
    both_nan = np.isnan(y) & np.isnan(r)
    same_inf = np.isinf(y) & np.isinf(r) & (np.sign(y) == np.sign(r))
    return np.where(both_nan | same_inf, 0.0, err)


def rel_l2(y: np.ndarray, r: np.ndarray) -> float:
    y = np.asarray(y, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(r))):
        return math.inf
    num = float(np.linalg.norm((y - r).ravel()))
    den = float(np.linalg.norm(r.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def condition_number(r: np.ndarray, a: np.ndarray) -> float:
    """κ = ‖a‖₂ / ‖r‖₂ of a reduction: ``r`` the float64 reference of a tensor whose element i sums terms
    c_ij, ``a`` their magnitudes a_i = Σ_j |c_ij| (docs/definitions.md, "Bounds on reductions"). For one element
    it is the condition number of the sum, Σ|c| / |Σc| ≥ 1: how much the terms cancel. ``inf`` when the terms
    cancel exactly (r = 0, a ≠ 0); 1 when there is nothing to sum (a = 0)."""
    r = np.asarray(r, dtype=np.float64).ravel()
    a = np.asarray(a, dtype=np.float64).ravel()
    num, den = float(np.linalg.norm(a)), float(np.linalg.norm(r))
    if num == 0.0:
        return 1.0
    return math.inf if den == 0.0 else num / den


def rel_l2_blocks(y: np.ndarray, r: np.ndarray) -> list[float] | None:
    """``rel_l2²`` split over contiguous blocks of the flattened tensor (module doc); None when
    ``rel_l2`` is not a finite ratio (non-finite values, or an all-zero reference)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    r = np.asarray(r, dtype=np.float64).ravel()
    if y.size == 0 or not (np.all(np.isfinite(y)) and np.all(np.isfinite(r))):
        return None
    den = float(np.dot(r, r))
    if den == 0.0:
        return None
    e2 = (y - r) ** 2
    return [float(b.sum()) / den for b in np.array_split(e2, min(ERROR_BLOCKS, y.size))]


def format_blocks(blocks: list[float] | None) -> str:
    return "" if blocks is None else ";".join(f"{b:.6e}" for b in blocks)


def parse_blocks(text) -> np.ndarray | None:
    """The numbers of a ``rel_l2_blocks`` cell (ValueError if it is not ``;``-joined numbers); None if empty."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or str(text).strip() == "":
        return None
    return np.array([float(x) for x in str(text).split(";")], dtype=np.float64)


def compare(y: np.ndarray, r: np.ndarray, dtype: str) -> dict:
    """All metrics of ``y`` against reference ``r``, with ULPs counted in ``dtype``.

    Returns a flat dict (one report row's metric columns). Shape mismatches
    are data too: they come back as ``{"shape_error": ...}`` for the caller to
    record, never as an exception.
    """
    y = np.asarray(y)
    r = np.asarray(r, dtype=np.float64)
    if y.shape != r.shape:
        return {"shape_error": f"got shape {y.shape}, reference has {r.shape}"}
    y64 = y.astype(np.float64)
    nan = int(np.isnan(y64).sum())
    inf = int(np.isinf(y64).sum())
    ref_nonfinite = int((~np.isfinite(r)).sum())
    with np.errstate(invalid="ignore", over="ignore"):
        abs_err = np.abs(y64 - r)
    abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)  # a NaN is the worst error there is
    u = ulp_error(y64, r, dtype)
    if y.size == 0:
        return dict(max_abs=0.0, rel_l2=0.0, ulp_max=0.0, ulp_mean=0.0, ulp_p99=0.0, rel_l2_blocks="", numel=0, nan=0,
                    inf=0, ref_nonfinite=0, worst_index="", ref_at_worst=math.nan, got_at_worst=math.nan)
    worst = np.unravel_index(int(np.argmax(abs_err)), y.shape)
    return dict(
        max_abs=float(abs_err.max()),
        rel_l2=rel_l2(y64, r),
        ulp_max=float(u.max()),
        ulp_mean=float(u.mean()),
        ulp_p99=float(np.percentile(u, 99, method="higher")),
        rel_l2_blocks=format_blocks(rel_l2_blocks(y64, r)),
        numel=int(y.size),  # how many elements the blocks split: the gate trusts one draw's bootstrap on large ones
        nan=nan,
        inf=inf,
        ref_nonfinite=ref_nonfinite,
        worst_index=str(tuple(int(i) for i in worst)),
        ref_at_worst=float(r[worst]),
        got_at_worst=float(y64[worst]),
    )


def nonfinite_where_ref_finite(y: np.ndarray, r: np.ndarray) -> int:
    """Elements where the kernel gave NaN/Inf but the reference is finite."""
    y = np.asarray(y, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    return int((~np.isfinite(y) & np.isfinite(r)).sum())
