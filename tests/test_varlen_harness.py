"""Packed variable-length sequences (``Case.lens``, fla's ``cu_seqlens``) through the harness.

Descriptors draw h0 / dht per sequence ([N,H,K,V]) and pass ``cu_seqlens`` to every leg: the float64
reference (tuple), fla (a torch.long tensor on the tensors' device), the Pallas kernels (a static
tuple, or a refusal while they do not take it). The causality check cuts inside a sequence, and the
isolation check redraws one sequence and holds every other sequence's rows bit-exact, on every leg.

Shapes are small: the emulated fla leg costs seconds per case.
"""

import dataclasses
import inspect

import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import make_inputs
from cases.suites import DECODE, SMOKE_LENS, get_suite
from harness.probes.causality import (causality_cases, check_case, default_t0, isolation_seqs, isolation_tensors,
                               perturb_future, perturb_sequence)
from harness.legs.base import LegOutput
from harness.legs.ref import RefLeg
from harness.ops import get_op
from harness.ops.base import LegBinding, call_tpu_kernel
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner
from harness.legs import make_leg

G = Gate("g", "logsigmoid", normalizer=16)
LENS = (5, 20, 7)  # T = 32: a boundary inside the first chunk of 16, the middle sequence over two of its own


def small(op: str, **kw) -> Case:
    """A packed case for the fla and reference legs (K = V = 32, H = 1, fp32)."""
    fields = dict(B=1, T=sum(LENS), H=1, K=32, V=32, dtype="float32", gate=G, h0=True, dht=True, lens=LENS,
                  chunk_size=32 if op in ("gla", "kda") else 16)  # gla: fla picks C = 32 for T = 32
    fields.update(kw)
    return Case(op, "chunk", **fields)


SMALL = {op: small(op) for op in ("simple_gla", "gla", "kda")}


def _statuses(rows):
    return {r["tensor"]: r["status"] for r in rows}


# ------------------------------------------------------------------------------------ descriptors
@pytest.mark.parametrize("op_name", sorted(SMALL))
def test_state_inputs_take_one_state_per_sequence(op_name):
    case = SMALL[op_name]
    x = make_inputs(case, get_op(op_name).inputs(case))
    assert x["h0"].shape == x["dht"].shape == case.state_shape == (3, 1, 32, 32)
    assert x["q"].shape == (1, 32, 1, 32)
    unpacked = case.replace(lens=None, B=2, T=16)
    y = make_inputs(unpacked, get_op(op_name).inputs(unpacked))
    assert y["h0"].shape == y["dht"].shape == (2, 1, 32, 32)  # N = B without lens


@pytest.mark.parametrize("op_name", sorted(SMALL))
def test_reference_leg_runs_a_packed_case_against_the_golden(op_name):
    """The golden (chunked reference with cu_seqlens) against the recurrent one with cu_seqlens: every row ok."""
    rows = Runner(make_leg("ref"), ReferenceCache(None)).run_case(SMALL[op_name])
    assert set(_statuses(rows).values()) == {"ok"}, rows
    assert all(r["rel_l2"] < 1e-12 for r in rows)
    assert '"cu_seqlens": [0, 5, 25, 32]' in rows[0]["details"]


def test_the_reference_sees_the_sequences():
    """Packing matters: the same arrays without cu_seqlens (one sequence, one state) are another function."""
    case = SMALL["simple_gla"]
    op = get_op(case.op)
    x = make_inputs(case, op.inputs(case)).as_float64()
    packed = op.reference(case, x)
    assert packed["ht"].shape == packed["dh0"].shape == case.state_shape
    one = case.replace(lens=None)
    flat = op.reference(one, {**x, "h0": x["h0"][:1], "dht": x["dht"][:1]})
    assert not np.allclose(packed["o"][:, 5:], flat["o"][:, 5:])  # the state resets at sequence 1
    np.testing.assert_allclose(packed["o"][:, :5], flat["o"][:, :5], rtol=1e-12)  # sequence 0 is the same


def test_ref_leg_refuses_no_case_for_its_size():
    """The recurrent check keeps a state per 64 tokens, not one per token (references/_scan.py): a packed case whose
    per-token states would take 32 GiB (4 sequences x 2**16 padded tokens x 128 x 128 x 8 bytes) is run."""
    leg = make_leg("ref")
    op = get_op("simple_gla")
    big = Case("simple_gla", "chunk", B=1, T=2 ** 16 + 3, H=1, K=128, V=128, gate=G, lens=(1, 1, 1, 2 ** 16))
    assert leg.supports(op, big) is None
    assert make_leg("ref", method="chunk").supports(op, big) is None


# ---------------------------------------------------------------------------------------- GPU leg
@pytest.fixture(scope="module")
def gpu_leg():

    return make_leg("gpu")


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("op_name", sorted(SMALL))
def test_gpu_leg_runs_fla_with_cu_seqlens(gpu_leg, op_name):
    """fla's chunk kernels with cu_seqlens (emulated): every row ok against the float64 golden."""
    rows = Runner(gpu_leg, ReferenceCache(None)).run_case(SMALL[op_name])
    assert set(_statuses(rows).values()) == {"ok"}, [(r["tensor"], r["status"], r["reason"]) for r in rows]
    assert all(r["rel_l2"] < 5e-3 for r in rows)
    assert '"cu_seqlens": [0, 5, 25, 32]' in rows[0]["details"]


@pytest.mark.needs_leg("gpu")
def test_gpu_binding_passes_a_long_tensor_on_the_tensors_device(gpu_leg, monkeypatch):
    """fla gets ``cu_seqlens`` as torch.long on q's device when packed, and no such keyword otherwise."""
    import torch

    import fla.ops.simple_gla as fla_simple_gla
    from harness.ops.simple_gla import fla_forward

    seen = []

    def fake(q, k, v, **kwargs):
        seen.append(kwargs.get("cu_seqlens", "absent"))
        return q, None

    monkeypatch.setattr(fla_simple_gla, "chunk_simple_gla", fake)
    monkeypatch.setattr(fla_simple_gla, "fused_chunk_simple_gla", fake)
    t = {n: torch.zeros(1, 32, 1, 32) for n in ("q", "k", "v")}
    for case in (SMALL["simple_gla"], SMALL["simple_gla"].replace(variant="fused_chunk")):
        fla_forward(case, t)
    fla_forward(SMALL["simple_gla"].replace(lens=None), t)
    packed, fused, unpacked = seen
    assert packed.dtype == fused.dtype == torch.long and packed.device == t["q"].device
    assert packed.tolist() == [0, 5, 25, 32] and unpacked == "absent"


# ---------------------------------------------------------------------------------------- TPU leg
def _tpu_takes_cu_seqlens() -> bool:
    from kernels_tpu import simple_gla

    return "cu_seqlens" in inspect.signature(simple_gla.chunk_simple_gla).parameters


TPU_CASE = Case("simple_gla", "chunk", B=1, T=48, H=1, K=128, V=128, dtype="float32", gate=G, chunk_size=16,
                h0=True, dht=True, lens=(5, 36, 7))


def test_tpu_leg_runs_or_refuses_a_packed_case_with_a_reason():
    """Kernels that take cu_seqlens run the packed case (ok rows); kernels that do not are refused with the
    reason, never a number."""

    rows = Runner(make_leg("tpu", compile_targets=()), ReferenceCache(None)).run_case(TPU_CASE)
    if _tpu_takes_cu_seqlens():
        assert set(_statuses(rows).values()) == {"ok"}, [(r["tensor"], r["status"], r["reason"]) for r in rows]
        assert '"cu_seqlens": [0, 5, 41, 48]' in rows[0]["details"]
    else:
        assert set(_statuses(rows).values()) == {"unsupported"}
        assert all("does not take cu_seqlens" in r["reason"] for r in rows)


def _pre_varlen_chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                                 output_final_state=False, chunk_size=64, interpret=None, mxu_model=None):
    """The public signature before packed sequences (no cu_seqlens keyword)."""
    from kernels_tpu.simple_gla import chunk_simple_gla

    return chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, chunk_size=chunk_size, interpret=interpret,
                            mxu_model=mxu_model)


def _tpu_forward_pre_varlen(case, a, ctx):
    o, ht = call_tpu_kernel(_pre_varlen_chunk_simple_gla, case, a["q"], a["k"], a["v"], g=a.get("g"),
                            scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                            chunk_size=case.chunk_size, interpret=ctx.interpret, mxu_model=ctx.mxu_model)
    return {"o": o, "ht": ht}


def test_kernels_without_cu_seqlens_make_unsupported_rows():
    """A kernel without the keyword: the TPU leg's supports (kernel_refusal) refuses the packed case with the reason."""

    op = get_op("simple_gla")
    old = dataclasses.replace(op, pallas=LegBinding(_tpu_forward_pre_varlen))
    leg = make_leg("tpu", compile_targets=())
    rows = Runner(leg, ReferenceCache(None), ops={"simple_gla": old}).run_case(TPU_CASE)
    assert set(_statuses(rows).values()) == {"unsupported"}
    assert all("_pre_varlen_chunk_simple_gla does not take cu_seqlens" in r["reason"] and "lens=5+36+7"
               in r["reason"] and len(r["input_sha256"]) == 64 for r in rows)
    # the isolation check reports the refusal on its rows too, and never a number
    crows = check_case(Runner(leg, ReferenceCache(None), ops={"simple_gla": old}), TPU_CASE)
    assert {r.status for r in crows} == {"unsupported"} and {r.check for r in crows} == {"causality", "isolation"}


def test_call_tpu_kernel_adds_the_keyword_only_when_packed_and_refuses_what_cannot_take_it():
    packed, unpacked = SMALL["kda"], SMALL["kda"].replace(lens=None)

    def takes(q, *, cu_seqlens=None, **options):
        return cu_seqlens, options

    assert call_tpu_kernel(takes, packed, 1, a=2) == ((0, 5, 25, 32), {"a": 2})
    assert call_tpu_kernel(takes, unpacked, 1, a=2) == (None, {"a": 2})

    def old(q, a=None):
        return q

    def kda_like(q, **options):  # kda's public functions take their options as keywords
        unknown = set(options) - {"a"}
        if unknown:
            raise TypeError(f"chunk_kda got unknown options {sorted(unknown)}")
        return q

    for fn in (old, kda_like):
        assert call_tpu_kernel(fn, unpacked, 1, a=2) == 1
        with pytest.raises(NotImplementedError, match="does not take cu_seqlens.*lens=5\\+20\\+7"):
            call_tpu_kernel(fn, packed, 1, a=2)

    def broken(q, cu_seqlens=None):  # a kernel that takes the keyword and fails: an error, not a refusal
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    with pytest.raises(TypeError, match="unsupported operand"):
        call_tpu_kernel(broken, packed, 1)


# ---------------------------------------------------------------------------- causality, isolation
def test_the_causal_cut_lands_inside_a_sequence():
    case = SMALL["simple_gla"]
    t0 = default_t0(case)  # the middle sequence [5, 25), past its first chunk of 16: 5 + min(18, 23) = 23
    assert t0 == 23 and 5 <= t0 and t0 + 1 < 25
    smoke = [c for c in get_suite("smoke") if c.lens]
    for c in smoke:
        t0 = default_t0(c)
        i = max(j for j, start in enumerate(c.cu_seqlens[:-1]) if start <= t0)
        assert c.cu_seqlens[i] <= t0 < t0 + 1 < c.cu_seqlens[i + 1], (c.id, t0)
    one_token = case.replace(lens=(1, 1, 30))
    assert default_t0(one_token) == 2 + 23  # the only sequence long enough, in its own second chunk
    assert default_t0(case.replace(lens=None)) == 23  # unpacked: as before (C + C // 2 - 1)


def test_isolation_redraws_one_sequence_its_state_and_cotangents_only():
    case = SMALL["gla"].replace(gate=Gate("g_gamma", "alibi"))
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    assert isolation_seqs(case) == (1,) and isolation_seqs(case.replace(lens=(9, 23))) == (0, 1)
    assert isolation_seqs(case.replace(lens=(32,))) == () == isolation_seqs(case.replace(lens=None))
    moved = perturb_sequence(op, case, inputs, 1)
    for name in ("q", "k", "v", "do"):
        np.testing.assert_array_equal(moved[name][:, :5], inputs[name][:, :5])
        np.testing.assert_array_equal(moved[name][:, 25:], inputs[name][:, 25:])
        assert (moved[name][:, 5:25] != inputs[name][:, 5:25]).all(), name
    for name in ("h0", "dht"):
        np.testing.assert_array_equal(np.delete(moved[name], 1, 0), np.delete(inputs[name], 1, 0))
        assert (moved[name][1] != inputs[name][1]).all()
    np.testing.assert_array_equal(moved["g_gamma"], inputs["g_gamma"])  # shared by every sequence
    assert isolation_tensors(op, case) == ["o", "ht", "dq", "dk", "dv", "dh0"]  # not dg_gamma (a sum over sequences)
    future = perturb_future(op, case, inputs, default_t0(case))  # the causal redraw leaves states alone
    np.testing.assert_array_equal(future["h0"], inputs["h0"])


@pytest.mark.parametrize("op_name", sorted(SMALL))
def test_reference_leg_is_causal_and_isolates_sequences_bit_exactly(op_name):
    case = SMALL[op_name]
    rows = check_case(Runner(make_leg("ref", method="chunk"), ReferenceCache(None)), case)
    t0 = default_t0(case)  # inside the middle sequence [5, 25): 23 at C = 16, 14 at C = 32
    causal = [(r.tensor, r.status, r.bit_exact, r.t0) for r in rows if r.check == "causality"]
    assert causal == [("o", "ok", True, t0), ("dq", "ok", True, t0)] and 5 <= t0 < 24
    iso = [r for r in rows if r.check == "isolation"]
    assert [r.tensor for r in iso] == isolation_tensors(get_op(op_name), case)
    assert {(r.status, r.bit_exact, r.seq, r.t0) for r in iso} == {("ok", True, 1, -1)}, iso


def test_the_isolation_check_runs_every_sequence_of_two():
    rows = check_case(Runner(make_leg("ref", method="chunk"), ReferenceCache(None)), SMALL["simple_gla"].replace(lens=(9, 23)))
    iso = [r for r in rows if r.check == "isolation"]
    assert {r.seq for r in iso} == {0, 1} and {r.status for r in iso} == {"ok"}


class CarryLeg(RefLeg):
    """The reference, with sequence 1's last token leaking (1e-6) into sequence 2's outputs: a state carried over."""

    name = "tpu"

    def run(self, op, case, inputs):
        out = dict(super().run(op, case, inputs).tensors)
        eos = case.cu_seqlens[2]
        out["o"] = out["o"].copy()
        out["o"][:, eos:] += 1e-6 * float(inputs["k"][0, eos - 1, 0, 0])
        return LegOutput(out)


class BackwardCarryLeg(RefLeg):
    """The reference, with sequence 1's dht leaking (1e-6) into sequence 0's dh0: a state gradient carried back."""

    name = "tpu"

    def run(self, op, case, inputs):
        out = dict(super().run(op, case, inputs).tensors)
        out["dh0"] = out["dh0"].copy()
        out["dh0"][0] += 1e-6 * inputs["dht"][1]
        return LegOutput(out)


@pytest.mark.parametrize("leg, leaked", [(CarryLeg, "o"), (BackwardCarryLeg, "dh0")])
def test_a_leak_between_sequences_far_below_epsilon_is_caught(leg, leaked):
    rows = check_case(Runner(leg(method="chunk"), ReferenceCache(None)), SMALL["simple_gla"])
    iso = {r.tensor: r for r in rows if r.check == "isolation"}
    assert iso[leaked].status == "leak" and 0 < iso[leaked].max_abs_diff < 1e-5
    assert "packed sequence 1" in iso[leaked].reason
    assert {r.status for n, r in iso.items() if n != leaked} == {"ok"}
    assert {r.status for r in rows if r.check == "causality"} == {"ok"}


@pytest.mark.needs_leg("gpu")
def test_gpu_leg_isolates_sequences_bit_exactly(gpu_leg):
    """fla with cu_seqlens (emulated): causal inside a sequence, and sequence 1 never reaches 0 or 2."""
    rows = check_case(Runner(gpu_leg, ReferenceCache(None)), SMALL["simple_gla"])
    assert {(r.check, r.status, r.bit_exact) for r in rows} == {("causality", "ok", True), ("isolation", "ok", True)}
    assert len([r for r in rows if r.check == "isolation"]) == 7  # o, ht, dq, dk, dv, dg, dh0


@pytest.mark.slow
@pytest.mark.parametrize("op_name", ["gla", "kda"])
def test_gpu_leg_isolates_sequences_bit_exactly_for_every_op(gpu_leg, op_name):
    rows = check_case(Runner(gpu_leg, ReferenceCache(None)), SMALL[op_name])
    assert {(r.status, r.bit_exact) for r in rows} == {("ok", True)}, [(r.tensor, r.reason) for r in rows]


def test_causality_picks_a_packed_case_per_op_variant_and_gate_as_well():
    chosen = causality_cases(get_suite("smoke") + get_suite("regressions"))
    packed = [(c.op, c.variant, c.gate.kind) for c in chosen if c.lens]
    assert len(packed) == len(set(packed))
    assert {op for op, _, _ in packed} == {"simple_gla", "gla", "kda", "gdn", "gdn2"}
    assert all(c.num_seqs >= 3 and c.K % 128 == 0 for c in chosen if c.lens)
    unpacked = causality_cases(get_suite("smoke"))
    assert [c for c in unpacked if not c.lens] == causality_cases([c for c in get_suite("smoke") if not c.lens])


# -------------------------------------------------------------------------------------------- suites
def test_suites_carry_packed_cases_at_their_edges():
    smoke = [c for c in get_suite("smoke") if c.lens == SMOKE_LENS]
    assert sorted(c.op for c in smoke) == ["gdn", "gla", "kda", "simple_gla"]
    for c in smoke:  # a boundary inside a chunk, a sequence over two chunks of its own
        assert any(b % c.chunk_size for b in c.cu_seqlens[1:-1]) and max(c.lens) > c.chunk_size
        assert c.K == c.V == 128 and c.h0 and c.dht
    # the decode variants, decode chains and state-cache cases (forward only) carry no dht; gla's fused g_gamma edge
    # case carries no ht
    reg = [c for c in get_suite("regressions")
           if c.lens and c.variant != DECODE and not {"decode", "state_dtype"} & set(c.opt) and c.final_state]
    assert any(1 in c.lens for c in reg)
    edges = {b % c.chunk_size for c in reg for b in c.cu_seqlens[1:-1]}
    assert {1, reg[0].chunk_size - 1} <= edges  # one token after and one before a chunk edge
    assert all(c.h0 and c.dht for c in reg)
    assert not any(c.K == 64 or c.V == 64 for c in smoke + reg)  # the decode step at K = V = 64 is its own case


def test_kernels_that_raise_while_asked_make_error_rows_not_an_aborted_run():
    """A kernel raising anything but NotImplementedError on a valid case (here a ValueError for the packed
    states) is that case's error rows; the run goes on."""

    def forward(case, a, ctx):
        raise ValueError(f"initial_state must be [B,H,K,V], got {a['h0'].shape}")

    old = dataclasses.replace(get_op("simple_gla"), pallas=LegBinding(forward))
    rows = Runner(make_leg("tpu", compile_targets=()), ReferenceCache(None), ops={"simple_gla": old}).run_case(TPU_CASE)
    assert set(_statuses(rows).values()) == {"error"}
    assert all(r["reason"].startswith("forward failed while tracing for the refusal check: ValueError: "
                                      "initial_state must be") for r in rows)
