"""Bounds on reductions (docs/definitions.md, "Bounds on reductions"): a tensor its op declares a sum is judged
against the magnitudes of its float64 terms, a = sum |c|, not against the sum itself.

Hand-computed values first; then each op's declared terms against its float64 reference (they must sum to the
reference's gradient); then, end to end (heavy), the regressions case whose sum cancelled, clean and with a
test-side fault of 1 %."""

import math

import numpy as np
import pytest

from cases.case import Case
from cases.inputs import make_inputs
from harness.core.metrics import condition_number, rel_l2
from harness.ops import get_op
from harness.ops.reductions import magnitude_name, magnitudes, reduction_of, trailing
from harness.core.policy import BOUNDS, CONTRIBUTIONS, REFERENCE, Bound, bound_for
from harness.run.reference_cache import ReferenceCache

BF16_SUM = bound_for("simple_gla", "dg_gamma", "bfloat16", "candidate", over=CONTRIBUTIONS)


def judged(y_hat, y, a, bound=BF16_SUM) -> bool:
    """The runner's rule for a declared sum: rel_l2 <= bound * kappa."""
    return rel_l2(y_hat, y) <= bound.limit(condition_number(y, a))


# ------------------------------------------------------------------ hand-made sums
CANCELLING = np.array([100.0, -99.0, 0.5])  # y = 1.5, a = 199.5: kappa = 133
STEADY = np.array([1.0, 2.0, 3.0, 4.0])  # y = 10 = a: kappa = 1


def test_magnitudes_and_condition_number_by_hand():
    a = magnitudes(CANCELLING, np.float64(1.5))
    assert a.shape == () and a == 199.5
    assert condition_number(np.float64(1.5), a) == pytest.approx(133.0)
    assert condition_number(np.float64(10.0), magnitudes(STEADY, np.float64(10.0))) == 1.0
    # per element: y = [1.5, 10], a = [199.5, 10]: kappa = ||a|| / ||y||
    terms = np.stack([np.pad(CANCELLING, (0, 1)), STEADY], axis=-1)  # [4 terms, 2 elements]
    y = terms.sum(axis=0)
    a = magnitudes(terms, y)
    assert a.tolist() == [199.5, 10.0]
    assert condition_number(y, a) == pytest.approx(math.hypot(199.5, 10) / math.hypot(1.5, 10))


def test_cancelling_sum_small_against_its_terms_passes():
    """An error of 0.1 on y = 1.5: rel_l2 6.7e-2 (over the old bf16 bound 5e-2), but 5.0e-4 of the terms."""
    y, a = np.float64(1.5), np.float64(199.5)
    y_hat = np.float64(1.6)
    assert rel_l2(y_hat, y) == pytest.approx(0.0667, abs=1e-4)
    assert rel_l2(y_hat, y) > bound_for("simple_gla", "dg_gamma", "bfloat16", "candidate").rel_l2
    assert judged(y_hat, y, a)
    assert BF16_SUM.limit(condition_number(y, a)) == min(BF16_SUM.rel_l2 * 133.0, 0.5)  # GROSS_REL_L2


def test_one_percent_of_the_terms_fails_even_where_they_cancel():
    """Each term 1 % off in the same direction: y_hat = y + 0.01 a, 1e-2 of the terms, over the bound 8e-3."""
    y, a = np.float64(1.5), np.float64(199.5)
    assert BF16_SUM.rel_l2 < 0.01
    assert not judged(y + 0.01 * a, y, a)
    assert judged(y + 0.003 * a, y, a)  # within the bound's 0.8 %, and rel_l2 0.4 < GROSS_REL_L2


def test_one_percent_scale_fault_fails_where_the_sum_does_not_cancel():
    """A sum of same-signed terms (kappa 1) is held to the bound itself: a 1 % error fails it."""
    y, a = np.float64(10.0), magnitudes(STEADY, np.float64(10.0))
    assert not judged(1.01 * y, y, a)
    assert judged(1.007 * y, y, a)


def test_a_zero_gradient_fails_however_much_the_terms_cancel():
    """Terms that cancel 138-fold (tests/test_fault_injection.py's gla case): zero is 0.72 % of the terms, within
    the bound over them, but its rel_l2 is 1, over GROSS_REL_L2."""
    from harness.core.policy import GROSS_REL_L2

    y, a = np.float64(-3928.7), np.float64(3928.7 * 138)
    assert rel_l2(np.float64(0.0), y) / condition_number(y, a) < BF16_SUM.rel_l2
    assert BF16_SUM.limit(condition_number(y, a)) == GROSS_REL_L2
    assert not judged(np.float64(0.0), y, a)
    assert judged(y * 0.6, y, a)


def test_exact_cancellation_and_nothing_summed():
    assert condition_number(np.float64(0.0), np.float64(3.0)) == math.inf
    assert condition_number(np.zeros(2), np.zeros(2)) == 1.0


def test_terms_that_do_not_sum_to_the_tensor_are_refused():
    with pytest.raises(ValueError, match="do not sum"):
        magnitudes(CANCELLING, np.float64(1.6))
    with pytest.raises(ValueError, match="does not end in"):
        magnitudes(np.ones((3, 2)), np.ones(3))


def test_trailing_moves_the_kept_axes_last():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert trailing(x, [1]).shape == (2, 4, 3)
    assert np.array_equal(trailing(x, [1]).sum(axis=(0, 1)), x.sum(axis=(0, 2)))


def test_bounds_over_contributions_are_looked_up_apart():
    for dtype in ("bfloat16", "float16", "float32"):
        ref = bound_for("kda", "dA_log", dtype, "baseline", over=REFERENCE)
        over = bound_for("kda", "dA_log", dtype, "baseline", over=CONTRIBUTIONS)
        assert ref.over == REFERENCE and over.over == CONTRIBUTIONS
        assert ref.limit(10.0) == ref.rel_l2 and over.limit(10.0) == over.rel_l2 * 10.0
    assert bound_for("kda", "dA_log", "float32", "reference", over=CONTRIBUTIONS).rel_l2 == 1e-4
    assert bound_for("kda", "dA_log", "float32", "baseline", over=CONTRIBUTIONS).rel_l2 == 3e-2  # fla's TF32
    assert all(b.over in (REFERENCE, CONTRIBUTIONS) for b in BOUNDS)
    with pytest.raises(ValueError, match="over="):
        Bound(1e-2, "x", over="sum")


# ------------------------------------------------------------------ each op's declared terms
DECLARED = [
    ("simple_gla.chunk/B1-T20-H2-K16-V16/fp32/g_gamma[]=const(-0.5)/C16/h0,dht", ["dg_gamma"]),
    ("simple_gla.chunk/B1-T20-H2-K16-V16/fp32/g=logsigmoid/16/g_gamma=alibi(L8,l0)/C16/lens=7+13", ["dg_gamma"]),
    ("gla.chunk/B1-T20-H2-K16-V16/fp32/g_gamma[H,K]=halfnormal/10/C16", ["dg_gamma"]),
    pytest.param("gla.chunk/B1-T20-H2-K16-V16/fp32/g_gamma=alibi(L8,l0)/C16/h0", ["dg_gamma"], marks=pytest.mark.slow),
    ("kda.chunk/B1-T20-H1-HV2-K16-V16/fp32/g=logsigmoid/16/C16/h0,lower_bound=-5,use_gate_in_kernel=1",
     ["dA_log", "ddt_bias"]),
    pytest.param("kda.chunk/B1-T20-H1-K16-V16/fp32/g=logsigmoid/16/C16/use_gate_in_kernel=1", ["dA_log", "ddt_bias"],
                 marks=pytest.mark.slow),  # the softplus gate, as gdn's below
    ("gdn.chunk/B1-T20-H1-HV2-K16-V16/fp32/g=logsigmoid/16/C16/lens=9+11,h0,dht,state_v_first,use_gate_in_kernel=1",
     ["dA_log", "ddt_bias"]),
]


@pytest.mark.parametrize("case_id,sums", DECLARED, ids=lambda v: v if isinstance(v, str) else None)
def test_declared_terms_sum_to_the_reference(case_id, sums):
    """The reference cache keeps each declared sum's magnitudes; :func:`magnitudes` has checked that the terms
    sum to the reference's gradient (to 1e-9 of their magnitudes), so a wrong declaration raises here."""
    case = Case.from_id(case_id)
    op = get_op(case.op)
    assert sorted(s.name for s in op.tensors(case) if reduction_of(s) is not None) == sorted(sums)
    golden = ReferenceCache(None).get(op, case, make_inputs(case, op.inputs(case)))
    for name in sums:
        a = golden[magnitude_name(name)]
        assert a.shape == golden[name].shape and np.all(a >= np.abs(golden[name]) * (1 - 1e-12))
        assert condition_number(golden[name], a) >= 1.0


def test_per_token_gradients_are_not_sums():
    case = Case.from_id(DECLARED[4][0])
    op = get_op(case.op)
    assert {s.name for s in op.tensors(case) if reduction_of(s) is None} >= {"o", "dq", "dg", "dbeta"}


# ------------------------------------------------------------------ end to end: the case whose sum cancelled
CANCELLED = "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g_gamma[]=const(-0.5)/C64/lens=0+70+0+37+21,h0,dht,pool=11"


def _with_dg_gamma_fault(op, fault):
    """The op with its Pallas forward's g_gamma behind an identity whose gradient is ``fault(dg_gamma)``: a
    test-side fault in the kernels' dg_gamma, the rest of the run untouched."""
    import dataclasses

    import jax

    @jax.custom_vjp
    def faulty(x):
        return x

    faulty.defvjp(lambda x: (x, None), lambda _, g: (fault(g),))
    forward = op.pallas.forward

    def faulty_forward(case, a, ctx):
        return forward(case, {**a, "g_gamma": faulty(a["g_gamma"])}, ctx)

    return dataclasses.replace(op, pallas=dataclasses.replace(op.pallas, forward=faulty_forward))


@pytest.mark.heavy
@pytest.mark.parametrize("seed", [10, 100])
def test_cancelled_case_passes_clean_and_fails_a_one_percent_fault(seed):
    """Draw 10 of the case is the one that gave ``bound`` (rel_l2 0.17 > 5e-2): its 256 terms, of magnitude 3007,
    sum to 3.33 (kappa 903). Clean, its dg_gamma is within the bound over the terms; a test-side fault of 1 % of
    the terms' magnitudes in the kernels' dg_gamma fails it, there and on draw 100 (kappa 3.4)."""
    from harness.legs.registry import make_leg
    from harness.ops import REGISTRY
    from harness.run.runner import Runner

    case = Case.from_id(CANCELLED).replace(seed=seed)
    op = REGISTRY[case.op]
    cache = ReferenceCache(None)
    a = float(cache.get(op, case, make_inputs(case, op.inputs(case)))[magnitude_name("dg_gamma")])

    def row(fault):
        ops = {**REGISTRY, case.op: _with_dg_gamma_fault(op, fault)}
        rows = Runner(make_leg("tpu"), cache, ops=ops).run_case(case)
        return next(r for r in rows if r["tensor"] == "dg_gamma")

    clean = row(lambda g: g)
    assert clean["status"] == "ok" and clean["bound_over"] == CONTRIBUTIONS and clean["kappa"] > 1
    if seed == 10:  # what the bound over the reference said of it
        assert clean["kappa"] > 800 and clean["rel_l2"] > bound_for(case.op, "dg_gamma", case.dtype, "candidate").rel_l2
    faulty = row(lambda g: g + 0.01 * a)
    assert faulty["status"] == "bound", faulty
    assert "kappa" in faulty["reason"]
