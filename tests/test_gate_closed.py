"""A gate that cannot be fooled: each test replays one observed way of passing a broken input, losing a result
or crashing, and checks that it now fails the gate, exits 2 with one line, or keeps the result."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.core.results import read_results, write_csv
from harness.run.result_file import ResultFile
from harness.run.runner import Runner
from test_runner_and_gate import CASE, FakeLeg, result_frame

SMALL = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64"  # a small suite case (regressions)
SMALL_KDA = "kda.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,lower_bound=-5,use_gate_in_kernel=1"


@pytest.fixture()
def files(tmp_path):
    """gpu.csv and tpu.csv of two cases that pass the gate, and a function to run the gate CLI on two files."""
    other = CASE.replace(seed=1)
    gpu = pd.concat([result_frame("gpu"), _rows("gpu", other)], ignore_index=True)
    tpu = pd.concat([result_frame("tpu"), _rows("tpu", other)], ignore_index=True)
    write_csv(gpu, tmp_path / "gpu.csv")
    write_csv(tpu, tmp_path / "tpu.csv")

    def gate(a, b, *extra):
        return main(["gate", str(a), str(b), "--out", str(tmp_path / "gate"), *extra])

    assert gate(tmp_path / "gpu.csv", tmp_path / "tpu.csv") == 0
    return tmp_path, gpu, tpu, gate


def _rows(leg, case):
    from harness.run.reference_cache import ReferenceCache
    from harness.core.results import rows_to_frame

    return rows_to_frame(Runner(FakeLeg(leg), ReferenceCache(None)).run_case(case))


def _write(df, path):
    write_csv(df, path)
    return path


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# 1. missing candidate rows --------------------------------------------------------------------------
def test_missing_candidate_rows_fail_unless_allowed(files):
    tmp, gpu, tpu, gate = files
    assert gate(tmp / "gpu.csv", _write(tpu.iloc[:0], tmp / "empty.csv")) == 1  # header only
    half = tpu[tpu["case_id"] == CASE.id]
    assert gate(tmp / "gpu.csv", _write(half, tmp / "half.csv")) == 1
    no_dq = _write(tpu[tpu["tensor"] != "dq"], tmp / "no_dq.csv")
    assert gate(tmp / "gpu.csv", no_dq) == 1
    assert gate(tmp / "gpu.csv", no_dq, "--allow-missing") == 0
    md = (tmp / "gate" / "parity.md").read_text()
    assert "2 (case, tensor) row(s) are in one file only" in md
    # a candidate row without a baseline row is missing too
    assert gate(_write(gpu[gpu["tensor"] != "dq"], tmp / "gpu_no_dq.csv"), tmp / "tpu.csv") == 1


# 2. the repro never replaces the suite's result; concurrent runs cannot both write ------------------
def test_a_case_run_writes_its_own_file_and_a_locked_file_refuses(tmp_path, capsys):
    out = tmp_path / "runs"
    suite_file = _write(result_frame("ref").assign(suite="smoke"), out / "ref.csv")
    before = suite_file.read_bytes()
    assert main(["run", "--backend", "ref", "--case", SMALL, "--out", str(out), "--no-progress",
                 "--no-ref-cache"]) == 0
    assert suite_file.read_bytes() == before
    [subset] = out.glob("ref.cases-*.csv")
    assert set(read_results(subset)["case_id"]) == {SMALL}
    # a second run into a file another run is writing stops at once
    provenance = {"leg": "ref", "suite": ""}
    with ResultFile(subset, provenance):
        assert main(["run", "--backend", "ref", "--case", SMALL, "--out", str(out), "--no-progress"]) == 2
    assert "another parity run is writing" in _err(capsys)


def test_a_run_of_another_suite_or_leg_does_not_overwrite_without_force(tmp_path):
    path = _write(result_frame("ref").assign(suite="regressions"), tmp_path / "ref.csv")
    with pytest.raises(ValueError, match="holds a result of suite regressions.*--force"):
        with ResultFile(path, {"leg": "ref", "suite": "smoke"}):
            pass
    with ResultFile(path, {"leg": "ref", "suite": "regressions"}):  # a re-run of the same suite replaces its own
        pass
    with ResultFile(path, {"leg": "ref", "suite": "smoke"}, force=True):
        pass
    (tmp_path / "notes.csv").write_text("my,own\nfile,1\n")
    with pytest.raises(ValueError, match="not a result file"):
        with ResultFile(tmp_path / "notes.csv", {"leg": "ref", "suite": "smoke"}):
            pass


def test_a_check_file_is_locked_and_replaces_only_its_own_leg(tmp_path):
    import fcntl

    import pandas as pd

    from harness.run.result_file import write_check_file

    rows = pd.DataFrame({"case_id": ["c"], "leg": ["ref"], "check": ["causality"], "status": ["ok"]})
    path = write_check_file(rows, tmp_path / "causality-ref.csv", "ref")
    assert write_check_file(rows.assign(status="fail"), path, "ref") == path  # a re-run replaces its own
    assert pd.read_csv(path)["status"].tolist() == ["fail"]
    with pytest.raises(ValueError, match="holds the checks of leg ref, this run is leg gpu.*--force"):
        write_check_file(rows.assign(leg="gpu"), path, "gpu")
    (tmp_path / "notes.csv").write_text("my,own\nfile,1\n")
    with pytest.raises(ValueError, match="not a check file"):
        write_check_file(rows, tmp_path / "notes.csv", "ref")
    assert (tmp_path / "notes.csv").read_text() == "my,own\nfile,1\n"
    write_check_file(rows.assign(leg="gpu"), path, "gpu", force=True)
    with open(tmp_path / ".causality-ref.csv.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another parity run is writing"):
            write_check_file(rows, path, "gpu")


def test_the_gate_takes_a_directory_holding_one_result_file_per_leg(tmp_path):
    from harness.app import result_in

    (tmp_path / "gpu.cases-0123abcd.csv").write_text("")
    (tmp_path / "gpu.cases-0123abcd.partial.csv").write_text("")
    (tmp_path / "gpu-notes.csv").write_text("")
    assert result_in(tmp_path, "gpu") == tmp_path / "gpu.cases-0123abcd.csv"
    assert result_in(tmp_path / "x.csv", "gpu") == tmp_path / "x.csv"  # a file is itself
    with pytest.raises(ValueError, match="holds none; name the file"):
        result_in(tmp_path, "tpu")
    (tmp_path / "gpu.csv").write_text("")
    with pytest.raises(ValueError, match="holds gpu.cases-0123abcd.csv, gpu.csv; name the file"):
        result_in(tmp_path, "gpu")


# 3. merge never overwrites an input and refuses mixed runs ------------------------------------------
def test_merge_needs_an_output_and_never_overwrites_an_input(files, capsys):
    tmp, gpu, _, _ = files
    a = _write(gpu[gpu["case_id"] == CASE.id], tmp / "a.csv")
    b = _write(gpu[gpu["case_id"] != CASE.id], tmp / "b.csv")
    before = a.read_bytes()
    assert main(["merge", str(a), str(b)]) == 2  # the old positional form: -o is required now
    assert "required: -o/--output" in capsys.readouterr().err  # argparse's usage and error
    assert main(["merge", "-o", str(a), str(a), str(b)]) == 2
    assert "never overwrites an input" in _err(capsys)
    assert a.read_bytes() == before
    assert main(["merge", "-o", str(tmp / "m.csv"), str(a), str(b)]) == 0
    assert len(read_results(tmp / "m.csv")) == len(gpu)
    assert main(["merge", "-o", str(tmp / "m.csv"), str(a), str(b)]) == 2  # exists: needs --force
    assert "pass --force" in _err(capsys)
    c = _write(gpu[gpu["case_id"] != CASE.id].assign(git_commit="0123456789ab"), tmp / "c.csv")
    assert main(["merge", "-o", str(tmp / "m2.csv"), str(a), str(c)]) == 2
    assert "different runs (git_commit" in _err(capsys)
    assert main(["merge", "-o", str(tmp / "m2.csv"), str(a), str(c), "--allow-mixed"]) == 0


# 4. the gate checks which leg each file came from ---------------------------------------------------
def test_the_gate_checks_the_legs(files, capsys):
    tmp, gpu, tpu, gate = files
    assert gate(tmp / "tpu.csv", tmp / "tpu.csv") == 2
    assert "both the baseline and the candidate" in _err(capsys)
    assert gate(_write(tpu, tmp / "tpu2.csv"), tmp / "tpu.csv") == 2
    assert "the baseline must come from the gpu leg" in _err(capsys)
    assert gate(tmp / "gpu.csv", _write(gpu, tmp / "gpu2.csv")) == 2
    assert "the candidate must come from the tpu leg" in _err(capsys)
    ref = pd.concat([result_frame("ref"), _rows("ref", CASE.replace(seed=1))], ignore_index=True)
    assert gate(tmp / "gpu.csv", _write(ref, tmp / "ref.csv")) == 2
    assert "its rows are from ref" in _err(capsys)
    relabelled = _write(tpu.assign(leg="gpu"), tmp / "relabelled.csv")
    assert gate(relabelled, tmp / "tpu.csv") == 2
    assert "names no triton" in _err(capsys)
    # another pair, asked for explicitly, is gated and the report says so
    assert gate(tmp / "ref.csv", tmp / "tpu.csv", "--baseline-leg", "ref") in (0, 1)
    assert "Not the GPU-vs-TPU gate" in (tmp / "gate" / "parity.md").read_text()


# 5. a gate with nothing compared fails ---------------------------------------------------------------
def test_a_gate_that_compares_nothing_fails(files):
    tmp, gpu, tpu, gate = files
    errors = gpu.assign(status="error", reason="fla raised", **{m: None for m in ("max_abs", "rel_l2", "ulp_max",
                                                                                    "ulp_mean", "ulp_p99")})
    assert gate(_write(errors, tmp / "gpu_err.csv"), tmp / "tpu.csv") == 1
    assert pd.read_csv(tmp / "gate" / "parity.csv")["reason"].str.contains("the GPU baseline errored").any()
    unsupported = tpu.assign(status="unsupported", reason="no")
    assert gate(tmp / "gpu.csv", _write(unsupported, tmp / "tpu_uns.csv")) == 1
    assert pd.read_csv(tmp / "gate" / "parity.csv")["metric"].eq("coverage").any()
    assert gate(_write(gpu.iloc[::2], tmp / "gpu_half.csv"), tmp / "tpu.csv") == 1


# 6. every row's input hash is checked ----------------------------------------------------------------
def test_every_row_hash_is_checked(files, capsys):
    tmp, gpu, tpu, gate = files
    changed = tpu.copy()
    second = changed.index[changed["case_id"] == CASE.id][1]
    changed.loc[second, "input_sha256"] = "e" * 64
    assert gate(tmp / "gpu.csv", _write(changed, tmp / "second.csv")) == 2
    assert "disagree on input_sha256" in _err(capsys)
    blank = tpu.copy()
    blank.loc[second, "input_sha256"] = None
    assert gate(tmp / "gpu.csv", _write(blank, tmp / "blank.csv")) == 2
    assert "blank.csv:" in _err(capsys)
    everywhere = tpu.copy()
    everywhere.loc[everywhere["case_id"] == CASE.id, "input_sha256"] = "e" * 64
    assert gate(tmp / "gpu.csv", _write(everywhere, tmp / "stale.csv")) == 2


# 7. impossible values are input errors that name the file, line and column ---------------------------
@pytest.mark.parametrize("column, value, message", [
    ("rel_l2", -1.0, "is negative"),
    ("max_abs", "abc", "is not a number"),
    ("status", "OK_TYPO", "unknown value 'OK_TYPO'"),
    ("mode", "hardware", "unknown value 'hardware'"),
    ("rel_l2", None, "needs a finite value"),
    ("rel_l2_blocks", "1e-12;abc", "is not ';'-joined numbers"),
    ("rel_l2_blocks", "", "empty, but rel_l2 is"),
    ("rel_l2_blocks", "-1;2", "finite and >= 0"),
])
def test_impossible_values_are_input_errors(files, capsys, column, value, message):
    tmp, _, tpu, gate = files
    bad = tpu.astype({column: object})
    bad.loc[3, column] = value
    assert gate(tmp / "gpu.csv", _write(bad, tmp / "bad.csv")) == 2
    err = _err(capsys)
    assert f"bad.csv:5: column {column!r}" in err and message in err


def test_a_nonzero_result_against_an_all_zero_reference_is_a_bound_row_the_files_take(files, capsys):
    """rel_l2 = inf (docs/definitions.md): fla's dg at T = 1, where the reference's is exactly 0. The row is
    ``bound`` with no blocks; the file takes it and the gate judges the case, instead of the run's file being
    refused. An ``ok`` row cannot have it."""
    from harness.core.metrics import compare

    row = compare(np.array([1e-9, 0.0]), np.zeros(2), "float32")
    assert row["rel_l2"] == np.inf and row["rel_l2_blocks"] == ""
    tmp, _, tpu, gate = files
    zero = tpu.copy()
    zero.loc[3, ["status", "rel_l2", "rel_l2_blocks"]] = ["bound", np.inf, ""]
    assert gate(tmp / "gpu.csv", _write(zero, tmp / "zero.csv")) == 1  # read, then failed as a bound row
    assert capsys.readouterr().err == ""
    zero.loc[3, "status"] = "ok"
    assert gate(tmp / "gpu.csv", _write(zero, tmp / "zero-ok.csv")) == 2
    assert "a ok row needs a finite value, got inf" in _err(capsys)


def test_a_doctored_rel_l2_no_longer_matches_its_blocks(files, capsys):
    tmp, _, tpu, gate = files
    bad = tpu.copy()
    bad.loc[3, "rel_l2"] = 1e-9
    assert gate(tmp / "gpu.csv", _write(bad, tmp / "bad.csv")) == 2
    assert "bad.csv:5: column 'rel_l2_blocks': the blocks give rel_l2" in _err(capsys)


# 8. (the reference cache verifies its entries: tests/test_reference_cache.py)

# 9. user errors are one line, exit 2, before any work ------------------------------------------------
def test_bad_paths_are_one_line_errors_before_any_work(files, capsys, monkeypatch):
    tmp, gpu, tpu, gate = files
    a_file = tmp / "gpu.csv"
    started = time.perf_counter()
    assert main(["run", "--backend", "ref", "--suite", "smoke", "--out", str(a_file)]) == 2
    assert "is a file, not a directory" in _err(capsys)
    assert main(["run", "--backend", "ref", "--suite", "smoke", "--out", "/proc/parity-x"]) == 2
    assert "not a writable directory" in _err(capsys)
    assert time.perf_counter() - started < 10  # refused before the leg ran a single case
    (tmp / "empty").mkdir()
    assert gate(tmp / "gpu.csv", tmp / "empty") == 2  # a directory with no candidate result file in it
    assert "is a directory: it must hold exactly one result file of the tpu leg, it holds none" in _err(capsys)
    assert gate(tmp / "gpu.csv", tmp / "tpu.csv", "--out", str(a_file)) == 2
    _err(capsys)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp))
    assert gate(tmp / "gpu.csv", tmp / "tpu.csv") == 2
    assert "GITHUB_STEP_SUMMARY" in _err(capsys)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert gate(tmp / "gpu.csv", _write(tpu.drop(columns=["reason"]), tmp / "noreason.csv")) == 2
    assert "missing columns ['reason']" in _err(capsys)


# 10. Ctrl-C keeps the finished cases, and --resume finishes the run ----------------------------------
def test_an_interrupted_run_keeps_its_cases_and_resumes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "runs"
    args = ["run", "--backend", "ref", "--case", SMALL, "--case", SMALL_KDA, "--out", str(out), "--no-progress",
            "--no-ref-cache"]
    calls = []
    original = Runner.run_case

    def interrupt_second(self, case):
        calls.append(case.id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, case)

    monkeypatch.setattr(Runner, "run_case", interrupt_second)
    assert main(args) == 130
    assert "--resume" in _err(capsys)
    [partial] = out.glob("*.partial.csv")
    kept = read_results(partial)
    assert set(kept["case_id"]) == {SMALL}
    interrupted = _write(kept, tmp_path / "interrupted.csv")
    # a plain re-run refuses to clobber the partial file; --resume runs only what is left
    assert main(args) == 2
    assert "--resume" in _err(capsys)
    resumed = []
    monkeypatch.setattr(Runner, "run_case", lambda self, case: resumed.append(case.id) or original(self, case))
    assert main(args + ["--resume"]) == 0
    assert resumed == [SMALL_KDA] and not partial.exists()
    [final] = [p for p in out.glob("ref.*.csv") if not p.name.endswith(".partial.csv")]
    assert set(read_results(final)["case_id"]) == {SMALL, SMALL_KDA}
    # the interrupted run's rows are a readable result file, which the gate fails as incomplete
    baseline = _write(read_results(final).assign(leg="gpu", versions=json.dumps({"triton": "x"})), tmp_path / "b.csv")
    gate = ["gate", str(baseline), str(interrupted), "--out", str(tmp_path / "g"), "--candidate-leg", "ref"]
    assert main(gate) == 1
    assert main(gate + ["--allow-missing"]) == 0


# 12. parity.md shows every device and commit; merge refuses mixed runs (test 3) -----------------------
def test_parity_md_shows_mixed_provenance(files):
    tmp, _, tpu, gate = files
    mixed = tpu.copy()
    mixed.loc[mixed["case_id"] != CASE.id, ["git_commit", "device"]] = ["0123456789ab", "other device"]
    assert gate(tmp / "gpu.csv", _write(mixed, tmp / "mixed.csv")) == 0
    md = (tmp / "gate" / "parity.md").read_text()
    assert "0123456789ab" in md and "other device" in md and "**mixed**" in md


@pytest.mark.parametrize("name", ["ref", pytest.param("gpu", marks=pytest.mark.needs_leg("gpu")), "tpu"])
def test_every_leg_names_its_package_in_versions(name):
    from harness.legs import leg_spec, make_leg

    assert leg_spec(name).version_key in make_leg(name).environment().versions
