import hashlib

import ml_dtypes
import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import alibi_g_gamma, alibi_slopes, make_inputs
from cases.suites import SUITES, get_suite
from harness.app import find_case
from harness.ops import get_op


def _case(**kw):
    base = dict(op="simple_gla", variant="chunk", B=1, T=256, H=2, K=128, V=128, dtype="bfloat16",
                gate=Gate("g_gamma", "alibi", num_layers=32, layer_idx=0), chunk_size=128, h0=True)
    base.update(kw)
    return Case(**base)


def test_case_id_is_readable_and_stable():
    assert _case().id == "simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0"
    assert _case(gate=Gate(), h0=False, dht=True, chunk_size=64).id == \
        "simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g=logsigmoid/16/C64/dht"


def test_seed_is_sha256_of_id_not_python_hash():
    c = _case()
    expected = int.from_bytes(hashlib.sha256(c.id.encode()).digest()[:8], "little")
    assert c.rng_seed == expected


def test_inputs_are_deterministic_and_quantized():
    c = _case(dht=True)
    op = get_op(c.op)
    a, b = make_inputs(c, op.inputs(c)), make_inputs(c, op.inputs(c))
    assert a.sha256 == b.sha256
    assert a["q"].dtype == ml_dtypes.bfloat16 and a["g_gamma"].dtype == np.float32
    assert a["h0"].shape == (1, 2, 128, 128) and a["dht"].dtype == np.float32
    for name in a.arrays:
        np.testing.assert_array_equal(a[name].view(np.uint8), b[name].view(np.uint8))
    # a different case draws different inputs
    assert make_inputs(c.replace(seed=1), op.inputs(c.replace(seed=1))).sha256 != a.sha256


def test_first_draw_is_pinned():
    """Guards cross-machine determinism: the generator and draw order must not drift silently."""
    c = _case(dtype="float32", gate=Gate(), h0=False)
    q = make_inputs(c, get_op(c.op).inputs(c))["q"]
    rng = np.random.Generator(np.random.PCG64(c.rng_seed))
    np.testing.assert_array_equal(q, rng.standard_normal(q.shape).astype(np.float32))


def test_alibi_g_gamma_formula():
    slopes = alibi_slopes(16)
    assert slopes[0] == 2.0**-0.5 and slopes[-1] == 2.0**-8
    assert alibi_slopes(2).tolist() == [2.0**-4, 2.0**-8]
    g = alibi_g_gamma(16, 32, 0)
    assert g[0] == pytest.approx(-(2.0**-0.5) * (1 + 1e-5), rel=1e-15)
    assert abs(g[0]) * 128 > 88.72  # float32 exp overflow threshold: the regression regime
    assert alibi_g_gamma(16, 1, 0)[0] == pytest.approx(-(2.0**-0.5) * (1 + 1e-5))  # max(L-1, 1)
    np.testing.assert_allclose(alibi_g_gamma(4, 21, 20), -alibi_slopes(4) * 1e-5)


def test_lower_bound_clamps_gate():
    c = _case(gate=Gate("g", "logsigmoid", normalizer=0.1, lower_bound=-5.0), dtype="float32")
    g = make_inputs(c, get_op(c.op).inputs(c))["g"]
    assert g.min() >= -5.0 and (g == -5.0).any()
    assert "lb-5" in c.id


@pytest.mark.parametrize("kw, match", [(dict(dtype="float64"), "dtype"), (dict(T=0), "T=0"),
                                       (dict(final_state=False, dht=True), "dht")])
def test_invalid_cases(kw, match):
    with pytest.raises(ValueError, match=match):
        _case(**kw)


def test_grouped_value_heads_in_the_case_model():
    gva = Case("gdn", "chunk", B=1, T=64, H=2, HV=6, K=64, V=32, dtype="bfloat16", h0=True, dht=True)
    assert gva.id == "gdn.chunk/B1-T64-H2-HV6-K64-V32/bf16/g=logsigmoid/16/C64/h0,dht"
    assert Case.from_id(gva.id) == gva and gva.grouped_values
    assert gva.state_shape == (1, 6, 64, 32)
    shapes = {s.name: s.shape(gva) for s in get_op("gdn").inputs(gva)}
    assert shapes["q"] == shapes["k"] == (1, 64, 2, 64)
    assert shapes["v"] == shapes["do"] == (1, 64, 6, 32) and shapes["g"] == shapes["beta"] == (1, 64, 6)
    assert shapes["h0"] == shapes["dht"] == (1, 6, 64, 32)
    # without GVA the id, and so every input draw, is what it always was
    plain = Case("kda", "chunk", B=1, T=64, H=2, K=64, V=64)
    assert plain == plain.replace(HV=2) and "HV" not in plain.id and not plain.grouped_values
    with pytest.raises(ValueError, match="HV=3 value heads must be a multiple of H=2"):
        Case("gdn", "chunk", B=1, T=64, H=2, HV=3, K=64, V=64)
    with pytest.raises(ValueError, match="simple_gla has no grouped value heads"):
        Case.from_id("simple_gla.chunk/B1-T64-H1-HV2-K64-V64/bf16/g=logsigmoid/16/C64", ops=get_op)


def test_gate_validation():
    with pytest.raises(ValueError, match="alibi"):
        Gate("g", "const", value=-0.5)  # a per-token g is drawn by logsigmoid or alibi


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_suites_are_valid_and_unique(suite):
    cases = get_suite(suite)
    assert cases
    for c in cases:
        get_op(c.op).validate(c)
    assert find_case(cases[0].id) == cases[0]


def test_regressions_reach_the_overflow_regime():
    cases = get_suite("regressions")
    assert any(c.gate.kind == "g_gamma" and c.chunk_size == 128 and c.H >= 16 and c.gate.layer_idx == 0
               for c in cases)
    assert any(c.dht and c.gate.kind == "g" for c in cases)


def test_the_user_like_sample_is_fixed_valid_and_covers_what_users_write():
    from cases.user_like import HEAD_DIMS, MAX_T, SIZE, user_like_cases

    cases = get_suite("user-like")
    assert [c.id for c in cases] == [c.id for c in user_like_cases()]  # the same sample on every call
    assert len(cases) == SIZE == len({c.id for c in cases})
    for c in cases:
        get_op(c.op).validate(c)
        assert 1 <= c.T <= MAX_T and 1 <= c.H <= 4 and c.K in HEAD_DIMS and c.V in HEAD_DIMS
    kinds = {(c.op, c.variant, c.gate.kind) for c in cases}
    assert kinds == {("simple_gla", "chunk", "g"), ("simple_gla", "chunk", "g_gamma"),
                     ("simple_gla", "fused_chunk", "g"), ("simple_gla", "fused_chunk", "g_gamma"),
                     ("gla", "chunk", "g"), ("gla", "chunk", "g_gamma"), ("kda", "chunk", "g"),
                     ("gdn", "chunk", "g")}
    assert {c.op for c in cases if c.grouped_values} == {"kda", "gdn"}  # grouped value heads, where ops take them
    assert {c.dtype for c in cases} == {"bfloat16", "float16", "float32"}
    assert sum(c.T % c.chunk_size != 0 for c in cases) > SIZE // 2  # partial last chunks are the rule
    assert SIZE // 5 <= sum(c.lens is not None for c in cases) <= SIZE // 2
    assert not any(get_op(c.op).binding_refusals(c) for c in cases)  # fla's own chunk size for gla
