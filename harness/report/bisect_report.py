"""``parity bisect``'s history report, from stored records only (the comparisons per version, the versions with
the dates read when they were resolved, the crossings): ``history.csv`` (one row per version × comparison),
``history.md`` (the table of ratio and verdict, version by version, and each comparison's first crossing in words
with its repro), ``history.png`` (the ratio over the versions, one panel per tensor) and ``history.html`` (both,
the plot inline as a ``data:`` PNG; nothing is fetched when it is viewed)."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.core.results import atomic_write_bytes, atomic_write_text, write_csv
from harness.report.peer_table import md_table

_MARK = {"pass": ("o", "tab:blue"), "fail": ("X", "tab:red"), "inconclusive": ("D", "tab:orange")}


def _cell(r) -> str:
    if r is None:
        return "not measured"
    if r["verdict"] in ("pass", "fail", "inconclusive") and not math.isnan(r["ratio"]):
        return f"{r['ratio']:.3g} {r['verdict']}"
    return str(r["verdict"])


def wide(table: pd.DataFrame, versions: list[dict]) -> pd.DataFrame:
    """Comparison (case, tensor) × version: 'ratio verdict' per cell."""
    names = [v["version"] for v in versions]
    by = {(r["case_id"], r["tensor"], r["version"]): r for r in table.to_dict("records")}
    keys = list(dict.fromkeys(zip(table["case_id"], table["tensor"])))
    return pd.DataFrame([{"case": c, "tensor": t, **{n: _cell(by.get((c, t, n))) for n in names}} for c, t in keys],
                        columns=["case", "tensor", *names])


def plot(table: pd.DataFrame, versions: list[dict]) -> bytes:
    """The ratio to the baseline over the versions (x: version order), one panel per tensor, one line per case;
    markers by verdict, the rule's line at 1."""
    names = [v["version"] for v in versions]
    x = {n: i for i, n in enumerate(names)}
    tensors = list(dict.fromkeys(table["tensor"])) or ["-"]
    fig = Figure(figsize=(max(6.0, 0.45 * len(names) + 2), 2.6 * len(tensors) + 0.6), layout="constrained")
    axes = fig.subplots(len(tensors), 1, squeeze=False, sharex=True)[:, 0]
    for ax, tensor in zip(axes, tensors):
        part = table[(table["tensor"] == tensor) & table["ratio"].notna() & (table["ratio"] > 0)
                     & table["ratio"].map(lambda r: math.isfinite(r))]
        for case_id, rows in part.groupby("case_id", sort=False):
            rows = rows.sort_values("version", key=lambda s: s.map(x))
            ax.plot(rows["version"].map(x), rows["ratio"], lw=0.8, alpha=0.6, color="0.5")
            for verdict, (marker, colour) in _MARK.items():
                hit = rows[rows["verdict"] == verdict]
                ax.scatter(hit["version"].map(x), hit["ratio"], marker=marker, color=colour, s=18, zorder=3)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_ylabel(f"{tensor}: eps/eps_base")
        ax.grid(alpha=0.3)
    axes[-1].set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    axes[0].set_title("ratio to the baseline per version (o pass, X fail, D inconclusive; dashed: the rule)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _date(v: dict) -> str:
    return (v.get("date") or "")[:10] or "unknown"


def sentences(crossings: list[dict], mode: str) -> list[str]:
    """Each comparison's first crossing in words, with its repro."""
    lines, seen = [], set()
    for c in crossings:
        key = (c["case_id"], c["tensor"])
        if key in seen:
            continue
        seen.add(key)
        if not c.get("after"):
            lines.append(f"- `{c['case_id']}` **{c['tensor']}**: {c['note']}.")
            continue
        between = f" ({c['unjudged']} between could not be judged)" if c.get("unjudged") else ""
        lines.append(f"- `{c['case_id']}` **{c['tensor']}** first changes verdict at **{c['after']}**: "
                     f"{c['verdict_before']} at {c['before']} (ratio {c['ratio_before']:.3g}) → {c['verdict_after']} "
                     f"(ratio {c['ratio_after']:.3g}){between}; {c['note']}.\n  repro: `{c['repro']}`")
    return lines or [f"- no comparison changes verdict over the versions {'measured' if mode == 'bisect' else 'swept'}."]


def write(out: Path, table: pd.DataFrame, versions: list[dict], crossings: list[dict], meta: dict) -> list[Path]:
    """history.csv, history.md, history.png and history.html under ``out``; returns their paths."""
    out = Path(out)
    measured = [v for v in versions if v["version"] in set(table["version"])]
    dates = {v["version"]: _date(v) for v in versions}
    table = table.assign(date=table["version"].map(dates))
    csv_path = write_csv(table, out / "history.csv")
    write_csv(pd.DataFrame(crossings), out / "crossings.csv")
    png = plot(table, measured)
    atomic_write_bytes(out / "history.png", png)
    grid = wide(table, measured)
    state = pd.DataFrame([{"version": v["version"], "date": _date(v), "state": v.get("state", "not measured"),
                           "reason": v.get("reason", "")} for v in versions])
    words = sentences(crossings, meta["mode"])
    md = [f"# {meta['leg']}: history against {meta['baseline_leg']}", "",
          f"{meta['what']}", "",
          f"Command: `{meta['command']}`", "",
          "## First crossing of each comparison", "", *words, "",
          "## Versions", "", "\n".join(md_table(state)), "",
          "## Ratio to the baseline and verdict, per version (rel_l2; `ratio verdict`)", "",
          "\n".join(md_table(grid)), "", "![ratio over versions](history.png)", ""]
    if meta.get("notes"):
        md[4:4] = ["Notes: " + "; ".join(meta["notes"]), ""]
    atomic_write_text(out / "history.md", "\n".join(md))
    page = ["<!doctype html><meta charset=utf-8><title>parity bisect</title>",
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}</style>",
            f"<h1>{html.escape(meta['leg'])}: history against {html.escape(meta['baseline_leg'])}</h1>",
            f"<p>{html.escape(meta['what'])}</p><p><code>{html.escape(meta['command'])}</code></p>",
            f"<img alt='ratio over versions' src='data:image/png;base64,{base64.b64encode(png).decode()}'>",
            "<h2>First crossing of each comparison</h2><ul>",
            *[f"<li>{html.escape(w[2:])}</li>" for w in words], "</ul><h2>Versions</h2>",
            state.to_html(index=False, escape=True), "<h2>Ratio and verdict per version</h2>",
            grid.to_html(index=False, escape=True)]
    atomic_write_text(out / "history.html", "\n".join(page))
    return [csv_path, out / "history.md", out / "history.png", out / "history.html"]
