"""flywheel-tpu 0.3.0 through its binding (``peers/flywheel_tpu.py``): its fused conv1d + GDN serving kernel (vLLM
TPU's v3, vendored) on gdn, forward only, mapped as the tpu-inference-v3 binding maps v3.

The refusals are fast tests; end to end (``-m heavy``): a decode request and a verify window from carried states
beside a prefill, at bf16 level against the float64 reference, the conv state bit for bit, its 2 Pallas kernels by
Mosaic. CI installs it (``pip install --no-deps --ignore-requires-python flywheel-tpu==0.3.0``) and sets
``PARITY_REQUIRE_FLYWHEEL_TPU=1``, where its absence is a failure, not a skip."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.app import case_from_id

HAVE = importlib.util.find_spec("flywheel_tpu") is not None
if not HAVE and os.environ.get("PARITY_REQUIRE_FLYWHEEL_TPU") == "1":
    raise ImportError("flywheel-tpu is not installed (pip install --no-deps --ignore-requires-python "
                      "flywheel-tpu==0.3.0), and PARITY_REQUIRE_FLYWHEEL_TPU=1 requires it")
needs = pytest.mark.skipif(not HAVE, reason="flywheel-tpu is not installed (see peers/flywheel_tpu.py)")

QWEN3_NEXT = "conv1d=4,use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1"
MAPPED = f"gdn.fused_recurrent/B1-T24-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+3+20,h0,{QWEN3_NEXT}"
REFUSED = {
    MAPPED.replace("/bf16/", "/fp32/"): "takes qkv in bfloat16 only (its check: 'qkv must be bfloat16')",
    MAPPED.replace("conv1d=4,", ""): "always convolves q, k, v first",
    MAPPED.replace("use_gate_in_kernel=1,", ""): "this case has use_gate_in_kernel=0",
    "kda.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0": "its fused_conv1d_kda is not bound",
}


def test_the_binding_imports_without_the_library_and_refuses_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "flywheel_tpu", None)  # find_spec answers None, as if it were not installed
    path = Path(__file__).resolve().parents[1] / "peers" / "flywheel_tpu.py"
    spec = importlib.util.spec_from_file_location("peers.flywheel_tpu_without_it", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.IMPLEMENTATION.bindings["gdn"].supports(case_from_id(MAPPED)) == (
        "flywheel-tpu is not installed (pip install --no-deps --ignore-requires-python flywheel-tpu==0.3.0)")


@needs
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(case):
    import peers.flywheel_tpu as fw

    why = fw.supports(case_from_id(case))
    assert why and REFUSED[case] in why, why


@needs
@pytest.mark.heavy  # flywheel-tpu's kernels through the candidate leg: pytest -m heavy (.ci/run)
def test_decode_verify_window_and_prefill_at_bf16_level(tmp_path):
    import pandas as pd

    from harness.cli import main

    assert main(["run", "--backend", "flywheel-tpu", "--case", MAPPED, "--out", str(tmp_path), "--no-progress",
                 "--tpu-targets", "v6e"]) == 0
    rows = pd.read_csv(next(tmp_path.glob("flywheel-tpu.cases-*.csv"))).set_index("tensor")
    assert (rows.status == "ok").all(), rows[["status", "reason"]]
    assert (rows.loc[["o", "ht"], "rel_l2"] < 1e-2).all(), rows.rel_l2
    assert rows.loc["conv_ht", "max_abs"] == 0  # the last W-1 raw inputs, from the right slots, bit for bit
    assert (rows.kernels_traced == 2).all() and (rows.kernels_mosaic == 2).all()
    assert rows.versions.str.contains('"flywheel-tpu": "flywheel-tpu 0.3.0"', regex=False).all()
