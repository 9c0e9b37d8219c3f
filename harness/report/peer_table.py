"""One table for every peer (``parity peers``): the rows of every candidate's report under ``reports/peers/``,
side by side per op, variant, dtype and gate form.

A report is a folder holding the baseline's rows (``gpu.csv`` or ``gpu.csv.gz``) and, beside them, each candidate's
(``<leg>.csv[.gz]``, the file named after the leg its rows name: ``tpu`` for this project's kernels, ``tops``,
``tpu-inference``, ``sglang-jax``, ...; :func:`candidate_frames`). The variant is labelled with the case's
convolution in front (``conv1d=W``) and a server's calls (``pool=S``, ``decode=n``: :func:`variant_label`), which
candidates map differently. Each report is judged with the shipped policy against its baseline of record
(:func:`harness.judge.baseline.baseline_of_record`: fla's native rows, ``reports/h200-native``, where they hold the
case, tensor and inputs, else the report's own fla rows) (:func:`harness.report.peer_report.peer_table`: per case
and forward tensor, ε_candidate / ε_fla on rel-L2, the gate's verdict and the ``baseline`` mode that judged it). A
(candidate, case, tensor) that several reports hold is taken from the report made last (its own baseline rows' newest
``timestamp``).

Per (op, variant, dtype, gate form) and candidate, a cell says:

- ``gm×``: the geometric mean of ε_candidate / ε_fla over the forward tensors both measured (``ok``), ``max×`` the
  largest, ``n`` how many;
- how many of them the gate failed (``fail``) or could not decide (``inconclusive``);
- how many cases the candidate refused (``unsupported``) or broke on (``error``: a crash, a wrong shape, a
  non-finite output);
- which fla rows judged its cases: ``fla native``, ``fla emulated``, or ``fla native k/n`` (:func:`baseline_words`).

The compile table counts, per candidate and target, the cases it ran (not refused) whose rows say they were compiled
for that target (``compiled_for``), the Pallas kernels per case (a case with none ran plain JAX or XLA) and the stack
(jax, libtpu) the rows ran on. The findings table lists each report's ``findings.toml`` (``[[finding]]``
tables with ``candidate``, ``title`` and ``link``, relative to that report's folder): what a person located and
wrote up, linked, counted per candidate.

Everything but the findings is computed from rows; ``parity peers`` writes ``README.md`` and ``index.html`` in the
folder it reads, and ``tests/test_peer_table.py`` fails when the committed page differs from what the rows give.
"""

from __future__ import annotations

import html
import json
import math
import tomllib
from pathlib import Path

import pandas as pd

from cases.case import Case

from harness.legs.registry import default_leg
from harness.ops.serving import OPTIONS as SERVING_OPTIONS
from harness.judge.baseline import NATIVE, baseline_of_record
from harness.report.peer_report import FORWARD, peer_table
from harness.core.policy import Policy
from harness.core.results import read_table

TARGETS = ("v5e", "v6e", "v7x")
CASE_COLUMNS = ("compiled_for", "kernels_traced", "kernels_mosaic", "versions")
"""What a candidate's rows say once per case: where it compiled, how many Pallas kernels it ran, on which stack."""
STACK = ("jax", "libtpu")
FINDINGS = "findings.toml"


def result_file(folder: Path, stem: str) -> Path | None:
    return next((p for p in (folder / f"{stem}.csv", folder / f"{stem}.csv.gz") if p.exists()), None)


def report_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` (itself included) that holds baseline rows, in path order."""
    base = default_leg("baseline")
    return sorted({p.parent for pattern in (f"{base}.csv", f"{base}.csv.gz") for p in Path(root).rglob(pattern)})


def candidate_frames(folder: Path) -> list[pd.DataFrame]:
    """The candidates' rows of one report: each ``<leg>.csv[.gz]`` or ``<what>.<leg>.csv[.gz]`` (e.g. the rows of
    the cases a candidate breaks on, kept apart) whose rows all name ``leg`` (not the baseline's or the
    reference's), in name order."""
    frames = []
    for path in sorted(folder.iterdir()):
        suffix = next((x for x in (".csv", ".csv.gz") if path.name.endswith(x)), None)
        leg = path.name[:-len(suffix)].rpartition(".")[2] if suffix else ""
        if not leg or leg in (default_leg("baseline"), default_leg("reference")):
            continue
        frame = read_table(path)
        if {"leg", "case_id", "tensor", "rel_l2"} <= set(frame.columns) and set(frame["leg"]) == {leg}:
            frames.append(frame)
    return frames


def gate_form(case: Case) -> str:
    """The case's gates: ``g``, ``g_gamma[H]`` (its form: ``[]`` one for every head, ``[H]``, ``[H,K]``), both
    joined by ``+``; ``(in kernel)`` when the op computes the gate from A_log and dt_bias."""
    forms = ["g" if gate.kind == "g" else f"g_gamma[{gate.gamma_shape}]" for gate in case.gates]
    return "+".join(forms) + (" (in kernel)" if case.opt.get("use_gate_in_kernel") else "")


def all_rows(root: Path, policy: Policy, native: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every report's :func:`harness.report.peer_report.peer_table` rows, with its folder, one per (candidate, case,
    tensor): the newest report's. Each report's fla rows are its baseline of record
    (:func:`harness.judge.baseline.baseline_of_record`): ``native`` rows where they hold the case, tensor and
    inputs, else its own."""
    tables = []
    for folder in report_folders(root):
        own = read_table(result_file(folder, default_leg("baseline")))
        baseline = own if native is None else baseline_of_record(own, native)
        candidates = candidate_frames(folder)
        if not candidates:
            continue
        table = peer_table(baseline, candidates, policy)
        table["report"] = folder.relative_to(root).as_posix() or "."
        table["made"] = str(own["timestamp"].max())  # when the report was made, whichever fla rows judge it
        case_rows = pd.concat(candidates).reindex(columns=["case_id", "leg", *CASE_COLUMNS])
        case_rows = case_rows.drop_duplicates(["case_id", "leg"])
        table = table.drop(columns="compiled_for").merge(
            case_rows.rename(columns={"leg": "candidate"}), on=["case_id", "candidate"], how="left")
        tables.append(table)
    if not tables:
        raise ValueError(f"no report under {root}: a report is a folder with gpu.csv[.gz] and its candidates' rows")
    rows = pd.concat(tables, ignore_index=True).sort_values(["made", "report"], kind="stable")
    rows = rows.drop_duplicates(["candidate", "case_id", "tensor"], keep="last")
    cases = {cid: Case.from_id(cid) for cid in rows["case_id"].unique()}
    rows["op"] = rows["case_id"].map(lambda c: cases[c].op)
    rows["variant"] = rows["case_id"].map(lambda c: variant_label(cases[c]))
    rows["dtype"] = rows["case_id"].map(lambda c: cases[c].dtype)
    rows["gate"] = rows["case_id"].map(lambda c: gate_form(cases[c]))
    return rows.reset_index(drop=True)


LABELLED_OPTIONS = ("conv1d", *SERVING_OPTIONS)
"""The case options a variant's label names: the convolution in front, and a server's calls (a state pool, decode
steps), which candidates map differently from a plain call."""


def variant_label(case: Case) -> str:
    """The case's variant and its :data:`LABELLED_OPTIONS` (``chunk conv1d=4 pool=11``)."""
    return " ".join([case.variant, *(f"{k}={case.opt[k]}" for k in LABELLED_OPTIONS if case.opt.get(k))])


GROUP = ["op", "variant", "dtype", "gate"]


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, variant, dtype, gate form, candidate): the cell's numbers (see the module doc)."""
    out = []
    for key, group in rows.groupby(GROUP + ["candidate"], sort=True):
        fwd = group[group["tensor"].isin(FORWARD)]
        measured = fwd[(fwd["status"] == "ok") & (fwd["ratio"] > 0)]
        ratios = measured["ratio"].astype(float)
        per_case = fwd.groupby("case_id")["status"].agg(set)
        judged = fwd.dropna(subset=["baseline"]).drop_duplicates("case_id")
        out.append(dict(zip(GROUP + ["candidate"], key),
                        n=len(ratios),
                        gm=math.exp(ratios.map(math.log).mean()) if len(ratios) else math.nan,
                        worst=ratios.max() if len(ratios) else math.nan,
                        fail=int((fwd["verdict"] == "fail").sum()),
                        inconclusive=int((fwd["verdict"] == "inconclusive").sum()),
                        cases=len(per_case),
                        unsupported=int(per_case.map(lambda s: s == {"unsupported"}).sum()),
                        error=int(per_case.map(lambda s: "error" in s or "nonfinite" in s).sum()),
                        fla_native=int((judged["baseline"] == NATIVE).sum()), fla_cases=len(judged),
                        reports=" ".join(sorted(group["report"].unique()))))
    return pd.DataFrame(out)


def cell(r) -> str:
    """One candidate's cell (see the module doc)."""
    parts = []
    if r.n:
        parts.append(f"{r.gm:.2f}× (max {r.worst:.3g}×, n {r.n})")
    if r.fail or r.inconclusive:
        parts.append(", ".join(f"{count} {word}" for count, word in ((r.fail, "fail"),
                                                                     (r.inconclusive, "inconclusive")) if count))
    if r.error:
        parts.append(f"{r.error}/{r.cases} error")
    if r.unsupported:
        parts.append(f"{r.unsupported}/{r.cases} unsupported")
    if parts and r.fla_cases:
        parts.append(baseline_words(r.fla_native, r.fla_cases))
    return "; ".join(parts) or "–"


def baseline_words(native: int, cases: int) -> str:
    """Which fla rows judged a cell's cases: ``fla native``, ``fla emulated``, or ``fla native k/n`` when only k of
    its n cases had native rows."""
    if native == cases:
        return "fla native"
    return "fla emulated" if native == 0 else f"fla native {native}/{cases}"


def pallas_kernels(group: pd.DataFrame) -> str:
    """The Pallas kernels a candidate's cases ran: ``min–max`` per case (Mosaic's count where the case compiled,
    else the count traced), and how many ran none, the sign of a fallback to plain JAX or XLA. Only cases that
    ran to their outputs count: one that broke (``error``) may have stopped before its first kernel."""
    done = group[group["status"] == "ok"]
    counts = done["kernels_mosaic"].fillna(done["kernels_traced"]).dropna().astype(int)
    if counts.empty:
        return "–"
    text = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}–{counts.max()}"
    none = int((counts == 0).sum())
    return text + (f" ({none} with none)" if none and counts.max() else "")


def stacks(group: pd.DataFrame) -> str:
    """The stacks a candidate's rows ran on: jax and libtpu, from the rows' ``versions``."""
    found = set()
    for text in group["versions"].dropna():
        versions = json.loads(text)
        found.add(", ".join(f"{name} {versions[name]}" for name in STACK if name in versions))
    return "; ".join(sorted(found)) or "–"


def compile_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """Per candidate: cases run (not refused) and, per target, how many of them were compiled for it; the Pallas
    kernels per case (:func:`pallas_kernels`) and the stack (:func:`stacks`)."""
    ran = rows[rows["status"] != "unsupported"].drop_duplicates(["candidate", "case_id"])
    out = []
    for candidate, group in ran.groupby("candidate"):
        targets = group["compiled_for"].fillna("").map(lambda s: set(s.split(",")) if s else set())
        out.append({"candidate": candidate, "cases run": len(group),
                    **{t: int(targets.map(lambda s, t=t: t in s).sum()) for t in TARGETS},
                    "Pallas kernels per case": pallas_kernels(group), "stack": stacks(group)})
    return pd.DataFrame(out)


def findings(root: Path) -> list[dict]:
    """Every report's ``findings.toml`` entries, each with its link made relative to ``root``."""
    out = []
    for path in sorted(Path(root).rglob(FINDINGS)):
        folder = path.parent.relative_to(root).as_posix()
        for f in tomllib.loads(path.read_text())["finding"]:
            out.append({"candidate": f["candidate"], "title": f["title"], "link": f"{folder}/{f['link']}",
                        "report": folder})
    return out


def _candidates(summary: pd.DataFrame) -> list[str]:
    """Column order: this project's kernels (the built-in candidate) first, then the peers by name."""
    ours = default_leg("candidate")
    names = sorted(summary["candidate"].unique())
    return ([ours] if ours in names else []) + [n for n in names if n != ours]


def tables(root: Path, policy: Policy, native: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The page's tables: ``ops`` (one row per op, variant, dtype, gate form; one column per candidate),
    ``compile`` and ``findings``, and ``judged``: how many (candidate, case, forward tensor) rows each mode of fla
    rows judged; ``native``: fla's native rows, the baseline of record where they hold a case."""
    rows = all_rows(root, policy, native)
    summary = summarize(rows)
    names = _candidates(summary)
    summary["cell"] = summary.apply(cell, axis=1)
    ops = summary.pivot_table(index=GROUP, columns="candidate", values="cell", aggfunc="first").reindex(
        columns=names).fillna("").reset_index()
    found = pd.DataFrame(findings(root), columns=["candidate", "title", "link", "report"])
    judged = rows.dropna(subset=["baseline"]).groupby("baseline").size().to_dict()  # which fla rows judged them
    return {"judged": judged, "ops": ops, "compile": compile_counts(rows).set_index("candidate").reindex(
        names).dropna(how="all").reset_index(), "findings": found}


def md_table(frame: pd.DataFrame) -> list[str]:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |")
    return lines


HEAD = """# Every peer against fla, side by side

Made by `parity peers` from the rows of every report under this folder, never edited by hand (its test fails when
it differs from them). A cell: ε_candidate / ε_fla on rel-L2 over the forward tensors (o, ht; conv_ht where the
case convolves) both measured, as a geometric mean (max, n); how many of those the shipped policy's gate failed or
could not decide; how many cases the candidate broke on (error) or refused (unsupported). `tpu` is this project's
kernels. An empty cell: no report ran that candidate on such cases. Each case is judged on fla's native rows
(`reports/h200-native`, an H200) where they hold its inputs, else on its report's own fla rows (emulated: the Triton
interpreter); each cell ends with which (`fla native`, `fla emulated`, or `fla native k/n` cases). Where reports
share a case, the newest one's rows count. Definitions: `harness/report/peer_table.py`,
`harness/judge/baseline.py`.
"""


def markdown(t: dict[str, pd.DataFrame]) -> str:
    lines = [HEAD]
    for op, frame in t["ops"].groupby("op", sort=True):
        lines += [f"## {op}", ""] + md_table(frame.drop(columns="op")) + [""]
    lines += ["## Compiled for real TPUs", "",
              "Cases each candidate ran (not refused); how many of them compiled for each target (libtpu, "
              "deviceless); the Pallas kernels per case (Mosaic's count, else the count traced: a case with none "
              "ran plain JAX or XLA); the jax and libtpu its rows ran on.", ""] + md_table(t["compile"]) + [""]
    lines += ["## Located findings", ""]
    counts = t["findings"].groupby("candidate").size()
    lines += [", ".join(f"{c}: {n}" for c, n in counts.items()) + "." if len(counts) else "None declared.", ""]
    for f in t["findings"].itertuples(index=False):
        lines.append(f"- **{f.candidate}**: [{f.title}]({f.link})")
    return "\n".join(lines) + "\n"


def html_page(t: dict[str, pd.DataFrame]) -> str:
    """The same tables as one self-contained page (inline CSS, no script)."""
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#eee}")
    parts = [f"<!doctype html><meta charset='utf-8'><title>Every peer against fla</title><style>{style}</style>",
             "<h1>Every peer against fla, side by side</h1>",
             "<p>" + html.escape(HEAD.split("\n", 2)[2].replace("\n", " ")) + "</p>"]
    for op, frame in t["ops"].groupby("op", sort=True):
        parts += [f"<h2>{html.escape(op)}</h2>", frame.drop(columns="op").to_html(index=False)]
    parts += ["<h2>Compiled for real TPUs</h2>", t["compile"].to_html(index=False), "<h2>Located findings</h2><ul>"]
    parts += [f"<li><b>{html.escape(f.candidate)}</b>: <a href='{html.escape(f.link)}'>{html.escape(f.title)}</a>"
              for f in t["findings"].itertuples(index=False)]
    return "\n".join(parts) + "</ul>\n"


def write_pages(root, policy, native, check: bool = False, force: bool = False, say=print) -> bool:
    """``root``/README.md and index.html from every report's rows under ``root`` (:func:`tables`), judged under
    ``policy`` beside fla's ``native`` rows. ``check``: write nothing, and say whether the pages match the rows.
    Returns False when ``check`` finds them stale. A README.md this did not write is a ValueError unless ``force``."""
    from pathlib import Path

    from harness.core.results import atomic_write_text

    root = Path(root)
    t = tables(root, policy, native)
    pages = {root / "README.md": markdown(t), root / "index.html": html_page(t)}
    if check:
        stale = [str(p) for p, text in pages.items() if not p.exists() or p.read_text() != text]
        say(f"peers: {', '.join(stale)} differ from the rows; run parity peers --root {root}" if stale
            else f"peers: {root}/README.md and index.html match the rows")
        return not stale
    mine = root / "README.md"
    if mine.exists() and not mine.read_text().startswith(HEAD.splitlines()[0]) and not force:
        raise ValueError(f"{mine} was not written by parity peers; --force replaces it")
    for path, text in pages.items():
        atomic_write_text(path, text)
    say(f"peers: {len(t['ops'])} rows (op, variant, dtype, gate form) x {len(t['ops'].columns) - 4} candidates "
        f"-> {mine}, {root / 'index.html'}; judged against fla's "
        + ", ".join(f"{mode} rows on {n}" for mode, n in sorted(t["judged"].items())))
    return True
