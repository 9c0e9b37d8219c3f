"""``parity gate --junit FILE``: the gate's verdicts as JUnit XML, one test case per (case, tensor)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.judge.gate import apply_gate
from harness.report.junit import GATE_CLASSNAME, junit_tree, write_junit
from harness.core.policy import Policy
from harness.core.results import ReportError, write_csv
from test_runner_and_gate import CASE, result_frame


@pytest.fixture(scope="module")
def frames():
    """A gpu and a tpu frame of one case: dq 10x worse on the TPU (a parity failure), dk all zeros (a bound
    failure), dh0 not provided by the GPU (bounds_only), the other tensors equal (passes)."""
    gpu = result_frame("gpu", edit={"dh0": lambda x: None})
    tpu = result_frame("tpu", edit={"dq": lambda x: x * (1 + 1e-5), "dk": lambda x: np.zeros_like(x)})
    return gpu, tpu


def _cases(root):
    return {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}


def test_one_testcase_per_case_and_tensor_with_failures_and_skips(frames):
    gpu, tpu = frames
    result = apply_gate(gpu, tpu, Policy())
    root = junit_tree(result).getroot()
    keys = result.parity[["case_id", "tensor"]].drop_duplicates()
    cases = _cases(root)
    assert set(cases) == set(map(tuple, keys.itertuples(index=False)))
    failed = {k[1] for k, c in cases.items() if c.find("failure") is not None}
    skipped = {k[1] for k, c in cases.items() if c.find("skipped") is not None}
    assert failed == set(result.failures["tensor"]) == {"dq", "dk"}
    assert skipped == {"dh0"}
    [suite] = root.iter("testsuite")
    for el in (root, suite):
        assert int(el.get("tests")) == len(keys)
        assert int(el.get("failures")) == 2 and int(el.get("skipped")) == 1 and el.get("errors") == "0"

    dq = cases[(CASE.id, "dq")].find("failure")
    dq_fails = result.failures[result.failures["tensor"] == "dq"]
    assert set(dq_fails["metric"]) == {"rel_l2", "max_abs"}  # 10x the GPU's error on both gated metrics
    assert dq.get("message") == "; ".join(f"{m}: {r}" for m, r in zip(dq_fails["metric"], dq_fails["reason"]))
    assert all(line in dq.text for line in ("rel_l2: fail, eps_gpu", "max_abs: fail, eps_gpu"))
    assert f"repro: parity run --backend tpu --case '{CASE.id}'" in dq.text
    dk = cases[(CASE.id, "dk")].find("failure")
    assert dk.get("message").startswith("status: TPU bound")
    assert "bounds_only" in cases[(CASE.id, "dh0")].find("skipped").get("message")
    passing = cases[(CASE.id, "o")]
    assert passing.find("failure") is None and passing.find("skipped") is None
    assert "rel_l2: pass" in passing.find("system-out").text

    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["rule"] == result.policy.describe() and props["verdict"] == "FAIL"
    assert props["baseline.mode"] == "emulated" and props["candidate.leg"] == "tpu"
    assert "triton" in props["baseline.versions"] and "libtpu" in props["candidate.versions"]


def test_missing_rows_and_the_coverage_failure(frames):
    gpu, tpu = frames
    # every candidate row missing, allowed: each (case, tensor) is skipped, and the gate-wide coverage fails
    result = apply_gate(gpu, tpu.iloc[:0], Policy(), allow_missing=True)
    cases = _cases(junit_tree(result).getroot())
    [coverage] = [c for k, c in cases.items() if k[0] == GATE_CLASSNAME]
    assert coverage.get("name") == "coverage" and "measured nothing" in coverage.find("failure").get("message")
    others = [c for k, c in cases.items() if k[0] != GATE_CLASSNAME]
    assert others and all("missing: not in the candidate" in c.find("skipped").get("message") for c in others)
    # not allowed: each fails, and its repro runs the candidate leg on the case (the row has none of its own)
    result = apply_gate(gpu, tpu[tpu["tensor"] != "dv"], Policy())
    dv = _cases(junit_tree(result).getroot())[(CASE.id, "dv")].find("failure")
    assert "not in the candidate (TPU) file" in dv.get("message")
    assert dv.text.endswith(f"repro: parity run --backend tpu --case '{CASE.id}'")


def test_a_file_of_someone_else_is_not_overwritten(frames, tmp_path):
    result = apply_gate(*frames, Policy())
    mine = write_junit(result, tmp_path / "junit.xml")
    assert write_junit(result, mine) == mine  # an earlier gate's report is replaced
    other = tmp_path / "other.xml"
    other.write_text('<testsuites name="pytest"/>')
    with pytest.raises(ReportError, match="not a JUnit report of the parity gate; pass --force"):
        write_junit(result, other)
    assert other.read_text() == '<testsuites name="pytest"/>'
    write_junit(result, other, force=True)
    assert ET.parse(other).getroot().get("failures") == "2"
    with pytest.raises(ReportError, match="is a directory"):
        write_junit(result, tmp_path)


def test_cli_gate_writes_junit_and_refuses_before_gating(frames, tmp_path, capsys):
    gpu, tpu = frames
    a, b = write_csv(gpu, tmp_path / "gpu.csv"), write_csv(tpu, tmp_path / "tpu.csv")
    out, junit = tmp_path / "gate", tmp_path / "reports" / "junit.xml"

    def gate(*extra):
        return main(["gate", str(a), str(b), "--out", str(out), *extra])

    assert gate("--junit", str(junit)) == 1
    root = ET.parse(junit).getroot()
    parity = pd.read_csv(out / "parity.csv")
    assert int(root.get("tests")) == len(parity[["case_id", "tensor"]].drop_duplicates())
    # an inconclusive comparison is a failing test case too: it never reads as a pass
    unsettled = parity[parity["verdict"].isin(["fail", "inconclusive"])]
    assert int(root.get("failures")) == len(unsettled[["case_id", "tensor"]].drop_duplicates())
    kinds = {f.get("type") for f in root.iter("failure")}
    assert kinds <= {"parity", "inconclusive"} and kinds
    assert f"-> {junit}" in capsys.readouterr().out

    # a passing gate gives a report without failures, replacing the earlier one
    write_csv(tpu[~tpu["tensor"].isin(["dq", "dk"])], b)
    assert gate("--junit", str(junit), "--allow-missing") == 0
    assert ET.parse(junit).getroot().get("failures") == "0"

    # someone else's file: one line, exit 2, before the gate runs (nothing written), kept as it was
    theirs = tmp_path / "theirs.xml"
    theirs.write_text("not xml\n")
    (out / "parity.csv").unlink()
    assert gate("--junit", str(theirs)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and "Traceback" not in err
    assert theirs.read_text() == "not xml\n" and not (out / "parity.csv").exists()
    assert gate("--junit", str(theirs), "--force", "--allow-missing") == 0
    assert ET.parse(theirs).getroot().get("tests") == root.get("tests")


def test_cli_all_refuses_someone_elses_junit_file_before_any_leg_runs(tmp_path, capsys):
    theirs = tmp_path / "theirs.xml"
    theirs.write_text("<testsuites/>\n")
    assert main(["all", "--suite", "smoke", "--out", str(tmp_path / "runs"), "--junit", str(theirs)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a JUnit report of the parity gate" in err
    assert theirs.read_text() == "<testsuites/>\n" and not list((tmp_path / "runs").glob("*.csv"))
