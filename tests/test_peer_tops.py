"""tops (primatrix/pallas-kernel) through its binding (``peers/tops.py``), as ``parity run --backend tops`` runs it:
interpret mode forced by the candidate leg, tops at the commit installed (the archive in ``../shared/peers/`` is
d7c3294), on its own stack (Python >= 3.12, jax 0.9.2 in its lock).

A wrong mapping (state layout, scale, the gate's sign or shape) gives an O(1) error, far above bf16's 1e-2: the
case tops passes bounds ε against the float64 reference. The refusals keep their reasons; tops' own refusals are
in its words. One finding must stay found: with g_gamma and T not a multiple of the chunk size, tops' chunk
simple_gla pads T with zero tokens and keeps decaying the state through them (ht = ht_true * exp(g_gamma * pad)),
so ht fails its bound. CI installs tops and sets ``PARITY_REQUIRE_TOPS=1``, where its absence is a failure, not a
skip; without it, only the test that the binding imports without tops runs."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HAVE_TOPS = importlib.util.find_spec("tops") is not None
if not HAVE_TOPS and os.environ.get("PARITY_REQUIRE_TOPS") == "1":
    raise ImportError("tops is not installed (see peers/tops.py), and PARITY_REQUIRE_TOPS=1 requires it")
needs_tops = pytest.mark.skipif(not HAVE_TOPS, reason="tops is not installed (see peers/tops.py)")

GAMMA = "bf16/g_gamma=alibi(L32,l0)/C64/h0,dht"
PASSES = f"simple_gla.chunk/B1-T64-H1-K128-V128/{GAMMA}"
PADDED = f"simple_gla.chunk/B1-T100-H1-K128-V128/{GAMMA}"  # T padded to 128 inside tops: the finding
REFUSED = {
    "simple_gla.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht":
        "tops refuses the case: ValueError: mode='chunk' does not support per-token gate `g`",
    f"simple_gla.chunk/B1-T64-H1-K128-V128/{GAMMA.replace('h0,dht', 'lens=30+34,h0,dht')}":
        "tops refuses the case: ValueError: mode='chunk' does not support `cu_seqlens`",
    "kda.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht,use_qk_l2norm_in_kernel=1":
        "takes no use_qk_l2norm_in_kernel",
    "kda.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/lens=30+34,h0,dht": "not yet supported",
}
BROKEN = {  # tops' public entry point fails at d7c3294; the row carries its error
    "gla.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht":
        "chunk_fwd_h_kernel() got an unexpected keyword argument 'cu_seqlens'",
    "kda.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht":
        "TracerBoolConversionError",  # its custom_vjp traces output_final_state and chunk_size
}


def test_the_binding_imports_without_tops_and_refuses_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "tops", None)  # an import of tops fails as if it were not installed
    monkeypatch.delitem(sys.modules, "tops.ops", raising=False)
    path = Path(__file__).resolve().parents[1] / "peers" / "tops.py"
    spec = importlib.util.spec_from_file_location("peers_tops_without_tops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    from harness.app import case_from_id

    for op, binding in module.IMPLEMENTATION.bindings.items():
        case = case_from_id(PASSES if op == "simple_gla" else next(c for c in BROKEN if c.startswith(op)))
        assert binding.supports(case).startswith("tops is not installed (pip install"), op


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    import pandas as pd

    from harness.cli import main

    out = tmp_path_factory.mktemp("peer")
    args = ["run", "--backend", "tops", "--out", str(out), "--no-progress", "--tpu-targets", "v6e"]
    for case in sorted({PASSES, PADDED} | set(REFUSED) | set(BROKEN)):
        args += ["--case", case]
    assert main(args) == 1  # the finding and tops' breakages are failing rows
    return pd.read_csv(next(out.glob("tops.cases-*.csv")))


@needs_tops
def test_a_case_tops_passes_matches_the_float64_reference_at_bf16_level(rows):
    mine = rows[(rows.case_id == PASSES) & (rows.tensor != "dg_gamma")]
    assert set(mine.tensor) == {"o", "ht", "dq", "dk", "dv", "dh0"}
    assert (mine.status == "ok").all(), mine[["tensor", "status", "reason"]]
    assert (mine.rel_l2 < 1e-2).all(), mine[["tensor", "rel_l2"]]
    assert set(mine.compiled_for) == {"v6e"}
    assert rows[rows.case_id == PASSES].versions.str.contains('"tops": "tops 0.1.0', regex=False).all()


@needs_tops
def test_its_g_gamma_gradient_is_declared_none_by_design(rows):
    """tops' backward returns zeros for g_gamma (a fixed hyperparameter to it): the binding declares it
    (LegBinding.no_gradient), so the row is not_provided with the reason instead of a zero that fails."""
    dg = rows[(rows.case_id == PASSES) & (rows.tensor == "dg_gamma")]
    assert len(dg) == 1 and dg.status.iloc[0] == "not_provided"
    assert "returns zeros for g_gamma by design" in dg.reason.iloc[0]


@needs_tops
def test_the_padded_tail_finding_stays_found(rows):
    """T=100, C=64: o and dq are fine, ht (and what dht reaches: dk, dv, dh0) are off by exp(g_gamma * 28)."""
    mine = rows[rows.case_id == PADDED].set_index("tensor")
    assert mine.loc["o", "status"] == "ok" and mine.loc["dq", "status"] == "ok"
    assert mine.loc["ht", "status"] == "bound" and mine.loc["ht", "rel_l2"] > 0.05
    # the same case with T a multiple of C passes: the error is the padding, not the precision
    assert rows[(rows.case_id == PASSES) & (rows.tensor == "ht")].rel_l2.iloc[0] < 1e-5


@needs_tops
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_is_refused_with_its_reason(rows, case):
    mine = rows[rows.case_id == case]
    assert len(mine) and (mine.status == "unsupported").all()
    assert mine.reason.str.contains(REFUSED[case], regex=False).all(), mine.reason.iloc[0]


@needs_tops
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_where_tops_breaks_the_row_says_so_in_its_words(rows, case):
    mine = rows[rows.case_id == case]
    assert len(mine) and (mine.status == "error").all()
    assert mine.reason.str.contains(BROKEN[case], regex=False).all(), mine.reason.iloc[0]


@needs_tops
def test_fused_chunk_kernels_tops_interprets_on_a_cpu_never_compile_ok(tmp_path):
    """Issue 41: tops' fused_chunk picks interpret mode itself (``not is_tpu_runtime()``) and then gives g_gamma the
    ANY memory space; its public API has no interpret option. Told nothing, the compile must name those kernels
    and never say ok (before issue 41 the row said ok with only _chunk_fwd_h_kernel compiled by Mosaic)."""
    import pandas as pd

    from harness.cli import main

    case = "simple_gla.fused_chunk/B1-T128-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64/h0,dht"
    assert main(["compile", "--backend", "tops", "--case", case, "--target", "v6e", "--out", str(tmp_path),
                 "--no-progress"]) == 1
    [row] = pd.read_csv(tmp_path / "compile.tops.csv").to_dict("records")
    assert row["status"] == "error" and row["kernels_traced"] == 3 and row["kernels_mosaic"] < 3
    assert "_fused_chunk_fwd_kernel, _fused_chunk_bwd_kernel asked by their library for interpret mode" in row["reason"]
