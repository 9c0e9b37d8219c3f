"""The first peer (issue 21): vLLM TPU's ``fused_gdn`` (``tpu-inference`` on PyPI) through its binding
(``peers/tpu_inference.py``), as ``parity run --backend tpu-inference`` runs it: interpret mode forced by the
candidate leg, without the package's ``__init__`` (which imports vLLM).

A wrong mapping (q/k heads against value heads, the in-kernel gate's per-head parameters, the state cache's
slots, beta's logits) gives an O(1) error, far above bf16's 1e-2: these tests bound ε against the float64
reference, and check the refusals' reasons. CI installs the package (``pip install --no-deps tpu-inference``)
and sets ``PARITY_REQUIRE_TPU_INFERENCE=1``, where its absence is a failure, not a skip."""

import importlib.util
import os

import pandas as pd
import pytest

from harness.cli import main
from peer_rows import assert_forward_only, assert_refused

if importlib.util.find_spec("tpu_inference") is None:
    if os.environ.get("PARITY_REQUIRE_TPU_INFERENCE") == "1":
        raise ImportError("tpu-inference is not installed (pip install --no-deps tpu-inference), and "
                          "PARITY_REQUIRE_TPU_INFERENCE=1 requires it")
    pytest.skip("tpu-inference is not installed (pip install --no-deps tpu-inference)", allow_module_level=True)

pytestmark = pytest.mark.heavy  # tpu-inference's kernels through the candidate leg: pytest -m heavy (.ci/run)

GQA = "B1-T24-H2-HV4-K128-V128/bf16/g=logsigmoid/16"
MAPPED = {
    # grouped value heads, the in-kernel gate per value head, two packed prefill requests on carried states
    f"gdn.chunk/{GQA}/C64/lens=9+15,h0,use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1",
    # decode: two one-token requests on carried states before two prefill requests, fla's decode variant
    f"gdn.fused_recurrent/B1-T26-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+1+9+15,h0,"
    f"use_beta_sigmoid_in_kernel=1,use_qk_l2norm_in_kernel=1",
    # kda's per-channel gate with grouped value heads, fresh state slots
    f"kda.chunk/{GQA},lb-5/C64/lens=9+15,use_beta_sigmoid_in_kernel=1",
}
REFUSED = {
    f"gdn.chunk/{GQA}/C64/lens=9+15": "takes beta as logits",
    f"kda.chunk/{GQA}/C64/lens=9+15,lower_bound=-5,use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1":
        "per channel",
    "gdn.chunk/B1-T24-H2-K64-V64/bf16/g=logsigmoid/16/C64/use_beta_sigmoid_in_kernel=1": "multiples of 128",
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("peer")
    args = ["run", "--backend", "tpu-inference", "--out", str(out), "--no-progress", "--tpu-targets", "v6e"]
    for case in sorted(MAPPED | set(REFUSED)):
        args += ["--case", case]
    assert main(args) == 0
    return pd.read_csv(next(out.glob("tpu-inference.cases-*.csv")))


def test_mapped_cases_match_the_float64_reference_at_bf16_level(rows):
    fwd = rows[rows.case_id.isin(MAPPED) & rows.tensor.isin(["o", "ht"])]
    assert len(fwd) == 2 * len(MAPPED)
    assert (fwd.status == "ok").all(), fwd[["case_id", "tensor", "status", "reason"]]
    assert (fwd.rel_l2 < 1e-2).all(), fwd[["case_id", "tensor", "rel_l2"]]
    assert set(fwd.compiled_for.dropna()) == {"v6e"}
    # the version of tpu-inference, not of this project, which ships the binding
    assert fwd.versions.str.contains('"tpu-inference": "tpu-inference 0.32.0"', regex=False).all()


def test_it_is_forward_only(rows):
    assert_forward_only(rows, MAPPED)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(rows, case):
    assert_refused(rows, case, REFUSED[case])


# ---------------------------------------------------------------------------------------------- v3 and v2
QWEN3_NEXT = "conv1d=4,use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1"
V3_MAPPED = {
    # the convolution in front; a one-token decode and a 3-token verify window (num_spec_tokens = 2) from carried
    # conv and recurrent states, beside a prefill: v3's batched and per-sequence segments in one call
    f"gdn.fused_recurrent/B1-T24-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+3+20,h0,{QWEN3_NEXT}",
}
V3_REFUSED = {
    f"gdn.chunk/{GQA}/C64/lens=9+15,h0,use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1":
        "always convolves",
    f"kda.chunk/{GQA},lb-5/C64/lens=9+15,use_beta_sigmoid_in_kernel=1": "has no binding for kda",
}
V2_DECODE = ("gdn.fused_recurrent/B1-T8-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+1+1+1+1+1+1+1,h0,"
             "use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1")


def test_v3_maps_the_fused_convolution_windows_and_slots(tmp_path):
    args = ["run", "--backend", "tpu-inference-v3", "--out", str(tmp_path), "--no-progress", "--tpu-targets", "v6e"]
    for case in sorted(V3_MAPPED | set(V3_REFUSED)):
        args += ["--case", case]
    assert main(args) == 0
    rows = pd.read_csv(next(tmp_path.glob("tpu-inference-v3.cases-*.csv")))
    fwd = rows[rows.case_id.isin(V3_MAPPED)].set_index("tensor")
    assert (fwd.loc[["o", "ht", "conv_ht"], "status"] == "ok").all(), fwd[["status", "reason"]]
    assert (fwd.loc[["o", "ht"], "rel_l2"] < 1e-2).all(), fwd.rel_l2
    assert fwd.loc["conv_ht", "max_abs"] == 0  # the last W-1 raw inputs, read from the right slots, bit for bit
    assert fwd.loc["o", "details"].count('"num_spec_tokens": 2') == 1
    for case, why in V3_REFUSED.items():
        mine = rows[rows.case_id == case]
        assert len(mine) and (mine.status == "unsupported").all() and mine.reason.str.contains(why).all()


def test_v2_decode_states_land_in_the_wrong_slots_and_the_gate_fails(tmp_path):
    """reports/peers/tpu-inference/v2-v3: under Pallas's default DMA timing (a copy reads its source when waited
    on) request i's slot holds a later request's state. The gate must fail on ht (every metric)."""
    args = ["all", "--candidate", "tpu-inference-v2", "--case", V2_DECODE, "--out", str(tmp_path), "--no-causality",
            "--no-progress", "--tpu-targets", "v6e", "--max-draws", "1"]  # one draw decides it
    assert main(args) == 1
    parity = pd.read_csv(tmp_path / "tpu-inference-v2" / "parity.csv")  # the candidate's own gate
    verdicts = parity.groupby("tensor").verdict.agg(set)
    assert verdicts["ht"] == {"fail"}, verdicts


def test_v3_a_write_to_a_read_slot_raises_naming_the_slot(monkeypatch):
    """A fault from the test side: a fused_conv1d_gdn that also writes one element of a read slot (prefix
    caching's block, which another request may share). The binding must raise, naming the slot; the runner turns
    that into the case's error rows."""
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    import peers.tpu_inference as ti
    from cases.case import Case
    from cases.inputs import make_inputs
    from harness.emulation.pallas_refs import ref_reshapes
    from harness.legs.external import INTERPRET_CHIP, tpu_info_for
    from harness.ops import get_op
    from peers.mapping import SlotWritten

    wrapper = ti._module(ti.V3_KERNEL)
    honest = wrapper.fused_conv1d_gdn

    def stray_write(*args, **kwargs):
        (conv, rec), out = honest(*args, **kwargs)
        read = args[13]  # read_state_indices
        return (conv, rec.at[read[1], 0, 0, 0].add(1.0)), out  # request 1 reads slot 4 (3 slots before: null, 2 writes)

    monkeypatch.setattr(wrapper, "fused_conv1d_gdn", stray_write)
    case = Case.from_id(f"gdn.fused_recurrent/B1-T16-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+15,h0,"
                        f"{QWEN3_NEXT}")
    arrays = make_inputs(case, get_op("gdn").inputs(case)).arrays
    with tpu_info_for(INTERPRET_CHIP), ref_reshapes(), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        with pytest.raises(SlotWritten, match=r"recurrent state: slot\(s\) \[4\] changed .*4: 1\)"):
            ti.forward_v3(case, arrays, None)
    assert np.isfinite(arrays["h0"]).all()  # the case's own arrays are never written


def test_v3_fp32_decode_fails_the_gate_at_bf16_precision(tmp_path):
    """reports/peers/tpu-inference/v2-v3, finding 2: v3 computes its dots in one bf16 MXU pass whatever the
    input dtype, so fp32 decode lands at bf16's error, thousands of times fla's (f32 in fused_recurrent). The gate
    must fail it on o and ht, decided (not inconclusive)."""
    case = f"gdn.fused_recurrent/B1-T8-H2-HV4-K128-V128/fp32/g=logsigmoid/16/C64/lens=1+3+4,h0,{QWEN3_NEXT}"
    args = ["all", "--candidate", "tpu-inference-v3", "--case", case, "--out", str(tmp_path), "--no-causality",
            "--no-progress", "--tpu-targets", "v6e", "--max-draws", "1"]  # one draw decides it
    assert main(args) == 1
    parity = pd.read_csv(tmp_path / "tpu-inference-v3" / "parity.csv")
    parity = parity[parity.case_id == case].set_index(["tensor", "metric"])  # draw 0 alone
    for tensor in ("o", "ht"):
        assert parity.loc[(tensor, "rel_l2"), "verdict"] == "fail"
        assert parity.loc[(tensor, "rel_l2"), "ratio"] > 100, parity.loc[(tensor, "rel_l2")]


def test_v3_an_empty_request_loses_its_carried_state_and_the_gate_fails(tmp_path):
    """reports/peers/serving, finding 1: with read and write slots apart (read_state_indices), a request of no
    tokens leaves its write slot as it was, so its carried states never reach it: the pool's slot and its conv
    state come back zero. The gate must fail ht and conv_ht; the requests with tokens are right."""
    case = f"gdn.chunk/B1-T32-H2-K128-V128/bf16/g=logsigmoid/16/C64/lens=0+20+0+12,h0,pool=9,{QWEN3_NEXT}"
    args = ["all", "--candidate", "tpu-inference-v3", "--case", case, "--out", str(tmp_path), "--no-causality",
            "--no-progress", "--tpu-targets", "v6e", "--max-draws", "1"]  # one draw decides it
    assert main(args) == 1
    verdicts = pd.read_csv(tmp_path / "tpu-inference-v3" / "parity.csv").groupby("tensor").verdict.agg(set)
    assert verdicts["ht"] == verdicts["conv_ht"] == {"fail"}, verdicts  # beyond the bf16 bound
    assert "pass" in verdicts["o"] and "fail" not in verdicts["o"], verdicts


def test_v1_hangs_on_an_empty_request_between_two_with_tokens(tmp_path):
    """reports/peers/tpu-inference/state-cache, finding 5: fused_gdn's recurrent kernel picks its double buffer and
    the stores it waits for by request index, and a request with no tokens has no block: with requests 0 and 2
    only, its epilogue waits for a store on buffer 1 that no request started. The case never returns; the runner
    stops it at its time limit and says so, and the same requests without the empty one run."""
    base = "gdn.chunk/B1-T16-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens={},h0,use_beta_sigmoid_in_kernel=1"
    args = ["run", "--backend", "tpu-inference", "--out", str(tmp_path), "--no-progress", "--tpu-targets", "v6e",
            "--case-timeout", "40", "--case", base.format("8+0+8"), "--case", base.format("8+8")]
    assert main(args) == 4  # a case lost to its time limit
    rows = pd.read_csv(next(tmp_path.glob("tpu-inference.cases-*.csv"))).set_index(["case_id", "tensor"])
    hung, ran = rows.loc[base.format("8+0+8")], rows.loc[base.format("8+8")]
    assert (hung.status == "error").all() and hung.reason.str.contains("ran past --case-timeout").all(), hung.reason
    assert ran.loc["o", "status"] == ran.loc["ht", "status"] == "ok", ran
