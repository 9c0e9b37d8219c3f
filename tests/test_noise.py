"""The noise-aware decision rule on hand-computed values: rel_l2 blocks, the paired block bootstrap,
policy files and the margins `parity calibrate` derives (definitions in docs/definitions.md, "The decision rule")."""

import math

import numpy as np
import pandas as pd
import pytest

from harness.judge.calibrate import CALIBRATION_COLUMNS, derive_policy
from harness.core.metrics import ERROR_BLOCKS, compare, format_blocks, parse_blocks, rel_l2_blocks
from harness.core.noise import (BOOTSTRAP_MIN_ELEMENTS, LOOKS, RESAMPLES, next_look, pooled_decision, pooled_looks,
                           sequential_decision, ratio_lower_bound, ratio_replicates,
                           resample_indices)
from harness.core.policy import DEFAULT_POLICY_FILE, MarginRule, Policy, default_policy, policy_from_options


def test_blocks_split_rel_l2_squared_over_contiguous_blocks():
    r = np.ones(4)
    y = r + np.array([1.0, 0.0, 0.0, 1.0])  # ||y - r||^2 = 2, ||r||^2 = 4
    assert rel_l2_blocks(y, r) == [0.25, 0.0, 0.0, 0.25]  # min(32, n) = 4 blocks of one element
    # 70 elements: 32 blocks, the first 70 % 32 = 6 of three elements, the rest of two
    r = np.ones(70)
    y = r + np.arange(70) % 2  # every odd element is off by 1
    blocks = rel_l2_blocks(y, r)
    assert len(blocks) == ERROR_BLOCKS
    assert blocks[:6] == [1 / 70 if i % 2 == 0 else 2 / 70 for i in range(6)]  # [0,1,0], [1,0,1], ...
    assert blocks[6:] == [1 / 70] * 26
    assert math.sqrt(sum(blocks)) == pytest.approx(math.sqrt(35 / 70), rel=1e-15)
    # no finite ratio, no blocks
    assert rel_l2_blocks(np.array([np.nan]), np.array([1.0])) is None
    assert rel_l2_blocks(np.zeros(3), np.zeros(3)) is None


def test_blocks_in_a_row_round_trip_to_seven_digits():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(2, 40, 3))
    y = r + 1e-3 * rng.normal(size=r.shape)
    row = compare(y, r, "float32")
    blocks = parse_blocks(row["rel_l2_blocks"])
    assert blocks.shape == (32,)
    assert math.sqrt(blocks.sum()) == pytest.approx(row["rel_l2"], rel=1e-6)
    assert format_blocks(None) == "" and parse_blocks("") is None and parse_blocks(float("nan")) is None
    with pytest.raises(ValueError):
        parse_blocks("1;two")


def test_resampling_is_fixed_and_starts_with_the_data():
    a, b = resample_indices(5), resample_indices(5)
    assert a is b and a.shape == (RESAMPLES, 5)
    assert list(a[0]) == [0, 1, 2, 3, 4]
    assert a.min() == 0 and a.max() == 4


def test_bootstrap_on_hand_computed_blocks():
    # the TPU is 1.2x worse in every block: every replicate is exactly 1.2, so is the bound
    g = np.array([1.0, 2.0, 3.0, 4.0])
    assert np.all(np.isclose(ratio_replicates(g, 1.44 * g), 1.2, rtol=1e-12))
    assert ratio_lower_bound(g, 1.44 * g, 0.01) == pytest.approx(1.2, rel=1e-12)
    # two blocks, each leg's error in the other block: a resample holds block 0 twice (ratio 0), one of
    # each (1) or block 1 twice (inf), with probabilities 1/4, 1/2, 1/4
    rep = ratio_replicates(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert set(np.unique(rep)) == {0.0, 1.0, math.inf}
    assert abs(np.mean(rep == 0.0) - 0.25) < 0.03 and abs(np.mean(rep == math.inf) - 0.25) < 0.03
    assert ratio_lower_bound(np.array([1.0, 0.0]), np.array([0.0, 1.0]), 0.01) == 0.0
    # both exact: ratio 1
    assert ratio_lower_bound(np.zeros(3), np.zeros(3), 0.01) == 1.0
    with pytest.raises(ValueError, match="equal"):
        ratio_replicates(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="alpha"):
        ratio_lower_bound(g, g, 0.5)


def test_judge_clears_an_excess_one_block_explains_but_not_a_uniform_one():
    policy = Policy(metrics=("rel_l2", "max_abs"), rel_margin=0.05, alpha=0.01)
    g = np.ones(32)
    one = g.copy()
    one[31] = 5.0  # point ratio sqrt(36 / 32) = 1.0607 > 1.05, all of it from one block of 32
    eps_g, eps_t = math.sqrt(g.sum()), math.sqrt(one.sum())
    assert not policy.passes("rel_l2", eps_t, eps_g)
    # (31/32)^32 = 36 % of the resamples miss block 31 and give exactly 1: the 1 % bound is 1
    assert policy.judge("rel_l2", eps_t, eps_g, g, one) == (True, 1.0)
    uniform = 1.1**2 * g  # 1.1x worse everywhere: no resample explains it away
    passed, lower = policy.judge("rel_l2", 1.1 * eps_g, eps_g, g, uniform)
    assert not passed and lower == pytest.approx(1.1, rel=1e-12)
    # the bootstrap only judges rel_l2, only after the point rule failed, and only with blocks
    assert policy.judge("max_abs", 1.06, 1.0, g, one) == (False, None)
    assert policy.judge("rel_l2", eps_g, eps_g, g, g) == (True, None)
    assert policy.judge("rel_l2", eps_t, eps_g) == (False, None)
    assert Policy(rel_margin=0.05).judge("rel_l2", eps_t, eps_g, g, one) == (False, None)  # alpha 0


def test_policy_files_round_trip_and_bad_ones_are_one_line_errors(tmp_path):
    policy = Policy(metrics=("rel_l2", "max_abs"), margins={"rel_l2": 0.05, "max_abs": 0.8}, alpha=0.01)
    path = tmp_path / "policy.toml"
    path.write_text(policy.to_toml("a header", {"suite": 'smoke "x"', "draws": 5}))
    loaded = Policy.load(path)
    assert (loaded.metrics, loaded.alpha, loaded.margin("max_abs"), loaded.margin("rel_l2")) == \
        (("rel_l2", "max_abs"), 0.01, 0.8, 0.05)
    assert loaded.source == str(path)
    for text, message in [("metrics = [", "not TOML"), ("margin = 1", "unknown field"),
                          ("[margins]\nrel_l2 = 'x'", "map metric names to numbers"),
                          ("[margins]\nbogus = 1", "bad"), ("alpha = 0.7", "alpha"),
                          ("metrics = ['x']", "subset"), ("[[rules]]\nop = 'kda'", "needs metric and margin")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as info:
            Policy.load(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="policy file"):
        Policy.load(tmp_path / "absent.toml")


def test_overrides_replace_the_policy_files_values():
    base = default_policy()
    assert base.source == "the shipped harness/policy.toml" and Policy.load(DEFAULT_POLICY_FILE).rules == base.rules
    strict = policy_from_options(None, "rel_l2", 0.0, None, 0.0)
    assert strict.metrics == ("rel_l2",) and strict.margin("max_abs") == 0.0 and strict.alpha == 0.0
    assert "overridden" in strict.source
    assert policy_from_options(None) == base


def test_derived_margins_are_twice_the_worst_clean_excess_where_it_is_wider():
    def row(tensor, metric, judged_max):
        return {c: None for c in CALIBRATION_COLUMNS} | {"op": "simple_gla", "dtype": "bfloat16", "tensor": tensor,
                                                        "metric": metric, "judged_max": judged_max}

    table = pd.DataFrame([row("dq", "max_abs", 1.31), row("o", "max_abs", 1.02), row("dg", "rel_l2", 0.97),
                          row("dg", "ulp_mean", 1.1), row("o", "rel_l2", 1.04), row("dq", "rel_l2", 1.07)])
    base = Policy(rel_margin=0.05, alpha=0.01)
    derived = derive_policy(table, base)
    at = {"op": "simple_gla", "dtype": "bfloat16"}
    # max_abs: one margin for the op x dtype, from its worst tensor: 2 x 0.31 = 0.62, rounded up to 0.05
    assert derived.margin("max_abs", tensor="dq", **at) == derived.margin("max_abs", tensor="o", **at) == 0.65
    assert derived.margin("rel_l2", tensor="dg", **at) == 0.05  # clean kernels never exceeded 1
    assert derived.margin("ulp_mean", tensor="dg", **at) == 0.2  # 2 x 0.1, exactly on the grid
    # rel_l2: per tensor. dq 2 x 0.07 = 0.14 -> 0.15; o 2 x 0.04 = 0.08 -> 0.1
    assert (derived.margin("rel_l2", tensor="dq", **at), derived.margin("rel_l2", tensor="o", **at)) == (0.15, 0.1)
    assert derived.margin("max_abs", op="gla", dtype="bfloat16", tensor="dq") == 0.05  # another op: the default
    assert len(derived.rules) == 4 and derived.alpha == 0.01
    # the rules survive a policy file
    loaded = Policy.load(_written(derived))
    assert loaded.rules == derived.rules


def _written(policy: Policy):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "policy.toml"
    path.write_text(policy.to_toml())
    return path


def test_the_most_specific_margin_rule_wins():
    policy = Policy(rel_margin=0.05, rules=(MarginRule("max_abs", 0.5, op="simple_gla"),
                                            MarginRule("max_abs", 0.9, op="simple_gla", tensor="dq"),
                                            MarginRule("max_abs", 0.7, op="simple_gla", dtype="bfloat16")))
    assert policy.margin("max_abs", "simple_gla", "bfloat16", "dq") == 0.7  # ties: the later rule
    assert policy.margin("max_abs", "simple_gla", "float32", "dq") == 0.9
    assert policy.margin("max_abs", "simple_gla", "float32", "o") == 0.5
    assert policy.margin("max_abs", "kda", "bfloat16", "dq") == 0.05
    assert policy.margin("rel_l2", "simple_gla", "bfloat16", "dq") == 0.05
    assert policy.passes("max_abs", 1.6, 1.0, op="simple_gla", dtype="float32", tensor="dq")
    assert not policy.passes("max_abs", 1.6, 1.0, op="kda", dtype="float32", tensor="dq")
    assert policy.with_overrides(margin=0.0).rules == ()  # --margin replaces every margin, rules too
    with pytest.raises(ValueError, match="margin rules"):
        Policy(rules=(MarginRule("bogus", 1.0),))


def with_tpu_blocks(tpu: pd.DataFrame, tensor: str, blocks: np.ndarray) -> pd.DataFrame:
    """``tpu`` with one tensor's rel_l2 blocks (and so its rel_l2) replaced, as a TPU kernel would have made them."""
    out = tpu.copy()
    i = out.index[out["tensor"] == tensor][0]
    out.loc[i, "rel_l2_blocks"] = format_blocks(list(blocks))
    out.loc[i, "rel_l2"] = math.sqrt(float(parse_blocks(out.loc[i, "rel_l2_blocks"]).sum()))
    return out


def test_the_gate_reports_what_the_bootstrap_cleared_and_what_it_did_not():
    from harness.judge.gate import apply_gate
    from harness.report.reports import markdown
    from test_runner_and_gate import result_frame

    gpu, tpu = result_frame("gpu"), result_frame("gpu").assign(leg="tpu")
    tpu["versions"] = result_frame("tpu")["versions"]
    g = parse_blocks(gpu.loc[gpu["tensor"] == "o", "rel_l2_blocks"].iloc[0])
    assert len(g) == 32
    one = g.copy()
    one[-1] += 0.1236 * g.sum()  # ratio sqrt(1.1236) = 1.06, all of the excess in the last block
    policy = Policy(metrics=("rel_l2",), rel_margin=0.05, alpha=0.01)
    result = apply_gate(gpu, with_tpu_blocks(tpu, "o", one), policy)
    o = result.parity[(result.parity["tensor"] == "o") & (result.parity["metric"] == "rel_l2")].iloc[0]
    assert result.passed and o["verdict"] == "pass" and o["ratio"] == pytest.approx(1.06, rel=1e-5)
    assert o["ratio_lower"] <= 1.05 and "within noise" in o["reason"]
    assert "within sampling noise" in markdown(result)
    # the same excess spread over every block is beyond the draw's noise: one draw does not decide it
    result = apply_gate(gpu, with_tpu_blocks(tpu, "o", 1.1236 * g), policy)
    assert not result.passed and result.failures.empty
    assert "beyond noise" in result.inconclusive.iloc[0]["reason"] and result.draws_needed == 3


# ------------------------------------------------------------ between draws: the sequential test
def _t_two_dof(p: float) -> float:
    """Student's t quantile at p for 2 degrees of freedom, in closed form: (2p - 1) / sqrt(2p(1 - p))."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def test_the_looks_and_the_cap():
    assert LOOKS == (1, 3, 8, 24)
    assert [next_look(n) for n in (1, 2, 3, 7, 8, 20, 24, 30)] == [3, 3, 8, 8, 24, 24, None, None]


def test_pooled_decision_on_hand_computed_log_ratios():
    # ln R = 1.0, 1.1, 1.2: mean 1.1, sd 0.1; alpha 0.03 spread over the three pooled looks: t(0.99, 2 dof)
    t = _t_two_dof(0.99)
    assert t == pytest.approx(6.964557, rel=1e-6)
    decision, mean, lower = pooled_decision(np.exp([1.0, 1.1, 1.2]), 1.15, alpha=0.03)
    assert decision == "fail" and mean == pytest.approx(math.exp(1.1))
    assert lower == pytest.approx(math.exp(1.1 - t * 0.1 / math.sqrt(3)), rel=1e-9)  # e^0.6979 = 2.0095
    # geometric mean (1.0 * 1.2 * 0.9)^(1/3) = 1.0260 <= 1.15: the point rule on the pooled ratio
    decision, mean, _ = pooled_decision([1.0, 1.2, 0.9], 1.15, alpha=0.03)
    assert decision == "pass" and mean == pytest.approx(1.08 ** (1 / 3))
    # the T80 case: three draws of dg are 1.45, 1.65, 1.25 (undecided), all eight 1.066 (a pass)
    ratios = [1.45, 1.65, 1.25, 0.91, 1.09, 0.76, 0.90, 0.82]
    assert pooled_decision(ratios[:3], 1.15, 0.01)[0] == "undecided"
    assert pooled_decision(ratios, 1.15, 0.01)[0] == "pass"
    # issue 20's violation, ht at 2.4-2.6x fla on every draw, fails at three draws
    assert pooled_decision([2.54, 2.4, 2.6], 1.15, 0.01)[0] == "fail"
    # an exact TPU (ratio 0) and an exact GPU with an inexact TPU (inf) are clipped, not NaN
    assert pooled_decision([0.0, 0.5, 0.4], 1.15, 0.01)[0] == "pass"
    assert pooled_decision([math.inf, math.inf, math.inf], 1.15, 0.01)[0] == "fail"
    with pytest.raises(ValueError, match="two or more"):
        pooled_decision([1.2], 1.15, 0.01)


def test_the_pooled_test_fails_a_clean_kernel_at_most_alpha_of_the_time():
    """Clean kernels: log ratios centred on ln(limit) itself (the worst clean case), sd 0.3; 4000 sequences
    through every pooled look (3, 8, 24 draws). The fraction failing is at most alpha (Bonferroni over the
    pooled looks)."""
    rng = np.random.default_rng(7)
    limit, alpha, fails = 1.15, 0.01, 0
    for _ in range(4000):
        x = np.log(limit) + 0.3 * rng.standard_normal(LOOKS[-1])
        for n in LOOKS[1:]:
            decision = pooled_decision(np.exp(x[:n]), limit, alpha)[0]
            if decision != "undecided":
                break
        fails += decision == "fail"
    assert 0 < fails / 4000 <= alpha  # and not 0: the test can fail a kernel at the limit


def _gate_draws(ratios, numel, policy):
    """The gate over one case's draws, draw d's tensor ``o`` every block ``ratios[d]`` times the baseline's
    error (so the block bootstrap confirms the ratio), every tensor ``numel`` elements (None: as made)."""
    from harness.judge.gate import apply_gate
    from test_runner_and_gate import result_frame

    gpu, tpu = [], []
    g0 = result_frame("gpu")
    blocks = parse_blocks(g0.loc[g0["tensor"] == "o", "rel_l2_blocks"].iloc[0])
    for seed, r in enumerate(ratios):
        g, t = g0.copy(), g0.assign(leg="tpu", versions=result_frame("tpu")["versions"])
        t = with_tpu_blocks(t, "o", blocks * r**2)  # every block r times worse: beyond one draw's noise
        case_id = g0["case_id"].iloc[0] + (f",seed={seed}" if seed else "")
        for df in (g, t):
            df["case_id"], df["draw"] = case_id, seed
            df["numel"] = df["numel"] if numel is None else numel
        gpu.append(g)
        tpu.append(t)
    result = apply_gate(pd.concat(gpu, ignore_index=True), pd.concat(tpu, ignore_index=True), policy)
    return result, result.parity[(result.parity["tensor"] == "o") & (result.parity["metric"] == "rel_l2")]


def test_the_gate_pools_the_draws_in_the_files():
    from harness.judge.gate import apply_gate
    from test_runner_and_gate import result_frame

    policy = Policy(metrics=("rel_l2",), rel_margin=0.15, alpha=0.01)

    def draws(ratios, numel=None):
        result, o = _gate_draws(ratios, numel, policy)
        draws.last = result.baseline, result.candidate
        return result, o

    assert (result_frame("gpu")["numel"] < BOOTSTRAP_MIN_ELEMENTS).all()  # the case's tensors are small: 256 elements
    result, o = draws([1.45])  # one draw past the margin: not decided, and not a pass
    assert list(o["verdict"]) == ["inconclusive"] and not result.passed and result.draws_needed == 3
    assert "run with --draws 3" in o["reason"].iloc[0] and result.headline.startswith("INCONCLUSIVE")
    result, o = draws([1.45, 1.65, 1.25])  # three draws: still undecided, 8 would decide
    assert set(o["verdict"]) == {"inconclusive"} and result.draws_needed == 8 and set(o["draws"]) == {3}
    result, o = draws([1.45, 1.65, 1.25, 0.91, 1.09, 0.76, 0.90, 0.82])  # eight: the geometric mean is 1.07
    assert result.passed and set(o["verdict"]) == {"pass"}
    assert "over 8 draws the ratio's geometric mean is 1.066" in o["reason"].iloc[0]
    result, o = draws([1.45], numel=BOOTSTRAP_MIN_ELEMENTS)  # a large tensor: its blocks decide one draw
    assert list(o["verdict"]) == ["fail"] and result.headline == "FAIL" and "beyond noise" in o["reason"].iloc[0]
    result, o = draws([2.54, 2.4, 2.6])  # a real violation fails at three draws
    assert set(o["verdict"]) == {"fail"} and len(result.failures) == 3 and result.headline == "FAIL"
    strict = apply_gate(*draws.last, policy.with_overrides(alpha=0.0))
    assert strict.inconclusive.empty and not strict.failures.empty  # --alpha 0: a draw's failure is final


def test_the_pooled_looks_over_the_draws_there_are():
    assert pooled_looks(1) == [] and pooled_looks(2) == [2] and pooled_looks(3) == [3]
    assert pooled_looks(5) == [3, 5]  # parity calibrate --draws 5: the look at 3, then all five
    assert pooled_looks(8) == [3, 8] and pooled_looks(24) == [3, 8, 24]
    assert pooled_looks(30) == [3, 8, 24]  # past the cap: never more looks than alpha is spread over


def test_the_sequential_decision_stops_at_the_first_look_that_decides():
    # draws 0-2 fail beyond doubt (as issue 20's violation); draws 3-7 alone would pass: the look at 3 decided
    ratios = [2.54, 2.4, 2.6, 0.5, 0.5, 0.5, 0.5, 0.5]
    decision, used, mean, _ = sequential_decision(ratios, 1.15, 0.01)
    assert (decision, used) == ("fail", 3) and mean == pytest.approx((2.54 * 2.4 * 2.6) ** (1 / 3))
    assert pooled_decision(ratios, 1.15, 0.01)[0] == "pass"  # all eight pooled at once would pass it
    # the T80 dg draws: undecided at 3, a pass at 8
    assert sequential_decision([1.45, 1.65, 1.25, 0.91, 1.09, 0.76, 0.90, 0.82], 1.15, 0.01)[:2] == ("pass", 8)
    assert sequential_decision([1.45], 1.15, 0.01)[:2] == ("undecided", 1)


def test_a_comparison_decided_on_its_first_draw_keeps_its_verdict_over_more_draws():
    """Issue 48: draws made for another tensor of the case neither fail nor pass a comparison its first draw
    decided. Each draw here is every block r times worse, so a large tensor's bootstrap confirms r."""
    policy = Policy(metrics=("rel_l2",), rel_margin=0.15, alpha=0.01)

    def gated(ratios, numel):
        return _gate_draws(ratios, numel, policy)

    big = BOOTSTRAP_MIN_ELEMENTS
    # a large tensor passing its first draw: later draws beyond the margin (each alone a confirmed failure) do
    # not fail it; before, every one of them was a failure of its own
    result, o = gated([1.0] + [1.45] * 23, big)
    assert set(o["verdict"]) == {"pass"} and result.passed
    assert "not judged alone: the comparison was decided on its first draw" in o["reason"].iloc[1]
    # a large tensor failing its first draw, confirmed by its blocks: passing draws later do not pass it
    result, o = gated([1.45, 1.0, 1.0], big)
    assert set(o["verdict"]) == {"fail"} and result.headline == "FAIL"
    # a small tensor passing its first draw: the same, its later draws' failures are not judged alone
    result, o = gated([1.0, 2.5, 2.5], None)
    assert set(o["verdict"]) == {"pass"}
    # undecided on its first draw: the looks, in order; the draws after the deciding look are not used
    result, o = gated([2.54, 2.4, 2.6, 0.5, 0.5, 0.5, 0.5, 0.5], None)
    assert set(o["verdict"]) == {"fail"} and set(o["draws"]) == {3}
    assert "this draw is not used: the first 3 decided" in o["reason"].iloc[-1]


def test_the_sequential_gate_draws_for_the_undecided_comparisons_only():
    """The sequential test (harness.judge.sequential), its evidence made here: draw 0's o is undecided (a small
    tensor 1.45x), its dq passes. The test asks for draws to the next look of o alone, says so, and leaves dq
    passed although dq's new draws are 3x (each a failure if judged alone). Capped at one draw, nothing is drawn
    and o stays inconclusive; evidence that cannot give the draws leaves it inconclusive too."""
    from harness.judge.sequential import sequential_gate
    from test_runner_and_gate import CASE, result_frame

    policy = Policy(metrics=("rel_l2",), rel_margin=0.15, alpha=0.01)
    g0 = result_frame("gpu")
    blocks = {t: parse_blocks(g0.loc[g0["tensor"] == t, "rel_l2_blocks"].iloc[0]) for t in ("o", "dq")}

    def rows(leg, case):
        df = result_frame("gpu", case=case)
        if leg == "tpu":
            df = df.assign(leg="tpu", versions=result_frame("tpu", case=case)["versions"])
            df = with_tpu_blocks(df, "o", blocks["o"] * (1.45 if case.seed == 0 else 1.0) ** 2)
            df = with_tpu_blocks(df, "dq", blocks["dq"] * (1.0 if case.seed == 0 else 3.0) ** 2)
        return df

    class Draws:
        def __init__(self, can_draw=True):
            self.frames = {leg: rows(leg, CASE) for leg in ("gpu", "tpu")}
            self.asked, self.can_draw = [], can_draw

        def rows(self):
            return self.frames["gpu"], self.frames["tpu"]

        def draw(self, cases):
            self.asked.append(sorted(c.seed for c in cases))
            if not self.can_draw:
                return False
            for leg in self.frames:
                self.frames[leg] = pd.concat([self.frames[leg], *(rows(leg, c) for c in cases)], ignore_index=True)
            return True

    said = []
    evidence = Draws()
    result = sequential_gate(evidence, [CASE], policy, max_draws=24, say=said.append)
    assert evidence.asked == [[1, 2]]  # to the next look, 3 draws, for o alone
    assert said == [f"gate: {CASE.id}: o rel_l2 undecided at 1 draw(s): 2 more, to 3"]
    assert result.passed  # o: geometric mean of 1.45, 1, 1 is 1.13 <= 1.15
    dq = result.parity[(result.parity["tensor"] == "dq") & (result.parity["metric"] == "rel_l2")]
    assert set(dq["verdict"]) == {"pass"} and (dq["ratio"] > 2.9).sum() == 2  # decided on draw 0, kept
    for evidence, cap in ((Draws(), 1), (Draws(can_draw=False), 24)):
        result = sequential_gate(evidence, [CASE], policy, max_draws=cap)
        assert evidence.asked == ([] if cap == 1 else [[1, 2]])
        assert list(result.inconclusive["tensor"]) == ["o"] and result.headline.startswith("INCONCLUSIVE")
    result = sequential_gate(Draws(), [CASE], policy, redraw=False)  # --baseline-rows: no draws are made
    assert list(result.inconclusive["tensor"]) == ["o"]


def test_a_reason_prints_its_numbers_apart():
    """Issue 48: a bound just past its limit never reads "1.05 > 1.05"; equal numbers print alike."""
    from harness.judge.gate import shown_apart

    assert shown_apart(1.05004, 1.05) == ("1.05004", "1.05")
    assert shown_apart(1.068, 1.053) == ("1.068", "1.053")  # four digits suffice
    assert shown_apart(2.0, 2.0) == ("2", "2")
