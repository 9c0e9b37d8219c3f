"""fla's tests' gate masking as a gate law parameter (issue 23): ``Gate(mask_p=p)`` zeroes each log decay of a
``g`` gate with probability p (fla: ``g * (torch.rand_like(g) > mask_p)``). Every leg gets the same drawn g, so
no leg needs to know; the case model must name it, draw it and refuse what it cannot mean."""

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import make_inputs
from cases.suites import gate_masking_cases
from harness.app import case_from_id
from harness.ops import get_op


def masked(p: float, op: str = "gdn", **gate) -> Case:
    return Case(op, "chunk", B=1, T=512, H=2, K=64, V=64, dtype="float16",
                gate=Gate("g", normalizer=1, mask_p=p, **gate))


def test_the_label_names_the_mask_and_reads_back():
    case = masked(0.5)
    assert "/g=logsigmoid/1,mask0.5/" in case.id and case_from_id(case.id) == case
    kda = masked(0.25, "kda", lower_bound=-5.0)
    assert "g=logsigmoid/1,lb-5,mask0.25" in kda.id and case_from_id(kda.id) == kda
    assert ",mask" not in masked(0.0).id  # unmasked ids (and so their draws) are unchanged


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_about_p_of_the_decays_are_zero_and_the_rest_follow_the_law(p):
    case = masked(p)
    g = make_inputs(case, get_op("gdn").inputs(case))["g"]
    n = g.size  # 512 x 2: the zero fraction is binomial, 4 standard deviations either side
    assert abs((g == 0).mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    assert (g[g != 0] < 0).all()  # log-sigmoid: a decay below 1 wherever not masked


@pytest.mark.parametrize("gate, match", [
    (dict(kind="g_gamma", law="alibi", mask_p=0.5), "no tokens to mask"),
    (dict(kind="g", mask_p=1.0), r"\[0, 1\)"),
    (dict(kind="g", mask_p=-0.1), r"\[0, 1\)"),
])
def test_a_mask_that_means_nothing_is_refused(gate, match):
    with pytest.raises(ValueError, match=match):
        Gate(**gate)


@pytest.mark.parametrize("op_name, options", [("gdn", (("use_gate_in_kernel", True),)),
                                              ("kda", (("use_gate_in_kernel", True), ("lower_bound", -5.0)))])
def test_the_in_kernel_gate_draws_raw_inputs_so_a_mask_is_refused(op_name, options):
    case = Case(op_name, "chunk", B=1, T=64, H=1, K=64, V=64, gate=Gate("g", mask_p=0.5), options=options)
    with pytest.raises(ValueError, match="mask_p"):
        get_op(op_name).validate(case)


def test_the_regressions_mask_the_ops_fla_masks():
    cases = gate_masking_cases()
    assert {c.op for c in cases} == {"kda", "gdn"} and all(c.gate.mask_p == 0.5 for c in cases)
    for c in cases:
        get_op(c.op).validate(c)
