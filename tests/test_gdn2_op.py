"""The gdn2 op descriptor (harness/ops/gdn2.py): its case rules, its draws, and its reference binding.

- validation: the chunk variant refuses grouped value heads with fla's reason, the decode variant takes them and
  refuses safe_gate; kda's option rules (lower_bound only with the in-op gate, a bool for every flag);
- draws: b in [0, 1], in [0, 2] with ``allow_neg_eigval`` (which is not passed to fla), w in [0, 1], in the case
  dtype; the shapes fla asserts (b [B,T,HV,K], w [B,T,HV,V]);
- the reference binding: gradients named after the gates (db, dw); with b = w = beta it is kda's binding on the
  same draws to 1e-14; a grouped decode case is the ungrouped reference on q and k repeated to the value heads.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import make_inputs
from harness.ops import get_op

G = Gate("g", "logsigmoid", normalizer=16)
GDN2 = get_op("gdn2")


def case(**kw) -> Case:
    base = dict(op="gdn2", variant="chunk", B=1, T=20, H=1, K=8, V=16, dtype="float32", gate=G, chunk_size=16,
                h0=True, dht=True)
    return Case(**{**base, **kw})


def draws(c: Case) -> dict:
    return make_inputs(c, GDN2.inputs(c)).arrays


@pytest.mark.parametrize("kw, message", [
    (dict(HV=2), r"fla's chunk_gdn2 asserts v \[B,T,H,V\]"),
    (dict(variant="fused_recurrent", dht=False, options=(("safe_gate", True),)), "has no safe_gate"),
    (dict(options=(("lower_bound", -5.0),)), "lower_bound acts only with use_gate_in_kernel"),
    (dict(options=(("allow_neg_eigval", 1),)), "must be a bool"),
    (dict(options=(("use_beta_sigmoid_in_kernel", True),)), "unknown gdn2 options"),
    (dict(variant="fused_recurrent"), "forward only"),
])
def test_validation_refuses_with_the_reason(kw, message):
    with pytest.raises(ValueError, match=message):
        GDN2.validate(case(**kw))


def test_the_decode_variant_takes_grouped_value_heads():
    GDN2.validate(case(variant="fused_recurrent", HV=2, dht=False))


def test_the_gates_draws_and_fla_keywords():
    c = case(dtype="bfloat16", T=64, H=1, HV=1, K=32, V=16)
    x = draws(c)
    assert x["b"].shape == (1, 64, 1, 32) and x["w"].shape == (1, 64, 1, 16)
    assert x["b"].dtype == x["q"].dtype == x["w"].dtype
    b = x["b"].astype(np.float64)
    assert b.min() >= 0 and b.max() <= 1
    wide = draws(c.replace(options=(("allow_neg_eigval", True),)))["b"].astype(np.float64)
    assert wide.max() > 1 and wide.max() <= 2  # 2048 draws of 2 sigmoid(N(0,1)): P(max <= 1) = 2^-2048
    from harness.ops.gdn2 import options

    assert "allow_neg_eigval" not in options(c.replace(options=(("allow_neg_eigval", True),)))


def test_reference_names_the_gates_gradients():
    c = case()
    golden = GDN2.reference(c, draws(c))
    assert set(GDN2.tensor_names(c)) == set(golden)
    assert {"db", "dw"} <= set(golden) and "dbeta" not in golden
    assert golden["db"].shape == (1, 20, 1, 8) and golden["dw"].shape == (1, 20, 1, 16)


def test_b_and_w_beta_is_kdas_binding():
    c = case()
    kda_case = c.replace(op="kda")
    x = make_inputs(kda_case, get_op("kda").inputs(kda_case)).arrays
    beta = x["beta"].astype(np.float64)
    gx = {n: a for n, a in x.items() if n != "beta"}
    gx["b"] = np.broadcast_to(beta[..., None], beta.shape + (c.K,)).copy()
    gx["w"] = np.broadcast_to(beta[..., None], beta.shape + (c.V,)).copy()
    ours, theirs = GDN2.reference(c, gx), get_op("kda").reference(kda_case, x)
    for name in ("o", "ht", "dq", "dk", "dv", "dg", "dh0"):
        err = np.max(np.abs(ours[name] - theirs[name])) / np.max(np.abs(theirs[name]))
        assert err <= 1e-14, (name, err)
    # beta's gradient is the sum of its two uses, over the K erase and the V write channels
    dbeta = ours["db"].sum(-1) + ours["dw"].sum(-1)
    assert np.max(np.abs(dbeta - theirs["dbeta"])) <= 1e-13 * np.max(np.abs(theirs["dbeta"]))


def test_a_grouped_decode_case_reads_q_and_k_per_group():
    c = case(variant="fused_recurrent", HV=2, dht=False)
    x = draws(c)
    got = GDN2.reference(c, x)
    flat = c.replace(HV=None, H=2)
    rep = {**x, **{n: np.repeat(x[n], 2, axis=2) for n in ("q", "k")}}
    want = GDN2.reference(flat, rep)
    np.testing.assert_array_equal(got["o"], want["o"])
    np.testing.assert_array_equal(got["ht"], want["ht"])
