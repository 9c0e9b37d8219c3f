"""deltanet-tpu 0.3.0 through its binding (``peers/deltanet_tpu.py``): candidates ``deltanet-tpu`` (its default
``precision="bf16"``) and ``deltanet-tpu-fp32``, as ``parity run --backend deltanet-tpu`` runs them: interpret mode
forced by the candidate leg, forward and backward (its ``custom_vjp``).

The mapping and the refusals are fast tests (nothing runs a kernel; the library's own head-dim check runs while the
leg traces shapes). A wrong mapping (the gate's form, grouped heads, the state layout, the scale) gives an O(1)
error, far above bf16's 1e-2: the end-to-end tests (``-m heavy``, as the other peers' are) bound ε against the
float64 reference on every tensor, gradients included, and count its Pallas kernels. CI installs it
(``pip install --no-deps --ignore-requires-python deltanet-tpu==0.3.0``) and sets ``PARITY_REQUIRE_DELTANET_TPU=1``,
where its absence is a failure, not a skip; without it only the test that the binding imports without the library
runs."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.app import case_from_id
from peer_rows import assert_compile_refused_finding

HAVE = importlib.util.find_spec("deltanet_tpu") is not None
if not HAVE and os.environ.get("PARITY_REQUIRE_DELTANET_TPU") == "1":
    raise ImportError("deltanet-tpu is not installed (pip install --no-deps --ignore-requires-python "
                      "deltanet-tpu==0.3.0), and PARITY_REQUIRE_DELTANET_TPU=1 requires it")
needs = pytest.mark.skipif(not HAVE, reason="deltanet-tpu is not installed (see peers/deltanet_tpu.py)")

GQA = "B1-T64-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64"
MAPPED = {
    f"gdn.chunk/{GQA}/h0,dht",  # grouped value heads: value head j reads key head j // 2, as fla's
    f"kda.chunk/{GQA}/h0,dht,use_qk_l2norm_in_kernel=1",  # the per-channel gate, its qk_l2norm
}
GDN2 = "gdn2.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht,allow_neg_eigval=1"  # b in [0, 2], as drawn
REFUSED = {
    "gdn.chunk/B1-T24-H2-K64-V64/bf16/g=logsigmoid/16/C64/h0":  # its own check, in its words
        "deltanet-tpu refuses the case: Unsupported head dimensions (K=64, V=64); Pallas TPU kernel requires K=128 "
        "and V=128.",
    f"gdn.chunk/{GQA}/h0,use_gate_in_kernel=1": "no A_log/dt_bias gate",
    f"gdn.chunk/{GQA}/h0,use_beta_sigmoid_in_kernel=1,use_qk_l2norm_in_kernel=1": "'the activated gate in [0, 1]'",
    f"kda.chunk/{GQA}/h0,lower_bound=-5,use_gate_in_kernel=1": "no A_log/dt_bias gate",
    f"gdn.chunk/{GQA}/h0,conv1d=4,use_qk_l2norm_in_kernel=1": "no convolution in front",
    "gdn2.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,lower_bound=-5,use_gate_in_kernel=1":
        "no A_log/dt_bias gate",
    f"gdn.fused_recurrent/{GQA}/h0": "one chunked Pallas kernel",
    f"gdn.chunk/{GQA}/lens=20+44,h0": "applied to the first sequence only",
    f"gdn.chunk/{GQA}/lens=20+44": "return the last sequence's final state",
    f"gla.chunk/{GQA.replace('HV4-', '')}/lens=20+0+44,noht": "an empty sequence in a packing raises",
    "gla.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/g_gamma=alibi(L8,l0)/C64/h0":
        "rounding sum made by the binding",
}


def test_the_binding_imports_without_the_library_and_refuses_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "deltanet_tpu", None)  # find_spec answers None, as if it were not installed
    path = Path(__file__).resolve().parents[1] / "peers" / "deltanet_tpu.py"
    spec = importlib.util.spec_from_file_location("peers.deltanet_tpu_without_it", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for impl in (module.IMPLEMENTATION, module.FP32):
        assert set(impl.bindings) == {"gdn", "kda", "gla", "simple_gla", "gdn2"}
        why = impl.bindings["gdn"].supports(case_from_id(sorted(MAPPED)[0]))
        assert why == "deltanet-tpu is not installed (pip install --no-deps --ignore-requires-python deltanet-tpu==0.3.0)"


@needs
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(case):
    """Through the candidate leg's own refusal check (the binding's supports, then the forward traced on shapes)."""
    from harness.legs.external import ExternalLeg
    from harness.ops import get_op

    c = case_from_id(case)
    leg = ExternalLeg("deltanet-tpu", "peers.deltanet_tpu:IMPLEMENTATION")
    why = leg.supports(get_op(c.op), c)
    assert why and REFUSED[case] in why, why


@needs
def test_gdn2_maps_b_as_drawn_with_allow_neg_eigval():
    """gdn2's allow_neg_eigval is a draw of b in [0, 2], no keyword: chunk_gdn2 takes b as given (nothing clamps it)."""
    import peers.deltanet_tpu as dn

    assert dn.supports(case_from_id(GDN2)) is None


@needs
def test_packed_sequences_map_without_h0_and_final_state():
    import peers.deltanet_tpu as dn

    c = case_from_id("gla.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/lens=20+44,noht")
    assert dn.supports(c) is None
    assert "cu_seqlens as it is" in dn.IMPLEMENTATION.bindings["gla"].describe(c)["packed"]


@needs
@pytest.mark.parametrize("op, form, shape", [("simple_gla", "", (1, 5, 2)), ("simple_gla", "H", (1, 5, 2)),
                                             ("gla", "H", (1, 5, 2, 128)), ("gla", "H,K", (1, 5, 2, 128))])
def test_g_gamma_becomes_its_one_gate_exactly(op, form, shape):
    """g_gamma [], [H] or [H, K] broadcast to the g chunk_gla takes: [B,T,H] for simple_gla (it broadcasts over K
    itself), [B,T,H,K] for gla; each token's value is g_gamma's, bit for bit."""
    import jax.numpy as jnp
    import numpy as np

    import peers.deltanet_tpu as dn

    gamma = {"": np.float32(-0.25), "H": np.array([-0.5, -0.125], np.float32),
             "H,K": -np.linspace(0.01, 1, 256, dtype=np.float32).reshape(2, 128)}[form]
    c = case_from_id(f"{op}.chunk/B1-T5-H2-K128-V128/bf16/g_gamma=alibi(L8,l0)/C64/h0")  # the array's form decides
    g = np.asarray(dn._gate(c, {"q": jnp.zeros((1, 5, 2, 128), jnp.bfloat16), "g_gamma": jnp.asarray(gamma)}))
    assert g.shape == shape and g.dtype == np.float32
    want = np.broadcast_to(gamma if form == "H,K" else np.broadcast_to(gamma, (2,))[:, None] if op == "gla"
                           else np.broadcast_to(gamma, (2,)), shape)
    assert np.array_equal(g, want)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    import pandas as pd

    from harness.cli import main

    out = tmp_path_factory.mktemp("peer")
    args = ["run", "--backend", "deltanet-tpu", "--out", str(out), "--no-progress", "--tpu-targets", "v6e"]
    for case in sorted(MAPPED):
        args += ["--case", case]
    assert main(args) == 0
    return pd.read_csv(next(out.glob("deltanet-tpu.cases-*.csv")))


@needs
@pytest.mark.heavy  # deltanet-tpu's kernels through the candidate leg: pytest -m heavy (.ci/run)
def test_mapped_cases_match_the_float64_reference_at_bf16_level_forward_and_backward(rows):
    assert set(rows.tensor) == {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert len(rows) == 8 * len(MAPPED)
    assert (rows.status == "ok").all(), rows[["case_id", "tensor", "status", "reason"]]
    assert (rows.rel_l2 < 1e-2).all(), rows[["case_id", "tensor", "rel_l2"]]
    # its Pallas kernels ran, none fell back to pure JAX: prepass and split, forward and backward, all by Mosaic
    assert (rows.kernels_traced == 4).all() and (rows.kernels_mosaic == 4).all()
    assert rows.versions.str.contains('"deltanet-tpu": "deltanet-tpu 0.3.0"', regex=False).all()
    assert rows.details.str.contains('"precision": "bf16 (its default)"', regex=False).all()


@needs
@pytest.mark.heavy
def test_fp16_does_not_compile_for_a_tpu_and_the_row_says_so(tmp_path):
    """Finding 1 of reports/peers/deltanet-tpu: its kernels cast fp16 operands to bf16, which Mosaic refuses for
    v6e ('Unsupported cast: float16 -> bfloat16'). The rows are errors (the gate fails them) that keep the emulated
    run's numbers in their reason."""
    assert_compile_refused_finding(tmp_path, "deltanet-tpu", "gdn.chunk/B1-T64-H1-K128-V128/fp16/g=logsigmoid/16/C64/h0",
                                   "NotImplementedError: Unsupported cast: float16 -> bfloat16")
