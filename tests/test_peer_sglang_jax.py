"""sglang-jax's linear-attention kernels (issue 40) through their binding (``peers/sglang_jax.py``), as ``parity run
--backend sglang-jax`` / ``sglang-jax-decode`` runs them: interpret mode forced by the candidate leg.

A wrong mapping (packing batch rows into requests, the state pool's slots, g_gamma per head, the in-kernel gate's
dt_bias per channel, beta's logits, the qkv layout) gives an O(1) error, far above bf16's 1e-2: these tests bound
ε against the float64 reference, check the refusals' reasons, that slots no request names come back untouched,
and that a finding fails the gate. CI installs sglang-jax from the archive in ../shared/peers and sets
``PARITY_REQUIRE_SGLANG_JAX=1``, where its absence is a failure, not a skip."""

import importlib.util
import os

import pandas as pd
import pytest

from harness.cli import main
from peer_rows import assert_forward_only, assert_refused

if importlib.util.find_spec("sgl_jax") is None:
    if os.environ.get("PARITY_REQUIRE_SGLANG_JAX") == "1":
        raise ImportError("sglang-jax is not installed (peers/sglang_jax.py says how), and "
                          "PARITY_REQUIRE_SGLANG_JAX=1 requires it")
    pytest.skip("sglang-jax is not installed (peers/sglang_jax.py says how)", allow_module_level=True)

pytestmark = pytest.mark.heavy  # sglang-jax's kernels through the candidate leg: pytest -m heavy (.ci/run)

QWEN = "use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1"
ALIBI = "g_gamma=alibi(L32,l0)/C64"
FP32_DECODE = f"gdn.fused_recurrent/B1-T4-H2-HV4-K128-V128/fp32/g=logsigmoid/16/C64/lens=1+1+1+1,h0,{QWEN}"
MAPPED = {
    # simple_gla_fwd (Pallas): packed prefill from carried states, a partial last chunk; batch rows as requests
    f"simple_gla.chunk/B1-T100-H2-K128-V128/bf16/{ALIBI}/lens=37+63,h0": "simple_gla_fwd",
    f"simple_gla.chunk/B2-T40-H2-K128-V128/bf16/{ALIBI}/h0": "simple_gla_fwd",
    # the pure-JAX recurrence, both gates at once
    "simple_gla.fused_recurrent/B2-T24-H2-K128-V128/bf16/g=logsigmoid/16/g_gamma=alibi(L32,l0)/C64/h0":
        "fused_recurrent_simple_gla",
    # chunk_kda (Pallas), its in-kernel gate with dt_bias per channel
    "kda.chunk/B1-T40-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,use_gate_in_kernel=1": "chunk_kda_fwd",
    # gdn: the fused conv1d + GDN prefill, the pure-JAX chunked prefill and decode, grouped value heads
    f"gdn.chunk/B1-T48-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+3+44,h0,conv1d=4,{QWEN}": "fused_conv1d_gdn",
    f"gdn.chunk/B1-T48-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=20+28,h0,{QWEN}": "chunked_gated_delta_rule_jax",
    f"gdn.fused_recurrent/B1-T4-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+1+1+1,h0,{QWEN}":
        "decode_gated_delta_rule_ref",
    FP32_DECODE: "decode_gated_delta_rule_ref",
}
REFUSED = {
    "simple_gla.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64": "has a per-token g",
    "simple_gla.fused_chunk/B1-T64-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64": "no entry point",
    "kda.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/use_qk_l2norm_in_kernel=1": "q and k as given",
    "gdn.chunk/B1-T64-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/use_beta_sigmoid_in_kernel=1": "always normalises",
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang")
    args = ["run", "--backend", "sglang-jax", "--out", str(out), "--no-progress", "--tpu-targets", "v6e"]
    for case in sorted(MAPPED.keys() | REFUSED.keys()):
        args += ["--case", case]
    assert main(args) == 0
    return pd.read_csv(next(out.glob("sglang-jax.cases-*.csv")))


def test_mapped_cases_match_the_float64_reference_at_bf16_level(rows):
    fwd = rows[rows.case_id.isin(MAPPED) & rows.tensor.isin(["o", "ht", "conv_ht"])]
    assert set(fwd.case_id) == set(MAPPED)
    assert (fwd.status == "ok").all(), fwd[["case_id", "tensor", "status", "reason"]]
    assert (fwd.rel_l2 < 1e-2).all(), fwd[["case_id", "tensor", "rel_l2"]]
    for case, entry in MAPPED.items():  # each case ran the entry point it maps to, and says how it ran
        details = rows[(rows.case_id == case) & (rows.tensor == "o")].details.iloc[0]
        assert entry in details and "ran_as" in details, details
    assert set(fwd.compiled_for.dropna()) <= {"v6e"}
    assert fwd.versions.str.contains('"sglang-jax": "sglang-jax 0.0.2+cddbf6f"', regex=False).all()
    conv = fwd[fwd.tensor == "conv_ht"]
    assert len(conv) == 1 and conv.max_abs.iloc[0] == 0  # the last W-1 raw inputs, bit for bit


def test_pure_jax_dots_run_where_the_compiled_program_runs_them(rows):
    """XLA:TPU fuses the decode step's two einsums into f32 multiply-reduces (no MXU instruction): the emulated run
    computes them in f32, so fp32 decode lands at f32's error, not at a bf16 pass's (harness/compile/xla_dots.py). The
    chunked prefill keeps its matmuls on the MXU, and they are rounded."""
    import json

    def xla(case):
        return json.loads(rows[(rows.case_id == case) & (rows.tensor == "o")].details.iloc[0])["xla_dots"]

    decode = xla(FP32_DECODE)
    assert decode["on_mxu"] == 0 and decode["outside_kernels"] == 2, decode
    fp32 = rows[(rows.case_id == FP32_DECODE) & rows.tensor.isin(["o", "ht"])]
    assert (fp32.rel_l2 < 1e-5).all(), fp32[["tensor", "rel_l2"]]
    chunked = xla(next(c for c, e in MAPPED.items() if e == "chunked_gated_delta_rule_jax"))
    assert chunked["on_mxu"] >= 1, chunked


def test_it_is_forward_only(rows):
    assert_forward_only(rows, MAPPED, ("o", "ht", "conv_ht"))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(rows, case):
    assert_refused(rows, case, REFUSED[case])


DECODE = f"simple_gla.fused_recurrent/B1-T4-H2-K128-V128/bf16/{ALIBI}/lens=1+1+1+1,h0"


def test_decode_kernel_reads_and_writes_its_requests_slots(tmp_path):
    args = ["run", "--backend", "sglang-jax-decode", "--out", str(tmp_path), "--no-progress", "--tpu-targets", "v6e",
            "--case", DECODE, "--case", f"simple_gla.fused_recurrent/B1-T4-H2-K128-V128/bf16/{ALIBI}/lens=1+3,h0"]
    assert main(args) == 0
    rows = pd.read_csv(next(tmp_path.glob("sglang-jax-decode.cases-*.csv")))
    fwd = rows[(rows.case_id == DECODE) & rows.tensor.isin(["o", "ht"])]
    assert (fwd.status == "ok").all() and (fwd.rel_l2 < 1e-2).all(), fwd[["tensor", "status", "rel_l2", "reason"]]
    longer = rows[rows.case_id != DECODE]
    assert (longer.status == "unsupported").all() and longer.reason.str.contains("one token per request").all()


def test_decode_a_write_to_a_slot_no_request_names_raises(monkeypatch):
    """A fault from the test side: a decode kernel that also writes the spare slot after the requests' (another
    request's state in a served pool). The binding must raise, naming it."""
    from jax.experimental.pallas import tpu as pltpu

    import peers.sglang_jax as sgl
    from cases.case import Case
    from cases.inputs import make_inputs
    from harness.legs.external import INTERPRET_CHIP, tpu_info_for
    from harness.ops import get_op
    from peers.mapping import SlotWritten

    honest = sgl._entry(("decode", "fused_recurrent"))

    def stray_write(*args, **kwargs):
        o, pool = honest(*args, **kwargs)
        return o, pool.at[-1, 0, 0, 0].add(1.0)

    monkeypatch.setattr(sgl, "_entry", lambda key: stray_write)
    case = Case.from_id(DECODE)
    arrays = make_inputs(case, get_op("simple_gla").inputs(case)).arrays
    with tpu_info_for(INTERPRET_CHIP), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        with pytest.raises(SlotWritten, match=r"state pool: slot\(s\) \[5\] changed .*5: 1\)"):
            sgl.forward_decode(case, arrays, None)


def test_packed_recurrence_in_bf16_with_an_f32_gamma_is_a_finding_the_gate_fails(tmp_path):
    """reports/peers/sglang-jax: fused_recurrent_simple_gla on packed requests carries its state in q's dtype and
    adds an f32 decay, so with bf16 activations and f32 ALiBi slopes its scan does not trace. Its rows are errors
    naming that, and the gate fails."""
    case = f"simple_gla.fused_recurrent/B1-T16-H2-K128-V128/bf16/{ALIBI}/lens=9+7,h0"
    args = ["all", "--candidate", "sglang-jax", "--case", case, "--out", str(tmp_path), "--no-causality",
            "--no-progress", "--tpu-targets", "v6e"]
    assert main(args) == 1
    rows = pd.read_csv(next(tmp_path.glob("sglang-jax.cases-*.csv")))
    fwd = rows[rows.tensor.isin(["o", "ht"])]
    assert (fwd.status == "error").all() and fwd.reason.str.contains("carry input and carry output").all()
    parity = pd.read_csv(tmp_path / "sglang-jax" / "parity.csv")
    assert set(parity[parity.tensor.isin(["o", "ht"])].verdict) == {"fail"}
