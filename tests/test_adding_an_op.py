"""Adding an op touches only its own files: a gate-less op (fla's linear attention, no decay) is described
here, on the test side, and runs through the unchanged case model, runner and comparator.

It borrows simple_gla's reference and kernels with no gate (decay 1), which is exactly ungated causal linear
attention: S_t = S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t.
"""

from __future__ import annotations

from cases.case import Case
from cases.inputs import InputSpec
from harness.ops import REGISTRY
from harness.ops.base import (LegBinding, OpDescriptor, forward_tensors, grad_tensors, qkv_specs,
                              state_and_cotangent_specs)
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner
from harness.core.status import Status
from harness.legs import make_leg


def _inputs(case: Case) -> list[InputSpec]:
    return qkv_specs(case) + state_and_cotangent_specs(case)


def _differentiable(case: Case) -> list[str]:
    return ["q", "k", "v"] + (["h0"] if case.h0 else [])


def _tensors(case: Case):
    dtypes = {"q": "case", "k": "case", "v": "case", "h0": "float32"}
    return forward_tensors(case) + grad_tensors(case, _differentiable(case), dtypes)


def _validate(case: Case) -> None:
    if case.gate is not None:
        raise ValueError(f"linear_attn takes no gate, got {case.gate.label}")


def _reference(case: Case, x: dict, method: str = "chunk", compute_dtype: str = "float64") -> dict:
    from references.simple_gla import chunk_simple_gla, chunk_simple_gla_bwd

    common = dict(scale=case.resolved_scale, initial_state=x.get("h0"), chunk_size=case.chunk_size,
                  method=method, compute_dtype=compute_dtype)
    o, ht = chunk_simple_gla(x["q"], x["k"], x["v"], output_final_state=True, **common)
    grads = chunk_simple_gla_bwd(x["q"], x["k"], x["v"], x["do"], x.get("dht"), **common)
    return {"o": o, "ht": ht, **{n: a for n, a in grads.items() if a is not None}}


def _tpu_forward(case: Case, a: dict, ctx) -> dict:
    from kernels_tpu.simple_gla import chunk_simple_gla

    o, ht = chunk_simple_gla(a["q"], a["k"], a["v"], scale=case.resolved_scale, initial_state=a.get("h0"),
                             output_final_state=case.final_state, chunk_size=case.chunk_size,
                             interpret=ctx.interpret, mxu_model=ctx.mxu_model)
    return {"o": o, "ht": ht}


LINEAR_ATTN = OpDescriptor(
    name="linear_attn", variants=("chunk",), doc=__doc__, inputs=_inputs, tensors=_tensors,
    differentiable=_differentiable, cotangents={"o": "do", "ht": "dht"}, validate=_validate,
    reference=_reference, pallas=LegBinding(_tpu_forward))


def test_a_gate_less_op_runs_without_edits_to_the_case_model():
    case = Case("linear_attn", "chunk", B=1, T=64, H=1, K=128, V=128, dtype="float32", gate=None,
                chunk_size=64, h0=True, dht=True)
    assert case.id == "linear_attn.chunk/B1-T64-H1-K128-V128/fp32/C64/h0,dht"
    rows = Runner(make_leg("tpu"), ReferenceCache(None), ops={**REGISTRY, "linear_attn": LINEAR_ATTN}).run_case(case)
    by_tensor = {r["tensor"]: r for r in rows}
    assert sorted(by_tensor) == sorted(["o", "ht", "dq", "dk", "dv", "dh0"])
    for name, row in by_tensor.items():
        assert row["status"] == Status.OK, (name, row["status"], row.get("reason"))
        assert 0 < row["rel_l2"] < 1e-5, (name, row["rel_l2"])  # f32 inputs, BF16X3 dots: f32-level error


def test_gated_ops_refuse_a_gate_less_case_with_a_reason():
    case = Case("simple_gla", "chunk", B=1, T=64, H=1, K=128, V=128, gate=None)
    rows = Runner(make_leg("tpu"), ReferenceCache(None)).run_case(case)
    assert {r["status"] for r in rows} == {Status.ERROR}
    assert "takes a g or g_gamma gate" in rows[0]["reason"]
