"""Your own cases: any well-formed case id (``Case.from_id``), case files (``--cases-file``), through the CLI
and the pytest plugin; one user case in no suite end to end through the ref, tpu and gpu legs and the gate."""

from pathlib import Path

import pandas as pd
import pytest

from cases.case import Case, Gate
from cases.case_file import CaseFileError
from cases.suites import SUITES, get_suite, with_draws
from harness.app import case_from_id, find_case, load_cases
from harness.cli import select_cases, build_parser, main

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parent.parent / "cases" / "examples" / "my_cases.toml"
USER = "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/dht"
"""A user case in no suite: a partial last chunk (T = 64 + 16) with an upstream state gradient, small enough for
every leg (the GPU leg, emulated, in about 15 s)."""

USER_TOML = """
[[case]]
op = "simple_gla"
variant = "chunk"
B = 1
T = 80
H = 1
K = 128
V = 128
gate = "g=logsigmoid/16"
dht = true
"""


def _all_suite_cases():
    return [c for name in SUITES for c in get_suite(name)]


# ------------------------------------------------------------------ ids
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_case_round_trips_through_its_id(suite):
    for case in with_draws(get_suite(suite), 3):
        parsed = Case.from_id(case.id)
        assert parsed == case and parsed.id == case.id and parsed.rng_seed == case.rng_seed


def test_the_id_grammar_round_trips_every_kind_of_part():
    cases = [
        Case("kda", "chunk", B=1, T=80, H=1, K=128, V=128, dtype="float32",
             gate=Gate("g", normalizer=0.1, lower_bound=-5.0), lens=(30, 50), dht=True,
             options=(("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", False))),
        Case("gla", "chunk", B=2, T=48, H=2, K=64, V=256, dtype="float16", gate=Gate("g_gamma", "alibi", num_layers=8,
             layer_idx=7), chunk_size=32, final_state=False, scale=0.25, seed=11, options=(("tpu_path", "chunk"),)),
        Case("kda", "chunk", B=1, T=64, H=1, K=128, V=128, gate=Gate(),
             options=(("use_gate_in_kernel", True), ("lower_bound", -2.5), ("safe_gate", True))),
    ]
    for case in cases:
        assert Case.from_id(case.id) == case, case.id
    # the id's long dtype names and flags in any order read the same case
    assert Case.from_id(USER.replace("/bf16/", "/bfloat16/").replace("/dht", "/dht,h0")) == \
        Case.from_id(USER + ",h0") == Case.from_id(USER).replace(h0=True)
    assert Gate.from_label("g=logsigmoid/16,lb-5") == Gate("g", normalizer=16, lower_bound=-5.0)


def test_option_values_read_as_the_id_writes_them():
    case = Case.from_id("kda.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/"
                        "lower_bound=-5,use_gate_in_kernel=1")
    assert case.opt == {"use_gate_in_kernel": True, "lower_bound": -5}
    assert case.opt["use_gate_in_kernel"] is True  # a bool, as the op's contract requires


@pytest.mark.parametrize("bad, part", [
    ("", "is empty"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64", "has 2 parts"),
    ("simple_gla/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64", "part 'simple_gla' must read op.variant"),
    ("simple_gla.chunk/B1-T80-H1-K64/bf16/g=logsigmoid/16/C64", "part 'B1-T80-H1-K64' must read B<n>-T<n>"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf8/g=logsigmoid/16/C64", "part 'bf8' is not a dtype"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/x/C64", "normalizer 'x' is not a finite number"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/C64", "lacks its normalizer"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=sigmoid/16/C64", "law must be one of"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16,lbx/C64", "',lb<number>'"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g_gamma=alibi(L8,l9)/C64", "layer_idx=9 must lie in"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/64", "part '64' is not a chunk size C<n>"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/h1", "flag 'h1'"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/h0,h0", "flag 'h0' appears twice"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/h0/dht", "part 'dht' follows the flags"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/lens=30+40", "T must equal it, got T=80"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/lens=30+-50", "lens reads <n>+<n>"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/seed=-1", "seed must be a non-negative int"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/scale=nan", "'nan' is not a finite number"),
    ("simple_gla.chunk/B0-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64", "B=0 must be a positive int"),
    ("simple_gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/noht,dht", "dht=True needs final_state=True"),
    # the op's contract (its descriptor's validate): no op-specific rule lives in the parser
    ("nope.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64", "unknown op 'nope'"),
    ("gla.fused_chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64", "gla case.variant='fused_chunk'"),
    ("kda.chunk/B1-T80-H1-K64-V64/bf16/g_gamma=alibi(L32,l0)/C64", "kda takes a per-token g gate"),
    ("gla.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/tpu_path=fast", "tpu_path='fast' must be one of"),
    ("kda.chunk/B1-T80-H1-K64-V64/bf16/g=logsigmoid/16/C64/lower_bound=-5", "lower_bound acts only with"),
])
def test_a_malformed_id_is_a_one_line_error_naming_the_bad_part(bad, part):
    with pytest.raises(ValueError) as info:
        case_from_id(bad)
    message = str(info.value)
    assert "\n" not in message and part in message, message
    assert message.startswith("case id ")


def test_find_case_takes_suite_cases_and_any_well_formed_id():
    suite_case = get_suite("smoke")[0]
    assert find_case(suite_case.id) is not None and find_case(suite_case.id) == suite_case
    assert find_case(suite_case.replace(seed=2).id) == suite_case.replace(seed=2)
    assert USER not in {c.id for c in _all_suite_cases()}
    assert find_case(USER).id == USER
    with pytest.raises(ValueError, match="part 'B1' must read"):
        find_case("simple_gla.chunk/B1/bf16/g=logsigmoid/16/C64")


# ------------------------------------------------------------ case files
def test_the_example_file_loads_and_its_cases_are_in_no_suite():
    cases = load_cases(EXAMPLE)
    suite_ids = {c.id for c in _all_suite_cases()}
    assert len(cases) == 7 and len({c.id for c in cases}) == 7
    assert not {c.id for c in cases} & suite_ids
    assert cases[1].id == "gla.chunk/B1-T80-H1-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64/h0"  # an id entry
    assert cases[2].lens == (17, 50, 13) and cases[2].T == 80 and cases[2].B == 1  # T and B from lens


def test_cases_and_a_grid(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(USER_TOML + """
[[case]]
id = "gla.chunk/B1-T48-H1-K128-V128/fp32/g_gamma=alibi(L8,l3)/C64/h0"

[[grid]]
op = "kda"
variant = "chunk"
H = 1
K = 128
V = 128
lens = [[30, 50], [80]]
dtype = ["bfloat16", "float32"]
gate = { kind = "g", normalizer = 16, lower_bound = -5.0 }
options = [{}, { use_qk_l2norm_in_kernel = true, use_beta_sigmoid_in_kernel = true }]
""")
    cases = load_cases(path)
    assert [c.id for c in cases[:2]] == [USER, "gla.chunk/B1-T48-H1-K128-V128/fp32/g_gamma=alibi(L8,l3)/C64/h0"]
    grid = cases[2:]
    assert len(grid) == 8  # 2 packings x 2 dtypes x 2 option sets, the last field varying fastest
    assert [(c.lens, c.dtype, bool(c.options)) for c in grid[:3]] == [
        ((30, 50), "bfloat16", False), ((30, 50), "bfloat16", True), ((30, 50), "float32", False)]
    assert all(c.T == 80 and c.B == 1 and c.gate.lower_bound == -5.0 for c in grid)
    assert grid[1].opt == {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True}
    for c in cases:  # a file's case is the case its id names
        assert Case.from_id(c.id) == c


@pytest.mark.parametrize("body, where", [
    ("[[case]]\nop = 'simple_gla'\nvariant = 'chunk'\nB = 1\nT = 0\nH = 1\nK = 64\nV = 64",
     "case[0]: field 'T': must be a positive int, got 0"),
    ("[[case]]\nop = 'simple_gla'\nvariant = 'chunk'\nB = 1\nH = 1\nK = 64\nV = 64",
     "case[0]: field 'T': missing"),
    (USER_TOML + "\n[[case]]\nop = 'simple_gla'\nvariant = 'chunkk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64",
     "case[1]: field 'variant': simple_gla has variants"),
    ("[[case]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64\nchunk = 64",
     "case[0]: field 'chunk': unknown field"),
    ("[[case]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64\ngate = 'g=logsigmoid'",
     "case[0]: field 'gate': gate 'g=logsigmoid' lacks its normalizer part"),
    ("[[case]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64\nlens = [3, 4]",
     "case[0]: field 'lens': lens=(3, 4) packs sum(lens)=7 tokens"),
    ("[[case]]\nid = 'gla.chunk/B1-T8-H1-K64-V64/bf16/g=logsigmoid/16/C64'\nh0 = true",
     "case[0]: field 'id': an id names the whole case"),
    ("[[case]]\nid = 'gla.chunk/B1-T8-H1-K64/bf16/g=logsigmoid/16/C64'",
     "case[0]: field 'id': case id 'gla.chunk/B1-T8-H1-K64/bf16/g=logsigmoid/16/C64': part 'B1-T8-H1-K64'"),
    ("[[grid]]\nop = 'kda'\nvariant = 'chunk'\nB = 1\nT = [16, 32]\nH = 1\nK = 64\nV = 64\n"
     "options = [{}, {lower_bound = -5.0}]",
     "grid[0] (T=16, options={lower_bound=-5.0}): field 'options.lower_bound': lower_bound acts only with"),
    # the message goes on to list the known options, safe_gate among them: the unknown one is blamed
    ("[[case]]\nop = 'kda'\nvariant = 'chunk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64\n"
     "options = {safe_gate = true, disable_recompute = true}",
     "case[0]: field 'options.disable_recompute': unknown kda options ['disable_recompute']"),
    ("[[grid]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = 16\nH = 1\nK = 64\nV = 64\ndtype = ['bf16', 'fp8']",
     "grid[0]: field 'dtype': must be one of"),
    ("[[grid]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = []\nH = 1\nK = 64\nV = 64",
     "grid[0]: field 'T': an empty list expands to no case"),
    ("[[grid]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = 16\nH = 1\nK = 64\nV = 64\ndht = true\n"
     "final_state = [true, false]", "grid[0] (final_state=False): field 'final_state': dht=True needs"),
    (USER_TOML + "\n[[grid]]\nop = 'simple_gla'\nvariant = 'chunk'\nB = 1\nT = [64, 80]\nH = 1\nK = 128\n"
     "V = 128\ndht = true", f"grid[0] (T=80) repeats case {USER} of case[0]"),
    ("[case]\nop = 'gla'", "'case' must be an array of tables: write [[case]], not [case]"),
    ("[[cases]]\nop = 'gla'", "unknown table or key 'cases'"),
    ("[[case]]\nop = ", "not valid TOML"),
    ("# nothing", "no [[case]] or [[grid]] entry"),
])
def test_file_errors_name_the_file_the_entry_and_the_field(tmp_path, body, where):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(CaseFileError) as info:
        load_cases(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cases file {path}: "), message
    assert where in message, message


# ------------------------------------------------------------------- CLI
@pytest.mark.parametrize("verb", ["cases", "run", "causality", "compile", "all", "calibrate"])
def test_every_selecting_verb_takes_ids_and_files(verb, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(USER_TOML)
    extra = ["--backend", "ref"] if verb in ("run", "causality") else []
    suite_case = get_suite("regressions")[0]
    args = build_parser().parse_args([verb, *extra, "--cases-file", str(path), "--case", suite_case.id,
                                      "--case", USER])
    cases = select_cases(args)
    draws = getattr(args, "draws", 1)
    assert [c.id for c in cases[::draws]] == [suite_case.id, USER]  # --case first, each case once


def test_cli_lists_a_file_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text(USER_TOML)
    assert main(["cases", "--cases-file", str(path)]) == 0
    assert capsys.readouterr().out.split("\t")[0] == USER
    path.write_text(USER_TOML.replace("T = 80", "T = -80"))
    out = ["--out", str(tmp_path / "out")]
    for verb in (["cases"], ["run", "--backend", "ref", *out], ["causality", "--backend", "ref", *out],
                 ["compile", *out], ["all", *out]):
        assert main([*verb, "--cases-file", str(path)]) == 2, verb
        err = capsys.readouterr().err
        assert err == f"parity: error: cases file {path}: case[0]: field 'T': must be a positive int, got -80\n"
    assert main(["run", "--backend", "ref", "--cases-file", str(tmp_path / "absent.toml")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["run", "--backend", "ref", "--case", USER.replace("K128-", "K128x-")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "part 'B1-T80-H1-K128x-V128' must read" in err


@pytest.mark.heavy  # a case through every leg and the gate, as the smoke run is: pytest -m heavy (.ci/run)
@pytest.mark.needs_leg("gpu")
def test_a_user_case_end_to_end_through_every_leg_and_the_gate(tmp_path, monkeypatch, capsys):
    """A case in no suite, by id and by file: the same case, the same result file name, the same inputs; the
    ref, tpu and gpu legs (emulated) run it and the gate compares gpu and tpu."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))  # no cache outside this test
    path = tmp_path / "mine.toml"
    path.write_text(USER_TOML)
    out = tmp_path / "out"
    common = ["--out", str(out), "--no-progress", "--no-ref-cache"]
    assert main(["run", "--backend", "ref", "--case", USER, *common]) == 0
    assert main(["run", "--backend", "tpu", "--cases-file", str(path), *common]) == 0
    assert main(["run", "--backend", "gpu", "--case", USER, *common]) == 0
    frames = {leg: pd.read_csv(next(out.glob(f"{leg}.cases-*.csv"))) for leg in ("ref", "tpu", "gpu")}
    names = {leg: next(out.glob(f"{leg}.cases-*.csv")).name.split(".", 1)[1] for leg in frames}
    assert len(set(names.values())) == 1, names  # by id or by file: one selection, one name
    for leg, df in frames.items():
        assert set(df["case_id"]) == {USER}, leg
        assert set(df["status"]) == {"ok"}, (leg, df[["tensor", "status", "reason"]])
        assert df["suite"].isna().all() or set(df["suite"].fillna("")) == {""}, leg  # not a suite's result
    inputs = {leg: set(df["input_sha256"]) for leg, df in frames.items()}
    assert inputs["ref"] == inputs["tpu"] == inputs["gpu"] and len(inputs["ref"]) == 1
    capsys.readouterr()
    gpu, tpu = (next(out.glob(f"{leg}.cases-*.csv")) for leg in ("gpu", "tpu"))
    assert main(["gate", str(gpu), str(tpu), "--out", str(out)]) == 0
    assert "gate: PASS" in capsys.readouterr().out
    parity = pd.read_csv(out / "parity.csv")
    assert set(parity["case_id"]) == {USER} and len(parity) > 0


# ---------------------------------------------------------- pytest plugin
INLINE = '''
def test_case(parity_case, parity_results, request):
    parity_results.add("ref", [{"case_id": parity_case.id, "tensor": "o", "leg": "ref", "status": "unsupported",
                                "reason": "a row without numbers", "input_sha256": "a" * 64, "mode": "native",
                                "suite": ""}])
'''


@pytest.mark.heavy  # three pytest runs, each its legs: pytest -m heavy (.ci/run)
def test_pytest_plugin_takes_ids_and_files(pytester, monkeypatch):
    pytester.makepyfile(test_inline=INLINE)
    path = pytester.path / "mine.toml"
    path.write_text(USER_TOML + '\n[[case]]\nid = "gla.chunk/B1-T48-H1-K128-V128/fp32/g_gamma=alibi(L8,l3)/C64"\n')
    out = pytester.path / "out"
    suite_case = get_suite("smoke")[0]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--parity-cases-file={path}",
                                           "--parity-case", suite_case.id, f"--parity-out={out}", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"*test_case?{USER}?*PASSED*"])
    [written] = out.glob("ref.cases-*.csv")  # named as `parity run --case/--cases-file` names its file
    assert set(pd.read_csv(written)["case_id"]) == {USER, suite_case.id,
                                                    "gla.chunk/B1-T48-H1-K128-V128/fp32/g_gamma=alibi(L8,l3)/C64"}
    # the environment variable, and --parity-op on top
    monkeypatch.setenv("PARITY_CASES_FILE", str(path))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parity-op", "gla", f"--parity-out={out}")
    result.assert_outcomes(passed=1)
    # a bad file is a usage error naming the file, entry and field
    path.write_text(USER_TOML.replace("H = 1", "H = 0"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines([f"ERROR: cases file {path}: case[[]0[]]: field 'H': must be a positive int, got 0"])


def test_a_file_lists_its_cases_in_the_order_it_writes_them(tmp_path):
    """tomllib keeps each kind's entries but not how [[case]] and [[grid]] interleave; the file's order wins."""
    path = tmp_path / "order.toml"
    path.write_text("[[grid]]\nop = 'gla'\nvariant = 'chunk'\nB = 1\nT = [16, 32]\nH = 1\nK = 64\nV = 64\n\n"
                    "[[case]]\nid = 'simple_gla.chunk/B1-T8-H1-K64-V64/bf16/g=logsigmoid/16/C64'\n\n"
                    "[[grid]]\nop = 'kda'\nvariant = 'chunk'\nB = 1\nT = 8\nH = 1\nK = 64\nV = 64\n")
    assert [(c.op, c.T) for c in load_cases(path)] == [("gla", 16), ("gla", 32), ("simple_gla", 8), ("kda", 8)]


def test_parity_cases_notes_a_binding_refusal_when_your_case_is_made(capsys):
    mismatch = "gla.chunk/B1-T15-H1-K64-V64/bf16/g=logsigmoid/16/C64"  # fla picks C16 for T=15
    assert main(["cases", "--case", mismatch]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(mismatch)
    assert "the fla binding refuses it" in err and "16 for T=15" in err and err.count("\n") == 1
    assert main(["cases", "--case", mismatch.replace("/C64", "/C16")]) == 0
    assert capsys.readouterr().err == ""
