"""The gate: join a GPU and a TPU result file and apply ε_TPU ≤ ε_GPU.

Files are joined on (case_id, tensor). Rows of the same case must carry the
same ``input_sha256`` in both files; otherwise the baseline is stale and the
gate refuses (:class:`GateInputError`, exit 2) naming the cases.

Verdicts, per (case, tensor) and, where both legs have numbers, per metric:

================= ==========================================================
``pass``/``fail`` gated metric: ``eps_tpu <= eps_gpu*(1+margin)+floor``
``info``          a metric reported but not gated by the policy
``fail``          TPU row ``error``, ``nonfinite`` or ``bound``; or the TPU
                  gives no tensor the GPU gives
``bounds_only``   no GPU number (``not_provided``, ``unsupported``, ``error``
                  or out of bounds); the TPU passed its absolute bound
``unsupported``   the TPU leg cannot run the case (with its reason)
``not_provided``  neither leg gives the tensor
``missing``       the (case, tensor) is in one file only
================= ==========================================================

Only ``fail`` makes the gate fail. Every failure is collected; the caller
exits once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .metrics import METRICS
from .policy import Policy
from .reports import KEY, ReportError, read_results
from .status import FAILING, Status

PARITY_COLUMNS = ["case_id", "tensor", "metric", "eps_gpu", "eps_tpu", "ratio", "allowed", "verdict", "reason",
                  "gpu_status", "tpu_status", "gpu_mode", "tpu_mode", "tpu_mxu_cost", "input_sha256", "repro"]


class GateInputError(ReportError):
    """The two files cannot be compared (stale baseline, wrong legs)."""


@dataclass
class GateResult:
    parity: pd.DataFrame
    policy: Policy
    gpu: pd.DataFrame
    tpu: pd.DataFrame

    @property
    def failures(self) -> pd.DataFrame:
        return self.parity[self.parity["verdict"] == "fail"]

    @property
    def passed(self) -> bool:
        return self.failures.empty


def _check_hashes(gpu: pd.DataFrame, tpu: pd.DataFrame) -> None:
    g = gpu.dropna(subset=["input_sha256"]).groupby("case_id")["input_sha256"].first()
    t = tpu.dropna(subset=["input_sha256"]).groupby("case_id")["input_sha256"].first()
    both = g.index.intersection(t.index)
    stale = sorted(c for c in both if g[c] != t[c])
    if stale:
        listed = "\n  ".join(stale[:20]) + ("\n  ..." if len(stale) > 20 else "")
        raise GateInputError(
            f"{len(stale)} case(s) were run on different inputs (input_sha256 differs), so their errors are "
            f"not comparable; re-run the baseline with this version of the harness:\n  {listed}")


def _ratio(eps_tpu: float, eps_gpu: float) -> float:
    if eps_gpu == 0:
        return 1.0 if eps_tpu == 0 else math.inf
    return eps_tpu / eps_gpu


def _judge(key, g, t, policy: Policy) -> list[dict]:
    case_id, tensor = key
    base = {"case_id": case_id, "tensor": tensor,
            "gpu_status": None if g is None else g["status"], "tpu_status": None if t is None else t["status"],
            "gpu_mode": None if g is None else g["mode"], "tpu_mode": None if t is None else t["mode"],
            "tpu_mxu_cost": None if t is None else t.get("mxu_cost"),
            "input_sha256": (t if t is not None else g)["input_sha256"],
            "repro": None if t is None else t.get("repro")}

    def status_row(verdict, reason):
        return [{**base, "metric": "status", "verdict": verdict, "reason": reason}]

    if t is None:
        return status_row("missing", "no TPU row for this case and tensor")
    if g is None:
        g_status = "missing"
    else:
        g_status = g["status"]
    t_status = t["status"]
    if t_status in FAILING:
        return status_row("fail", f"TPU {t_status}: {t['reason']}")
    if t_status == Status.UNSUPPORTED:
        return status_row("unsupported", f"TPU: {t['reason']}")
    if t_status == Status.NOT_PROVIDED:
        if g_status == Status.OK:
            return status_row("fail", "the TPU leg gives no such tensor but the GPU leg does")
        return status_row("not_provided", "neither leg gives this tensor")
    # the TPU has numbers within its bound
    if g_status != Status.OK:
        why = "no GPU row" if g is None else f"GPU {g_status}: {g['reason']}"
        return status_row("bounds_only", f"TPU within its absolute bound; no GPU baseline ({why})")
    rows = []
    for metric in METRICS:
        eps_g, eps_t = float(g[metric]), float(t[metric])
        gated = metric in policy.metrics
        allowed = policy.allowed(metric, eps_g)
        if not gated:
            verdict, reason = "info", "not gated by the policy"
        elif policy.passes(metric, eps_t, eps_g):
            verdict, reason = "pass", ""
        else:
            verdict, reason = "fail", f"eps_tpu {eps_t:.4g} > allowed {allowed:.4g}"
        rows.append({**base, "metric": metric, "eps_gpu": eps_g, "eps_tpu": eps_t, "ratio": _ratio(eps_t, eps_g),
                     "allowed": allowed, "verdict": verdict, "reason": reason})
    return rows


def apply_gate(gpu: pd.DataFrame, tpu: pd.DataFrame, policy: Policy) -> GateResult:
    _check_hashes(gpu, tpu)
    g_rows = {tuple(k): r for k, r in zip(gpu[KEY].itertuples(index=False), gpu.to_dict("records"))}
    t_rows = {tuple(k): r for k, r in zip(tpu[KEY].itertuples(index=False), tpu.to_dict("records"))}
    keys = list(t_rows) + [k for k in g_rows if k not in t_rows]
    rows = []
    for key in keys:
        rows.extend(_judge(key, g_rows.get(key), t_rows.get(key), policy))
    parity = pd.DataFrame(rows)
    for col in PARITY_COLUMNS:
        if col not in parity.columns:
            parity[col] = pd.NA
    return GateResult(parity[PARITY_COLUMNS], policy, gpu, tpu)


def gate_files(gpu_csv: Path, tpu_csv: Path, policy: Policy) -> GateResult:
    return apply_gate(read_results(gpu_csv), read_results(tpu_csv), policy)


# ---------------------------------------------------------------- rendering
