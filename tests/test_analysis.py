"""The public helper for analysis scripts (harness.app.analysis): one case on one leg against the golden."""

import numpy as np
import pytest

from harness.app.analysis import f64, golden, rel_l2, run_case
from harness.core.metrics import rel_l2 as file_rel_l2

CASE = "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht"


def test_rel_l2_on_hand_computed_values():
    # ||(1, 2) - (1, 1)|| / ||(1, 1)|| = 1 / sqrt(2); per row of [[3, 4], [0, 1]] against [[3, 0], [0, 2]]: 4/3, 1/2
    assert rel_l2([1.0, 2.0], [1.0, 1.0]) == pytest.approx(2 ** -0.5, rel=1e-15)
    np.testing.assert_allclose(rel_l2([[3.0, 4.0], [0.0, 1.0]], [[3.0, 0.0], [0.0, 2.0]], axis=1), [4 / 3, 1 / 2])
    assert f64(np.float32(1.5)).dtype == np.float64


def test_a_leg_against_the_golden_gives_the_result_files_numbers():
    """The reference leg (its recurrent form against the chunked golden) on one case: the helper's rel_l2 is the
    result file's, its error is got - ref, and one golden serves several runs unchanged."""
    g = golden(CASE)
    assert g.case.id == CASE and set(g.op.tensor_names(g.case)) <= set(g.tensors)
    r = run_case(g, "ref")
    assert r.golden is g and r.case is g.case
    for tensor in ("o", "dq"):
        assert r.rel_l2(tensor) == pytest.approx(file_rel_l2(r.tensors[tensor], g.tensors[tensor]), rel=1e-12)
        assert r.metrics(tensor)["rel_l2"] == pytest.approx(r.rel_l2(tensor), rel=1e-12)
        np.testing.assert_array_equal(r.error(tensor), f64(r.tensors[tensor]) - f64(g.tensors[tensor]))
    assert 0 < r.rel_l2("o") < 1e-10  # two float64 formulations of one sum
    assert run_case(CASE, "ref").rel_l2("o") == r.rel_l2("o")  # from the id: the same inputs, the same numbers
