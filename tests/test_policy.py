import math

import pytest

from harness.legs.registry import role_of
from harness.core.policy import BOUNDS, Bound, Policy, bound_for, parse_floors


def test_most_specific_bound_wins():
    rules = [Bound(1.0, "any"), Bound(0.5, "bf16", dtype="bfloat16"),
             Bound(0.1, "bf16 dg", tensor="dg", dtype="bfloat16"), Bound(0.2, "later tie", dtype="bfloat16")]
    assert bound_for("x", "o", "bfloat16", "candidate", rules).rel_l2 == 0.2  # ties: the later rule
    assert bound_for("x", "dg", "bfloat16", "candidate", rules).rel_l2 == 0.1
    assert bound_for("x", "dg", "float32", "baseline", rules).rel_l2 == 1.0
    by_role = rules + [Bound(0.01, "the reference", role="reference")]
    assert bound_for("x", "o", "bfloat16", "reference", by_role).rel_l2 == 0.01
    assert bound_for("x", "o", "bfloat16", "baseline", by_role).rel_l2 == 0.2


def test_project_bounds_cover_every_dtype_and_catch_zero_gradients():
    for dtype in ("bfloat16", "float16", "float32"):
        for role in ("baseline", "candidate", "reference"):
            b = bound_for("simple_gla", "dg", dtype, role, BOUNDS)
            assert b.rel_l2 < 1.0  # rel_l2 of an all-zero gradient is exactly 1


def test_strict_policy():
    p = Policy()
    assert p.passes("rel_l2", 1e-3, 1e-3)
    assert not p.passes("rel_l2", 1.0000001e-3, 1e-3)
    assert not p.passes("rel_l2", math.nan, 1e-3)
    assert not p.passes("rel_l2", 1e-3, math.nan)


def test_margin_and_floor():
    p = Policy(metrics=("rel_l2", "ulp_p99"), rel_margin=0.1, abs_floor={"ulp_p99": 2.0})
    assert p.passes("rel_l2", 1.1e-3, 1e-3) and not p.passes("rel_l2", 1.11e-3, 1e-3)
    assert p.allowed("ulp_p99", 10.0) == pytest.approx(13.0)
    assert p.passes("ulp_p99", 2.0, 0.0)  # the floor lets a 0-error baseline be matched loosely


@pytest.mark.parametrize("kwargs", [dict(metrics=()), dict(metrics=("bogus",)), dict(rel_margin=-1.0),
                                    dict(abs_floor={"rel_l2": -1.0})])
def test_invalid_policy(kwargs):
    with pytest.raises(ValueError):
        Policy(**kwargs)


def test_parse_floors():
    assert parse_floors("rel_l2=1e-6, max_abs=2") == {"rel_l2": 1e-6, "max_abs": 2.0}
    with pytest.raises(ValueError, match="metric=value"):
        parse_floors("rel_l2")


def test_fla_on_an_h100_is_within_every_bound():
    """The absolute bounds catch gross bugs; fla's own hardware numbers must never trip them (a GPU row out of
    bounds loses its number, and the gate then has nothing to compare). reports/h100-native holds the GPU leg
    run natively on an H100: strong-decay fp32 dg reached 1.22e-2 there."""
    from pathlib import Path

    import pandas as pd

    rows = pd.concat(pd.read_csv(f) for f in (Path(__file__).parents[1] / "reports" / "h100-native").glob("*.csv"))
    rows = rows[rows["rel_l2"].notna()]
    assert len(rows) > 300 and set(rows["mode"]) == {"native"}
    over = [(r.case_id, r.tensor, r.rel_l2) for r in rows.itertuples()
            if r.rel_l2 > bound_for(r.op, r.tensor, r.dtype, role_of(r.leg), BOUNDS).rel_l2]
    assert not over, over


def test_gate_parameter_gradients_are_judged_over_their_terms():
    """dA_log sums dg * dG/dA_log / dG/dg over every token and channel: its op declares it a sum, so its bound is
    the one over its terms' magnitudes (tests/test_reductions.py); the 1e-1 rel_l2 allowances that stood for
    cancellation are gone, and a rule over the reference keeps the dtype's bound."""
    for dtype, other in (("float32", 1e-2), ("bfloat16", 5e-2)):
        assert bound_for("kda", "dA_log", dtype, "baseline", BOUNDS).rel_l2 == other
        assert bound_for("kda", "dq", dtype, "baseline", BOUNDS).rel_l2 == other
        assert bound_for("kda", "dA_log", dtype, "baseline", BOUNDS, over="contributions").over == "contributions"
