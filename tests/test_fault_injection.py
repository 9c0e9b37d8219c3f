"""Known bug classes, injected into real kernels, must be caught by bounds or the gate.

Faults live on the test side (``tests/faults.py``): a named kernel helper swapped
for its buggy twin (``inject``), or a test-side custom_vjp around the real
kernels. The kernels run through the real TPU leg (interpret mode, after the
real TPU compile) and the real gate. The baseline is fla through the
real GPU leg (emulated here), or, for the NaN class where any baseline does,
the reference leg recomputed in float32.
"""

import dataclasses

import pytest

from cases.case import Case, Gate
from cases.suites import alibi
from harness.judge.gate import apply_gate
from harness.ops import get_op
from harness.core.policy import Policy
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame
from harness.run.runner import Runner
from harness.legs import make_leg


@pytest.fixture(scope="module")
def cache():
    return ReferenceCache(None)


def _with_tpu_forward(op_name, forward):
    op = get_op(op_name)
    return {op_name: dataclasses.replace(op, pallas=dataclasses.replace(op.pallas, forward=forward))}


def _gate(case, faulty_ops, cache):
    baseline = rows_to_frame(Runner(make_leg("ref", method="chunk", compute_dtype="float32"), cache).run_case(case))
    rows = Runner(make_leg("tpu"), cache, ops=faulty_ops).run_case(case)
    return rows, apply_gate(baseline, rows_to_frame(rows), Policy(), baseline_leg="ref")


def test_masked_exp_after_exp_gives_nan_and_fails_the_gate(cache, inject):
    """exp of the unmasked gate difference, then the mask: exp(+90.5) = inf at C=128, H=16, layer 0."""
    from faults import unsafe_causal_decay
    from kernels_tpu.simple_gla import chunk as chunk_module

    case = Case("simple_gla", "chunk", B=1, T=128, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(32, 0),
                chunk_size=128)
    # the safe kernel on the case is finite and within bounds
    safe = Runner(make_leg("tpu"), cache).run_case(case)
    assert {r["status"] for r in safe} == {"ok"}, [(r["tensor"], r["reason"]) for r in safe]
    inject(chunk_module, "causal_decay", unsafe_causal_decay)
    rows, result = _gate(case, {"simple_gla": get_op("simple_gla")}, cache)
    statuses = {r["tensor"]: r["status"] for r in rows}
    assert statuses["o"] == "nonfinite", statuses
    assert "o" in set(result.failures["tensor"])


@pytest.fixture(scope="module")
def gpu_rows():
    """fla's rows for a case, computed once per case (the real GPU leg, emulated here)."""

    memo = {}

    def get(case, cache):
        if case.id not in memo:
            memo[case.id] = rows_to_frame(Runner(make_leg("gpu"), cache).run_case(case))
        return memo[case.id]

    return get


GLA_CASE = Case("gla", "chunk", B=1, T=64, H=2, K=256, V=128, dtype="bfloat16", gate=alibi(24, 0), chunk_size=64,
                h0=True, dht=True)


def _gla_fused_forward(zero_dg_gamma=False):
    """The fused g_gamma path, optionally behind a test-side custom_vjp that zeroes dg_gamma."""
    from faults import zero_gradient
    from kernels_tpu import gla as kernels

    def forward(case, a, ctx):
        g_gamma = zero_gradient(a["g_gamma"]) if zero_dg_gamma else a["g_gamma"]
        o, ht = kernels.chunk_gla(a["q"], a["k"], a["v"], g_gamma=g_gamma, scale=case.resolved_scale,
                                  initial_state=a.get("h0"), output_final_state=True, chunk_size=case.chunk_size,
                                  interpret=ctx.interpret, mxu_model=ctx.mxu_model, path="fused")
        return {"o": o, "ht": ht}

    return forward


def _tpu_verdicts(case, fault_forward, baseline, cache):
    rows = Runner(make_leg("tpu"), cache, ops=_with_tpu_forward(case.op, fault_forward)).run_case(case)
    result = apply_gate(baseline, rows_to_frame(rows), Policy())
    return {r["tensor"]: r for r in rows}, result


@pytest.mark.needs_leg("gpu")
def test_zero_dg_gamma_is_caught_by_bounds_without_a_gpu_number(cache, gpu_rows):
    """fla gives no dg_gamma, so only the absolute bound can see a zero gate gradient."""
    baseline = gpu_rows(GLA_CASE, cache)
    assert baseline.set_index("tensor").loc["dg_gamma", "status"] == "not_provided"
    rows, result = _tpu_verdicts(GLA_CASE, _gla_fused_forward(zero_dg_gamma=True), baseline, cache)
    assert rows["dg_gamma"]["status"] == "bound" and rows["dg_gamma"]["rel_l2"] == 1.0
    assert set(result.failures["tensor"]) == {"dg_gamma"}


@pytest.mark.needs_leg("gpu")
def test_dropped_k_tile_reduction_is_caught_by_the_gate(cache, gpu_rows, inject):
    from faults import first_k_tile_only
    from kernels_tpu.gla import fused

    baseline = gpu_rows(GLA_CASE, cache)
    # the healthy fused kernel on the case passes the strict rule for o against fla
    _, healthy = _tpu_verdicts(GLA_CASE, _gla_fused_forward(), baseline, cache)
    assert "o" not in set(healthy.failures["tensor"]), healthy.failures.to_dict("records")
    inject(fused, "k_tile_reduction", first_k_tile_only)
    rows, result = _tpu_verdicts(GLA_CASE, _gla_fused_forward(), baseline, cache)
    assert "o" in set(result.failures["tensor"])


@pytest.mark.needs_leg("gpu")
def test_missing_transpose_in_the_inverse_gradient_is_caught_by_the_gate(cache, gpu_rows, inject):
    """dX = -Aᵀ dA Aᵀ with one transpose dropped: kda's dk, dg and dbeta go wrong."""
    from faults import inverse_grad_missing_transpose
    from kernels_tpu import delta_rule

    inject(delta_rule, "inverse_grad", inverse_grad_missing_transpose)
    case = Case("kda", "chunk", B=1, T=64, H=2, K=128, V=128, dtype="float32", gate=Gate(), chunk_size=64, h0=True,
                dht=True)
    rows, result = _tpu_verdicts(case, get_op("kda").pallas.forward, gpu_rows(case, cache), cache)
    failed = set(result.failures["tensor"])
    assert {"dk", "dbeta"} <= failed, result.failures.to_dict("records")
    assert "o" not in failed  # the forward is untouched: only the gradient gate can see this bug
