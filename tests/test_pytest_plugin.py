"""The pytest plugin's mechanics: one test per suite case, rows merged across xdist workers."""

import pandas as pd

from cases.suites import get_suite

pytest_plugins = ["pytester"]

INLINE = '''
def test_case(parity_case, parity_results, request):
    parity_results.add("ref", [{"case_id": parity_case.id, "tensor": "o", "leg": "ref", "status": "unsupported",
                                "reason": "a row without numbers", "input_sha256": "a" * 64, "mode": "native",
                                "suite": request.config.option.parity_suite}])
'''


def _expected_ids():
    return sorted(c.id for c in get_suite("smoke") if c.op == "kda")


def test_one_test_per_case_and_merged_csv(pytester):
    pytester.makepyfile(test_inline=INLINE)
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "--parity-suite", "smoke",
                                           "--parity-op", "kda", f"--parity-out={out}")
    result.assert_outcomes(passed=len(_expected_ids()))
    df = pd.read_csv(out / "ref.op-kda.csv")  # an --parity-op selection names itself, as `parity run --op` does
    assert sorted(df["case_id"]) == _expected_ids()
    assert not (out / ".parts").exists()  # worker parts are merged and removed
    # a session of another suite never overwrites that result: its rows go to a file of their own
    before = (out / "ref.op-kda.csv").read_bytes()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parity-suite", "regressions",
                                           "--parity-op", "kda", f"--parity-out={out}")
    assert (out / "ref.op-kda.csv").read_bytes() == before
    result.stdout.fnmatch_lines(["*not writing*holds a result of suite smoke*"])
    [other] = [p for p in out.glob("ref.op-kda.*.csv") if p.name != "ref.op-kda.csv"]
    assert set(pd.read_csv(other)["suite"]) == {"regressions"}


def test_tpu_tests_skip_without_a_gpu_file(pytester):
    pytester.makepyfile(test_inline='''
def test_needs_baseline(gpu_baseline):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no GPU result file: pass --gpu-results PATH*"])


def test_empty_selection_is_an_error(pytester):
    pytester.makepyfile(test_inline=INLINE)
    result = pytester.runpytest_subprocess("--parity-op", "nope")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown op 'nope'*"])
    result = pytester.runpytest_subprocess("--parity-case", _expected_ids()[0], "--parity-op", "gla")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*selects no case*"])


def test_parity_op_takes_a_comma_list(pytester):
    pytester.makepyfile(test_inline=INLINE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parity-op", "kda,gla", "--collect-only", "-q")
    expected = sorted(c.id for c in get_suite("smoke") if c.op in ("kda", "gla"))
    assert sorted(line.split("[", 1)[1][:-1] for line in result.outlines if "::test_case[" in line) == expected


def test_counting_uncompared_rows_reads_a_file_without_reasons_quietly(tmp_path, recwarn):
    """A result file whose reasons are all empty (every row ok) is read without a warning: pandas would read the
    column as floats, and filling those with "" warns (Pandas4Warning)."""
    from harness.pytest_plugin import uncompared_rows
    from harness.core.status import FORWARD_ONLY, NO_GRADIENT

    path = tmp_path / "rows.csv"
    pd.DataFrame({"tensor": ["o", "dq"], "reason": [None, None]}).to_csv(path, index=False)
    assert uncompared_rows(path) == (0, 0)
    assert not recwarn.list, [str(w.message) for w in recwarn.list]
    pd.DataFrame({"tensor": ["o", "dq", "dg"], "reason": [None, f"{FORWARD_ONLY} dq", f"{NO_GRADIENT}: why"]}).to_csv(
        path, index=False)
    assert uncompared_rows(path) == (1, 1)


def test_tpu_compile_targets_reach_the_tpu_leg(pytester):
    pytester.makepyfile(test_inline='''
def test_targets(parity_runner):
    leg = parity_runner("tpu").leg
    assert leg.native or leg.compile_targets == ("v5e", "v7x")
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parity-tpu-targets", "v5e,v7x")
    result.assert_outcomes(passed=1)
    pytester.makepyfile(test_inline='''
def test_targets(parity_runner):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parity-tpu-targets", "v9")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown TPU target*v9*"])
