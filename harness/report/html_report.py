"""The gate's report to look at: ``parity.html`` (self-contained) and ``parity.png`` (its heatmap).

The heatmap shows ε_TPU/ε_GPU of one gated metric (rel_l2 when the policy gates it, else the policy's first
gated metric) per case × tensor on a logarithmic colour scale centred on 1: red where the TPU's error is
larger, blue where it is smaller. A (case, tensor) with a ``fail`` verdict on any metric or status is outlined
and crossed in :data:`FAIL_COLOR`, a colour the colour map never takes; one with no ratio on that metric
(unsupported, not provided, bounds only, missing, or a failing status) is grey; a tensor the case does not
have is left blank.

``parity.html`` holds the verdict counts, the heatmap (the same PNG, as a ``data:`` URI), the rows (failing
rows first, each with its repro) and the run's provenance. It loads nothing: no script, no stylesheet, no
font, no image from anywhere else. The figure is drawn with matplotlib's object API on the Agg canvas (no
pyplot, no global state).
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.colors import LogNorm, to_rgba
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle

from harness.core.results import atomic_write_bytes, atomic_write_text, provenance_line

from harness.judge.gate import side_labels
from harness.report.reports import fmt, eps_labels, gate_notes
if TYPE_CHECKING:
    from harness.judge.gate import GateResult

CMAP = "RdBu_r"
"""Diverging: blue (TPU error smaller) through white (equal) to red (TPU error larger)."""
FAIL_COLOR = "#ff00ff"
"""Marks failing cells; magenta is on no point of :data:`CMAP`, so a failure cannot pass for a ratio."""
NO_RATIO_COLOR = "#a0a0a0"
CELL_EDGE_COLOR = "#d0d0d0"
DPI = 100
CELL_W, CELL_H = 0.55, 0.24
"""Inches per heatmap cell."""
MAX_DECADES = 6
"""The colour scale spans at most 10^-6..10^6; ratios beyond (and 0, ∞) take the end colours."""
MAX_PIXELS = 60000
"""Agg's limit is 2^16 pixels a side: a taller heatmap is drawn at a lower resolution."""
COLUMN_FONT = 8
"""Points, for the tensor names over the columns. They stand upright: a column is CELL_W wide and a name such as
``dconv_weight`` is wider than that lying down, so lying labels of neighbouring columns ran into each other."""


@dataclass(frozen=True)
class Heatmap:
    """The heatmap's numbers: one row per case, one column per tensor, in the order the gate met them."""

    metric: str
    cases: list[str]
    tensors: list[str]
    ratio: np.ndarray  # eps_tpu / eps_gpu; NaN where there is no ratio on `metric`
    present: np.ndarray  # the case has this tensor (a row in the gate result)
    failing: np.ndarray  # some row of this (case, tensor) has the verdict "fail"
    decades: int  # the colour scale spans 10^-decades .. 10^decades

    @property
    def norm(self) -> LogNorm:
        return LogNorm(vmin=10.0 ** -self.decades, vmax=10.0 ** self.decades)

    def colors(self) -> np.ndarray:
        """RGBA per cell: the colour map on the clipped ratio, grey without one, white where absent."""
        norm = self.norm
        clipped = np.clip(np.nan_to_num(self.ratio, nan=1.0), norm.vmin, norm.vmax)
        rgba = colormaps[CMAP](norm(clipped))
        rgba[self.present & np.isnan(self.ratio)] = to_rgba(NO_RATIO_COLOR)
        rgba[~self.present] = to_rgba("white")
        return rgba


def heatmap_metric(result: GateResult) -> str:
    """The metric the heatmap shows: rel_l2 when gated, else the policy's first gated metric."""
    metrics = tuple(result.policy.metrics)
    return "rel_l2" if "rel_l2" in metrics else metrics[0]


def heatmap_data(result: GateResult) -> Heatmap:
    metric = heatmap_metric(result)
    p = result.parity[result.parity["metric"] != "coverage"]  # the gate-wide coverage row names no case
    cases = list(dict.fromkeys(p["case_id"]))
    tensors = list(dict.fromkeys(p["tensor"]))
    row = {c: i for i, c in enumerate(cases)}
    col = {t: j for j, t in enumerate(tensors)}
    shape = (len(cases), len(tensors))
    ratio, present, failing = np.full(shape, np.nan), np.zeros(shape, bool), np.zeros(shape, bool)
    for r in p.to_dict("records"):
        i, j = row[r["case_id"]], col[r["tensor"]]
        present[i, j] = True
        failing[i, j] |= r["verdict"] in ("fail", "inconclusive")
        if r["metric"] == metric and r["ratio"] is not None and not math.isnan(r["ratio"]):
            ratio[i, j] = r["ratio"]
    positive = ratio[np.isfinite(ratio) & (ratio > 0)]
    spread = float(np.abs(np.log10(positive)).max()) if positive.size else 0.0
    decades = int(min(max(math.ceil(spread), 1), MAX_DECADES))
    return Heatmap(metric, cases, tensors, ratio, present, failing, decades)


def heatmap_figure(h: Heatmap, title: str, sides: tuple[str, str] = ("GPU", "TPU")) -> Figure:
    """The heatmap as a matplotlib Figure under ``title`` (tick labels stick out left; save with
    ``bbox_inches="tight"``); ``sides``: what the baseline and the candidate are called (harness.judge.gate.side_labels)."""
    base, cand = sides
    n, m = len(h.cases), len(h.tensors)
    if n == 0:
        fig = Figure(figsize=(4, 1), dpi=DPI)
        fig.text(0.5, 0.7, title, ha="center", va="center", fontsize=10, weight="bold")
        fig.text(0.5, 0.3, "no (case, tensor) rows to show", ha="center", va="center")
        return fig
    labels_h = _longest_text_inches(h.tensors, COLUMN_FONT) + 0.05
    top, bottom, legend_w = 0.85 + labels_h, 0.1, 2.6
    ax_w, ax_h = m * CELL_W, n * CELL_H
    width, height = ax_w + legend_w, max(ax_h, 2.6) + top + bottom
    fig = Figure(figsize=(width, height), dpi=DPI, facecolor="white")
    ax = fig.add_axes((0, (height - top - ax_h) / height, ax_w / width, ax_h / height))
    ax.imshow(h.colors(), aspect="auto", interpolation="nearest")
    ax.add_collection(PatchCollection(
        [Rectangle((j - 0.5, i - 0.5), 1, 1) for i, j in zip(*np.nonzero(h.present))],
        facecolor="none", edgecolor=CELL_EDGE_COLOR, linewidth=0.5))
    segments = []
    for i, j in zip(*np.nonzero(h.failing)):
        x0, x1, y0, y1 = j - 0.38, j + 0.38, i - 0.3, i + 0.3
        segments += [[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)], [(x0, y0), (x1, y1)], [(x0, y1), (x1, y0)]]
    if segments:
        ax.add_collection(LineCollection(segments, colors=FAIL_COLOR, linewidths=2.5))
    ax.set_xlim(-0.5, m - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xticks(range(m), h.tensors, fontsize=COLUMN_FONT, rotation=90, ha="center", va="bottom")
    ax.set_yticks(range(n), h.cases, fontsize=7)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(f"ε_{cand} / ε_{base} ({h.metric})", fontsize=10, pad=8 + 72 * labels_h, loc="left")
    fig.text(0, 1 - 0.2 / height, title, fontsize=11, weight="bold", va="top")
    bar_h = min(max(ax_h, 2.6), 4.0) - 0.9
    cax = fig.add_axes(((ax_w + 0.35) / width, (height - top - bar_h) / height, 0.18 / width, bar_h / height))
    fig.colorbar(ScalarMappable(norm=h.norm, cmap=colormaps[CMAP]), cax=cax)
    cax.set_ylabel(f"ε_{cand} / ε_{base}", fontsize=8)
    cax.tick_params(labelsize=7)
    fig.text((ax_w + 0.35) / width, (height - top - bar_h - 0.15) / height,
             f"red: {cand} error larger\nblue: {cand} error smaller\ngrey: no ratio\noutlined X: fails the gate",
             fontsize=7.5, va="top", linespacing=1.4)
    return fig


def _longest_text_inches(texts: list[str], fontsize: float) -> float:
    """The width in inches of the widest of ``texts`` set in ``fontsize`` points (Agg's own text metrics)."""
    renderer, font = RendererAgg(1, 1, DPI), FontProperties(size=fontsize)
    return max(renderer.get_text_width_height_descent(t, font, ismath=False)[0] for t in texts) / DPI


def png_bytes(fig: Figure) -> bytes:
    height_px = fig.get_figheight() * DPI
    dpi = DPI if height_px <= MAX_PIXELS else DPI * MAX_PIXELS / height_px
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.15, facecolor="white")
    return buf.getvalue()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# -------------------------------------------------------------------- the page
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _inline(markdown_text: str) -> str:
    """The inline Markdown the gate's texts use (``**bold**``, ```code```) as escaped HTML."""
    text = html.escape(markdown_text, quote=False)
    return _CODE.sub(r"<code>\1</code>", _BOLD.sub(r"<strong>\1</strong>", text))


_PAGE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Linear-attention parity: $verdict</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #1a1a1a; max-width: none; }
h1.pass { color: #1b6e20; } h1.fail { color: #a40000; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #c8c8c8; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #eeeeee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fbe3e4; }
tr.fail td.verdict { color: #a40000; font-weight: bold; }
blockquote { border-left: 4px solid #c8c8c8; margin: 0.8em 0; padding: 0.2em 0.8em; color: #444444; }
code { font-size: 12px; word-break: break-all; }
.heatmap { overflow-x: auto; }
.heatmap img { max-width: none; display: block; }
</style>
</head>
<body>
<h1 class="$verdict_class">Linear-attention parity: $verdict</h1>
<p>Rule: $rule.</p>
<ul>
$provenance
</ul>
$notes
<h2>Verdicts</h2>
<table>
<tr><th>verdict</th><th>rows</th></tr>
$counts
</table>
<h2>$eps_cand / $eps_base per case × tensor ($metric)</h2>
<p>Logarithmic colour scale centred on 1: red where the $cand's error is larger, blue where it is smaller.
A (case, tensor) failing the gate on any metric or status is outlined and crossed; grey cells have no $metric ratio
(unsupported, not provided, bounds only, missing, or a failing status); blank cells are tensors the case does not
have.</p>
<div class="heatmap"><img src="data:image/png;base64,$png" width="$png_width" height="$png_height"
 alt="heatmap of $eps_cand / $eps_base ($metric) per case and tensor; $n_failing failing (case, tensor)"></div>
<h2>Rows, failing first</h2>
<p>$rows_note</p>
<table>
<tr><th>case</th><th>tensor</th><th>metric</th><th>$eps_base</th><th>$eps_cand</th><th>ratio</th><th>verdict</th>
<th>reason</th><th>repro</th></tr>
$rows
</table>
</body>
</html>
""")


def _row_html(r: dict) -> str:
    cells = [f"<td><code>{html.escape(str(r['case_id']))}</code></td>", f"<td>{html.escape(str(r['tensor']))}</td>",
             f"<td>{html.escape(str(r['metric']))}</td>",
             *(f'<td class="num">{html.escape(fmt(r[c]))}</td>' for c in ("eps_gpu", "eps_tpu", "ratio")),
             f'<td class="verdict">{html.escape(str(r["verdict"]))}</td>',
             f"<td>{html.escape(fmt(r['reason']))}</td>", f"<td><code>{html.escape(fmt(r['repro']))}</code></td>"]
    css = ' class="fail"' if r["verdict"] in ("fail", "inconclusive") else ""
    return f"<tr{css}>{''.join(cells)}</tr>"


def summary(result: GateResult) -> str:
    """The verdict counts in one line: ``53 fail, 755 pass, ...`` (fail first)."""
    counts = result.parity.groupby("verdict").size().to_dict()
    return ", ".join(f"{counts[v]} {v}" for v in sorted(counts, key=lambda v: (v != "fail", v)))


def page(result: GateResult, h: Heatmap, png: bytes) -> str:
    """``parity.html``: counts, heatmap, rows (failing first, with repro) and provenance, self-contained."""
    p = result.parity
    counts = p.groupby("verdict").size().to_dict()
    failing = p[p["verdict"].isin(["fail", "inconclusive"])]
    rest = p[~p["verdict"].isin(["fail", "inconclusive"]) & p["metric"].isin([h.metric, "status"])]
    width, height = png_size(png)
    verdict = result.headline
    provenance = [f"<li>baseline ({html.escape(result.baseline_leg)}): {_inline(provenance_line(result.baseline))}</li>",
                  f"<li>candidate ({html.escape(result.candidate_leg)}): {_inline(provenance_line(result.candidate))}"
                  f"</li>"]
    notes = ["<blockquote>" + "".join(f"<p>{_inline(par)}</p>" for par in note) + "</blockquote>"
             for note in gate_notes(result)]
    return _PAGE.substitute(
        verdict=html.escape(verdict), verdict_class="pass" if result.passed else "fail", rule=html.escape(result.policy.describe()),
        provenance="\n".join(provenance), notes="\n".join(notes),
        counts="\n".join(f'<tr><td>{html.escape(str(v))}</td><td class="num">{n}</td></tr>'
                         for v, n in sorted(counts.items())),
        eps_base=html.escape(eps_labels(result)[0]), eps_cand=html.escape(eps_labels(result)[1]),
        cand=html.escape(side_labels(result.baseline_leg, result.candidate_leg)[1]),
        metric=html.escape(h.metric), png=base64.b64encode(png).decode("ascii"), png_width=width,
        png_height=height, n_failing=int(h.failing.sum()),
        rows_note=html.escape(f"{len(failing)} failing row(s) (any metric or status), then the {h.metric} and "
                              f"status rows that pass or have no verdict; parity.csv has every metric."),
        rows="\n".join(_row_html(r) for r in [*failing.to_dict("records"), *rest.to_dict("records")]))


def write_html_report(result: GateResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``parity.html`` and ``parity.png`` into ``out_dir``, atomically; returns their paths."""
    out_dir = Path(out_dir)
    h = heatmap_data(result)
    png = png_bytes(heatmap_figure(h, f"Linear-attention parity: {result.headline} "
                                      f"({summary(result)})", side_labels(result.baseline_leg, result.candidate_leg)))
    png_path, html_path = out_dir / "parity.png", out_dir / "parity.html"
    atomic_write_bytes(png_path, png)
    atomic_write_text(html_path, page(result, h, png))
    return html_path, png_path
