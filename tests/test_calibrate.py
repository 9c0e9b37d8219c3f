"""Input draws (``--draws``) and ``parity calibrate``: the false-alarm rate and ratio noise band of a policy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cases.suites import get_suite, with_draws
from harness.app import find_case
from harness.judge.calibrate import calibration_table, summary
from harness.cli import main
from harness.core.metrics import METRICS
from harness.core.policy import Policy
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame, write_csv
from harness.run.result_file import result_name
from harness.run.runner import Runner
from test_runner_and_gate import CASE, FakeLeg


def test_draws_are_seeds_and_repros_find_them():
    base = get_suite("smoke")[:2]
    drawn = with_draws(base, 3)
    assert [c.seed for c in drawn] == [0, 1, 2, 0, 1, 2]
    assert drawn[0] == base[0] and drawn[2].id == base[0].id + ",seed=2"
    assert find_case(drawn[2].id) == drawn[2]  # the one-line repro of a drawn case works
    assert len({c.id for c in drawn}) == 6
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="--draws"):
            with_draws(base, bad)
    assert result_name("tpu", draws=5) == "tpu.draws-5.csv"


def _frames(draws, tpu_edit):
    """GPU and TPU rows of CASE over ``draws`` draws; the TPU rows transformed by ``tpu_edit``."""
    cache = ReferenceCache(None)
    cases = with_draws([CASE], draws)
    gpu = rows_to_frame([r for c in cases for r in Runner(FakeLeg("gpu"), cache).run_case(c)])
    tpu = rows_to_frame([r for c in cases for r in Runner(FakeLeg("tpu", edit=tpu_edit), cache).run_case(c)])
    return gpu, tpu


def test_rows_record_their_draw():
    gpu, _ = _frames(2, {})
    assert sorted(set(gpu["draw"])) == [0, 1]


def test_calibration_counts_false_alarms_per_group():
    # both legs err by 1e-6 relative, except the TPU's dq: 2e-6, a ratio of 2 on every draw
    gpu, tpu = _frames(3, {"dq": lambda x: x * (1 + 2e-6)})
    table = calibration_table(gpu, tpu, Policy()).set_index(["tensor", "metric"])
    dq = table.loc[("dq", "rel_l2")]
    assert (dq["n"], dq["false_alarms"], dq["false_alarm_rate"]) == (3, 3, 1.0)
    assert dq["ratio_min"] == pytest.approx(2, rel=1e-3) and dq["ratio_max"] == pytest.approx(2, rel=1e-3)
    assert table.loc[("o", "rel_l2"), "false_alarms"] == 0 and table.loc[("o", "rel_l2"), "gated"]
    assert not table.loc[("dq", "ulp_p99"), "gated"]  # judged as if gated, flagged as not
    gated_groups = table[table["gated"]]
    assert summary(table.reset_index()) == {"n": int(gated_groups["n"].sum()), "false_alarms": 6,
                                            "rate": 6 / gated_groups["n"].sum()}
    # a margin wide enough for the dq ratio: no false alarm left
    assert summary(calibration_table(gpu, tpu, Policy(rel_margin=1.5)))["false_alarms"] == 0


def test_cli_calibrate_from_result_files(tmp_path, capsys):
    gpu, tpu = _frames(2, {"dq": lambda x: x * (1 + 2e-6)})
    files = [str(write_csv(gpu, tmp_path / "gpu.csv")), str(write_csv(tpu, tmp_path / "tpu.csv"))]
    assert main(["calibrate", "--results", *files, "--out", str(tmp_path / "cal")]) == 1
    assert "4 false alarm(s)" in capsys.readouterr().out  # dq rel_l2 and max_abs, two draws each
    table = pd.read_csv(tmp_path / "cal" / "calibration.csv")
    assert set(table["op"]) == {"simple_gla"} and table["false_alarms"].sum() > 0
    assert "false alarm" in (tmp_path / "cal" / "calibration.md").read_text()
    assert main(["calibrate", "--results", *files, "--out", str(tmp_path / "cal"), "--margin", "1.5"]) == 0
    # the files calibrate reads are checked like the gate's
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert main(["calibrate", "--results", files[0], str(tmp_path / "bad.csv"), "--out", str(tmp_path)]) == 2


BASE_MARGIN = 0.05
"""The margin the shipped calibration was run with (every metric): derived margins never go below it."""
CHECKED_IN = Path(__file__).parents[1] / "reports" / "calibration" / "smoke-regressions-draws5"


def test_the_shipped_policy_is_the_checked_in_calibration():
    """harness/policy.toml is `parity calibrate`'s policy.toml of the rows checked in under reports/, and
    re-deriving it from those rows gives the same margins and no false alarm on them."""
    from harness.judge.calibrate import derive_policy
    from harness.core.policy import DEFAULT_POLICY_FILE, default_policy
    from harness.core.results import read_results

    assert DEFAULT_POLICY_FILE.read_text() == (CHECKED_IN / "policy.toml").read_text()
    shipped = default_policy()
    gpu, tpu = read_results(CHECKED_IN / "gpu.draws-5.csv"), read_results(CHECKED_IN / "tpu.draws-5.csv")
    assert sorted(set(tpu["draw"])) == [0, 1, 2, 3, 4]
    table = calibration_table(gpu, tpu, shipped)
    assert summary(table)["false_alarms"] == 0 and summary(table)["n"] > 1000
    base = Policy(metrics=shipped.metrics, rel_margin=BASE_MARGIN, alpha=shipped.alpha)
    rederived = derive_policy(calibration_table(gpu, tpu, base), base)
    assert {m: rederived.margin(m) for m in METRICS} == {m: shipped.margin(m) for m in METRICS}
    assert rederived.rules == shipped.rules and shipped.alpha == base.alpha
