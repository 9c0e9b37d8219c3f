"""The gate forms tops' tests vary (issue 36), on every leg: g_gamma one value for every head (``g_gamma[]=``), per
head (``g_gamma=``), per head and key channel (gla, ``g_gamma[H,K]=``), drawn by ALiBi, ``const(x)`` or
``halfnormal/n``; both gates at once (``g=.../g_gamma=...``: ``Case.gamma``); and the ``fused_recurrent`` variant of
simple_gla and gla.

Each form is in the id grammar (round trip), the input draw (deterministic, the law's values), the float64
reference through the op descriptor, and each kernel binding: it runs (through an exact broadcast where the
implementation takes another shape, checked bit for bit against the case written in that shape) or is refused with
the reason. The reference's own identities on hand-computed values are in ``tests/test_reference_simple_gla.py``
and ``tests/test_reference_gla.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import Inputs, inputs_sha256, make_inputs
from harness.app import case_from_id, load_cases
from harness.legs import make_leg
from harness.legs.tpu import kernel_refusal
from harness.ops import get_op
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner

SCALAR = "simple_gla.chunk/B2-T40-H4-K16-V16/fp32/g_gamma[]=const(-0.5)/C16/h0,dht"
PER_HEAD_K = "gla.chunk/B2-T32-H4-K32-V64/fp32/g_gamma[H,K]=halfnormal/10/C32/h0"
BOTH = "simple_gla.fused_recurrent/B2-T40-H4-K16-V8/fp32/g=logsigmoid/1/g_gamma=halfnormal/2/C16/h0,dht"
GLA_BOTH = "gla.chunk/B2-T32-H4-K32-V64/fp32/g=logsigmoid/16/g_gamma=halfnormal/10/C32"
GLA_RECURRENT = "gla.fused_recurrent/B1-T64-H2-K16-V32/bf16/g_gamma[]=halfnormal/10/C64/h0,dht"


def _case(text: str) -> Case:
    return case_from_id(text)


def _inputs(case: Case) -> Inputs:
    return make_inputs(case, get_op(case.op).inputs(case))


# ------------------------------------------------------------------ grammar
@pytest.mark.parametrize("text", [SCALAR, PER_HEAD_K, BOTH, GLA_BOTH, GLA_RECURRENT,
                                  "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma=const(-0.8)/C128",
                                  "simple_gla.fused_recurrent/B2-T32-H4-K32-V64/fp32/g_gamma=logsigmoid/1/C64",
                                  "gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma[H,K]=alibi(L32,l0)/C64",
                                  "simple_gla.chunk/B1-T64-H2-K8-V8/bf16/g=logsigmoid/16,lb-5/g_gamma=const(0)/C64"])
def test_the_id_round_trips(text):
    case = _case(text)
    assert case.id == text and Case.from_id(case.id) == case


def test_the_forms_as_fields():
    scalar = _case(SCALAR)
    assert scalar.gate == Gate("g_gamma", "const", value=-0.5, gamma_shape="")
    assert _case(PER_HEAD_K).gate == Gate("g_gamma", "halfnormal", normalizer=10, gamma_shape="H,K")
    both = _case(BOTH)
    assert both.gate == Gate("g", "logsigmoid", normalizer=1) and both.gamma == Gate("g_gamma", "halfnormal",
                                                                                      normalizer=2)
    assert both.gates == (both.gate, both.gamma)
    # per head is the default shape: written without brackets, [H] read as it
    assert Case.from_id(SCALAR.replace("g_gamma[]", "g_gamma[H]")).id == SCALAR.replace("g_gamma[]", "g_gamma")


@pytest.mark.parametrize("text, match", [
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma[]=alibi(L32,l0)/C64", "ALiBi slopes are per head"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma=const(0.5)/C64", "a finite number <= 0"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma=halfnormal/0/C64", "pass a positive number"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=const(-0.5)/C64", "a per-token g gate is drawn by"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma=sigmoid/16/C64", "law must be one of"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma[K]=const(-0.5)/C64", "gamma_shape='K' must be one of"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g[H,K]=logsigmoid/16/C64", "a g gate has its op's per-token shape"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma=const(-0.5)/g=logsigmoid/16/C64", "the g gate comes first"),
    ("simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g_gamma[H,K]=const(-0.5)/C64", "is gla's"),
    ("kda.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/g_gamma=const(-0.5)/C64", "kda takes one gate"),
    ("gdn.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/g_gamma=const(-0.5)/C64", "gdn takes one gate"),
])
def test_bad_forms_say_the_fix(text, match):
    with pytest.raises(ValueError, match=match):
        _case(text)


def test_a_cases_file_gives_the_second_gate_as_gamma(tmp_path):
    path = tmp_path / "both.toml"
    path.write_text('[[grid]]\nop = "simple_gla"\nvariant = "fused_recurrent"\nB = 2\nT = 16\nH = 4\nK = 16\n'
                    'V = 8\ndtype = "float32"\ngate = "g=logsigmoid/1"\n'
                    'gamma = ["g_gamma=halfnormal/2", false, {kind = "g_gamma", law = "const", value = -0.5, '
                    'gamma_shape = ""}]\n')
    ids = [c.id for c in load_cases(path)]
    assert ids == ["simple_gla.fused_recurrent/B2-T16-H4-K16-V8/fp32/g=logsigmoid/1/g_gamma=halfnormal/2/C64",
                   "simple_gla.fused_recurrent/B2-T16-H4-K16-V8/fp32/g=logsigmoid/1/C64",
                   "simple_gla.fused_recurrent/B2-T16-H4-K16-V8/fp32/g=logsigmoid/1/g_gamma[]=const(-0.5)/C64"]
    with pytest.raises(ValueError, match="holds two gates"):
        Gate.from_label("g=logsigmoid/16/g_gamma=const(-0.5)")


# ------------------------------------------------------------------- inputs
def test_each_form_draws_its_shape_and_law_deterministically():
    scalar, per_head_k, both = _inputs(_case(SCALAR)), _inputs(_case(PER_HEAD_K)), _inputs(_case(BOTH))
    assert scalar["g_gamma"].shape == () and scalar["g_gamma"] == np.float32(-0.5)
    assert per_head_k["g_gamma"].shape == (4, 32) and (per_head_k["g_gamma"] <= 0).all()
    assert both["g"].shape == (2, 40, 4) and both["g_gamma"].shape == (4,)
    # halfnormal/n is -|N(0,1)| / n: the first draw of a fresh generator, as the law's own text says
    case = _case(PER_HEAD_K)
    rng = np.random.Generator(np.random.PCG64(case.rng_seed))
    for spec in get_op(case.op).inputs(case)[:3]:  # q, k, v are drawn before the gate
        rng.standard_normal(spec.shape(case))
    np.testing.assert_array_equal(per_head_k["g_gamma"],
                                  (-np.abs(rng.standard_normal((4, 32))) / 10).astype(np.float32))
    again = _inputs(_case(PER_HEAD_K))
    assert again.sha256 == per_head_k.sha256 == inputs_sha256(per_head_k.arrays)


def test_the_compared_tensors_follow_the_gates():
    both = _case(BOTH)
    assert get_op("simple_gla").differentiable(both) == ["q", "k", "v", "g", "g_gamma", "h0"]
    names = get_op("gla").tensor_names(_case(GLA_BOTH))
    assert names == ["o", "ht", "dq", "dk", "dv", "dg", "dg_gamma"]


# ---------------------------------------------------------------- reference
@pytest.mark.parametrize("text", [BOTH, GLA_RECURRENT])
def test_the_fused_recurrent_reference_is_the_chunk_one(text):
    """fused_recurrent is the same function: its reference is the chunk variant's, and the recurrence agrees with
    the chunked form to 1e-12 in float64."""
    case = _case(text)
    op, x = get_op(case.op), _inputs(case).as_float64()
    chunked = op.reference(case, x)
    assert op.reference(case.replace(variant="chunk"), x).keys() == chunked.keys()
    recurrent = op.reference(case, x, method="recurrent")
    for name, want in chunked.items():
        got = recurrent[name]
        assert np.linalg.norm(got - want) <= 1e-12 * np.linalg.norm(want), name


# -------------------------------------------------------------- bindings
@pytest.mark.parametrize("text, fla, pallas", [
    (SCALAR, None, None),
    (PER_HEAD_K, None, None),
    (PER_HEAD_K.replace("/C32/h0", "/C32/h0,tpu_path=fused"), None, "needs a per-head g_gamma [H]"),
    (BOTH, None, None),  # the decode kernel (kernels_tpu.gated_recurrent) takes both gates
    (BOTH.replace("fused_recurrent", "chunk"), "returns a wrong result", "not both at once"),
    (BOTH.replace("fused_recurrent", "fused_chunk").replace("C16", "C64"), "'Only one of `g` or `g_gamma` should",
     "not both at once"),
    (GLA_BOTH, "has no fla form", "not both at once"),
    (GLA_BOTH.replace("chunk", "fused_recurrent"), "has no fla form", None),
    (GLA_RECURRENT, None, None),
    (GLA_RECURRENT.replace("/h0", "/h0,tpu_path=chunk"), None, "fused_recurrent has one kernel"),
    ("simple_gla.fused_recurrent/B1-T64-H2-K8-V8/bf16/g=logsigmoid/16/C64/h0,dht,state_v_first", None, None),
])
def test_each_leg_runs_a_form_or_says_why_not(text, fla, pallas):
    """None: the leg runs the case; else a fragment of the unsupported row's reason (the fla binding's, or the TPU
    binding's and kernels' own: ``kernel_refusal`` traces the binding on shape-only inputs)."""
    case = _case(text)
    op = get_op(case.op)
    fla_why = op.fla.supports(case)
    tpu_why = op.pallas.supports(case) or kernel_refusal(op, case)
    for got, want in ((fla_why, fla), (tpu_why, pallas)):
        if want is None:
            assert got is None, got
        else:
            assert got is not None and want in got, got


def _tpu(case: Case, inputs: Inputs) -> dict:
    return make_leg("tpu", compile_targets=()).run(get_op(case.op), case, inputs).tensors


def _with(inputs: Inputs, **arrays) -> Inputs:
    out = {**inputs.arrays, **arrays}
    out = {n: a for n, a in out.items() if a is not None}
    return Inputs(out, inputs_sha256(out))


def test_tpu_runs_a_scalar_g_gamma_as_the_per_head_one():
    """The binding broadcasts g_gamma [] to [H]: bit for bit the per-head case on the same values; dg_gamma is the
    per-head gradient summed."""
    scalar = _case(SCALAR)
    x = _inputs(scalar)
    per_head = scalar.replace(gate=Gate("g_gamma", "const", value=-0.5))
    got = _tpu(scalar, x)
    want = _tpu(per_head, _with(x, g_gamma=np.full((scalar.H,), x["g_gamma"], np.float32)))
    for name in ("o", "ht", "dq", "dk", "dv", "dh0"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["dg_gamma"].shape == ()
    np.testing.assert_allclose(got["dg_gamma"], want["dg_gamma"].sum(), rtol=1e-6)


def test_tpu_runs_a_per_channel_g_gamma_as_a_constant_g():
    """gla's g_gamma [H,K] reaches the chunk kernels as g = g_gamma broadcast to [B,T,H,K]: bit for bit the g case on
    the same values; dg_gamma is that dg summed over batch and tokens."""
    case = _case(PER_HEAD_K)
    x = _inputs(case)
    as_g = case.replace(gate=Gate("g", "logsigmoid"))
    g = np.ascontiguousarray(np.broadcast_to(x["g_gamma"], (case.B, case.T, case.H, case.K)))
    got, want = _tpu(case, x), _tpu(as_g, _with(x, g_gamma=None, g=g))
    for name in ("o", "ht", "dq", "dk", "dv", "dh0"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # two float32 sums of the same B*T terms in different orders (the kernel's pinned halving order, numpy's here):
    # each is within n * eps * sum|dg| of the exact sum (the standard bound for any order of n - 1 adds)
    n = case.B * case.T
    bound = 2 * n * np.finfo(np.float32).eps * np.abs(want["dg"]).sum(axis=(0, 1))
    assert np.all(np.abs(got["dg_gamma"] - want["dg"].sum(axis=(0, 1))) <= bound)


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("text", [BOTH, GLA_RECURRENT])
def test_fla_runs_fused_recurrent_and_both_gates_within_the_bounds(text):
    rows = Runner(make_leg("gpu"), ReferenceCache(None)).run_case(_case(text))
    status = {r["tensor"]: r["status"] for r in rows}
    assert status.pop("dg_gamma") == "not_provided"  # fla returns no gradient for g_gamma, in any form
    assert set(status.values()) == {"ok"}, [(r["tensor"], r["status"], r["reason"]) for r in rows]
