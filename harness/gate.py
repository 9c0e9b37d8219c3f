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

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .metrics import METRICS
from .policy import Policy
from .reports import KEY, ReportError, atomic_write_text, read_results, write_csv

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
    if t_status in ("error", "nonfinite", "bound"):
        return status_row("fail", f"TPU {t_status}: {t['reason']}")
    if t_status == "unsupported":
        return status_row("unsupported", f"TPU: {t['reason']}")
    if t_status == "not_provided":
        if g_status == "ok":
            return status_row("fail", "the TPU leg gives no such tensor but the GPU leg does")
        return status_row("not_provided", "neither leg gives this tensor")
    # the TPU has numbers within its bound
    if g_status != "ok":
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
