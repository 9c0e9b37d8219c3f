import numpy as np

from cases.case import Case, Gate
from cases.inputs import make_inputs
from cases.suites import get_suite
from harness.probes.causality import causality_cases, check_case, default_t0, perturb_future
from harness.legs.base import LegOutput
from harness.legs.ref import RefLeg
from harness.ops import get_op
from harness.legs import make_leg
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner

CASE = Case("simple_gla", "chunk", B=1, T=24, H=2, K=8, V=8, dtype="float32", gate=Gate(), chunk_size=8, h0=True,
            dht=True)


def test_perturbation_touches_only_the_future_of_forward_inputs():
    op = get_op(CASE.op)
    inputs = make_inputs(CASE, op.inputs(CASE))
    t0 = default_t0(CASE)
    assert t0 == 11  # inside the second chunk of 8
    moved = perturb_future(op, CASE, inputs, t0)
    for name in ("q", "k", "v", "g"):
        np.testing.assert_array_equal(moved[name][:, : t0 + 1], inputs[name][:, : t0 + 1])
        assert (moved[name][:, t0 + 1:] != inputs[name][:, t0 + 1:]).all()
    for name in ("do", "dht", "h0"):  # upstream gradients and the state stay the same
        np.testing.assert_array_equal(moved[name], inputs[name])
    assert moved.sha256 != inputs.sha256


def test_reference_leg_is_bit_exactly_causal():
    rows = check_case(Runner(make_leg("ref", method="chunk"), ReferenceCache(None)), CASE)
    assert [(r.tensor, r.status, r.bit_exact) for r in rows] == [("o", "ok", True), ("dq", "ok", True)]


class LeakyLeg(RefLeg):
    """The reference, plus a tiny leak of the last token's gate into every output."""

    name = "tpu"

    def run(self, op, case, inputs):
        out = dict(super().run(op, case, inputs).tensors)
        leak = 1e-4 * float(inputs["g"][0, -1, 0])
        out["o"] = out["o"] + leak
        return LegOutput(out)


def test_a_leak_far_below_epsilon_is_caught():
    rows = {r.tensor: r for r in check_case(Runner(LeakyLeg(method="chunk"), ReferenceCache(None)), CASE)}
    assert rows["o"].status == "leak" and 0 < rows["o"].max_abs_diff < 1e-3
    assert rows["dq"].status == "ok"


def test_one_case_per_op_variant_and_gate_that_every_leg_runs():
    """... and one more per (op, variant, gate) of the packed cases: the varlen kernel paths and the isolation check."""
    chosen = causality_cases(get_suite("smoke"))
    keys = [(c.op, c.variant, c.gate.kind, c.lens is not None) for c in chosen]
    assert len(keys) == len(set(keys))
    assert {("simple_gla", "fused_chunk", "g", False), ("simple_gla", "fused_chunk", "g_gamma", False),
            ("gla", "chunk", "g_gamma", False), ("kda", "chunk", "g", False), ("simple_gla", "chunk", "g", True),
            ("gla", "chunk", "g", True), ("kda", "chunk", "g", True), ("gdn", "chunk", "g", True),
            ("gdn", "fused_recurrent", "g", True), ("kda", "fused_recurrent", "g", True)} <= set(keys)


class RefusingLeg(RefLeg):
    name = "tpu"

    def supports(self, op, case):
        return "TPU kernels need K and V to be multiples of 128"


def test_unsupported_rows_carry_reason_and_input_hash():
    rows = check_case(Runner(RefusingLeg(), ReferenceCache(None)), CASE)
    assert {r.status for r in rows} == {"unsupported"}
    assert all("multiples of 128" in r.reason and len(r.input_sha256) == 64 and r.mode == "native" for r in rows)


def test_a_long_case_is_checked_cut_to_three_chunks_keeping_its_last_chunk():
    from harness.probes.causality import bounded_case

    long = CASE.replace(T=1000, chunk_size=64)
    assert bounded_case(long).T == 2 * 64 + 1000 % 64 == 168  # two whole chunks, then its own partial one
    assert bounded_case(long.replace(T=1024)).T == 192  # no partial chunk: three whole ones
    assert bounded_case(long.replace(T=150)) is not None and bounded_case(long.replace(T=150)).T == 150
    packed = long.replace(B=1, T=37 + 300 + 91, lens=(37, 300, 91))
    cut = bounded_case(packed)
    assert cut.lens == (37, 2 * 64 + 300 % 64, 91) and cut.T == sum(cut.lens)
    assert (cut.op, cut.variant, cut.gate, cut.dtype, cut.H, cut.K, cut.V, cut.h0, cut.dht) == \
        (packed.op, packed.variant, packed.gate, packed.dtype, packed.H, packed.K, packed.V, packed.h0, packed.dht)
    # a file of fla-like shapes: each checked case is cut, so the check costs what a short case does
    chosen = causality_cases([long, long.replace(T=2000, H=4)])
    assert [c.T for c in chosen] == [168]  # one per (op, variant, gate kind): the cheaper after the cut
