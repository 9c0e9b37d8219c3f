"""ULP, rel_l2 and compare() on hand-computed values (definitions in docs/definitions.md)."""

import math

import numpy as np
import pytest

from harness.core.metrics import compare, rel_l2, ulp, ulp_error


@pytest.mark.parametrize("dtype, r, expected", [
    # normal numbers: 2^(floor(log2 |r|) - p), p = fraction bits (bf16 7, fp16 10, fp32 23)
    ("bfloat16", 1.0, 2.0**-7),
    ("bfloat16", 1.5, 2.0**-7),
    ("bfloat16", 3.0, 2.0**-6),
    ("bfloat16", -0.75, 2.0**-8),
    ("float16", 1.0, 2.0**-10),
    ("float16", 1000.0, 2.0**(9 - 10)),
    ("float32", 1.0, 2.0**-23),
    ("float32", 2.0**-126, 2.0**-149),
    # subnormals and zero share the smallest spacing 2^(e_min - p)
    ("float16", 2.0**-20, 2.0**-24),
    ("float16", 0.0, 2.0**-24),
    ("float32", 2.0**-130, 2.0**-149),
    ("bfloat16", 0.0, 2.0**-133),
    # beyond the largest finite value the spacing of the top binade is kept
    ("float16", 1.0e6, 2.0**(15 - 10)),
    ("float32", 1.0e40, 2.0**(127 - 23)),
])
def test_ulp_spacing(dtype, r, expected):
    assert ulp(np.array([r]), dtype)[0] == expected


@pytest.mark.parametrize("dtype, y, r, expected", [
    ("bfloat16", 1.0 + 2.0**-7, 1.0, 1.0),  # the next bf16 number after 1
    ("bfloat16", 1.0 + 2.0**-8, 1.0, 0.5),  # half a step: a correctly rounded result is <= 0.5
    ("bfloat16", 2.0, 2.0 - 2.0**-7, 1.0),  # counted at the reference's binade: ulp(1.99) = 2^-7
    ("float16", 1.0 - 2.0**-10, 1.0, 1.0),
    ("float16", 3 * 2.0**-24, 2.0**-24, 2.0),  # subnormal steps
    ("float32", 1.0 + 3 * 2.0**-23, 1.0, 3.0),
    ("float32", -0.0, 0.0, 0.0),  # +0 and -0 are equal
    ("float32", 0.0, -0.0, 0.0),
    ("bfloat16", math.nan, math.nan, 0.0),  # NaN matches only NaN
    ("bfloat16", math.nan, 1.0, math.inf),
    ("bfloat16", 1.0, math.nan, math.inf),
    ("float16", math.inf, math.inf, 0.0),  # an infinity matches the same infinity
    ("float16", -math.inf, math.inf, math.inf),
    ("float16", 65504.0, math.inf, math.inf),
    ("float16", math.inf, 65504.0, math.inf),
])
def test_ulp_error_hand_computed(dtype, y, r, expected):
    assert ulp_error(np.array([y]), np.array([r]), dtype)[0] == expected


def test_rel_l2_hand_computed():
    assert rel_l2(np.array([3.0, 5.0]), np.array([3.0, 4.0])) == pytest.approx(0.2, rel=1e-15)
    assert rel_l2(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_l2(np.array([1e-30, 0.0]), np.zeros(2)) == math.inf
    assert rel_l2(np.zeros(4), np.ones(4)) == 1.0  # an all-zero gradient is 100 % wrong
    assert rel_l2(np.array([np.nan, 1.0]), np.ones(2)) == math.inf


def test_compare_summaries_and_worst_element():
    r = np.array([[1.0, 2.0], [4.0, 8.0]])
    y = np.array([[1.0, 2.0], [4.0 + 2.0**-5, 8.0]], dtype=np.float32)
    m = compare(y, r, "bfloat16")
    assert m["max_abs"] == 2.0**-5
    assert m["worst_index"] == "(1, 0)"
    assert m["ref_at_worst"] == 4.0 and m["got_at_worst"] == 4.0 + 2.0**-5
    # ulp_bf16(4) = 2^-5: one ULP at one element of four
    assert m["ulp_max"] == 1.0 and m["ulp_mean"] == 0.25
    assert m["ulp_p99"] == 1.0  # "higher" percentile: an element value, never interpolated
    assert m["nan"] == 0 and m["inf"] == 0
    assert m["rel_l2"] == pytest.approx(2.0**-5 / math.sqrt(1 + 4 + 16 + 64), rel=1e-12)


def test_compare_nonfinite_is_unbounded_error():
    r = np.ones((3,))
    y = np.array([1.0, np.nan, np.inf])
    m = compare(y, r, "float32")
    assert m["nan"] == 1 and m["inf"] == 1
    assert m["max_abs"] == math.inf and m["rel_l2"] == math.inf and m["ulp_max"] == math.inf
    assert m["ulp_p99"] == math.inf


def test_ulp_p99_is_an_element_value():
    r = np.ones(200)
    y = r.copy()
    y[:3] += 2.0**-23  # 3 of 200 elements one ULP off: 1.5 % > 1 %
    assert compare(y, r, "float32")["ulp_p99"] == 1.0
    y[1:3] = 1.0  # 1 of 200 (0.5 %): the 99th-percentile element (rank 0.99*199 rounded up) is exact
    assert compare(y, r, "float32")["ulp_p99"] == 0.0


def test_compare_bf16_input_is_read_exactly():
    import ml_dtypes

    y = np.array([1.0078125], dtype=ml_dtypes.bfloat16)  # 1 + 2^-7 exactly
    assert compare(y, np.array([1.0]), "bfloat16")["ulp_max"] == 1.0


def test_compare_shape_mismatch_is_data_not_exception():
    assert "shape_error" in compare(np.ones(3), np.ones(4), "float32")
