"""fla's ``state_v_first`` layout as a case feature (issue 23): h0, ht, dht and dh0 are [N,HV,V,K].

The reference and the TPU leg call their K-first bindings with the state transposed in and out
(``harness.ops.base.call_k_first``), so a V-first case must give exactly the K-first case's numbers on the same
inputs, transposed: bit for bit. fla runs its own V-first kernels (``state_v_first=True``), another code path
whose error is the point of the feature: its rows must be ok and within the bounds. K != V throughout, so a
swap on the wrong axes cannot pass unseen."""

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import Inputs, make_inputs
from harness.app import case_from_id
from harness.legs import make_leg
from harness.ops import get_op
from harness.ops.base import STATE_TENSORS, state_k_first
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner

OPTIONS = {"kda": (("use_beta_sigmoid_in_kernel", True), ("use_qk_l2norm_in_kernel", True)),
           "gdn": (("use_beta_sigmoid_in_kernel", True),)}
GATES = {"kda": Gate("g", "logsigmoid", normalizer=16, lower_bound=-5.0)}


def v_first(op: str, **kw) -> Case:
    return Case(op, "chunk", B=1, T=40, H=1, HV=2 if op in OPTIONS else None, K=32, V=64, dtype="float32",
                gate=GATES.get(op, Gate()), chunk_size=16 if op == "gla" else 64, h0=True, dht=True,
                lens=(15, 25), options=OPTIONS.get(op, ()), state_v_first=True, **kw)


def test_the_case_lays_its_state_out_v_first():
    case = v_first("gdn")
    assert case.state_shape == (2, 2, 64, 32) and case.replace(state_v_first=False).state_shape == (2, 2, 32, 64)
    assert case.id.endswith("state_v_first,use_beta_sigmoid_in_kernel=1")
    assert case_from_id(case.id) == case
    x = make_inputs(case, get_op("gdn").inputs(case))
    assert x["h0"].shape == x["dht"].shape == case.state_shape
    with pytest.raises(ValueError, match="has none"):
        Case("gdn", "chunk", B=1, T=8, H=1, K=32, V=64, final_state=False, state_v_first=True)


@pytest.mark.parametrize("leg_name", ["ref", "tpu"])
@pytest.mark.parametrize("op_name", ["simple_gla", "gla", "kda", "gdn"])
def test_a_k_first_binding_sees_the_k_first_case(op_name, leg_name):
    op, case = get_op(op_name), v_first(op_name)
    k_first = case.replace(state_v_first=False)
    x = make_inputs(case, op.inputs(case))
    x_k = Inputs(state_k_first(case, x.arrays), x.sha256)
    leg = make_leg(leg_name, **({"compile_targets": ()} if leg_name == "tpu" else {}))
    got, want = leg.run(op, case, x).tensors, leg.run(op, k_first, x_k).tensors
    assert set(got) == set(want) and {"ht", "dh0"} <= set(got)
    for name in got:
        expected = want[name].swapaxes(-1, -2) if name in STATE_TENSORS else want[name]
        if leg_name == "tpu":
            # the same values, up to the order in which XLA:CPU accumulates the MXU model's f32 passes, which
            # the programs' layouts may change (simple_gla's dg, a reverse cumsum run as a HIGHEST dot with
            # truncation pieces: within 5 f32 ulps of its largest value); a wrong transpose is off by O(1)
            scale = np.finfo(np.float32).eps * float(np.max(np.abs(expected)))
            np.testing.assert_allclose(got[name], expected, rtol=0, atol=16 * scale, err_msg=f"{op_name} {name}")
        else:
            np.testing.assert_array_equal(got[name], expected, err_msg=f"{op_name} {name}")


@pytest.mark.needs_leg("gpu")
def test_fla_runs_its_v_first_kernels_within_the_bounds():
    case = v_first("gdn")
    rows = Runner(make_leg("gpu"), ReferenceCache(None)).run_case(case)
    assert {r["tensor"] for r in rows} >= {"ht", "dh0"}
    assert all(r["status"] == "ok" for r in rows), [(r["tensor"], r["status"], r["reason"]) for r in rows]
