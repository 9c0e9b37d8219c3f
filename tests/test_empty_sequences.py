"""Empty sequences in a packing (issue 23: fla's tests pack ``cu_seqlens = [0, 0, 16]``).

An empty sequence has no token: its final state is its initial state, and the gradient of that initial state is
the final state's upstream gradient, exactly. The other sequences are untouched by it: they equal the packing
without it. Checked on the reference and on the TPU leg for every op (the kernels see an all-identity row), and
on fla through the GPU leg's rows."""

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import Inputs, make_inputs
from harness.legs import make_leg
from harness.ops import get_op
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner

LENS = (0, 13, 0, 21)  # empty first and between, as fla's [0, 0, 16] and more
OPTIONS = {"kda": (("use_beta_sigmoid_in_kernel", True),), "gdn": (("use_qk_l2norm_in_kernel", True),)}
GATES = {"kda": Gate("g", "logsigmoid", normalizer=16, lower_bound=-5.0)}


def packed(op: str, lens=LENS) -> Case:
    return Case(op, "chunk", B=1, T=sum(lens), H=1, K=32, V=64, dtype="float32", gate=GATES.get(op, Gate()),
                chunk_size=16, h0=True, dht=True, lens=lens, options=OPTIONS.get(op, ()))


def test_a_packing_may_hold_empty_sequences_but_not_only_those():
    assert packed("gdn").cu_seqlens == (0, 0, 13, 13, 34) and packed("gdn").num_seqs == 4
    with pytest.raises(ValueError, match="not all 0"):
        Case("gdn", "chunk", B=1, T=1, H=1, K=32, V=64, lens=(0, 0))


@pytest.mark.parametrize("leg_name", ["ref", "tpu"])
@pytest.mark.parametrize("op_name", ["simple_gla", "gla", "kda", "gdn"])
def test_an_empty_sequence_passes_its_state_through_and_touches_no_other(op_name, leg_name):
    op, case = get_op(op_name), packed(op_name)
    full = [i for i, n in enumerate(LENS) if n]
    without = packed(op_name, tuple(LENS[i] for i in full))
    x = make_inputs(case, op.inputs(case))
    x_without = Inputs({n: a[full] if n in ("h0", "dht") else a for n, a in x.arrays.items()}, x.sha256)
    leg = make_leg(leg_name, **({"compile_targets": ()} if leg_name == "tpu" else {}))
    got, want = leg.run(op, case, x).tensors, leg.run(op, without, x_without).tensors
    empty = [i for i, n in enumerate(LENS) if not n]
    np.testing.assert_array_equal(got["ht"][empty], x["h0"][empty])
    np.testing.assert_array_equal(got["dh0"][empty], x["dht"][empty])
    for name, value in want.items():
        mine = got[name][full] if name in ("ht", "dh0") else got[name]
        np.testing.assert_allclose(mine, value, rtol=1e-12 if leg_name == "ref" else 0, atol=0,
                                   err_msg=f"{op_name} {name}")


@pytest.mark.needs_leg("gpu")
def test_fla_runs_empty_sequences_within_the_bounds():
    rows = Runner(make_leg("gpu"), ReferenceCache(None)).run_case(packed("gdn"))
    assert {r["tensor"] for r in rows} >= {"ht", "dh0"}
    assert all(r["status"] == "ok" for r in rows), [(r["tensor"], r["status"], r["reason"]) for r in rows]
