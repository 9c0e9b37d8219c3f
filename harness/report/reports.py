"""The gate's Markdown report (``parity.md``, also appended to ``$GITHUB_STEP_SUMMARY``) and the notes every
rendering of a gate shows (:mod:`harness.report.html_report` reuses them)."""

from __future__ import annotations

import json
import math

import pandas as pd

from harness.judge.gate import GateResult, side_labels
from harness.legs import default_leg
from harness.legs.external import GPU_ONLY
from harness.core.results import column_values, package_versions, provenance_line, settings_values
from harness.core.status import NO_GRADIENT


# ------------------------------------------------------------- the gate's report
def fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return ""
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _cost(x) -> str:
    """A modeled MXU cost ratio as ``1.23×``; ``–`` where none was modeled (native TPU, no run, or a kernel with no
    dot: the decode path)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(x) else f"{x:.2f}×"


def compiled_note(candidate: pd.DataFrame) -> str:
    """Which real TPU targets the emulated TPU kernels were compiled for, and with which libtpu."""
    emulated = candidate[candidate["mode"] == "emulated"]
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
    return text + _mxu_note(emulated)


def _mxu_note(emulated: pd.DataFrame) -> str:
    """What the compile read of the MXU passes (``mxu_check``): verified against Mosaic's output, or why not."""
    if "mxu_check" not in emulated.columns:
        return ""
    per_case = emulated.groupby("case_id")["mxu_check"].first().dropna().astype(str)
    if per_case.empty:
        return ""
    verified = per_case[per_case == "verified"]
    text = (f" The MXU model's passes were checked against the passes Mosaic emitted for every kernel dot: "
            f"{len(verified)} of {len(per_case)} case(s) verified.")
    others = per_case[per_case != "verified"]
    if len(others):
        text += f" **{len(others)} not verified**: {others.iloc[0]}."
    return text


def gate_notes(result: GateResult) -> list[list[str]]:
    """The caveats every gate report shows above its verdict counts: one list of Markdown paragraphs per note."""
    notes = []
    if (result.baseline_leg, result.candidate_leg) != (default_leg("baseline"), default_leg("candidate")):
        notes.append([f"**Not the GPU-vs-TPU gate**: the baseline is the {result.baseline_leg} leg and the "
                      f"candidate the {result.candidate_leg} leg, as asked (--baseline-leg/--candidate-leg)."])
    if result.forward_only:
        cases = result.parity.loc[result.parity["verdict"] == "forward_only", "case_id"].nunique()
        notes.append([f"**Forward only**: the candidate ({result.candidate_leg}) has no backward, so "
                      f"{result.forward_only} gradient tensor(s) of {cases} case(s) that the baseline gives were "
                      f"**not compared**. This verdict covers the forward tensors (o, ht) only; it is not a "
                      f"training-grade PASS."])
    if result.no_gradient:
        judged = result.parity[result.parity["verdict"] == "no_gradient"]
        why = sorted({f"{tensor} ({str(reason).removeprefix(NO_GRADIENT + ': ')})"
                      for tensor, reason in zip(judged["tensor"], judged["reason"])})
        notes.append([f"**No gradient by design**: the candidate ({result.candidate_leg}) declares it gives no "
                      f"gradient of some inputs, so {result.no_gradient} gradient tensor(s) of "
                      f"{judged['case_id'].nunique()} case(s) that the baseline gives were **not compared**: "
                      f"{'; '.join(why)}. This verdict does not cover them."])
    missing = int((result.parity["verdict"] == "missing").sum())
    if missing:
        notes.append([f"**{missing} (case, tensor) row(s) are in one file only** and were allowed "
                      f"(--allow-missing): this gate covers a subset."])
    made_apart = provenance_mismatch(result)
    if made_apart:
        notes.append([f"**The two sides were made apart**: {'; '.join(made_apart)}."])
    gpu_candidate = gpu_platform_note(result)
    if gpu_candidate:
        notes.append([gpu_candidate])
    if "emulated" in set(result.baseline["mode"].dropna()) | set(result.candidate["mode"].dropna()):
        note = ["Emulated rows ran on CPU (Triton interpreter / Pallas interpret mode with the MXU model); "
                "they are not hardware numbers."]
        if "emulated" in set(result.candidate["mode"].dropna()) and not gpu_candidate:
            note.append(compiled_note(result.candidate))
        notes.append(note)
    return notes


def provenance_mismatch(result: GateResult) -> list[str]:
    """Where the baseline's and the candidate's rows were made apart, one clause each: another commit of this
    harness, or another version of a package both sides record (jax, say)."""
    clauses = []
    ours, theirs = column_values(result.baseline, "git_commit"), column_values(result.candidate, "git_commit")
    if ours and theirs and ours != theirs:
        clauses.append(f"the baseline's rows come from commit {', '.join(ours)}, the candidate's from "
                       f"{', '.join(theirs)}")
    a, b = package_versions(result.baseline), package_versions(result.candidate)
    for package in sorted(set(a) & set(b)):
        if a[package] != b[package]:
            clauses.append(f"{package} {a[package]} on the baseline's side, {b[package]} on the candidate's")
    return clauses


def gpu_platform_note(result: GateResult) -> str:
    """For a candidate whose rows say it is a GPU implementation (its settings' ``platform``, written by the candidate
    leg: harness.legs.external), what its verdict means; else ''. No TPU compile or MXU model applies to it."""
    if GPU_ONLY not in settings_values(result.candidate, "platform"):
        return ""
    ran = result.candidate[result.candidate["status"] != "unsupported"]
    where = (f"{ran['case_id'].nunique()} case(s) ran on {', '.join(sorted(set(ran['device'].dropna().astype(str))))}"
             if len(ran) else "no case ran here: every one was refused for want of a GPU")
    return (f"**A GPU candidate** ({result.candidate_leg}), {GPU_ONLY.removeprefix('GPU: ')}: "
            f"ε_{result.candidate_leg} is its error on a GPU against the float64 reference, as ε_{result.baseline_leg} is "
            f"the {result.baseline_leg} leg's; {where}.")


def eps_labels(result: GateResult) -> tuple[str, str]:
    """The column headings of the two sides' ε: ε_GPU and ε_TPU for the built-in pair of legs, else the legs'
    names (:func:`harness.judge.gate.side_labels`)."""
    return tuple(f"ε_{side}" for side in side_labels(result.baseline_leg, result.candidate_leg))


def markdown(result: GateResult) -> str:
    p = result.parity
    counts = p.groupby("verdict").size().to_dict()
    lines = [
        f"## Linear-attention parity: {result.headline}",
        "",
        f"Rule: {result.policy.describe()}.",
        "",
        f"- baseline ({result.baseline_leg}): {provenance_line(result.baseline)}",
        f"- candidate ({result.candidate_leg}): {provenance_line(result.candidate)}",
    ]
    for note in gate_notes(result):
        lines.append("")
        for i, paragraph in enumerate(note):
            lines += [">"] * bool(i) + [f"> {paragraph}"]
    lines += ["", "| verdict | rows |", "|---|---|"] + [f"| {v} | {n} |" for v, n in sorted(counts.items())]
    cleared = p[(p["verdict"] == "pass") & p["ratio_lower"].notna()]
    if len(cleared):
        lines += ["", f"> {len(cleared)} rel_l2 comparison(s) exceeded the margin within sampling noise (the "
                      f"paired block bootstrap's lower bound of the ratio is within 1 + margin): they pass, and "
                      f"the table below shows their bound."]
    eb, ec = eps_labels(result)
    fails = result.failures
    if len(fails):
        lines += ["", "### Failures", "", f"| case | tensor | metric | {eb} | {ec} | ratio | reason | repro |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in fails.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {r['metric']} | {fmt(r['eps_gpu'])} | "
                         f"{fmt(r['eps_tpu'])} | {fmt(r['ratio'])} | {r['reason']} | `{fmt(r['repro'])}` |")
    undecided = result.inconclusive
    if len(undecided):
        more = f"`--draws {result.draws_needed}`" if result.draws_needed else "no more draws (the cap)"
        lines += ["", "### Inconclusive: not decided by the draws in the files", "",
                  f"Each failed its own draw's rule, and the draws of its case do not decide whether the ratio is "
                  f"beyond the margin (`harness/core/noise.py`, the sequential test). This is not a pass: run both legs "
                  f"with {more} (`parity all` does so itself).", "",
                  f"| case | tensor | metric | {eb} | {ec} | ratio | draws | reason |", "|---|---|---|---|---|---|---|---|"]
        for r in undecided.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {r['metric']} | {fmt(r['eps_gpu'])} | "
                         f"{fmt(r['eps_tpu'])} | {fmt(r['ratio'])} | {fmt(r['draws'])} | {r['reason']} |")
    rel = p[p["metric"] == "rel_l2"]
    if len(rel):
        lines += ["", "<details><summary>rel_l2 per case and tensor</summary>", "",
                  "TPU MXU cost: the case's modeled bf16-pass multiply-adds over one pass per dot, forward and "
                  "backward (1.0× = every dot one bf16 pass; `HIGHEST` is 6×); modeled in emulation, not timed.",
                  "", f"| case | tensor | {eb} | {ec} | ratio | bootstrap bound | TPU MXU cost | verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rel.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {fmt(r['eps_gpu'])} | {fmt(r['eps_tpu'])} | "
                         f"{fmt(r['ratio'])} | {fmt(r['ratio_lower'])} | {_cost(r.get('tpu_mxu_cost'))} | "
                         f"{r['verdict']} |")
        lines += ["", "</details>"]
    other = p[(p["metric"] == "status") & (p["verdict"] != "fail")]
    if len(other):
        lines += ["", "<details><summary>rows without a metric comparison</summary>", "",
                  "| case | tensor | verdict | reason |", "|---|---|---|---|"]
        for r in other.to_dict("records"):
            lines.append(f"| `{r['case_id']}` | {r['tensor']} | {r['verdict']} | {r['reason']} |")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
