"""atomic-ops 0.2.0 through its binding (``peers/atomic_ops.py``): ``atomic_gdn2``, candidates ``atomic-ops`` (its
PROD config, ``make_cfg()``) and ``atomic-ops-lean``, forward and backward, interpret mode forced by the leg.

atomic-ops installs ``atomic_ops``, as gdn2-pallas does, so it runs in an environment of its own (the binding's
doc says how to make one); in any other the binding refuses every case with the reason, which the first test
checks wherever it runs. The rest need atomic-ops: the refusals (its own check in its words), the config it
builds for a TPU host (no interpret mode, 4 Pallas kernels), ``o`` compared in the case dtype, and ``-m heavy``:
one case end to end at bf16's level of the float64 reference. Neither CI stack installs it;
``PARITY_REQUIRE_ATOMIC_OPS=1`` makes its absence a failure."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.app import case_from_id
from peer_rows import assert_compile_refused_finding

ROOT = Path(__file__).resolve().parents[1]
HAVE = importlib.util.find_spec("atomic_gdn2") is not None
if HAVE:
    from peers import atomic_ops as binding_module

    HAVE = binding_module.IMPORT_ERROR is None
if not HAVE and os.environ.get("PARITY_REQUIRE_ATOMIC_OPS") == "1":
    raise ImportError("atomic-ops is not installed here, or is shadowed by gdn2-pallas (see peers/atomic_ops.py), "
                      "and PARITY_REQUIRE_ATOMIC_OPS=1 requires it")
needs = pytest.mark.skipif(not HAVE, reason="atomic-ops is not the atomic_ops installed (see peers/atomic_ops.py)")

CASE = "gdn2.chunk/B1-T{T}-H1-K{K}-V{V}/bf16/g=logsigmoid/16/C64/h0,dht"
REFUSED = {
    CASE.format(T=96, K=128, V=128): "atomic-ops refuses the case: L=96 must be divisible by bt=128",
    CASE.format(T=128, K=128, V=256): "one head dim for all six: K=128 != V=256",
    CASE.format(T=128, K=128, V=128) + ",use_qk_l2norm_in_kernel=1": "takes no use_qk_l2norm_in_kernel",
    CASE.format(T=128, K=128, V=128).replace("h0,dht", "lens=64+64,h0,dht"): "no packed sequences",
    CASE.format(T=128, K=128, V=128).replace("chunk", "fused_recurrent").replace(",dht", ""):
        "no fused_recurrent kernel",
}


def test_without_atomic_ops_as_the_one_installed_every_case_is_refused_with_the_reason(monkeypatch):
    """Without it: its install command. Where gdn2-pallas's atomic_ops is the one on the path: the same, naming
    whose package is there. (Here, whichever this environment has; with atomic-ops itself, as if it were not.)"""
    if HAVE:
        monkeypatch.setitem(sys.modules, "atomic_gdn2", None)
    spec = importlib.util.spec_from_file_location("peers.atomic_ops_without_it", ROOT / "peers" / "atomic_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for impl in (module.IMPLEMENTATION, module.LEAN):
        assert set(impl.bindings) == {"gdn2"}
        why = impl.bindings["gdn2"].supports(case_from_id(CASE.format(T=128, K=128, V=128)))
        assert why.startswith("atomic-ops is not installed (pip install --no-deps atomic-ops==0.2.0, in an "
                              "environment without gdn2-pallas)"), why


@needs
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(case):
    from harness.legs.external import ExternalLeg
    from harness.ops import get_op

    c = case_from_id(case)
    why = ExternalLeg("atomic-ops", "peers.atomic_ops:IMPLEMENTATION").supports(get_op(c.op), c)
    assert why and REFUSED[case] in why, why


@needs
def test_on_a_tpu_host_it_builds_four_kernels_for_mosaic_and_o_is_compared_in_the_case_dtype():
    """Its config picks interpret mode when constructed: here it asks for it, as a v6e host it does not. Forward:
    scores, solve, recompute + scan; backward: one kernel. The library returns o in float32."""
    import jax
    import jax.numpy as jnp

    from cases.inputs import input_shapes
    from harness.legs.external import tpu_host
    from harness.legs.tpu import NATIVE
    from harness.ops import get_op
    from harness.compile.tpu_compile import traced_kernels

    c = case_from_id(CASE.format(T=128, K=128, V=128))
    arrays = {name: jax.ShapeDtypeStruct(shape, dtype)
              for name, (shape, dtype) in input_shapes(c, get_op("gdn2").inputs(c)).items()}
    binding = binding_module.IMPLEMENTATION.bindings["gdn2"]

    def loss(a):
        out = binding.forward(c, a, NATIVE)
        return out["o"].astype(jnp.float32).sum() + out["ht"].sum()

    assert binding_module._LIB.make_cfg().interpret
    jax.clear_caches()
    with tpu_host("v6e"):
        kernels = traced_kernels(jax.make_jaxpr(jax.grad(loss))(arrays))
    jax.clear_caches()
    assert len(kernels.traced) == 4 and kernels.interpreted == ()
    out = jax.eval_shape(lambda a: binding.forward(c, a, NATIVE), arrays)
    assert out["o"].dtype == jnp.bfloat16 and out["ht"].dtype == jnp.float32
    assert binding.describe(c)["o_dtype"] == "float32 returned, cast to bfloat16"


@needs
@pytest.mark.heavy  # its kernels through the candidate leg: pytest -m heavy, in atomic-ops' environment
def test_a_case_it_takes_matches_the_float64_reference_at_bf16_level_forward_and_backward(tmp_path):
    import pandas as pd

    from harness.cli import main

    assert main(["run", "--backend", "atomic-ops", "--out", str(tmp_path), "--no-progress", "--tpu-targets", "v6e",
                 "--case", CASE.format(T=128, K=128, V=128)]) == 0
    rows = pd.read_csv(next(tmp_path.glob("atomic-ops.cases-*.csv")))
    assert set(rows.tensor) == {"o", "ht", "dq", "dk", "dv", "dg", "db", "dw", "dh0"}
    assert (rows.status == "ok").all(), rows[["tensor", "status", "reason"]]
    assert (rows.rel_l2 < 1e-2).all(), rows[["tensor", "rel_l2"]]
    assert (rows.kernels_traced == 4).all() and (rows.kernels_mosaic == 4).all()


@needs
@pytest.mark.heavy
def test_fp16_does_not_compile_for_a_tpu_and_the_row_says_so(tmp_path):
    """A finding of reports/peers/gdn2: the 3 of its 4 kernels that load fp16 operands are refused by Mosaic for v6e ('Invalid vector type
    for load'). The rows are errors (the gate fails them) that keep the emulated run's numbers in their reason."""
    assert_compile_refused_finding(tmp_path, "atomic-ops", CASE.format(T=128, K=128, V=128).replace("bf16", "fp16"),
                                   "MosaicError: INTERNAL: Mosaic failed to compile TPU kernel: Invalid vector type "
                                   "for load")
