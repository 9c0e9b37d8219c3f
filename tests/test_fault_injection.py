"""Known bug classes, injected into real kernels, must be caught by bounds or the gate.

Each fault is a documented, test-only switch of a ``kernels_tpu`` kernel. The
faulty kernel is bound into a copy of the op's descriptor and run through the
real TPU leg (interpret mode) and the real gate. The baseline is the reference
leg recomputed in float32: an honest second result file that needs no GPU.
"""

import dataclasses

import pytest

from cases.case import Case
from cases.suites import alibi
from harness.gate import apply_gate
from harness.legs.ref import RefLeg
from harness.legs.tpu import TpuLeg
from harness.ops import get_op
from harness.ops.base import LegBinding
from harness.policy import Policy
from harness.reference_cache import ReferenceCache
from harness.reports import rows_to_frame
from harness.runner import Runner


@pytest.fixture(scope="module")
def cache():
    return ReferenceCache(None)


def _with_tpu_forward(op_name, forward):
    op = get_op(op_name)
    return {op_name: dataclasses.replace(op, tpu=dataclasses.replace(op.tpu, forward=forward))}


def _gate(case, faulty_ops, cache):
    baseline = rows_to_frame(Runner(RefLeg(method="chunk", compute_dtype="float32"), cache).run_case(case))
    rows = Runner(TpuLeg(), cache, ops=faulty_ops).run_case(case)
    return rows, apply_gate(baseline, rows_to_frame(rows), Policy())


def test_masked_exp_after_exp_gives_nan_and_fails_the_gate(cache):
    """exp of the unmasked gate difference, then the mask: exp(+90.5) = inf at C=128, H=16, layer 0."""
    from kernels_tpu import simple_gla as kernels

    case = Case("simple_gla", "chunk", B=1, T=128, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(32, 0),
                chunk_size=128)

    def unsafe_forward(case, a, ctx):
        o, ht = kernels.chunk_simple_gla(a["q"], a["k"], a["v"], g_gamma=a["g_gamma"], scale=case.resolved_scale,
                                         output_final_state=True, chunk_size=case.chunk_size,
                                         interpret=ctx.interpret, mxu_model=ctx.mxu_model, unsafe_masked_exp=True)
        return {"o": o, "ht": ht}

    rows, result = _gate(case, _with_tpu_forward("simple_gla", unsafe_forward), cache)
    statuses = {r["tensor"]: r["status"] for r in rows}
    assert statuses["o"] == "nonfinite", statuses
    failed = set(result.failures["tensor"])
    assert "o" in failed
    # the safe kernel on the same case is finite and within bounds
    safe = Runner(TpuLeg(), cache).run_case(case)
    assert {r["status"] for r in safe} == {"ok"}, [(r["tensor"], r["reason"]) for r in safe]
