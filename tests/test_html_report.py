"""The gate's report to look at: parity.html (self-contained) and parity.png, on real result rows
(the checked-in holdout run), as a browser shows them (headless Chromium)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from matplotlib import colormaps
from matplotlib.colors import to_rgb

from harness.report import html_report
from harness.cli import main
from harness.judge.gate import apply_gate
from harness.core.metrics import format_blocks, parse_blocks
from harness.core.policy import default_policy
from harness.core.results import read_table, write_csv

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "reports" / "calibration" / "smoke-seeds5-9-holdout"
EXAMPLE_PNG = ROOT / "reports" / "example" / "parity.png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _subset(leg: str, n_cases: int) -> pd.DataFrame:
    """The holdout rows of one leg for its first ``n_cases`` cases at seed 5: a small real gate input."""
    df = read_table(HOLDOUT / f"{leg}.csv")
    cases = [c for c in dict.fromkeys(df["case_id"]) if c.endswith("seed=5")][:n_cases]
    return df[df["case_id"].isin(cases)].reset_index(drop=True)


def _worsen(tpu: pd.DataFrame, i: int, factor: float) -> None:
    """Row ``i``'s rel_l2 ``factor`` times larger (its blocks scaled to match)."""
    tpu.at[i, "rel_l2"] = tpu.at[i, "rel_l2"] * factor
    tpu.at[i, "rel_l2_blocks"] = format_blocks(list(parse_blocks(tpu.at[i, "rel_l2_blocks"]) * factor ** 2))


@pytest.fixture(scope="module")
def inputs():
    """(gpu, passing tpu, failing tpu): the failing one has a 10x rel_l2 on one tensor and an error on another."""
    gpu, tpu = _subset("gpu", 4), _subset("tpu", 4)
    bad = tpu.copy()
    ok = bad.index[bad["status"] == "ok"]
    _worsen(bad, ok[0], 10.0)
    err = ok[len(ok) // 2]
    bad.loc[err, ["status", "reason"]] = ["error", "RuntimeError: kernel exploded"]
    bad.loc[err, ["rel_l2", "max_abs", "ulp_max", "ulp_mean", "ulp_p99", "rel_l2_blocks"]] = np.nan
    return gpu, tpu, bad


@pytest.fixture(scope="module")
def results(inputs):
    gpu, tpu, bad = inputs
    passing, failing = apply_gate(gpu, tpu, default_policy()), apply_gate(gpu, bad, default_policy())
    assert passing.passed and not failing.passed
    return passing, failing


class _Page(HTMLParser):
    """Tags, external references, visible text and table rows (cell texts) of an HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.tags, self.refs, self.text, self.tables = [], [], [], []
        self._row = self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.refs += [(tag, k, v) for k, v in attrs if k in ("src", "href", "srcset", "data", "poster", "action")]
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self.tables[-1].append(self._row)

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _gate(tmp_path: Path, gpu: pd.DataFrame, tpu: pd.DataFrame, name: str) -> Path:
    out = tmp_path / name
    write_csv(gpu, tmp_path / f"{name}-gpu.csv")
    write_csv(tpu, tmp_path / f"{name}-tpu.csv")
    main(["gate", str(tmp_path / f"{name}-gpu.csv"), str(tmp_path / f"{name}-tpu.csv"), "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def gated(inputs, tmp_path_factory):
    """``parity gate`` output directories for the passing and the failing input."""
    gpu, tpu, bad = inputs
    tmp = tmp_path_factory.mktemp("gate")
    return _gate(tmp, gpu, tpu, "pass"), _gate(tmp, gpu, bad, "fail")


def test_the_gate_writes_the_page_and_the_png_next_to_parity_md(gated):
    for out in gated:
        assert {"parity.csv", "parity.md", "parity.html", "parity.png"} <= {p.name for p in out.iterdir()}
        png = (out / "parity.png").read_bytes()
        assert png.startswith(PNG_SIGNATURE)
        width, height = html_report.png_size(png)
        image = mpimg.imread(out / "parity.png")
        assert image.shape[:2] == (height, width) and width > 0 and height > 0


def test_the_page_is_self_contained(gated):
    for out in gated:
        text = (out / "parity.html").read_text()
        page = _Page(text)
        assert "img" in page.tags
        assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
        assert page.refs and all(v.startswith("data:") for _, _, v in page.refs), page.refs
        assert not re.search(r"https?://|url\(|@import", text, re.I)


def test_the_page_has_counts_failing_rows_first_with_repro_and_provenance(gated, results):
    _, failing = results
    page = _Page((gated[1] / "parity.html").read_text())
    counts, rows = page.tables[0], page.tables[-1]
    expected = failing.parity.groupby("verdict").size().to_dict()
    assert {v: int(n) for v, n in counts[1:]} == expected
    header = rows[0]
    verdict, repro = header.index("verdict"), header.index("repro")
    fails = _unsettled(failing)
    assert len(fails) >= 2  # the worsened tensor (one draw: inconclusive) and the error row (a failure)
    assert [r[verdict] for r in rows[1:len(fails) + 1]] == list(fails["verdict"])
    assert not {"fail", "inconclusive"} & {r[verdict] for r in rows[len(fails) + 1:]} and len(rows) > len(fails) + 1
    assert [r[repro] for r in rows[1:len(fails) + 1]] == list(fails["repro"])
    assert all(r.startswith("parity run --backend tpu --case ") for r in fails["repro"])
    text = " ".join(" ".join(page.text).split())
    for leg in (failing.baseline, failing.candidate):
        versions = json.loads(leg["versions"].iloc[0])
        for name, version in versions.items():
            assert f"{name} {version}" in text
        assert str(leg["git_commit"].iloc[0]) in text
        for mode in leg["mode"].unique():
            assert f"mode {mode}" in text
    compiled = sorted({t for v in failing.candidate["compiled_for"].dropna() for t in str(v).split(",")})
    assert compiled and all(t in text for t in compiled)  # the real-TPU compile targets


def test_the_heatmap_marks_failures_and_centres_the_scale_on_one(results):
    passing, failing = results
    h = html_report.heatmap_data(failing)
    fails = _unsettled(failing)
    marked = {(h.cases[i], h.tensors[j]) for i, j in zip(*np.nonzero(h.failing))}
    assert marked == set(zip(fails["case_id"], fails["tensor"]))
    errored = fails[fails["metric"] == "status"]
    for case, tensor in zip(errored["case_id"], errored["tensor"]):  # no ratio: grey, and still marked
        i, j = h.cases.index(case), h.tensors.index(tensor)
        assert np.isnan(h.ratio[i, j]) and np.allclose(h.colors()[i, j, :3], to_rgb(html_report.NO_RATIO_COLOR))
    assert h.norm(1.0) == pytest.approx(0.5)
    assert not html_report.heatmap_data(passing).failing.any()


def test_every_column_label_of_the_heatmap_is_clear_of_the_others_and_of_the_titles():
    """Smoke's long tensor names side by side (conv_ht, dconv_weight, dconv_h0 once ran into each other): drawn on
    Agg, no two column labels' boxes meet, none meets the cells, the axes' title or the figure's title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tensors = ["o", "ht", "conv_ht", "dconv_weight", "dconv_h0", "dconv_bias", "dA_log", "ddt_bias", "dg_gamma"]
    cases = [f"case{i}" for i in range(3)]
    shape = (len(cases), len(tensors))
    h = html_report.Heatmap("rel_l2", cases, tensors, np.ones(shape), np.ones(shape, bool), np.zeros(shape, bool), 1)
    fig = html_report.heatmap_figure(h, "a title")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    labels = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
    assert len(labels) == len(tensors) and all(b.width > 0 and b.height > 0 for b in labels)
    for (i, a), (j, b) in itertools.combinations(enumerate(labels), 2):
        assert not a.overlaps(b), f"labels {tensors[i]!r} and {tensors[j]!r} overlap"
    others = {"the cells": ax.get_window_extent(renderer), "the axes' title": ax.title.get_window_extent(renderer),
              "the figure's title": fig.texts[0].get_window_extent(renderer)}
    for name, box in others.items():
        hit = [tensors[i] for i, b in enumerate(labels) if b.overlaps(box)]
        assert not hit, f"labels {hit} overlap {name}"


def _unsettled(result) -> pd.DataFrame:
    """The rows a gate did not pass, failures and inconclusive comparisons, in the parity table's order."""
    return result.parity[result.parity["verdict"].isin(["fail", "inconclusive"])]


def _has(image: np.ndarray, color: str, tol: float = 0.12) -> np.ndarray:
    return np.all(np.abs(image[..., :3] - np.array(to_rgb(color))) < tol, axis=-1)


def test_the_png_shows_the_failure_marker_only_for_a_failing_gate(gated):
    passing, failing = (mpimg.imread(out / "parity.png") for out in gated)
    assert _has(failing, html_report.FAIL_COLOR).sum() > html_report.CELL_W * html_report.DPI
    assert _has(passing, html_report.FAIL_COLOR).sum() == 0


# ---------------------------------------------------------------- in a browser
def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        reason = "no chromium binary on PATH (Debian: apt-get install chromium)"
        if os.environ.get("PARITY_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{reason}, and PARITY_REQUIRE_CHROMIUM=1 requires it")
        pytest.skip(reason)
    return path


def _screenshot(chromium: str, page: Path, width: int, height: int, tmp: Path) -> np.ndarray:
    shot = tmp / f"{page.parent.name}.png"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--force-device-scale-factor=1", "--force-color-profile=srgb", "--virtual-time-budget=5000",
           f"--user-data-dir={tmp / 'profile'}", f"--window-size={width},{height}", f"--screenshot={shot}",
           page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    return mpimg.imread(shot)


def _colormap_pixels(image: np.ndarray, tol: int = 3) -> int:
    """Pixels within ``tol`` (of 255) per channel of a saturated colour of the heatmap's colour map
    (neither its near-white centre nor grey)."""
    def code(rgb):
        rgb = rgb.astype(np.int64)
        return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]

    palette = np.round(colormaps[html_report.CMAP](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.int64)
    palette = palette[palette.max(axis=1) - palette.min(axis=1) > 64]
    steps = np.arange(-tol, tol + 1)
    shifts = np.stack(np.meshgrid(steps, steps, steps), axis=-1).reshape(-1, 3)
    near = np.clip(palette[:, None, :] + shifts[None, :, :], 0, 255).reshape(-1, 3)
    pixels = np.round(image[..., :3] * 255).reshape(-1, 3)
    return int(np.isin(code(pixels), np.unique(code(near))).sum())


def test_chromium_shows_the_heatmap_and_the_failing_cell(gated, results, tmp_path):
    chromium = _chromium()
    shots = []
    for out, result in zip(gated, results):
        width, height = html_report.png_size((out / "parity.png").read_bytes())
        shots.append(_screenshot(chromium, out / "parity.html", width + 200, height + 1600, tmp_path))
        h = html_report.heatmap_data(result)
        colors = h.colors()[h.present & ~np.isnan(h.ratio)][:, :3]
        coloured_cells = int((colors.max(axis=1) - colors.min(axis=1) > 0.25).sum())
        cell_px = html_report.CELL_W * html_report.CELL_H * html_report.DPI ** 2
        assert coloured_cells > 0
        assert _colormap_pixels(shots[-1]) > 0.5 * coloured_cells * cell_px  # the heatmap is drawn
    passing, failing = shots
    assert _has(failing, html_report.FAIL_COLOR).sum() > html_report.CELL_W * html_report.DPI
    assert _has(passing, html_report.FAIL_COLOR).sum() == 0


def test_the_readme_shows_the_committed_example():
    assert EXAMPLE_PNG.read_bytes().startswith(PNG_SIGNATURE)
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"!\[[^\]]*\]\(reports/example/parity\.png\)", readme)
