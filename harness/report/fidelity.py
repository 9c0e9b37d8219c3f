"""``parity fidelity``: the emulated GPU leg's rows against fla's native rows of the same cases and inputs, printed
and written as ``fidelity.csv`` and ``fidelity.md`` (the numbers and their definitions:
:mod:`harness.judge.fidelity`, docs/definitions.md#fidelity-emulated-against-native-rows-parity-fidelity).

``fidelity.csv`` holds one row per path × dtype × tensor, then one per path × dtype (``tensor`` ``*``, with the
targets' status), then the overall row (``path``, ``dtype`` and ``tensor`` ``*``). With candidate files, the verdicts
that change between the emulated baseline and the baseline of record go to ``fidelity-verdicts.csv``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.core.policy import Policy
from harness.core.results import ReportError, atomic_write_text, read_results, write_csv
from harness.judge import fidelity as F

TITLE = "# Fidelity: fla's emulated rows against its native rows"
FILES = ("fidelity.csv", "fidelity.md", "fidelity-verdicts.csv")


@dataclass
class Fidelity:
    pairs: pd.DataFrame
    tensors: pd.DataFrame
    paths: pd.DataFrame
    overall: dict
    sources: dict[str, list[str]]
    conflicts: dict[str, int]
    moves: list[F.Moves] = field(default_factory=list)

    @property
    def missed(self) -> pd.DataFrame:
        return F.missed(self.paths)


def measure(files, candidates=(), policy: Policy | None = None) -> Fidelity:
    """Read the result files (each all ``emulated`` or all ``native``, :func:`harness.judge.fidelity.split_by_mode`),
    pair them and compute every table; judge each candidate file against both baselines when a policy is given.
    ReportError (exit 2) for a file that is not a result file, a file of mixed modes, files of one mode only, or
    pairs made from different inputs."""
    frames = [(str(p), read_results(Path(p))) for p in files]
    sides = F.split_by_mode(frames)
    pairs = F.pairs(sides[F.EMULATED], sides[F.NATIVE])
    tensors = F.by_tensor(pairs)
    paths = F.by_path(pairs, tensors)
    sources = {mode: [name for name, rows in frames if len(rows) and rows["mode"].iloc[0] == mode]
               for mode in F.SIDES}
    result = Fidelity(pairs, tensors, paths, F.overall(pairs), sources,
                      {mode: sides[mode].attrs["conflicts"] for mode in F.SIDES})
    for path in candidates:
        rows = read_results(Path(path))
        result.moves.append(F.verdict_moves(sides[F.EMULATED], sides[F.NATIVE], rows, policy))
    return result


def _num(x: float, digits: int = 3) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:.{digits}f}"


def _share(count: int, rows: int) -> str:
    return f"{count / rows:.1%} ({count})" if rows else "–"


def _table(frame: pd.DataFrame, cols: list[str]) -> list[str]:
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in frame.to_dict("records"):
        lines.append("| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |")
    return lines


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["median"] = out["median"].map(_num)
    out["mean |ln|"] = out["mean_abs_ln"].map(lambda v: _num(v, 4))
    out["worst element bit-equal"] = [_share(b, n) for b, n in zip(out["bit_equal"], out["rows"])]
    return out


def markdown(f: Fidelity) -> str:
    o = f.overall
    only = f.pairs.attrs.get("only", {})
    lines = [TITLE, "",
             f"Emulated rows: {', '.join(f.sources[F.EMULATED])}. Native rows: {', '.join(f.sources[F.NATIVE])}.",
             "",
             f"{len(f.pairs)} (case, tensor) pairs with the same inputs; {o['rows']} compared (both `ok`); rows "
             f"without a twin: {only.get(F.EMULATED, 0)} emulated, {only.get(F.NATIVE, 0)} native; rows given twice "
             f"whose rel_l2 differ by more than {F.SAME_RTOL:g} relative (the first file's kept): "
             f"{f.conflicts[F.EMULATED]} emulated, "
             f"{f.conflicts[F.NATIVE]} native.", "",
             f"**Overall**: {o['rows']} rows, median ratio emulated/native {_num(o['median'])}, mean |ln ratio| "
             f"{_num(o['mean_abs_ln'], 4)}, worst element bit-equal {_share(o['bit_equal'], o['rows'])}.", "",
             "Ratio = rel_l2(emulated) / rel_l2(native) (above 1: the emulation overstates fla's error); worst "
             "element bit-equal: the same element and the same value bit for bit. Targets (issue 76): mean |ln ratio|"
             f" ≤ {F.MEAN_ABS_LN_MAX}; worst element bit-equal on ≥ {F.BIT_EQUAL_MIN:.0%} of rows; fp32 "
             f"{F.DECODE_VARIANT} {' and '.join(F.DECODE_TENSORS)} medians within "
             f"{F.DECODE_MEDIAN_BAND[0]:.2f}–{F.DECODE_MEDIAN_BAND[1]:.2f}.", "",
             "## Per path × dtype", ""]
    paths = _shown(f.paths).rename(columns={"target_ln": "mean |ln| ≤ 0.05", "target_bits": "bit-equal ≥ 90 %",
                                            "target_decode": "fp32 decode o, dv median"})
    lines += _table(paths, ["path", "dtype", "rows", "median", "mean |ln|", "worst element bit-equal",
                            "mean |ln| ≤ 0.05", "bit-equal ≥ 90 %", "fp32 decode o, dv median"])
    missed = f.missed
    lines += ["", f"Targets missed on {len(missed)} of {len(f.paths)} path × dtype groups.", "",
              "## Per path × dtype × tensor", ""]
    lines += _table(_shown(f.tensors), ["path", "dtype", "tensor", "rows", "median", "mean |ln|",
                                        "worst element bit-equal"])
    differs = F.status_differs(f.pairs)
    lines += ["", f"## Statuses that differ ({len(differs)})", ""]
    for r in differs.to_dict("records"):
        lines.append(f"- `{r['case_id']}` {r['tensor']}: emulated {r['status_e']} (rel_l2 {r['rel_l2_e']:.3g}), "
                     f"native {r['status_n']} (rel_l2 {r['rel_l2_n']:.3g})")
    if f.moves:
        lines += ["", "## Verdicts that change: each candidate judged against the emulated rows and against the "
                  "baseline of record (native rows where they exist)", "",
                  "| candidate | verdicts | vs emulated fla | vs native fla | changed |", "|---|---|---|---|---|"]
        for m in f.moves:
            count = lambda side: ", ".join(f"{k} {v}" for k, v in m.counts(side).items()) or "–"  # noqa: E731
            lines.append(f"| {m.candidate} | {len(m.both)} | {count('emulated')} | {count('native')} | "
                         f"{len(m.moved)} |")
        for m in f.moves:
            for r in m.moved.to_dict("records"):
                lines.append(f"- {m.candidate} `{r['case_id']}` {r['tensor']} {r['metric']}: "
                             f"{r['verdict_emulated']} → {r['verdict_native']} (ratio "
                             f"{_num(r['ratio_emulated'])} → {_num(r['ratio_native'])}); emulated: "
                             f"{r['reason_emulated']}; native "
                             f"({r['gpu_mode_native']} baseline): {r['reason_native']}")
    return "\n".join(lines) + "\n"


def csv_rows(f: Fidelity) -> pd.DataFrame:
    cols = ["path", "dtype", "tensor", "rows", "median", "mean_abs_ln", "bit_equal", "bit_equal_frac", "target_ln",
            "target_bits", "target_decode"]
    overall = pd.DataFrame([{"path": "*", "dtype": "*", "tensor": "*", **f.overall}])
    return pd.concat([f.tensors, f.paths.assign(tensor="*"), overall], ignore_index=True).reindex(columns=cols)


def check_out(out: Path, force: bool) -> None:
    """Never over a fidelity.md that parity fidelity did not write, unless ``force``."""
    md = Path(out) / "fidelity.md"
    if md.exists() and not md.read_text(encoding="utf-8").startswith(TITLE) and not force:
        raise ReportError(f"{md} was not written by parity fidelity; --force replaces it")


def write(f: Fidelity, out: Path) -> list[Path]:
    out = Path(out)
    written = [write_csv(csv_rows(f), out / "fidelity.csv")]
    md = out / "fidelity.md"
    atomic_write_text(md, markdown(f))
    written.append(md)
    if f.moves:
        moves = pd.concat([m.moved for m in f.moves], ignore_index=True).reindex(columns=F.MOVE_COLUMNS)
        written.append(write_csv(moves, out / "fidelity-verdicts.csv"))
    return written
