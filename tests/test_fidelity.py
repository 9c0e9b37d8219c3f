"""``parity fidelity`` (harness/judge/fidelity.py, harness/report/fidelity.py) and the baseline of record
(harness/judge/baseline.py): every definition on hand-built rows, the refusals (exit 2), the verdicts that move, and
the figures on the committed native H200 rows with the emulated side recomputed here for a fixed subset of cases."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.core.policy import policy_from_options
from harness.core.results import read_results, write_csv
from harness.judge import fidelity as F
from harness.judge.baseline import baseline_of_record, native_rows

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE_DIR = ROOT / "reports" / "h200-native"
NATIVE = NATIVE_DIR / "gpu-smoke-regressions.csv.gz"
EMULATED = NATIVE_DIR / "gpu-smoke-regressions.emulated.csv.gz"
# the emulated rows before issue 76's compiled sum order (fp32 decode o and dv overstated 1.4-2.1x)
BEFORE = NATIVE_DIR / "reduce-order" / "gpu-smoke-regressions.before.emulated.csv.gz"
H = "a" * 64  # an input_sha256
H2 = "b" * 64


# ---------------------------------------------------------------------------------------------- definitions
def test_the_ratio_is_emulated_over_native_with_its_values_at_zero():
    assert F.ratio(2e-3, 1e-3) == 2.0
    assert F.ratio(0.0, 0.0) == 1.0  # both exact: equal
    assert F.ratio(1e-3, 0.0) == math.inf
    assert F.ratio(0.0, 1e-3) == 0.0


def test_abs_ln_is_symmetric_in_a_factor_and_infinite_at_zero_and_infinity():
    assert F.abs_ln(2.0) == pytest.approx(0.6931471805599453)
    assert F.abs_ln(0.5) == pytest.approx(0.6931471805599453)
    assert F.abs_ln(1.0) == 0.0
    assert F.abs_ln(0.0) == math.inf and F.abs_ln(math.inf) == math.inf


def test_bit_equality_is_of_the_64_bits():
    a = np.array([1.0, 0.0, 1.0, 3.0])
    b = np.array([1.0, -0.0, np.nextafter(1.0, 2.0), 3.0])
    assert F.bits_equal(a, b).tolist() == [True, False, False, True]


def _rows(mode, *rows, dtype="float32"):
    """Result-like rows: (case_id, tensor, rel_l2, worst_index, got_at_worst[, status[, input_sha256]])."""
    out = []
    for r in rows:
        case, tensor, rel, index, got = r[:5]
        out.append({"case_id": case, "tensor": tensor, "rel_l2": rel, "worst_index": index, "got_at_worst": got,
                    "status": r[5] if len(r) > 5 else "ok", "input_sha256": r[6] if len(r) > 6 else H,
                    "dtype": dtype, "mode": mode})
    return pd.DataFrame(out)


A = "simple_gla.fused_recurrent/B1-T16-H1-K64-V64/fp32/g=logsigmoid/16/C64"
B = "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64"


def test_pairs_join_on_case_tensor_and_inputs_and_say_where_the_worst_element_is_bit_equal():
    emulated = _rows("emulated", (A, "o", 2e-3, "(0, 1, 0, 2)", 0.5), (A, "dv", 1e-3, "(0, 1, 0, 2)", 0.25),
                     (A, "ht", 4e-3, "(0, 0, 3, 1)", -1.0), (A, "dq", 1e-3, "(0, 0, 0, 0)", 1.0, "bound"),
                     (B, "o", 1e-3, "(0, 0, 0, 0)", 1.0))
    native = _rows("native", (A, "o", 1e-3, "(0, 1, 0, 2)", 0.5),       # same place, same bits
                   (A, "dv", 1e-3, "(0, 1, 0, 3)", 0.25),               # same value, another element
                   (A, "ht", 1e-3, "(0, 0, 3, 1)", np.nextafter(-1.0, 0)),  # same element, one ulp apart
                   (A, "dq", 1e-3, "(0, 0, 0, 0)", 1.0))
    p = F.pairs(emulated, native).set_index("tensor")
    assert p.attrs["only"] == {"emulated": 1, "native": 0}  # B has no native twin
    assert list(p.index) == ["o", "dv", "ht", "dq"]
    assert p.loc["o", "ratio"] == 2.0 and p.loc["dv", "ratio"] == 1.0 and p.loc["ht", "ratio"] == 4.0
    assert p.loc["o", "abs_ln"] == pytest.approx(math.log(2))
    assert p["bit_equal"].tolist() == [True, False, False, False]  # dq: not compared (a bound row)
    assert p["compared"].tolist() == [True, True, True, False]
    assert F.status_differs(p.reset_index())["tensor"].tolist() == ["dq"]


def test_group_figures_median_mean_abs_ln_and_bit_equal_share():
    emulated = _rows("emulated", (A, "o", 1e-3, "(0,)", 1.0), (A + "/h0", "o", 2e-3, "(0,)", 1.0),
                     (A + "/dht", "o", 4e-3, "(1,)", 1.0), (A + "/h0,dht", "o", 1e-3, "(1,)", 2.0))
    native = _rows("native", (A, "o", 1e-3, "(0,)", 1.0), (A + "/h0", "o", 1e-3, "(0,)", 1.5),
                   (A + "/dht", "o", 1e-3, "(0,)", 1.0), (A + "/h0,dht", "o", 2e-3, "(1,)", 2.0))
    p = F.pairs(emulated, native)  # worst element bit-equal: the first and the last
    (t,) = F.by_tensor(p).to_dict("records")
    # ratios 1, 2, 4, 0.5: median (1 + 2) / 2, mean |ln| (0 + ln2 + 2 ln2 + ln2) / 4 = ln 2
    assert (t["path"], t["dtype"], t["tensor"], t["rows"]) == ("simple_gla.fused_recurrent", "float32", "o", 4)
    assert t["median"] == 1.5
    assert t["mean_abs_ln"] == pytest.approx(math.log(2))
    assert (t["bit_equal"], t["bit_equal_frac"]) == (2, 0.5)
    (s,) = F.by_path(p, F.by_tensor(p)).to_dict("records")
    assert s["target_ln"] == "MISSED (0.693)" and s["target_bits"] == "MISSED (50.0%)"
    assert s["target_decode"] == "MISSED (o 1.5)"  # an fp32 fused_recurrent path: o's median is judged


@pytest.mark.parametrize("path, dtype, ln, bits, medians, expected", [
    ("gla.chunk", "float32", 0.05, 0.90, {"o": 3.0}, ("met", "met", "")),  # at the bounds; no decode target
    ("gla.chunk", "float32", 0.0501, 0.899, {}, ("MISSED (0.0501)", "MISSED (89.9%)", "")),
    ("gla.fused_recurrent", "float32", 0.0, 1.0, {"o": 1.05, "dv": 0.95}, ("met", "met", "met")),
    ("gla.fused_recurrent", "float32", 0.0, 1.0, {"o": 1.06, "dv": 0.95, "dq": 9.0},
     ("met", "met", "MISSED (o 1.06)")),
    ("gla.fused_recurrent", "bfloat16", 0.0, 1.0, {"o": 2.0}, ("met", "met", "")),  # fp32 only
    ("gla.fused_recurrent", "float32", 0.0, 1.0, {"dq": 2.0}, ("met", "met", "")),  # neither o nor dv measured
])
def test_targets(path, dtype, ln, bits, medians, expected):
    found = F.targets(path, dtype, {"rows": 10, "mean_abs_ln": ln, "bit_equal_frac": bits}, medians)
    assert (found["target_ln"], found["target_bits"], found["target_decode"]) == expected


def test_a_row_given_twice_on_one_side_is_the_first_files_and_a_different_one_is_counted():
    first = _rows("emulated", (A, "o", 1e-3, "(0,)", 1.0), (A, "dv", 1e-3, "(0,)", 1.0))
    again = _rows("emulated", (A, "o", 1e-3 * (1 + 1e-12), "(0,)", 1.0),  # the same measurement (another host)
                  (A, "dv", 1.01e-3, "(0,)", 1.0))                         # another: counted
    sides = F.split_by_mode([("a", first), ("b", again), ("n", _rows("native", (A, "o", 1e-3, "(0,)", 1.0)))])
    assert sides["emulated"]["rel_l2"].tolist() == [1e-3, 1e-3]
    assert (sides["emulated"].attrs["conflicts"], sides["native"].attrs["conflicts"]) == (1, 0)


def test_rows_of_different_inputs_are_refused():
    with pytest.raises(F.FidelityInputError, match="input_sha256 differs"):
        F.pairs(_rows("emulated", (A, "o", 1e-3, "(0,)", 1.0, "ok", H)),
                _rows("native", (A, "o", 1e-3, "(0,)", 1.0, "ok", H2)))


# -------------------------------------------------------------------------------- the baseline of record
def test_the_baseline_of_record_takes_native_rows_of_the_same_inputs_row_by_row():
    rows = _rows("emulated", (A, "o", 2e-3, "(0,)", 1.0), (A, "dv", 3e-3, "(0,)", 1.0),
                 (B, "o", 5e-3, "(0,)", 1.0, "ok", H2), (A, "ht", 7e-3, "(0,)", 1.0))
    native = _rows("native", (A, "o", 1e-3, "(0,)", 1.0), (A, "dv", 1.5e-3, "(0,)", 1.0),
                   (B, "o", 9e-3, "(0,)", 1.0))  # B's native row is of other inputs; A's ht has none
    record = baseline_of_record(rows, native)
    assert record[["case_id", "tensor"]].values.tolist() == rows[["case_id", "tensor"]].values.tolist()
    assert record["mode"].tolist() == ["native", "native", "emulated", "emulated"]
    assert record["rel_l2"].tolist() == [1e-3, 1.5e-3, 5e-3, 7e-3]
    assert record.attrs["native"] == 2
    assert baseline_of_record(rows, native.iloc[0:0])["mode"].tolist() == ["emulated"] * 4


def test_native_rows_are_the_baseline_legs_native_files_only():
    rows = native_rows([NATIVE_DIR])
    assert set(rows["mode"]) == {"native"} and set(rows["leg"]) == {"gpu"}
    # the emulated copy and jax-linear-attention's rows (a candidate's, native) are left out
    assert set(rows["_source"]) == {str(NATIVE_DIR / "gpu-peers.csv.gz"), str(NATIVE)}


# ------------------------------------------------------------------------------------- the command line
def _one_case(path, case_id) -> pd.DataFrame:
    rows = read_results(path)
    return rows[rows["case_id"] == case_id].reset_index(drop=True)


DECODE_CASE = ("simple_gla.fused_recurrent/B1-T16-H2-K128-V128/fp32/g=logsigmoid/16/g_gamma[]=const(-0.5)/C64/"
               "lens=0+0+16,h0,dht,pool=7")


def test_the_command_refuses_what_it_cannot_compare_with_one_line_and_exit_2(tmp_path, capsys):
    emulated = write_csv(_one_case(EMULATED, DECODE_CASE), tmp_path / "e.csv")
    native = write_csv(_one_case(NATIVE, DECODE_CASE), tmp_path / "n.csv")
    stale = _one_case(NATIVE, DECODE_CASE).assign(input_sha256=H2)
    mixed = pd.concat([read_results(emulated), read_results(native)])
    mixed["case_id"] = mixed["case_id"] + np.where(mixed["mode"] == "native", ",seed=1", "")
    (tmp_path / "not.csv").write_text("a,b\n1,2\n")
    cases = {"two files of one mode": [str(emulated), str(emulated)],
             "no native rows": [str(emulated)],
             "other inputs": [str(emulated), str(write_csv(stale, tmp_path / "stale.csv"))],
             "mixed modes": [str(write_csv(mixed, tmp_path / "mixed.csv")), str(native)],
             "not a result file": [str(tmp_path / "not.csv"), str(native)]}
    for what, files in cases.items():
        assert main(["fidelity", *files]) == 2, what
        err = capsys.readouterr().err.strip()
        assert err.startswith("parity: error: ") and len(err.splitlines()) == 1, (what, err)
    assert main(["fidelity", str(native), str(emulated)]) == 0  # either order


def _as_candidate(rows: pd.DataFrame) -> pd.DataFrame:
    """fla's rows relabelled as a candidate's: a kernel exactly as accurate as the emulated fla."""
    versions = [json.dumps({**json.loads(v), "libtpu": "0", "jax": "0"}) for v in rows["versions"]]
    return rows.assign(leg="tpu", versions=versions)


def test_verdicts_that_move_are_listed_with_their_reasons(tmp_path, capsys):
    emulated = _one_case(BEFORE, DECODE_CASE)  # a baseline that overstates fla's error: the leg before issue 76
    native = _one_case(NATIVE, DECODE_CASE)
    policy = policy_from_options(None, None, None, None, None)
    moves = F.verdict_moves(emulated, native, _as_candidate(emulated), policy)
    # against its own emulated rows every gated comparison passes (ratio 1); against the native ones the tensors
    # the emulation overstates (o, dv: 1.75x, 1.72x) no longer do, and dh0 (the same error) keeps its pass
    gated = moves.both[moves.both["metric"].isin(policy.metrics)]
    assert set(gated["verdict_emulated"]) == {"pass"} and len(gated) >= 12
    both = moves.both.set_index(["tensor", "metric"])
    moved = moves.moved.set_index(["tensor", "metric"])
    assert {("o", "rel_l2"), ("dv", "rel_l2")} <= set(moved.index)
    assert set(moved["verdict_native"]) <= {"fail", "inconclusive"}
    assert (moved["reason_native"].str.len() > 0).all() and set(moved["gpu_mode_native"]) == {"native"}
    assert both.loc[("dh0", "rel_l2"), "verdict_native"] == "pass"
    cand = write_csv(_as_candidate(emulated), tmp_path / "tpu.csv")
    files = [str(write_csv(emulated, tmp_path / "e.csv")), str(write_csv(native, tmp_path / "n.csv"))]
    assert main(["fidelity", *files, "--candidate", str(cand), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"| tpu | {len(moves.both)} |" in out and f"| {len(moves.moved)} |" in out
    written = pd.read_csv(tmp_path / "out" / "fidelity-verdicts.csv")
    assert len(written) == len(moves.moved) and (tmp_path / "out" / "fidelity.md").read_text().startswith("# Fid")


def test_it_never_overwrites_a_page_it_did_not_write(tmp_path, capsys):
    files = [str(write_csv(_one_case(p, DECODE_CASE), tmp_path / f"{p.name}.csv")) for p in (EMULATED, NATIVE)]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "fidelity.md").write_text("my notes\n")
    assert main(["fidelity", *files, "--out", str(tmp_path / "out")]) == 2
    assert (tmp_path / "out" / "fidelity.md").read_text() == "my notes\n"
    assert main(["fidelity", *files, "--out", str(tmp_path / "out"), "--force"]) == 0


# --------------------------------------------------------- the committed native rows, the emulated side remade
SUBSET = (
    "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",  # chunk, bf16 (smoke)
    "gla.chunk/B1-T64-H2-K256-V128/fp32/g=logsigmoid/16/C64/dht",              # chunk, fp32 (smoke)
    DECODE_CASE,                                                               # decode, fp32 (regressions)
)
NOT_YET = pytest.mark.xfail(strict=True, reason="issue 76 parts 1-2: the emulation's tl.sum order and tl.dot are not "
                                                "yet the GPU's; remove this mark when the target is met")
TARGETS = [
    pytest.param("simple_gla.chunk", "bfloat16", "target_ln"),
    pytest.param("simple_gla.chunk", "bfloat16", "target_bits", marks=NOT_YET),
    pytest.param("gla.chunk", "float32", "target_ln"),
    pytest.param("gla.chunk", "float32", "target_bits", marks=NOT_YET),
    pytest.param("simple_gla.fused_recurrent", "float32", "target_ln", marks=NOT_YET),
    pytest.param("simple_gla.fused_recurrent", "float32", "target_bits", marks=NOT_YET),
    pytest.param("simple_gla.fused_recurrent", "float32", "target_decode"),  # met since the compiled sum order
]


@pytest.fixture(scope="module")
def remade(tmp_path_factory):
    """The emulated GPU leg run here on :data:`SUBSET` (no cache), and ``parity fidelity`` of its rows against the
    committed native rows (the whole native file: rows of other cases have no twin and are counted apart)."""
    from harness.app import case_from_id
    from harness.core.results import rows_to_frame
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner

    tmp = tmp_path_factory.mktemp("fidelity")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARITY_CACHE_DIR", str(tmp / "cache"))  # nothing read from or left in the user's caches
        runner = Runner(make_leg("gpu"), ReferenceCache(None))
        rows = rows_to_frame([r for case_id in SUBSET for r in runner.run_case(case_from_id(case_id))])
    path = write_csv(rows, tmp / "gpu.csv")
    code = main(["fidelity", str(path), str(NATIVE), "--out", str(tmp / "out")])
    checked = main(["fidelity", str(path), str(NATIVE), "--check"])
    return {"rows": read_results(path), "code": code, "checked": checked, "out": tmp / "out",
            "csv": pd.read_csv(tmp / "out" / "fidelity.csv", keep_default_na=False)}


@pytest.mark.needs_leg("gpu")
def test_every_remade_row_joins_a_native_row_of_the_same_inputs_and_status(remade):
    rows = remade["rows"]
    assert remade["code"] == 0 and set(rows["mode"]) == {"emulated"}
    assert set(rows["case_id"]) == set(SUBSET)
    p = F.pairs(rows, read_results(NATIVE))
    assert p.attrs["only"]["emulated"] == 0 and len(p) == len(rows)  # the same inputs (else exit 2 above)
    assert F.status_differs(p).empty
    assert p["compared"].sum() == (rows["status"] == "ok").sum() >= 19


@pytest.mark.needs_leg("gpu")
def test_check_exits_1_exactly_when_a_target_is_missed(remade):
    summary = remade["csv"][(remade["csv"]["tensor"] == "*") & (remade["csv"]["path"] != "*")]
    missed = summary[["target_ln", "target_bits", "target_decode"]].apply(
        lambda r: any(v.startswith("MISSED") for v in r), axis=1)
    assert remade["checked"] == (1 if missed.any() else 0)


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("path, dtype, target", TARGETS)
def test_issue_76_targets_on_the_remade_subset(remade, path, dtype, target):
    table = remade["csv"]
    row = table[(table["path"] == path) & (table["dtype"] == dtype) & (table["tensor"] == "*")]
    assert len(row) == 1, f"{path} {dtype}: no compared rows"
    assert row[target].iloc[0] == "met", f"{path} {dtype}: {target} {row[target].iloc[0]}"
