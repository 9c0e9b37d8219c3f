"""The table of every peer (harness/report/peer_table.py, ``parity peers``): its numbers on hand-made rows, the committed
page against the committed rows, and what it never overwrites."""

import math
from pathlib import Path

import pandas as pd
import pytest

from cases.case import Case
from harness.cli import main
from harness.report.peer_table import cell, gate_form, summarize, variant_label

ROOT = Path(__file__).resolve().parents[1] / "reports" / "peers"


def _row(case, tensor, status="ok", ratio=1.0, verdict="pass", candidate="peer", baseline="emulated"):
    return {"op": "gdn", "variant": "chunk", "dtype": "bfloat16", "gate": "g", "candidate": candidate,
            "case_id": case, "tensor": tensor, "status": status, "ratio": ratio, "verdict": verdict, "report": "r",
            "baseline": baseline}


def test_a_cell_is_the_geometric_mean_the_worst_and_the_counts():
    rows = pd.DataFrame([_row("a", "o", ratio=2.0, verdict="fail"), _row("a", "ht", ratio=0.5),
                         _row("a", "dq", ratio=100.0),  # a gradient: not a forward tensor, not counted
                         _row("b", "o", status="unsupported", ratio=math.nan, verdict="unsupported"),
                         _row("b", "ht", status="unsupported", ratio=math.nan, verdict="unsupported"),
                         _row("c", "o", status="error", ratio=math.nan, verdict="fail"),
                         _row("c", "ht", status="ok", ratio=8.0, verdict="inconclusive")])
    (r,) = summarize(rows).itertuples(index=False)
    assert (r.n, r.worst, r.fail, r.inconclusive, r.cases, r.unsupported, r.error) == (3, 8.0, 2, 1, 3, 1, 1)
    assert r.gm == pytest.approx((2.0 * 0.5 * 8.0) ** (1 / 3))  # 2: exp(mean(ln 2, ln 0.5, ln 8))
    assert cell(r) == "2.00× (max 8×, n 3); 2 fail, 1 inconclusive; 1/3 error; 1/3 unsupported; fla emulated"


def test_a_cell_says_which_fla_rows_judged_its_cases():
    def one(baselines):
        rows = pd.DataFrame([_row(f"c{i}", "o", baseline=b) for i, b in enumerate(baselines)])
        (r,) = summarize(rows).itertuples(index=False)
        return cell(r)

    assert one(["native", "native"]).endswith("; fla native")
    assert one(["emulated", "emulated"]).endswith("; fla emulated")
    assert one(["native", "emulated", "emulated"]).endswith("; fla native 1/3")
    assert one(["native", None]).endswith("; fla native")  # a case with no fla row: judged by neither


def test_gate_forms_name_each_gate_and_the_in_kernel_law():
    assert gate_form(Case.from_id("simple_gla.chunk/B1-T64-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64")) == \
        "g_gamma[H]"
    assert gate_form(Case.from_id(
        "simple_gla.fused_recurrent/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/g_gamma=alibi(L32,l0)/C64")) == \
        "g+g_gamma[H]"
    assert gate_form(Case.from_id("kda.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/use_gate_in_kernel=1")) \
        == "g (in kernel)"


def test_variants_name_the_convolution_and_a_servers_calls():
    case = Case.from_id("gdn.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/lens=30+34,h0,conv1d=4,pool=5,"
                        "use_qk_l2norm_in_kernel=1")
    assert variant_label(case) == "chunk conv1d=4 pool=5"
    assert variant_label(case.replace(options=(("decode", 3), ("pool", 5)))) == "chunk pool=5 decode=3"
    assert variant_label(case.replace(options=())) == "chunk"


def test_the_committed_page_is_what_the_committed_rows_give(capsys):
    # --check builds both pages from every report's rows (the gate of each: the whole cost) and compares them
    assert main(["peers", "--check"]) == 0, "run: parity peers"
    assert "README.md and index.html match the rows" in capsys.readouterr().out


def test_it_never_overwrites_a_page_it_did_not_write(tmp_path, capsys):
    report = tmp_path / "one"
    report.mkdir()
    for name in ("gpu.csv.gz", "tpu.csv.gz"):  # one report: fla's rows and this project's
        (report / name).write_bytes((ROOT / "tops" / name).read_bytes())
    (tmp_path / "README.md").write_text("# my notes\n")
    assert main(["peers", "--root", str(tmp_path)]) == 2
    assert "not written by parity peers" in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "# my notes\n"
    assert main(["peers", "--root", str(tmp_path), "--check"]) == 1
    assert main(["peers", "--root", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "README.md").read_text().startswith("# Every peer against fla")
    assert main(["peers", "--root", str(tmp_path)]) == 0  # its own page it replaces


def test_the_compile_table_counts_pallas_kernels_and_names_the_stack():
    from harness.report.peer_table import compile_counts

    versions = '{"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1", "peer": "peer 1.0"}'
    rows = pd.DataFrame([
        {**_row("a", "o"), "compiled_for": "v5e,v6e", "kernels_mosaic": 3.0, "kernels_traced": 3.0, "versions": versions},
        {**_row("b", "o"), "compiled_for": "v6e", "kernels_mosaic": math.nan, "kernels_traced": 0.0,  # not compiled
         "versions": '{"jax": "0.9.2", "libtpu": "0.0.37"}'},
        {**_row("c", "o"), "compiled_for": "", "kernels_mosaic": 5.0, "kernels_traced": 4.0, "versions": versions},
        {**_row("d", "o", status="unsupported"), "compiled_for": "", "kernels_mosaic": math.nan,
         "kernels_traced": math.nan, "versions": math.nan},  # refused: not a case run
        {**_row("e", "o", status="error"), "compiled_for": "", "kernels_mosaic": math.nan, "kernels_traced": 0.0,
         "versions": versions}])  # broke before its first kernel: run, but its count says nothing
    (r,) = compile_counts(rows).to_dict("records")
    assert (r["cases run"], r["v5e"], r["v6e"], r["v7x"]) == (4, 1, 2, 0)
    assert r["Pallas kernels per case"] == "0–5 (1 with none)"  # Mosaic's 5, not the 4 traced, for c
    assert r["stack"] == "jax 0.10.2, libtpu 0.0.42.1; jax 0.9.2, libtpu 0.0.37"
