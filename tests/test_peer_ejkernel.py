"""ejkernel 0.0.80.3 through its binding (``peers/ejkernel.py``): its Pallas TPU ``gated_delta_rule`` on gdn, as
``parity run --backend ejkernel`` runs it.

The refusals are fast tests. End to end (``-m heavy``, as the other peers' are), on fla's decode variant (forward
only: o and ht): one token per batch row from a carried state runs its Pallas single-step kernel (1 kernel, by
Mosaic); 64 tokens run its XLA path, which its Pallas entry point routes every T > 1 to, and the rows must say so
(0 Pallas kernels, ``ran_as`` XLA). A wrong mapping gives an O(1) error, far above bf16's 1e-2. CI installs it (see
the module doc of peers/ejkernel.py) and sets ``PARITY_REQUIRE_EJKERNEL=1``, where its absence is a failure, not a
skip."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.app import case_from_id

HAVE = importlib.util.find_spec("ejkernel") is not None
if not HAVE and os.environ.get("PARITY_REQUIRE_EJKERNEL") == "1":
    raise ImportError("ejkernel is not installed (see peers/ejkernel.py), and PARITY_REQUIRE_EJKERNEL=1 requires it")
needs = pytest.mark.skipif(not HAVE, reason="ejkernel is not installed (see peers/ejkernel.py)")

STEP = "gdn.fused_recurrent/B2-T1-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0"  # its Pallas single-step kernel
PREFILL = "gdn.fused_recurrent/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0"  # T > 1: its XLA path
REFUSED = {
    "gdn.chunk/B1-T64-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/h0": "no grouped value heads",
    "gdn.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/lens=20+44,h0":
        "'Pallas GDR does not support sequence packing (seg_ids); the packed path uses the XLA backend.'",
    "gdn.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,use_gate_in_kernel=1": "no A_log/dt_bias gate",
    "gdn.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,scale=0.5": "scales q by 1/sqrt(K) itself",
    "kda.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0": "not fla's per-channel gate",
}


def test_the_binding_imports_without_the_library_and_refuses_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ejkernel", None)  # find_spec answers None, as if it were not installed
    path = Path(__file__).resolve().parents[1] / "peers" / "ejkernel.py"
    spec = importlib.util.spec_from_file_location("peers.ejkernel_without_it", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.IMPLEMENTATION.bindings["gdn"].supports(case_from_id(STEP)).startswith(
        "ejkernel is not installed (pip install --no-deps ejkernel==0.0.80.3 ")


@needs
def test_a_release_without_its_pallas_gated_delta_rule_is_refused_in_its_own_terms(monkeypatch):
    """ejkernel 0.0.60 to 0.0.71 have no ``ejkernel.kernels._pallas.tpu.gated_delta_rule`` (0.0.71 registers a
    gated_delta_rule for Platform.XLA only): every case is refused with that, not with an import error, and
    ``parity bisect`` marks such a release ``unsupported`` with the reason (tests/test_bisect.py). The release is
    made from the test side: the module is hidden from ``find_spec``."""
    import importlib.metadata

    real, hidden = importlib.util.find_spec, "ejkernel.kernels._pallas.tpu.gated_delta_rule"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name, *a))
    path = Path(__file__).resolve().parents[1] / "peers" / "ejkernel.py"
    spec = importlib.util.spec_from_file_location("peers.ejkernel_without_the_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    why = module.IMPLEMENTATION.bindings["gdn"].supports(case_from_id(STEP))
    assert why == (f"ejkernel {importlib.metadata.version('ejkernel')} has no Pallas TPU gated_delta_rule: no module "
                   "ejkernel.kernels._pallas.tpu.gated_delta_rule in its kernel registry (its gated_delta_rule is "
                   "registered for Platform.XLA only)")


@needs
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(case):
    import peers.ejkernel as ej

    why = ej.supports(case_from_id(case))
    assert why and REFUSED[case] in why, why


@needs
def test_importing_it_leaves_jax_without_a_persistent_compilation_cache():
    """ejkernel's import sets jax_compilation_cache_dir (its ejit); a compile served from disk would skip what the
    harness reads from a compile. The binding restores jax's setting."""
    import jax

    import peers.ejkernel  # noqa: F401

    assert "ejkernel" not in str(jax.config.jax_compilation_cache_dir), jax.config.jax_compilation_cache_dir


@needs
@pytest.mark.heavy  # ejkernel's kernels through the candidate leg: pytest -m heavy (.ci/run)
def test_its_pallas_step_and_its_xla_prefill_at_bf16_level_with_their_kernel_counts(tmp_path):
    import pandas as pd

    from harness.cli import main

    assert main(["run", "--backend", "ejkernel", "--case", STEP, "--case", PREFILL, "--out", str(tmp_path),
                 "--no-progress", "--tpu-targets", "v6e"]) == 0
    rows = pd.read_csv(next(tmp_path.glob("ejkernel.cases-*.csv"))).set_index(["case_id", "tensor"])
    assert (rows.status == "ok").all(), rows[["status", "reason"]]
    assert (rows.rel_l2 < 1e-2).all(), rows.rel_l2
    step, prefill = rows.loc[STEP], rows.loc[PREFILL]
    assert (step.kernels_traced == 1).all() and (step.kernels_mosaic == 1).all()
    assert step.details.str.contains("Pallas: its single-step kernel", regex=False).all()
    assert (prefill.kernels_traced == 0).all()  # no Pallas kernel ran: the rows say so
    assert prefill.details.str.contains("XLA, 0 Pallas kernels", regex=False).all()
    assert rows.versions.str.contains('"ejkernel": "ejkernel 0.0.80.3"', regex=False).all()


GRADS = "gdn.chunk/B1-T32-H1-K64-V64/fp32/g=logsigmoid/10/C64/h0,dht"  # T > 1: its XLA path, differentiated by jax


@needs
@pytest.mark.heavy  # ejkernel's XLA path through the candidate leg: pytest -m heavy (.ci/run)
def test_its_xla_path_gradients_are_measured_through_the_mxu_model(tmp_path):
    """jax differentiates its XLA path's HIGHEST dots and its ``solve_triangular``, inside the candidate leg's MXU
    model. The gradients were zero (the model's bf16 split has a zero derivative), then raised "Transpose rule ...
    for 'custom_vjp_call' not implemented" (a dot that solve_triangular's JVP makes, wrapped by the model in a
    custom_vjp). Now each is the gradient, its cotangent dots modeled at HIGHEST: 6 passes, f32 level (2e-7 against
    float64 when measured; at one bf16 pass each they would be near 1e-3, zeros give 1)."""
    import pandas as pd

    from harness.cli import main

    assert main(["run", "--backend", "ejkernel", "--case", GRADS, "--out", str(tmp_path), "--no-progress",
                 "--tpu-targets", "v6e"]) == 0
    rows = pd.read_csv(next(tmp_path.glob("ejkernel.cases-*.csv"))).set_index("tensor")
    grads = rows.loc[["dq", "dk", "dv", "dg", "dbeta", "dh0"]]
    assert (grads.status == "ok").all(), grads[["status", "reason"]]
    assert (grads.rel_l2 < 1e-5).all(), grads.rel_l2
