"""Precision regressions of graded size (tests/faults.py) and the ones the shipped policy must catch.

The full study, the smallest caught regression per class over smoke and regressions, is
``python tests/power.py`` (docs/testing.md, "Power"; its results: reports/power/README.md); these tests
pin its floor on one small case each."""

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from faults import REGRESSIONS, round_fraction, unsettled
from harness.app import find_case
from harness.judge.gate import apply_gate
from harness.core.policy import default_policy
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame
from harness.run.runner import Runner
from power import caught_at
from harness.legs import make_leg

FP32 = "simple_gla.chunk/B1-T128-H2-K128-V128/fp32/g=logsigmoid/16/C64/dht"
FP16 = "simple_gla.chunk/B1-T128-H2-K128-V128/fp16/g_gamma=alibi(L32,l0)/C64/h0,dht"
STRONG_FP16 = "simple_gla.chunk/B1-T128-H1-K128-V128/fp16/g=logsigmoid/0.1/C64/h0,dht"  # regressions


def test_round_fraction_on_hand_computed_values():
    x = jnp.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, -3.0 - 2**-6, 2**-20 * (1 + 2**-11)], jnp.float32)
    # 7 bits: spacing 2^-7 at 1, 2^-6 at 3. 1 + 2^-8 is a tie -> even (1); 1 + 3*2^-8 a tie -> even
    # (1 + 2^-6); -3 - 2^-6 is on the grid; 6 bits: it is a tie between -3 and -3 - 2^-5 -> even (-3)
    assert list(np.array(round_fraction(x, 7))) == [1.0, 1 + 2**-6, 1.0, -3.0 - 2**-6, 2**-20]
    assert np.array(round_fraction(x, 6))[3] == -3.0
    assert list(np.array(round_fraction(x, 8))) == [1 + 2**-8, 1 + 3 * 2**-8, 1.0, -3.0 - 2**-6, 2**-20]
    r = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    assert np.array_equal(np.array(round_fraction(jnp.array(r), 7)), r.astype(jnp.bfloat16).astype(np.float32))
    assert np.array_equal(np.array(round_fraction(jnp.array(r), 10)), r.astype(np.float16).astype(np.float32))
    assert np.array_equal(np.array(round_fraction(jnp.array(r), 23)), r)
    # the gradient is the identity, as through a dtype round trip
    grad = jax.grad(lambda v: jnp.sum(3.0 * round_fraction(v, 7)))(jnp.array(r))
    assert np.all(np.array(grad) == 3.0)


@pytest.fixture(scope="module")
def baselines():

    cache = ReferenceCache(None)
    gpu = {cid: rows_to_frame(Runner(make_leg("gpu"), cache).run_case(find_case(cid))) for cid in (FP32, FP16, STRONG_FP16)}
    return gpu, cache


PINNED = {
    "state rounded per chunk": FP16,
    "scores rounded twice": FP16,
    "f32 dots at fewer bits": FP32,  # 7 bits: one bf16 pass
    "fp16 inputs at fewer bits": FP16,  # 7 bits: fp16 through bf16
    "products at fewer bits": FP16,
}
"""Each regression class at 7 fraction bits (bf16's) and a small case where the shipped policy must catch it.
A regression is caught only where it makes the TPU worse than fla: on fp32 cases fla's TF32 dots
(rel_l2 about 1.5e-3) leave room for a bf16-rounded state or bf16 scores (5e-4, 1.6e-3 on o), so those
two are pinned on the fp16 case, where fla's error is 3e-4."""


def test_every_regression_class_is_pinned():
    assert set(PINNED) == set(REGRESSIONS)


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("regression", list(PINNED))
def test_the_shipped_policy_catches_each_class_at_bf16_precision(baselines, regression):
    gpu, cache = baselines
    policy, case_id = default_policy(), PINNED[regression]
    case = find_case(case_id)
    clean = apply_gate(gpu[case_id], rows_to_frame(Runner(make_leg("tpu", compile_targets=()), cache).run_case(case)), policy)
    assert clean.passed, clean.failures[["tensor", "metric", "reason"]]  # the catch below is the fault's
    result = caught_at(regression, 7, [case], gpu[case_id], policy, cache)
    assert result["caught"], result
    assert result["patched"]  # the fault reached at least one kernel helper


@pytest.mark.needs_leg("gpu")
def test_the_strong_decay_class_is_caught_on_the_suites(baselines, monkeypatch):
    """Issue 20's class on the regressions suite's fp16 strong-decay case (fla's normalizer 0.1): ht is about
    k_T v_T^T, which fla multiplies exactly, so the gate sees the fp16 policy of before (three bf16 passes,
    lo*lo dropped: about 2^-16 of each product) and products kept at 16 bits, where the clean kernels pass."""
    from kernels_tpu import mxu

    gpu, cache = baselines
    policy, case = default_policy(), find_case(STRONG_FP16)

    def gate():
        jax.clear_caches()
        tpu = rows_to_frame(Runner(make_leg("tpu", compile_targets=()), cache).run_case(case))
        jax.clear_caches()
        return apply_gate(gpu[STRONG_FP16], tpu, policy)

    assert gate().passed
    result = caught_at("products at fewer bits", 16, [case], gpu[STRONG_FP16], policy, cache)
    assert result["caught"] and result["tensor"] == "ht", result
    monkeypatch.setitem(mxu.F32_DOT_PRECISION, "float16", mxu.BF16X3)
    # one draw decides it: ht has 16384 elements, where the block bootstrap is trusted (harness.core.noise)
    before = gate()
    assert not before.passed and set(before.failures["tensor"]) == {"ht"}, unsettled(before)


def test_a_catch_is_decided_over_draws_as_parity_all_decides_it():
    """A comparison one draw leaves inconclusive is not a catch by itself: gate_case, given the GPU's draws,
    runs both legs at the sequential test's draws (the GPU's only where the baseline lacks them) and the
    pooled verdict decides."""
    from test_noise import with_tpu_blocks
    from test_runner_and_gate import CASE, result_frame

    from harness.core.metrics import parse_blocks
    from harness.core.policy import Policy
    from harness.app import gate_case

    policy = Policy(metrics=("rel_l2",), rel_margin=0.15, alpha=0.01)
    g0 = result_frame("gpu")
    blocks = parse_blocks(g0.loc[g0["tensor"] == "o", "rel_l2_blocks"].iloc[0])

    class Draws:  # a Runner's run_case: the rows of draw case.seed, o r times worse on the TPU than on the GPU
        def __init__(self, leg, ratios):
            self.leg, self.ratios, self.ran = leg, ratios, []

        def run_case(self, case):
            self.ran.append(case.seed)
            df = g0.copy()
            if self.leg == "tpu":
                df = with_tpu_blocks(g0.assign(leg="tpu", versions=result_frame("tpu")["versions"]), "o",
                                      blocks * self.ratios[case.seed] ** 2)
            return df.assign(case_id=case.id, draw=case.seed).to_dict("records")

    def tpu_draws(rows):
        return [r["draw"] for r in rows if r["tensor"] == "o"]

    def decide(ratios):
        tpu, gpu = Draws("tpu", ratios), Draws("gpu", ratios)
        base = pd.DataFrame(gpu.run_case(CASE))
        result, rows = gate_case(CASE, tpu.run_case, base, policy, "tpu", gpu.run_case)
        o = result.parity[(result.parity["tensor"] == "o") & (result.parity["metric"] == "rel_l2")]
        return result, o, gpu.ran[1:], rows

    # issue 24's clean T80 draws: inconclusive on the first, a pass over 8 (geometric mean 1.07): no catch
    result, o, ran, rows = decide([1.45, 1.65, 1.25, 0.91, 1.09, 0.76, 0.90, 0.82])
    assert result.passed and o["draws"].max() == 8 and unsettled(result).empty
    assert ran == [1, 2, 3, 4, 5, 6, 7] and sorted(tpu_draws(rows)) == list(range(8))  # each draw ran once
    # a real violation fails at three draws: a catch
    result, o, ran, _ = decide([2.54, 2.4, 2.6] + [2.5] * 21)
    assert set(o["verdict"]) == {"fail"} and set(o["draws"]) == {3} and ran == [1, 2]
    # without a GPU runner only the baseline's draws count: one draw stays inconclusive (still not a pass)
    tpu = Draws("tpu", [1.45])
    result, _ = gate_case(CASE, tpu.run_case, pd.DataFrame(Draws("gpu", [1.45]).run_case(CASE)), policy, "tpu")
    assert not result.passed and len(result.inconclusive) == 1


def test_a_study_raises_bits_from_its_start_until_the_first_miss(monkeypatch):
    """smallest_caught tries start, start + 1, ... and stops at the first grade the gate misses; a study
    resumed at --start-bits N runs none of the grades below N."""
    import power

    tried = []

    def fake_caught_at(regression, bits, cases, gpu, policy, cache, gpu_runner=None):
        tried.append(bits)
        return {"regression": regression, "bits": bits, "caught": bits <= 11, "cases_run": 1, "case_id": "c",
                "tensor": "o", "metric": "rel_l2", "verdict": "fail", "draws": 1, "wall_s": 0.0}

    monkeypatch.setattr(power, "caught_at", fake_caught_at)
    monkeypatch.setattr(power, "cases_for", lambda regression: [])
    rows = power.smallest_caught("f32 dots at fewer bits", None, None, None, log=lambda *_: None, start=10)
    assert tried == [10, 11, 12] and [r["caught"] for r in rows] == [True, True, False]
    rows = power.smallest_caught("f32 dots at fewer bits", None, None, None, log=lambda *_: None)
    assert tried[3:] == list(range(7, 13))
