"""What a new user met binding a library on its own stack (issue 65), each made from the test side: a backward the
interpreter stops, a library's own device check, an error deep in a library, a case id to read, a candidate's gate
columns, and the draws a cross-stack gate needs."""

import math
import re
import sys

import pandas as pd
import pytest

from harness.cli import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, main

BF16 = "simple_gla.chunk/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64"  # the case the faulty binding breaks on


def _faulty_run(tmp_path, monkeypatch, faulty, fault: str, *cases: str) -> tuple[int, pd.DataFrame, object]:
    monkeypatch.setenv("FAULT", fault)
    out = tmp_path / f"out-{fault}"
    code = main(["run", *faulty, *[a for c in cases or (BF16,) for a in ("--case", c)], "--out", str(out),
                 "--no-progress", "--jobs", "1", "--tpu-targets", "v6e"])
    [path] = out.glob("faulty.cases-*.csv")
    return code, pd.read_csv(path, keep_default_na=False), path


@pytest.mark.needs_leg("tpu")
def test_a_failed_backward_keeps_the_forward_rows_with_their_numbers(tmp_path, monkeypatch, faulty):
    code, rows, path = _faulty_run(tmp_path, monkeypatch, faulty, "backward")
    assert code == EXIT_FAIL
    by = rows.set_index("tensor")
    for tensor in ("o", "ht"):  # the forward ran: its rows are compared as any
        assert by.loc[tensor, "status"] == "ok" and 0 < float(by.loc[tensor, "rel_l2"]) < 1e-2
    grads = by.loc[["dq", "dk", "dv", "dg"]]
    assert (grads["status"] == "error").all()
    assert grads["reason"].str.startswith("the backward failed after the forward ran: RuntimeError: the "
                                          "interpreter cannot run this backward kernel").all()
    kept = path.with_name(path.name.replace(".csv", ".tracebacks.txt")).read_text()
    assert "the error rows of dq, dk, dv, dg:" in kept and "in _stop_on_cpu" in kept


@pytest.mark.needs_leg("tpu")
def test_an_error_row_keeps_its_whole_traceback_and_its_repro_shows_it(tmp_path, monkeypatch, faulty, capsys):
    fp32 = BF16.replace("/bf16/", "/fp32/")
    code, rows, path = _faulty_run(tmp_path, monkeypatch, faulty, "raise", BF16, fp32)
    assert code == EXIT_FAIL
    assert set(rows.loc[rows.case_id == fp32, "status"]) == {"ok", "not_provided"}  # a forward-only binding
    reason = rows.loc[rows.case_id == BF16, "reason"].iloc[0]
    assert "ValueError: block size 64 does not divide the sequence" in reason and "\n" not in reason  # one line
    kept = (path.parent / path.name.replace(".csv", ".tracebacks.txt")).read_text()
    [entry] = [e for e in kept.split("=== ") if e]  # the case that failed, once, under its repro
    repro = rows.loc[rows.case_id == BF16, "repro"].iloc[0]
    assert entry.startswith(f"{BF16} [faulty leg]\nrepro: {repro}\n")
    assert re.search(r"in _check_block\n.*\nValueError: block size 64", entry)  # the frame the reason leaves out
    printed = capsys.readouterr().out
    assert f"full tracebacks, under each case's repro: {path.parent / path.name.replace('.csv', '.tracebacks.txt')}"\
        in printed and "Traceback (most recent call last)" not in printed  # two cases: the file is named

    # the repro command (one case) prints the traceback itself
    again = tmp_path / "again"
    assert main(["run", *faulty, "--case", BF16, "--out", str(again), "--no-progress", "--jobs", "1",
                 "--tpu-targets", "v6e"]) == EXIT_FAIL
    printed = capsys.readouterr().out
    assert "Traceback (most recent call last)" in printed and "in _check_block" in printed
    # a new run of the same file replaces the tracebacks of the rows it replaces
    monkeypatch.setenv("FAULT", "none")
    assert main(["run", *faulty, "--case", BF16, "--out", str(again), "--no-progress", "--jobs", "1",
                 "--tpu-targets", "v6e"]) == EXIT_PASS
    assert not list(again.glob("*.tracebacks.txt"))


@pytest.mark.needs_leg("tpu")
def test_a_librarys_own_device_check_is_named_as_such(tmp_path, monkeypatch, faulty):
    code, rows, _ = _faulty_run(tmp_path, monkeypatch, faulty, "device")
    assert code == EXIT_PASS  # unsupported: a refusal, not a failure
    reasons = rows["reason"]
    assert (rows["status"] == "unsupported").all()
    assert reasons.str.startswith("Not supported on cpu.; this is the library's own device check, not the case").all()
    assert reasons.str.contains("docs/legs.md#a-library-that-checks-its-device").all()


def test_only_a_refusal_of_the_cpu_in_an_emulated_run_gets_the_device_note():
    from harness.run.runner import PLATFORM_NOTE, platform_refusal

    for said in ("NotImplementedError: Not supported on cpu.", "kernel requires a TPU", "only supported on TPU v6+",
                 "not implemented for the CPU backend"):
        assert platform_refusal(said, "emulated") == said + PLATFORM_NOTE, said
    for said in ("kernel not implemented for this case", "K must be a multiple of 128", "shape not supported"):
        assert platform_refusal(said, "emulated") == said, said
    assert platform_refusal("Not supported on cpu.", "native") == "Not supported on cpu."  # a device's own word


# ------------------------------------------------------------------------------------------ parity cases --explain
def test_explain_reads_a_case_id_part_by_part(capsys):
    case = ("kda.chunk/B1-T96-H2-HV4-K64-V64/bf16/g=logsigmoid/16/C64/lens=0+60+36,h0,dht,seed=3,"
            "use_gate_in_kernel=1,lower_bound=-5")
    assert main(["cases", "--explain", case]) == EXIT_PASS
    text = capsys.readouterr().out
    # the gate: logsigmoid(N(0,1)) / 16 has median logsigmoid(0) / 16 = -ln 2 / 16, so a half-life of 16 tokens
    assert f"median log decay {-math.log(2) / 16:.4g}, a decay of {2 ** (-1 / 16):.4g} per token, half-life 16 tokens" \
        in text
    assert "HV=4 value heads (grouped: each q/k head serves 2)" in text
    assert "3 sequences packed along T of one batch row (fla's cu_seqlens [0, 0, 60, 96]); 1 empty" in text
    assert "h0: an initial state [3x4x64x64] is passed" in text and "seed=3: input draw 3" in text
    from harness.ops import get_op

    kda = get_op("kda")
    for name in ("use_gate_in_kernel", "lower_bound"):  # each option with the descriptor's own words
        assert f"  {name}=" in text and kda.options[name] in text
    assert "compares: o (" in text and "dA_log (gradient of A_log)" in text


def test_explain_says_a_strong_decay_its_bound_and_a_constant_gate(capsys):
    case = "simple_gla.chunk/B1-T64-H2-K64-V64/fp32/g=logsigmoid/0.1,lb-5,mask0.5/g_gamma[H,K]=const(-0.5)/C64"
    main(["cases", "--explain", case.replace("[H,K]", "")])
    text = capsys.readouterr().out
    assert f"median log decay {-math.log(2) / 0.1:.4g}" in text  # '/0.1' multiplies the draws by 10
    assert f"lb-5: every log decay clamped from below at -5 (never faster than a decay of {math.exp(-5):.4g}" in text
    assert "mask0.5: each log decay zeroed (no decay at that token) with probability 0.5" in text
    assert f"const(-0.5): every value is -0.5, a decay of {math.exp(-0.5):.4g} per token" in text
    assert "refused by the fla binding" in text  # both gates at once: fla's chunk kernel takes one


def test_explain_of_a_bad_id_is_one_line_and_exit_2(capsys):
    assert main(["cases", "--explain", "kda.chunk/B1-T64"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a case id reads op.variant/" in err


def test_every_option_an_op_takes_says_what_it_means():
    """The descriptors' ``options`` are the options each op's validation accepts, each with its meaning."""
    from harness.ops import delta_rule, gdn, gdn2, get_op, gla, kda, serving

    takes = {"kda": set(kda.OPTIONS) | set(delta_rule.CONV_OPTIONS),
             "gdn": set(gdn.OPTIONS) | set(delta_rule.CONV_OPTIONS),
             "gdn2": set(gdn2.OPTIONS) | set(delta_rule.CONV_OPTIONS), "gla": set(gla.OPTIONS), "simple_gla": set()}
    for name, own in takes.items():
        op = get_op(name)
        assert set(op.options) == own | set(serving.OPTIONS), name
        assert all(isinstance(m, str) and len(m) > 20 for m in op.options.values()), name


# ------------------------------------------------------------------------------------- the gate's columns
def test_the_gates_columns_are_named_by_the_legs_it_compared():
    from harness.judge.gate import PARITY_COLUMNS, SIDE_COLUMNS, side_columns

    assert side_columns("gpu", "tpu") == {c: c for c in SIDE_COLUMNS}  # the built-in pair keeps every name
    named = side_columns("gpu", "tokamax")
    assert [named.get(c, c) for c in PARITY_COLUMNS if c in SIDE_COLUMNS] == [
        "eps_gpu", "eps_tokamax", "gpu_status", "tokamax_status", "gpu_mode", "tokamax_mode", "tokamax_mxu_cost"]


# ------------------------------------------------------------------------------------- draws across two stacks
CASE = "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64"


@pytest.fixture
def made_apart(tmp_path, monkeypatch):
    """fla's rows and this project's kernels' rows of CASE, each made by its own ``parity run``."""
    from harness.core.results import read_results

    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    files = {}
    for leg in ("gpu", "tpu"):
        assert main(["run", "--backend", leg, "--case", CASE, "--out", str(tmp_path / leg), "--no-progress",
                     "--tpu-targets", "v6e"]) == EXIT_PASS
        [files[leg]] = (tmp_path / leg).glob(f"{leg}.cases-*.csv")
    return files, read_results


def _run_taking_gpu(tmp_path, files, read_results, python):
    from harness.app.session import Run, FoldedDraws
    from harness.app.settings import RunSettings

    out = tmp_path / "all"
    out.mkdir()
    run = Run(RunSettings(out=out, progress=False), say=lambda line: None)
    run.take("gpu", files["gpu"], read_results(files["gpu"]), python=python)
    tpu = out / files["tpu"].name
    tpu.write_bytes(files["tpu"].read_bytes())
    run.frames["tpu"], run.paths["tpu"] = read_results(tpu), tpu
    return run, FoldedDraws(run, ("gpu", "tpu")), out


@pytest.mark.needs_leg("gpu")
@pytest.mark.needs_leg("tpu")
def test_draws_the_baseline_lacks_are_said_as_its_stacks_command(tmp_path, made_apart):
    from cases.case import Case

    files, read_results = made_apart
    run, evidence, out = _run_taking_gpu(tmp_path, files, read_results, python=None)
    draws = [Case.from_id(CASE).replace(seed=s) for s in (1, 2)]
    assert evidence.draw(draws) is False  # the gate keeps them inconclusive
    assert set(run.frames["tpu"]["case_id"]) == {CASE}  # and the candidate did not run draws it cannot be judged on
    lines = run.undrawn_lines()
    listed = out / "gpu.undrawn.txt"
    assert listed.read_text().splitlines() == [d.id for d in draws]
    assert f"parity run --backend gpu $(sed 's/^/--case /' {listed}) --out DIR" in lines[1]
    assert "one more --baseline-rows" in lines[2] and "--baseline-python" in lines[2]


@pytest.mark.needs_leg("gpu")
@pytest.mark.needs_leg("tpu")
def test_the_baselines_stack_makes_its_draws_and_they_are_pooled(tmp_path, made_apart, capsys):
    from cases.case import Case

    files, read_results = made_apart
    run, evidence, out = _run_taking_gpu(tmp_path, files, read_results, python=sys.executable)  # "the other stack"
    draw = Case.from_id(CASE).replace(seed=1)
    assert evidence.draw([draw]) is True
    for leg in ("gpu", "tpu"):
        assert set(run.frames[leg]["case_id"]) == {CASE, draw.id}, leg
    kept = read_results(out / "gpu.draws.csv")  # made there, kept apart from the file given
    assert set(kept["case_id"]) == {draw.id} and set(kept["leg"]) == {"gpu"}
    assert set(read_results(files["gpu"])["case_id"]) == {CASE}  # the user's file is never written

    # a later run pools the given file and the draws' file (--baseline-rows twice)
    assert main(["all", "--case", CASE, "--baseline-rows", str(files["gpu"]), "--baseline-rows",
                 str(out / "gpu.draws.csv"), "--out", str(tmp_path / "pooled"), "--no-causality", "--no-progress",
                 "--tpu-targets", "v6e"]) == EXIT_PASS
    assert f"gpu: 1 cases' rows from {files['gpu']}, {out / 'gpu.draws.csv'} (2 draws)" in capsys.readouterr().out


def test_baseline_python_without_baseline_rows_is_one_line_and_exit_2(capsys):
    assert main(["all", "--case", CASE, "--baseline-python", sys.executable]) == EXIT_USAGE
    assert "give the baseline's rows too" in capsys.readouterr().err


@pytest.mark.needs_leg("gpu")
@pytest.mark.needs_leg("tpu")
def test_the_gate_judges_a_subset_without_allow_missing(tmp_path, made_apart, capsys):
    """fla's rows of more cases than the candidate ran: the gate is asked for the candidate's cases, and still fails
    a selected case the candidate lacks."""
    files, _ = made_apart
    other = CASE.replace("/fp32/", "/bf16/")
    assert main(["run", "--backend", "gpu", "--case", CASE, "--case", other, "--out", str(tmp_path / "both"),
                 "--no-progress"]) == EXIT_PASS
    [both] = (tmp_path / "both").glob("gpu.cases-*.csv")
    assert main(["gate", str(both), str(files["tpu"]), "--out", str(tmp_path / "g0")]) == EXIT_FAIL  # other: missing
    assert main(["gate", str(both), str(files["tpu"]), "--case", CASE, "--out", str(tmp_path / "g1")]) == EXIT_PASS
    assert set(pd.read_csv(tmp_path / "g1" / "parity.csv")["case_id"]) == {CASE}
    assert main(["gate", str(both), str(files["tpu"]), "--case", CASE, "--case", other, "--out",
                 str(tmp_path / "g2")]) == EXIT_FAIL  # a selected case the candidate lacks
    assert main(["gate", str(both), str(files["tpu"]), "--case", other, "--out", str(tmp_path / "g3")]) == EXIT_USAGE
    assert f"{files['tpu']} holds no row of the selected cases" in capsys.readouterr().err
    assert main(["gate", str(both), str(files["tpu"]), "--op", "gla", "--out", str(tmp_path / "g4")]) == EXIT_USAGE
    assert f"{both} holds no row of the selected cases" in capsys.readouterr().err
