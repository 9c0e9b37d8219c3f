"""A run survives its faults (docs/faults.md): each fault is made here, from the test side, and the run must keep
every other case, name what happened, and exit with the code the fault table gives.

The candidates are written into a temporary module and registered with ``--impl``, as a team binds its own
library: an outside implementation's cases each run in a worker process of their own even at ``--jobs 1``
(harness.app.workers), so a binding that exits, crashes or hangs on one case costs that case alone."""

import math
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from harness.cli import EXIT_INTERRUPTED, EXIT_LOST, EXIT_USAGE, main

CASES = ["simple_gla.chunk/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64",  # the one the binding breaks on
         "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64"]


def _run(tmp_path, monkeypatch, faulty, fault: str, *extra) -> tuple[int, pd.DataFrame]:
    monkeypatch.setenv("FAULT", fault)
    out = tmp_path / f"out-{fault}"
    code = main(["run", *faulty, *[a for c in CASES for a in ("--case", c)], "--out", str(out), "--no-progress",
                 "--jobs", "1", "--tpu-targets", "v6e", *extra])
    [path] = out.glob("faulty.cases-*.csv")
    return code, pd.read_csv(path, keep_default_na=False)


def _by_case(rows: pd.DataFrame) -> dict[str, set[str]]:
    """Each case's statuses, but ``not_provided`` (the forward-only binding's gradient rows)."""
    rows = rows[rows["status"] != "not_provided"]
    return rows.groupby("case_id")["status"].agg(set).to_dict()


@pytest.mark.needs_leg("tpu")
@pytest.mark.parametrize("fault, how", [("exit", r"its process ended \(exit code 7\)"),
                                        ("segfault", r"its process ended \(signal SIGSEGV\)")])
def test_a_case_that_kills_its_process_is_its_own_error_rows(tmp_path, monkeypatch, faulty, fault, how):
    code, rows = _run(tmp_path, monkeypatch, faulty, fault)
    assert code == EXIT_LOST  # not 1: nothing was judged on that case
    assert _by_case(rows) == {CASES[0]: {"error"}, CASES[1]: {"ok"}}  # the case after it ran, in a fresh worker
    reasons = rows.loc[rows["case_id"] == CASES[0], "reason"]
    assert reasons.str.contains(how).all(), reasons.tolist()
    assert reasons.str.contains("its stderr: faulty: about to break on bfloat16").all()  # what it printed


@pytest.mark.needs_leg("tpu")
def test_a_case_past_its_time_limit_is_stopped_and_the_run_goes_on(tmp_path, monkeypatch, faulty):
    t0 = time.monotonic()
    code, rows = _run(tmp_path, monkeypatch, faulty, "hang", "--case-timeout", "20")
    assert time.monotonic() - t0 < 300  # the hang is 600 s: it was stopped, not waited for
    assert code == EXIT_LOST
    assert _by_case(rows) == {CASES[0]: {"error"}, CASES[1]: {"ok"}}
    reasons = rows.loc[rows["case_id"] == CASES[0], "reason"]
    assert reasons.str.contains("ran past --case-timeout 20 s and was stopped").all(), reasons.tolist()


@pytest.mark.parametrize("bad", ["-1", "soon", "inf", "nan"])
def test_a_bad_case_timeout_is_one_line_and_exit_2(tmp_path, capsys, bad):
    code = main(["run", "--backend", "ref", "--case", CASES[1], "--out", str(tmp_path), "--case-timeout", bad])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"parity: error: --case-timeout {bad!r} must be a number of seconds, at least 0 (0: no limit)"]


@pytest.mark.needs_leg("tpu")
def test_sigterm_ends_a_run_as_ctrl_c_does(tmp_path):
    """What CI sends a cancelled job, with libtpu loaded (its failure handler would dump a stack): the finished
    cases are kept, the resume hint printed, exit 130; and the same command with --resume finishes the run."""
    env = dict(os.environ, PARITY_CACHE_DIR=str(tmp_path / "cache"))
    cases = [CASES[1], "simple_gla.chunk/B1-T128-H2-K64-V64/fp32/g=logsigmoid/16/C64"]
    command = [sys.executable, "-m", "harness.cli", "run", "--backend", "tpu",
               *[a for c in cases for a in ("--case", c)], "--tpu-targets", "v6e", "--out", str(tmp_path / "out"),
               "--no-progress", "--jobs", "1"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = None
    deadline = time.monotonic() + 240
    while partial is None and proc.poll() is None and time.monotonic() < deadline:
        partial = next((tmp_path / "out").glob("tpu.cases-*.partial.csv"), None)
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before a case was kept: choose a longer selection"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert "--resume" in err and str(partial) in err, err[-2000:]
    assert "Traceback" not in err and "*** SIGTERM" not in err, err[-2000:]
    assert partial.exists()
    done = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    # the second case too when the stop landed where Python swallows a KeyboardInterrupt (a gc callback of jax's):
    # the walk then stops after that case
    assert re.search(r"[12] of 2 cases already done", done.stdout), done.stdout


# ------------------------------------------------------------------ files: torn writes, resumes, unfinished runs
SMALL = ["simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64",
         "simple_gla.chunk/B1-T64-H2-K64-V64/fp32/g=logsigmoid/16/C64"]


@pytest.fixture
def ref_rows(tmp_path, monkeypatch):
    """A finished ref-leg result file of two small cases, and its rows."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "made"
    assert main(["run", "--backend", "ref", *[a for c in SMALL for a in ("--case", c)], "--out", str(out),
                 "--no-progress", "--jobs", "1"]) == 0
    [path] = out.glob("ref.cases-*.csv")
    return path, pd.read_csv(path, keep_default_na=False)


def _provenance(rows: pd.DataFrame) -> dict:
    return {c: rows[c].iloc[0] for c in ("leg", "mode", "suite", "git_commit", "versions", "settings")}


@pytest.mark.needs_leg("ref")
def test_a_failed_write_keeps_every_whole_case_and_names_the_file(tmp_path, monkeypatch, ref_rows):
    """A full disk while a case is appended: the file is cut back to the cases before it, the error names the
    file and the way on, and --resume takes every whole case."""
    import errno

    import harness.run.result_file as result_file

    _, rows = ref_rows
    first, second = (rows[rows["case_id"] == c].to_dict("records") for c in SMALL)
    path = tmp_path / "run" / "ref.csv"
    path.parent.mkdir()
    with result_file.ResultFile(path, _provenance(rows)) as out:
        out.append(first)
        kept = out.partial.read_bytes()

        def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(result_file.os, "fsync", full)  # the disk fills as the second case is written
        with pytest.raises(OSError) as caught:
            out.append(second)
        assert caught.value.filename == str(out.partial)
        assert "No space left on device" in caught.value.strerror and "--resume" in caught.value.strerror
        assert out.partial.read_bytes() == kept  # no torn case
    monkeypatch.undo()
    with result_file.ResultFile(path, _provenance(rows), resume=True) as out:
        assert out.done == {SMALL[0]}


@pytest.mark.needs_leg("ref")
def test_resume_refuses_a_changed_setting_and_names_it(tmp_path, ref_rows, capsys):
    path, _ = ref_rows
    partial = path.with_name(path.stem + ".partial.csv")
    path.rename(partial)  # as a run cut after its cases would leave it
    code = main(["run", "--backend", "ref", *[a for c in SMALL for a in ("--case", c)], "--out", str(path.parent),
                 "--no-progress", "--jobs", "1", "--resume", "--ref-dtype", "float32"])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"cannot resume {partial}: it was made with settings." in err and "--force" in err, err
    assert partial.exists()  # nothing the user made is touched


@pytest.mark.needs_leg("ref")
def test_the_gate_refuses_an_unfinished_run_unless_told(tmp_path, ref_rows, capsys):
    path, rows = ref_rows
    other = tmp_path / "other" / path.name
    other.parent.mkdir()
    rows.to_csv(other, index=False)
    partial = path.with_name(path.stem + ".partial.csv")
    path.rename(partial)
    gate = ["gate", str(other), str(partial), "--baseline-leg", "ref", "--candidate-leg", "ref",
            "--out", str(tmp_path / "gate")]
    assert main(gate) == EXIT_USAGE
    assert "is the partial file of a run that did not finish" in capsys.readouterr().err
    code = main(gate + ["--allow-partial"])
    out = capsys.readouterr().out
    assert code == 1 and "gate: UNFINISHED RUN, not a pass" in out, out
    assert "UNFINISHED RUN" in (tmp_path / "gate" / "parity.md").read_text()


# ------------------------------------------------------------------ rows edited by hand: what the gate re-derives
@pytest.mark.needs_leg("ref")
def test_an_edited_max_abs_is_refused_naming_the_column(tmp_path, monkeypatch, capsys):
    """Halving a row's max_abs (its error ~1e-7 in float32; the check resolves 1e-13 of the values' size)."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", "--backend", "ref", "--case", SMALL[0], "--ref-dtype", "float32", "--out",
                 str(tmp_path / "made"), "--no-progress", "--jobs", "1"]) == 0
    [path] = (tmp_path / "made").glob("ref.cases-*.csv")
    rows = pd.read_csv(path, keep_default_na=False)
    edited = rows.copy()
    i = edited.index[edited["status"] == "ok"][0]
    edited.at[i, "max_abs"] = float(edited.at[i, "max_abs"]) / 2  # a smaller error than the row's own worst element
    candidate = tmp_path / "edited" / path.name
    candidate.parent.mkdir()
    edited.to_csv(candidate, index=False)
    code = main(["gate", str(path), str(candidate), "--baseline-leg", "ref", "--candidate-leg", "ref",
                 "--out", str(tmp_path / "gate")])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{candidate}:{i + 2}: column 'max_abs'" in err and "the row was edited" in err, err


@pytest.mark.needs_leg("ref")
def test_a_row_reads_back_as_written_under_a_lossy_csv_parser(tmp_path, monkeypatch, request, ref_rows):
    """A native H200 run wrote max_abs 0.00034456638728446663; pandas 3.0.6's read_csv returned
    0.0003445663872844 (pandas-dev/pandas#39514, 16 significant digits behind leading zeros) and --resume refused
    the row as edited. Such a parser is put in pandas' place here, from the test side: the rows must still read
    back bit for bit and pass the check."""
    from harness.core import results

    path, rows = ref_rows
    ref, got = -3.289981155834498e-05, 0.00031166657572612166  # that row's worst element
    i = rows.index[rows["status"] == "ok"][0]
    rows.loc[i, ["ref_at_worst", "got_at_worst", "max_abs"]] = [ref, got, abs(ref - got)]
    rows.to_csv(path, index=False)
    assert "0.00034456638728446663" in path.read_text()  # written as its repr

    read_csv = pd.read_csv

    def first_17_digits(x: float) -> float:  # what pandas 3.0.6 made of those two fields written in positional form
        text = repr(abs(x))
        return x if "e" in text else math.copysign(float(text[:18]), x)

    def lossy(*args, **kwargs):  # pandas' "high" parser before 3.1, as far as these fields show it
        df = read_csv(*args, **kwargs)
        if kwargs.get("float_precision") != "round_trip":
            for c in df.columns[df.dtypes == float]:
                df[c] = df[c].map(first_17_digits)
        return df

    request.addfinalizer(results.exact_float_keywords.cache_clear)
    results.exact_float_keywords.cache_clear()
    monkeypatch.setattr(pd, "read_csv", lossy)
    assert results.exact_float_keywords() == {"float_precision": "round_trip"}
    back = results.read_results(path)
    assert back.loc[i, ["ref_at_worst", "got_at_worst", "max_abs"]].tolist() == [ref, got, abs(ref - got)]
    results.exact_float_keywords.cache_clear()
    monkeypatch.setattr(results, "exact_float_keywords", lambda: {})  # the parser taken as it is: the fault shows
    with pytest.raises(results.ReportError, match=rf":{i + 2}: column 'max_abs'.*the row was edited"):
        results.read_results(path)


@pytest.mark.needs_leg("ref")
def test_a_native_mode_on_an_interpreter_is_refused(ref_rows):
    from harness.core.results import ReportError, check_results

    _, rows = ref_rows
    emulated = rows.assign(mode="emulated", device="cpu (Pallas TPU interpret mode)")
    check_results(emulated, "tpu.csv")  # as the emulated TPU leg writes it
    with pytest.raises(ReportError, match=r"tpu.csv:2: column 'mode': 'native', but its device is 'cpu \(Pallas "
                                          r"TPU interpret mode\)'"):
        check_results(emulated.assign(mode="native"), "tpu.csv")


@pytest.mark.needs_leg("ref")
def test_sides_made_apart_are_a_line_of_the_verdict(tmp_path, ref_rows, capsys):
    """Another commit, or another version of a package both sides record, is said with the verdict (terminal,
    parity.md), not only on the provenance lines."""
    import json

    path, rows = ref_rows
    versions = json.loads(rows["versions"].iloc[0])
    package = sorted(versions)[0]
    other = rows.assign(git_commit="0" * 40, versions=json.dumps({**versions, package: "0.0.1"}, sort_keys=True))
    candidate = tmp_path / "apart" / path.name
    candidate.parent.mkdir()
    other.to_csv(candidate, index=False)
    assert main(["gate", str(path), str(candidate), "--baseline-leg", "ref", "--candidate-leg", "ref",
                 "--out", str(tmp_path / "gate")]) == 0
    out = capsys.readouterr().out
    assert f"gate: made apart: the baseline's rows come from commit {rows['git_commit'].iloc[0]}" in out, out
    assert f"gate: made apart: {package} {versions[package]} on the baseline's side, 0.0.1 on the candidate's" in out
    assert "**The two sides were made apart**" in (tmp_path / "gate" / "parity.md").read_text()


# ------------------------------------------------------------------ a case larger than the machine
def test_a_case_larger_than_the_machine_is_refused_before_it_allocates(tmp_path, capsys):
    from cases.case import Case
    from harness.app.selection import check_memory, input_bytes

    case = Case.from_id("simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64/h0,dht")
    assert input_bytes(case) == 8 * (4 * 64 * 64 + 64 + 2 * 64 * 64)  # q, k, v, do; g; h0, dht: float64 draws
    check_memory(case, memory=197120)  # exactly enough
    with pytest.raises(ValueError, match=r"needs at least 0\.0 GiB .* more than this machine's 0\.0 GiB"):
        check_memory(case, memory=197119)
    huge = "simple_gla.chunk/B1-T1000000000-H4-K128-V128/bf16/g=logsigmoid/16/C64"
    assert main(["run", "--backend", "ref", "--case", huge, "--out", str(tmp_path)]) == EXIT_USAGE
    [line] = capsys.readouterr().err.strip().splitlines()  # 8 (4 x 10^9 x 4 x 128 + 4 x 10^9) bytes
    assert line.startswith(f"parity: error: case {huge} needs at least 15,288.6 GiB for its inputs alone"), line
    assert not list(tmp_path.iterdir())  # refused before anything was made


@pytest.mark.needs_leg("ref")
def test_resume_runs_again_a_case_cut_inside_its_write(tmp_path, ref_rows, capsys):
    """A machine that stopped in the middle of a case's write leaves a torn last line: --resume drops that case's
    rows and runs it again, and the finished file holds every row of both cases once."""
    path, rows = ref_rows
    partial = path.with_name(path.stem + ".partial.csv")
    data = path.read_bytes()
    partial.write_bytes(data[:-40])  # cut inside the last row of the second case
    path.unlink()
    capsys.readouterr()
    assert main(["run", "--backend", "ref", *[a for c in SMALL for a in ("--case", c)], "--out", str(path.parent),
                 "--no-progress", "--jobs", "1", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"the rows of {SMALL[1]} were cut inside their write" in out and "1 of 2 cases already done" in out, out
    again = pd.read_csv(path, keep_default_na=False)
    assert sorted(map(tuple, again[["case_id", "tensor"]].values)) == sorted(map(tuple, rows[["case_id", "tensor"]].values))


@pytest.mark.needs_leg("ref")
def test_a_refusal_the_leg_does_not_give_is_an_edited_row(tmp_path, ref_rows, capsys):
    """A row edited from ok to unsupported would take its comparison out of the gate: parity gate asks the leg
    again (same commit, same versions) and refuses the file; rows of another commit are said not re-asked."""
    path, rows = ref_rows
    edited = rows.copy()
    i = edited.index[edited["case_id"] == SMALL[1]][0]
    edited.loc[i, ["status", "reason", "max_abs", "rel_l2"]] = ["unsupported", "no kernel for this shape", None, None]
    for column in ("ulp_max", "ulp_mean", "ulp_p99", "rel_l2_blocks"):
        edited.loc[i, column] = None
    candidate = tmp_path / "edited" / path.name
    candidate.parent.mkdir()
    edited.to_csv(candidate, index=False)
    gate = ["gate", str(path), str(candidate), "--baseline-leg", "ref", "--candidate-leg", "ref",
            "--out", str(tmp_path / "gate")]
    assert main(gate) == EXIT_USAGE
    err = capsys.readouterr().err
    assert (f"{candidate}: {SMALL[1]} is unsupported there ('no kernel for this shape'), but the ref leg here runs "
            f"it: the row was edited") in err, err
    edited.assign(git_commit="0" * 12).to_csv(candidate, index=False)  # made elsewhere: not asked, and said
    main(gate)
    out = capsys.readouterr().out
    assert f"gate: the refusals in {candidate} were not re-asked of the ref leg: its rows come from commit " in out


# ------------------------------------------------------------------ a file size limit libtpu would die of
def test_a_file_size_limit_too_small_for_libtpu_is_refused_before_it_compiles(tmp_path):
    import resource

    from harness.app.settings import DUMP_ROOM, check_file_size_limit

    check_file_size_limit(("v6e",), limit=resource.RLIM_INFINITY)
    check_file_size_limit(("v6e",), limit=DUMP_ROOM)
    check_file_size_limit((), limit=1024)  # nothing to compile: nothing libtpu writes
    with pytest.raises(ValueError, match=r"is 256 KiB: libtpu aborts .* compiling for v5e, v6e does not fit; raise it to "
                                         r"at least 64 MiB \(ulimit -f 65536\)"):
        check_file_size_limit(("v5e", "v6e"), limit=256 * 1024)

    def limited():  # in the child: what `ulimit -f 256` does
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))

    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--backend", "tpu", "--case", CASES[1],
                           "--out", str(tmp_path / "out"), "--tpu-targets", "v6e"], preexec_fn=limited,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_USAGE, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "parity: error: the file size limit (ulimit -f) is 256 KiB: libtpu aborts the process when a file it writes "
        "while compiling for v6e does not fit; raise it to at least 64 MiB (ulimit -f 65536) or to unlimited"]
