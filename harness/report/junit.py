"""The gate's verdicts as JUnit XML (``parity gate --junit FILE``), for any CI that reads JUnit.

One ``<testcase>`` per (case, tensor) of the gate's ``parity`` table: ``classname`` is the case id,
``name`` the tensor.

- ``<failure>`` when any of its rows is a ``fail``; the message names each failing metric and its
  reason, the body adds the numbers and the one-line repro.
- ``<skipped>`` when nothing was compared and nothing failed (``unsupported``, ``not_provided``,
  ``bounds_only``, ``missing``), with the verdict and its reason.
- passed otherwise. Every test case carries its per-metric numbers in ``<system-out>``.

The gate's ``coverage`` failure (no gated metric compared at all) is the test case ``parity.gate`` /
``coverage``. The suite's ``<properties>`` hold the rule and the provenance of both files.

A file is replaced only if it is a JUnit report this module wrote (its root says so), unless forced.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from harness.core.results import ReportError, atomic_write_text, column_values
from harness.judge.gate import side_columns
from harness.report.reports import compiled_note

if TYPE_CHECKING:
    from harness.judge.gate import GateResult

ROOT_NAME = "linear-attn-parity gate"
"""The ``name`` of the root ``<testsuites>``: marks a file as one this module may replace."""

GATE_CLASSNAME = "parity.gate"
"""``classname`` of the gate-wide test case (``coverage``), which belongs to no case."""


def _text(x) -> str:
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x)


def _num(x) -> str:
    text = _text(x)
    return f"{float(x):.4g}" if text and isinstance(x, (int, float)) else text


def _metric_line(r: dict, names: dict[str, str]) -> str:
    """One comparison's line; ``names``: the side columns' names for the legs compared (``side_columns``)."""
    if r["metric"] == "status" or r["metric"] == "coverage":
        return f"{r['metric']}: {r['verdict']}" + (f" ({_text(r['reason'])})" if _text(r["reason"]) else "")
    line = (f"{r['metric']}: {r['verdict']}, {names['eps_gpu']} {_num(r['eps_gpu'])}, "
            f"{names['eps_tpu']} {_num(r['eps_tpu'])}, ratio {_num(r['ratio'])}")
    if r["verdict"] != "info":
        line += f", allowed {_num(r['allowed'])}"
    if _text(r["ratio_lower"]):
        line += f", bootstrap lower bound {_num(r['ratio_lower'])}"
    return line + (f" ({_text(r['reason'])})" if _text(r["reason"]) else "")


def _provenance(df: pd.DataFrame) -> dict[str, str]:
    return {c: " / ".join(column_values(df, c)) for c in ("mode", "device", "versions", "git_commit", "suite")}


def junit_tree(result: GateResult, timestamp: datetime | None = None) -> ET.ElementTree:
    """The gate's verdicts as a JUnit ``<testsuites>`` tree (see the module docstring)."""
    stamp = (timestamp or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    suite_name = f"parity {result.candidate_leg} vs {result.baseline_leg}"
    names = side_columns(result.baseline_leg, result.candidate_leg)
    root = ET.Element("testsuites", name=ROOT_NAME)
    suite = ET.SubElement(root, "testsuite", name=suite_name, timestamp=stamp)
    props = ET.SubElement(suite, "properties")
    facts = {"rule": result.policy.describe(), "baseline.leg": result.baseline_leg,
             "candidate.leg": result.candidate_leg, "verdict": result.headline}
    for role, df in (("baseline", result.baseline), ("candidate", result.candidate)):
        facts.update({f"{role}.{k}": v for k, v in _provenance(df).items() if v})
    if "emulated" in column_values(result.candidate, "mode"):
        facts["candidate.compiled_for"] = compiled_note(result.candidate).replace("**", "")  # plain text, not Markdown
    for key, value in facts.items():
        ET.SubElement(props, "property", name=key, value=value)

    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for (case_id, tensor), group in result.parity.groupby(["case_id", "tensor"], sort=False):
        rows = group.to_dict("records")
        gate_wide = case_id == "*"
        case = ET.SubElement(suite, "testcase", classname=GATE_CLASSNAME if gate_wide else str(case_id),
                             name=rows[0]["metric"] if gate_wide else str(tensor))
        counts["tests"] += 1
        fails = [r for r in rows if r["verdict"] in ("fail", "inconclusive")]  # an undecided one never passes
        compared = [r for r in rows if r["verdict"] in ("pass", "fail", "inconclusive", "info")]
        if fails:
            counts["failures"] += 1
            from harness.run.runner import repro as repro_command  # the runner's own repro, for a row that has none

            repro = "" if gate_wide else (_text(rows[0]["repro"]) or repro_command(result.candidate_leg, case_id))
            kind = "parity" if any(r["verdict"] == "fail" for r in fails) else "inconclusive"
            failure = ET.SubElement(case, "failure", type=kind,
                                    message="; ".join(f"{r['metric']}: {_text(r['reason'])}" for r in fails))
            failure.text = "\n".join([_metric_line(r, names) for r in fails] + ([f"repro: {repro}"] if repro else []))
        elif not compared:
            counts["skipped"] += 1
            ET.SubElement(case, "skipped",
                          message="; ".join(f"{r['verdict']}: {_text(r['reason'])}" for r in rows))
        ET.SubElement(case, "system-out").text = "\n".join(_metric_line(r, names) for r in rows)
    for el in (root, suite):
        el.set("tests", str(counts["tests"]))
        el.set("failures", str(counts["failures"]))
        el.set("errors", "0")
        el.set("skipped", str(counts["skipped"]))
    ET.indent(root)
    return ET.ElementTree(root)


def _written_by_us(path: Path) -> bool:
    try:
        for _, element in ET.iterparse(path, events=("start",)):
            return element.tag == "testsuites" and element.get("name") == ROOT_NAME
    except (ET.ParseError, OSError, UnicodeDecodeError):
        return False
    return False


def check_junit_path(path, force: bool = False) -> Path:
    """``--junit FILE``, checked before any work: not a directory, in a writable directory, and not a
    file of someone else's unless ``force`` (a JUnit report of an earlier gate is replaced)."""
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"--junit {path} is a directory; name the XML file to write")
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ReportError(f"--junit {path}: {parent} is not a directory")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ReportError(f"--junit {path}: {probe} is not writable")
    if path.exists() and not force and not _written_by_us(path):
        raise ReportError(f"--junit {path} exists and is not a JUnit report of the parity gate; "
                          f"pass --force to overwrite it")
    return path


def write_junit(result: GateResult, path, force: bool = False) -> Path:
    """Write :func:`junit_tree` to ``path`` atomically, under the rule of :func:`check_junit_path`."""
    path = check_junit_path(path, force)
    tree = junit_tree(result)
    # ASCII with character references: the file is the same whatever the locale's encoding
    atomic_write_text(path, ET.tostring(tree.getroot(), encoding="us-ascii", xml_declaration=True).decode("ascii")
                      + "\n")
    return path
