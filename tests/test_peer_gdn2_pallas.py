"""gdn2-pallas 0.1.1 through its binding (``peers/gdn2_pallas.py``): candidates ``gdn2-pallas`` (its default
config), ``gdn2-pallas-small`` and ``gdn2-pallas-undamped``, as ``parity run --backend gdn2-pallas`` runs them:
interpret mode forced by the candidate leg, forward and backward (its ``custom_vjp``).

Its public entry point runs a pure-JAX reference off a TPU and says nothing: a test shows that it does here, and
that on a TPU host it traces the very program the binding calls. The refusals are fast tests (the library's own
checks run while the leg traces shapes). ``-m heavy``: one case end to end, every tensor within bf16's level of
the float64 reference, its 6 Pallas kernels compiled by Mosaic. Neither CI stack installs it (CI's time is
spent; ``reports/peers/gdn2/`` has the measurement), so without it only the tests that need no library run;
``PARITY_REQUIRE_GDN2_PALLAS=1`` makes its absence a failure."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.app import case_from_id
from peer_rows import assert_compile_refused_finding

ROOT = Path(__file__).resolve().parents[1]
HAVE = importlib.util.find_spec("atomic_ops") is not None
if HAVE:
    from peers import gdn2_pallas

    HAVE = gdn2_pallas.IMPORT_ERROR is None
if not HAVE and os.environ.get("PARITY_REQUIRE_GDN2_PALLAS") == "1":
    raise ImportError("gdn2-pallas is not installed (pip install --no-deps gdn2-pallas==0.1.1), and "
                      "PARITY_REQUIRE_GDN2_PALLAS=1 requires it")
needs = pytest.mark.skipif(not HAVE, reason="gdn2-pallas is not installed (see peers/gdn2_pallas.py)")

CASE = "gdn2.chunk/B1-T{T}-H1-K{K}-V{V}/bf16/g=logsigmoid/16/C64/h0,dht"
REFUSED = {  # (candidate, case) -> the reason's words
    ("IMPLEMENTATION", CASE.format(T=256, K=64, V=64)):
        "gdn2-pallas refuses the case: Kernels assume d_head=128 (MXU tile); got D=64.",
    ("IMPLEMENTATION", CASE.format(T=128, K=128, V=128)):
        "gdn2-pallas refuses the case: seq_len=128 must be divisible by config.bt=256.",
    ("SMALL", CASE.format(T=128, K=128, V=256)): "v.shape=(1, 128, 1, 256) must match q.shape=(1, 128, 1, 128)",
    ("SMALL", CASE.format(T=128, K=128, V=128) + ",use_qk_l2norm_in_kernel=1"): "takes no use_qk_l2norm_in_kernel",
    ("SMALL", CASE.format(T=128, K=128, V=128) + ",lower_bound=-5,use_gate_in_kernel=1"):
        "it has no A_log/dt_bias gate",
    ("SMALL", CASE.format(T=128, K=128, V=128).replace("h0,dht", "lens=64+64,h0,dht")): "no packed sequences",
    ("SMALL", CASE.format(T=128, K=128, V=128).replace("chunk", "fused_recurrent").replace(",dht", "")):
        "no fused_recurrent kernel",
}


def test_the_binding_imports_without_the_library_and_refuses_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "atomic_ops", None)  # find_spec answers None, as if it were not installed
    spec = importlib.util.spec_from_file_location("peers.gdn2_pallas_without_it", ROOT / "peers" / "gdn2_pallas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for impl in (module.IMPLEMENTATION, module.SMALL, module.UNDAMPED):
        assert set(impl.bindings) == {"gdn2"}
        why = impl.bindings["gdn2"].supports(case_from_id(CASE.format(T=256, K=128, V=128)))
        assert why == "gdn2-pallas is not installed (pip install --no-deps gdn2-pallas==0.1.1)"


def test_a_package_overwritten_by_another_distribution_is_not_taken_for_it(tmp_path, monkeypatch):
    """Two wheels installing one package name (gdn2-pallas and atomic-ops: ``atomic_ops``) share its path; the
    last install overwrites the first's files. peers.mapping.provider checks the file against the hash the
    distribution recorded."""
    from peers.mapping import provider

    pkg, info = tmp_path / "twinpkg", tmp_path / "twin_one-1.0.dist-info"
    pkg.mkdir()
    info.mkdir()
    (pkg / "__init__.py").write_text("WHO = 'one'\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twin-one\nVersion: 1.0\n")
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(b"WHO = 'one'\n").digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"twinpkg/__init__.py,sha256={digest},12\n")
    (info / "top_level.txt").write_text("twinpkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert provider("twinpkg", "twin-one", "pip install twin-one") is None
    assert provider("twinpkg", "twin-two", "pip install twin-two").startswith(
        "twin-two is not installed (pip install twin-two): the package twinpkg here is")
    (pkg / "__init__.py").write_text("WHO = 'two'\n")  # the other wheel installed over it
    assert "its files were overwritten" in provider("twinpkg", "twin-one", "pip install twin-one")


@needs
@pytest.mark.parametrize("impl, case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(impl, case):
    """Through the candidate leg's own refusal check (the binding's supports, then the forward traced on shapes)."""
    from harness.legs.external import ExternalLeg
    from harness.ops import get_op

    c = case_from_id(case)
    why = ExternalLeg("gdn2-pallas", f"peers.gdn2_pallas:{impl}").supports(get_op(c.op), c)
    assert why and REFUSED[impl, case] in why, why


def _kernels(fn, *shapes) -> int:
    import jax

    from harness.compile.tpu_compile import kernel_equations

    jax.clear_caches()  # a trace cached under the other runtime would answer for this one
    return kernel_equations(jax.make_jaxpr(fn)(*shapes))


@needs
def test_its_public_entry_is_pure_jax_here_and_the_bound_program_on_a_tpu_host():
    """gdn2_forward_trainable (config=None) off a TPU: no Pallas kernel, silently. As a v6e host answers: the
    program gdn2_pallas_forward_trainable(config=DEFAULT_CONFIG) traces, the one the binding calls, kernel for
    kernel (forward: scores, WY solve, recompute)."""
    import re

    import atomic_ops
    import jax
    import jax.numpy as jnp

    from harness.legs.external import tpu_host

    x, f32 = (jax.ShapeDtypeStruct((1, 256, 1, 128), d) for d in (jnp.bfloat16, jnp.float32))
    h0 = jax.ShapeDtypeStruct((1, 1, 128, 128), jnp.float32)
    shapes = (x, x, x, x, x, f32, h0)

    def public(q, k, v, w, b, g, h0):
        return atomic_ops.gdn2_forward_trainable(q, k, v, w, b, g, 128 ** -0.5, h0=h0)

    def bound(q, k, v, w, b, g, h0):
        return atomic_ops.gdn2_pallas_forward_trainable(q, k, v, w, b, g, 128 ** -0.5, h0=h0,
                                                        config=atomic_ops.DEFAULT_CONFIG)

    assert _kernels(public, *shapes) == []
    with tpu_host("v6e"):
        assert len(_kernels(public, *shapes)) == 3
        jax.clear_caches()
        on_tpu = jax.make_jaxpr(public)(*shapes)
    jax.clear_caches()
    here = jax.make_jaxpr(bound)(*shapes)
    plain = lambda j: re.sub(r"0x[0-9a-f]+", "", str(j))  # noqa: E731 - object addresses aside
    assert plain(on_tpu) == plain(here)
    assert len(_kernels(bound, *shapes)) == 3


@needs
def test_o_comes_back_float32_and_is_compared_in_the_case_dtype():
    import jax
    import jax.numpy as jnp

    from cases.inputs import input_shapes
    from harness.legs.tpu import NATIVE
    from harness.ops import get_op

    c = case_from_id(CASE.format(T=128, K=128, V=128))
    arrays = {name: jax.ShapeDtypeStruct(shape, dtype)
              for name, (shape, dtype) in input_shapes(c, get_op("gdn2").inputs(c)).items()}
    binding = gdn2_pallas.SMALL.bindings["gdn2"]
    out = jax.eval_shape(lambda a: binding.forward(c, a, NATIVE), arrays)
    assert out["o"].dtype == jnp.bfloat16 and out["ht"].dtype == jnp.float32
    raw = jax.eval_shape(lambda a: gdn2_pallas._LIB.gdn2_pallas_forward_trainable(
        a["q"], a["k"], a["v"], a["w"], a["b"], a["g"], 1.0, h0=a["h0"], config=gdn2_pallas._LIB.KAGGLE_SMALL),
        arrays)
    assert raw[0].dtype == jnp.float32  # what the library returns
    assert binding.describe(c)["o_dtype"] == "float32 returned, cast to bfloat16"


@needs
@pytest.mark.heavy  # its kernels through the candidate leg: pytest -m heavy
def test_a_case_it_takes_matches_the_float64_reference_at_bf16_level_forward_and_backward(tmp_path):
    import pandas as pd

    from harness.cli import main

    case = CASE.format(T=128, K=128, V=128)
    assert main(["run", "--backend", "gdn2-pallas-small", "--out", str(tmp_path), "--no-progress",
                 "--tpu-targets", "v6e", "--case", case]) == 0
    rows = pd.read_csv(next(tmp_path.glob("gdn2-pallas-small.cases-*.csv")))
    assert set(rows.tensor) == {"o", "ht", "dq", "dk", "dv", "dg", "db", "dw", "dh0"}
    assert (rows.status == "ok").all(), rows[["tensor", "status", "reason"]]
    assert (rows.rel_l2 < 1e-2).all(), rows[["tensor", "rel_l2"]]
    # forward A, B, C and backward B2, B3, B4: all six ran as Pallas kernels and reached Mosaic
    assert (rows.kernels_traced == 6).all() and (rows.kernels_mosaic == 6).all()
    assert rows.versions.str.contains('"gdn2-pallas-small": "gdn2-pallas 0.1.1"', regex=False).all()


@needs
@pytest.mark.heavy
def test_fp16_does_not_compile_for_a_tpu_and_the_row_says_so(tmp_path):
    """A finding of reports/peers/gdn2: the 4 of its 6 kernels that load fp16 operands are refused by Mosaic for v6e ('Invalid vector type
    for load'). The rows are errors (the gate fails them) that keep the emulated run's numbers in their reason."""
    assert_compile_refused_finding(tmp_path, "gdn2-pallas-small", CASE.format(T=128, K=128, V=128).replace("bf16", "fp16"),
                                   "MosaicError: INTERNAL: Mosaic failed to compile TPU kernel: Invalid vector type "
                                   "for load")
