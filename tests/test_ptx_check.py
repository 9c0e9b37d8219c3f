"""The PTX check (harness/emulation/ptx/): the emulated GPU leg's assumptions (harness/emulation/gpu_model.py,
probed from the emulation itself) against Triton's own sm_80 / sm_90 PTX of fla's kernels.

Fast: hand-made TTIR/PTX snippets for each check, the facts the emulation gives, one real fla kernel compiled for
both targets (in a subprocess: the compile needs fla's kernels as JITFunctions, not interpreted), a TF32 fault
patched into the emulation from here, and the command's bad input. Slow (``-m slow``): the whole smoke sweep."""

from __future__ import annotations

import argparse
import functools
import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from harness.emulation import dots, gpu_model, ptx
from harness.emulation.bits import round_to_tf32
from harness.emulation.gpu_model import emulation_facts
from harness.emulation.specialization import specialization_key

ROOT = Path(__file__).resolve().parents[1]

F32_DOT_TTIR = ("    %b_o = tt.dot %b_q_63, %b_h, %cst_5, inputPrecision = tf32 : tensor<64x128xf32> * "
                "tensor<128x128xf32> -> tensor<64x128xf32> loc(#loc118)\n")
BF16_DOT_TTIR = ("    %b_A = tt.dot %q, %k, %cst, inputPrecision = tf32 : tensor<64x64xbf16> * tensor<64x64xbf16> -> "
                 "tensor<64x64xf32> loc(#loc1)\n")
MMA_TF32 = "\tmma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 { %r1, %r2, %r3, %r4 }, { %r5, %r6, %r7, %r8 }, " \
           "{ %r9, %r10 }, { %r1, %r2, %r3, %r4 };\n"
WGMMA_TF32 = "\twgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%r1,%r2}, %rd1, %rd2, 1, 1;\n"


def _ptx(body: str) -> str:
    return (".version 8.7\n.target sm_80\n.address_size 64\n// a comment: fma.rn.f32 is not an instruction here\n"
            ".visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\t.reg .b32 %r<9>;\n$L__BB0_1:\n"
            + body + "\tret;\n}\n")


@pytest.fixture(scope="module")
def facts():
    return emulation_facts()


def row(check, ttir, body, facts, nofusion_body=None, target="sm80"):
    instr = ptx.ptx_instructions(_ptx(body))
    instr_nf = ptx.ptx_instructions(_ptx(body if nofusion_body is None else nofusion_body))
    return check("k@0", target, ttir, instr, instr_nf, facts)


def test_the_emulation_states_its_facts_by_behaviour(facts):
    assert facts.as_dict() == {
        "tf32_rounding": "truncate",
        "low_precision_dot": "tensor-core sm_90: bf16 16-product blocks, 2 extra alignment bits, rz",
        "contraction": "fused f32, bf16",
        "bf16_rounding": "rne", "f16_rounding": "rne", "float_to_int": "truncate", "int_to_float": "rne",
        "f32_divide": "rcp", "f32_sqrt": "ieee-ftz", "subnormals": "kept", "exp2_subnormals": "flushed",
        "exp_lowering": "ex2.approx"}


@pytest.fixture
def stock_facts(monkeypatch):
    """The facts of the emulation without its PTX arithmetic (ptx_arith off): numpy's, rounded at every step."""
    monkeypatch.setattr(gpu_model, "install_ptx_arithmetic", lambda patcher: None)
    f = emulation_facts()
    assert (f.contraction, f.f32_divide, f.f32_sqrt, f.exp2_subnormals) == ("none", "ieee", "ieee", "kept")
    return f


def test_the_probe_leaves_the_interpreter_builder_as_it_found_it():
    import triton.runtime.interpreter as interp

    b = interp.interpreter_builder
    before = {n: getattr(b, n) for n in ("create_dot", "cast_impl", "binary_op", "create_fp_to_fp")}
    emulation_facts()
    assert {n: getattr(b, n) for n in before} == before


def test_ptx_instructions_skip_comments_directives_and_labels():
    body = "\t@%p1 cvt.rn.bf16.f32 %rs1, %r1;\n\tex2.approx.ftz.f32 %r2, %r3; // ex2.approx.f32\n" + MMA_TF32
    got = ptx.ptx_instructions(_ptx(body))
    assert got == {"cvt.rn.bf16.f32": 1, "ex2.approx.ftz.f32": 1,
                   "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32": 1, "ret": 1}


def test_ttir_dots_read_operand_types_and_precision():
    assert ptx.ttir_dots(F32_DOT_TTIR + BF16_DOT_TTIR) == [
        ptx.TtirDot("f32", "f32", "f32", "tf32"), ptx.TtirDot("bf16", "bf16", "f32", "tf32")]
    elided = F32_DOT_TTIR.replace(", inputPrecision = tf32", "")  # MLIR elides the default: ieee
    assert ptx.ttir_dots(elided)[0].precision == "ieee"


def test_ieee_dot_is_an_fma_chain_not_the_tensor_core(facts):
    ttir = F32_DOT_TTIR.replace(", inputPrecision = tf32", "")
    chain = "\tfma.rn.f32 %r1, %r2, %r3, %r1;\n"
    assert row(ptx.check_ieee_dot, ttir, chain, facts).status == "match"
    assert row(ptx.check_ieee_dot, ttir, MMA_TF32, facts).status == "mismatch"
    assert row(ptx.check_ieee_dot, F32_DOT_TTIR, chain, facts).status == "n/a"
    assert row(ptx.check_tf32_dot, ttir, chain, facts).status == "n/a"


def test_tf32_dot_raw_registers_match_truncation_and_a_cvt_does_not(facts):
    assert row(ptx.check_tf32_dot, F32_DOT_TTIR, MMA_TF32, facts).status == "match"
    assert row(ptx.check_tf32_dot, F32_DOT_TTIR, WGMMA_TF32, facts).status == "match"
    rounded = "\tcvt.rna.tf32.f32 %r5, %r5;\n" + MMA_TF32
    r = row(ptx.check_tf32_dot, F32_DOT_TTIR, rounded, facts)
    assert r.status == "mismatch" and "cvt.rna.tf32.f32 x1" in r.found and "truncated" in r.expected
    r = row(ptx.check_tf32_dot, F32_DOT_TTIR, "\tfma.rn.f32 %r1, %r2, %r3, %r1;\n", facts)
    assert r.status == "mismatch" and "tf32 mma: none" in r.found
    assert row(ptx.check_tf32_dot, BF16_DOT_TTIR, MMA_TF32, facts).status == "n/a"


def test_low_precision_dot_needs_the_modelled_generations_mma_shape(facts):
    """The emulation models sm_90's tensor core (16-product blocks): on sm90 every bf16 mma must accumulate in f32
    with a k that is a multiple of 16 (wgmma k16, or mma.sync m16n8k16 where Triton uses MMAv2); sm80 rows are n/a
    (another tensor core)."""
    wgmma = "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, 1, 1;\n"
    mma16 = "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1}, {%r2}, {%r3}, {%r1};\n"
    mma8 = "\tmma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%r1}, {%r2}, {%r3}, {%r1};\n"
    for body in (wgmma, mma16, wgmma + mma16):
        assert row(ptx.check_low_precision_dot, BF16_DOT_TTIR, body, facts, target="sm90").status == "match"
    r = row(ptx.check_low_precision_dot, BF16_DOT_TTIR, mma8, facts, target="sm90")
    assert r.status == "mismatch" and "k not a multiple of the 16-product block" in r.found
    assert "each instruction's k a multiple of 16" in r.expected
    assert row(ptx.check_low_precision_dot, BF16_DOT_TTIR, MMA_TF32, facts, target="sm90").status == "mismatch"
    r = row(ptx.check_low_precision_dot, BF16_DOT_TTIR, mma16, facts, target="sm80")
    assert r.status == "n/a" and "models sm_90's tensor core, not sm80's" in r.found
    assert row(ptx.check_low_precision_dot, F32_DOT_TTIR, wgmma, facts, target="sm90").status == "n/a"
    # an emulation that rounds the exact sum once names no tensor core: the check cannot hold
    exact = dataclasses.replace(facts, low_precision_dot="exact-products-f32-acc")
    assert row(ptx.check_low_precision_dot, BF16_DOT_TTIR, wgmma, exact, target="sm90").status == "mismatch"


def test_the_tensor_core_fact_follows_the_legs_generation_and_a_fault(monkeypatch):
    """sm_80 as the leg's default: the fact names A100's 8-product blocks and 1 extra bit, so sm80's m16n8k16 is
    held to it. A dot fault (exact products rounded once) shows in the fact."""
    from harness.emulation import tensor_core, triton_interpreter

    monkeypatch.setitem(triton_interpreter.triton_emulation.__wrapped__.__kwdefaults__, "tensor_core", "sm_80")
    f = emulation_facts()
    assert f.low_precision_dot == "tensor-core sm_80: bf16 8-product blocks, 1 extra alignment bits, rz"
    mma16 = "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1}, {%r2}, {%r3}, {%r1};\n"
    assert row(ptx.check_low_precision_dot, BF16_DOT_TTIR, mma16, f, target="sm80").status == "match"
    assert row(ptx.check_low_precision_dot, BF16_DOT_TTIR, mma16, f, target="sm90").status == "n/a"
    monkeypatch.undo()
    monkeypatch.setattr(dots, "mma_chain", lambda a, b, c, model: (
        np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)) + c).astype(np.float32))
    assert emulation_facts().low_precision_dot == "exact-products-f32-acc"
    assert tensor_core.DEFAULT_ARCH == "sm_90"


def test_contraction_counts_the_fma_only_fusion_makes(facts, stock_facts):
    fused = "\tfma.rn.f32 %r1, %r2, %r3, %r4;\n\tfma.rn.f32 %r5, %r2, %r3, %r4;\n"
    plain = "\tfma.rn.f32 %r1, %r2, %r3, %r4;\n\tmul.f32 %r6, %r2, %r3;\n\tadd.f32 %r5, %r6, %r4;\n"
    pinned = plain.replace("mul.f32", "mul.rn.f32").replace("add.f32", "add.rn.f32")
    # the emulation fuses f32 and bf16: contracted fma of those types, or unpinned pairs left to ptxas, agree
    r = row(ptx.check_contraction, "", fused, facts, nofusion_body=plain)
    assert r.status == "match" and "contracted: fma.rn.f32 x1" in r.found
    assert row(ptx.check_contraction, "", plain, facts, nofusion_body=plain).status == "match"
    bf16x2 = fused + "\tfma.rn.bf16x2 %r7, %r2, %r3, %r4;\n"
    assert row(ptx.check_contraction, "", bf16x2, facts, nofusion_body=plain).status == "match"
    f16 = "\tfma.rn.f16 %rs1, %rs2, %rs3, %rs4;\n"
    r = row(ptx.check_contraction, "", f16, facts, nofusion_body="")
    assert r.status == "mismatch" and "contracted: fma.rn.f16 x1" in r.found
    # an emulation that rounds the product first contradicts every contracted fma and every unpinned pair
    r = row(ptx.check_contraction, "", fused, stock_facts, nofusion_body=plain)
    assert r.status == "mismatch" and "contracted: fma.rn.f32 x1" in r.found
    assert row(ptx.check_contraction, "", pinned, stock_facts, nofusion_body=pinned).status == "match"
    # no .rn: ptxas is free to fuse them (LLVM NVPTX writes .rn exactly when fusion is off)
    r = row(ptx.check_contraction, "", plain, stock_facts, nofusion_body=plain)
    assert r.status == "mismatch" and "no .rn): add.f32 x1, mul.f32 x1" in r.found
    assert row(ptx.check_contraction, "", "\tadd.f32 %r1, %r2, %r3;\n", facts).status == "n/a"


def test_rounding_modes_of_conversions_and_bf16_arithmetic(facts):
    ok = "\tcvt.rn.bf16.f32 %rs1, %r1;\n\tcvt.rn.f16.f32 %rs2, %r1;\n\tcvt.rzi.s32.f32 %r2, %r1;\n" \
         "\tcvt.f32.bf16 %r3, %rs1;\n\tcvt.rn.f32.s32 %r4, %r2;\n\tcvt.u64.u32 %rd1, %r2;\n" \
         "\tfma.rn.bf16 %rs3, %rs1, %rs1, %rs1;\n"
    assert row(ptx.check_rounding_modes, "", ok, facts).status == "match"
    rz = "\tcvt.rz.bf16.f32 %rs1, %r1;\n"
    r = row(ptx.check_rounding_modes, "", rz, facts)
    assert r.status == "mismatch" and "contradicting: cvt.rz.bf16.f32 x1" in r.found
    asks_rtz = "    %zr = tt.fp_to_fp %x_1, rounding = rtz : tensor<128xf32> -> tensor<128xbf16> loc(#loc44)\n"
    assert row(ptx.check_rounding_modes, asks_rtz, rz, facts).status == "match"
    assert row(ptx.check_rounding_modes, "", "\tcvt.rni.s32.f32 %r2, %r1;\n", facts).status == "mismatch"
    assert row(ptx.check_rounding_modes, "", "\tcvt.f32.bf16 %r3, %rs1;\n", facts).status == "n/a"
    # bf16 arithmetic without a modifier rounds as PTX's default, .rn; .rz would contradict
    assert row(ptx.check_rounding_modes, "", "\tadd.bf16x2 %r1, %r2, %r3;\n", facts).status == "match"
    assert row(ptx.check_rounding_modes, "", "\tadd.rz.bf16x2 %r1, %r2, %r3;\n", facts).status == "mismatch"


def test_division_and_sqrt_are_the_instructions_the_emulation_models(facts, stock_facts):
    div = "    %z_4 = arith.divf %x_1, %y_3 : tensor<128xf32> loc(#loc37)\n"
    sqrt = "    %r_5 = math.sqrt %x_1 : tensor<128xf32> loc(#loc38)\n"
    full, rn = "\tdiv.full.f32 %r1, %r2, %r3;\n", "\tdiv.rn.f32 %r1, %r2, %r3;\n"
    assert row(ptx.check_f32_div_sqrt, div, full, facts).status == "match"
    r = row(ptx.check_f32_div_sqrt, div, rn, facts)
    assert r.status == "mismatch" and "not the emulation's: div.rn.f32 x1" in r.found and "missing: div.full.f32" in r.found
    r = row(ptx.check_f32_div_sqrt, div, full, stock_facts)
    assert r.status == "mismatch" and "not the emulation's: div.full.f32 x1" in r.found
    assert row(ptx.check_f32_div_sqrt, div, rn, stock_facts).status == "match"
    # tl.div_rn / tl.sqrt_rn are precise in the TTIR and div.rn / sqrt.rn in the PTX, whatever the facts
    precise = ("    %z_4 = tt.precise_divf %x_1, %y_3 : tensor<128xf32> loc(#loc37)\n"
               "    %r_5 = tt.precise_sqrt %x_1 : tensor<128xf32> loc(#loc38)\n")
    assert row(ptx.check_f32_div_sqrt, precise, rn + "\tsqrt.rn.f32 %r4, %r2;\n", facts).status == "match"
    approx_sqrt = "\tsqrt.approx.ftz.f32 %r4, %r2;\n"
    assert row(ptx.check_f32_div_sqrt, sqrt, approx_sqrt, facts).status == "match"
    assert row(ptx.check_f32_div_sqrt, sqrt, approx_sqrt, stock_facts).status == "mismatch"
    assert row(ptx.check_f32_div_sqrt, "", full, facts).status == "n/a"


def test_exp_lowers_to_ex2_approx_and_ftz_only_where_the_emulation_flushes(facts, stock_facts):
    ttir = "    %z_16 = math.exp2 %x_1 : tensor<128xf32> loc(#loc41)\n"
    body = "\tex2.approx.ftz.f32 %r1, %r2;\n"
    assert row(ptx.check_exp_ex2, ttir, body, facts).status == "match"
    r = row(ptx.check_exp_ex2, ttir, "\tfma.rn.f32 %r1, %r2, %r3, %r4;\n", facts)  # e.g. a libdevice expf
    assert r.status == "mismatch" and "PTX: none" in r.found
    assert row(ptx.check_exp_ex2, "", body, facts).status == "n/a"
    # exp2's flush is the emulation's; an emulation that keeps exp2's subnormals is contradicted
    assert row(ptx.check_subnormals, ttir, body, facts).status == "match"
    r = row(ptx.check_subnormals, ttir, body, stock_facts)
    assert r.status == "mismatch" and "not the emulation's: ex2.approx.ftz.f32 x1" in r.found
    assert row(ptx.check_subnormals, ttir, "\tex2.approx.f32 %r1, %r2;\n", stock_facts).status == "match"
    # f32 arithmetic the kernel writes keeps subnormals in the emulation: a flushing multiply contradicts it
    r = row(ptx.check_subnormals, "", "\tmul.ftz.f32 %r1, %r2, %r3;\n", facts)
    assert r.status == "mismatch" and "not the emulation's: mul.ftz.f32 x1" in r.found
    # libdevice's logf (math.log) is a polynomial of fma.rn.ftz.f32; the emulation's log is numpy's, as its exp is
    log = "    %b_gate_25 = math.log %b_gate_24 : tensor<64xf32> loc(#loc66)\n"
    poly = "\tfma.rn.ftz.f32 %r29, %r27, %r28, %r23;\n"
    r = row(ptx.check_subnormals, log, poly, facts)
    assert r.status == "match" and "inside libdevice's math.log" in r.found
    assert row(ptx.check_subnormals, "", poly, facts).status == "mismatch"


# one specialization the smoke suite launches (simple_gla chunk, fp32: three f32 dots at tf32), as the capture
# records it; the test compiles it for both targets
CHUNK_FWD_O_FP32 = {
    "module": "fla.ops.common.chunk_o", "qualname": "chunk_fwd_kernel_o",
    "signature": {"q": "*fp32", "k": "*fp32", "v": "*fp32", "h": "*fp32", "g": "*fp32", "g_gamma": "constexpr",
                  "o": "*fp32", "cu_seqlens": "constexpr", "chunk_indices": "constexpr", "scale": "fp32", "T": "i32",
                  "H": "constexpr", "HV": "constexpr", "K": "constexpr", "V": "constexpr", "BT": "constexpr",
                  "BK": "constexpr", "BV": "constexpr", "USE_G": "constexpr", "USE_G_GAMMA": "constexpr",
                  "STATE_V_FIRST": "constexpr", "IS_VARLEN": "constexpr"},
    "constexprs": [[[i], {"t": "NoneType", "v": None}] for i in (5, 7, 8)]
    + [[[i], {"t": "int", "v": v}] for i, v in ((11, 2), (12, 2), (13, 128), (14, 128), (15, 64), (16, 128),
                                                (17, 128))]
    + [[[i], {"t": "bool", "v": v}] for i, v in ((18, True), (19, False), (20, False), (21, False))],
    "attrs": [[[i], [["tt.divisibility", 16]]] for i in (0, 1, 2, 3, 4, 6)],
    "options": {"num_warps": 8, "num_ctas": 1, "num_stages": 3}, "launches": 1,
}
CHUNK_FWD_O_FP32["key"] = specialization_key(CHUNK_FWD_O_FP32)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("ptx")
    launches = d / "launches.json"
    launches.write_text(json.dumps({"specializations": [CHUNK_FWD_O_FP32]}))
    index = ptx.compile_kernels(launches, d / "compiled", ["sm80", "sm90"], d / "compile.log")
    return d, launches, index


def test_a_real_fla_kernel_compiles_for_both_targets_and_confirms_tf32_truncation(compiled, facts):
    d, launches, index = compiled
    assert [(k["target"], k["error"]) for k in index["kernels"]] == [("sm80", None), ("sm90", None)]
    rows = ptx.check_compiled(json.loads(launches.read_text()), index, d / "compiled", facts)
    assert [(r.target, r.assumption) for r in rows] == [(t, a) for t in ("sm80", "sm90") for a in ptx.ASSUMPTIONS]
    for t, target_line in (("sm80", ".target sm_80"), ("sm90", ".target sm_90")):
        stem = d / "compiled" / t / f"chunk_fwd_kernel_o-{CHUNK_FWD_O_FP32['key']}"
        assert target_line in stem.with_suffix(".ptx").read_text()
    tf32 = {r.target: r for r in rows if r.assumption == "tf32_dot"}
    assert tf32["sm80"].status == "match" and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in tf32["sm80"].found
    assert tf32["sm90"].status == "match" and "wgmma.mma_async" in tf32["sm90"].found
    assert all("cvt to tf32: none" in r.found for r in tf32.values())


def test_a_tf32_fault_in_the_emulation_fails_the_check(compiled, monkeypatch):
    """The emulation rounds TF32 operands to nearest (ties away) instead of truncating: the facts say so, and the
    real PTX (raw f32 registers into the mma, no cvt) contradicts it, naming kernel, target and assumption."""
    d, launches, index = compiled
    monkeypatch.setattr(dots, "round_to_tf32", lambda x, mode="truncate": round_to_tf32(x, "rna"))
    faulty = emulation_facts()
    assert faulty.tf32_rounding == "rna"
    rows = ptx.check_compiled(json.loads(launches.read_text()), index, d / "compiled", faulty)
    bad = [r for r in rows if r.status == "mismatch" and r.assumption == "tf32_dot"]
    assert sorted(r.target for r in bad) == ["sm80", "sm90"]
    assert all(r.kernel.startswith("fla.ops.common.chunk_o.chunk_fwd_kernel_o@") and "cvt.rna.tf32.f32" in r.expected
               and "cvt to tf32: none" in r.found for r in bad)


def test_a_contraction_fault_in_the_emulation_fails_the_check(compiled, facts, monkeypatch):
    """The emulation rounds a product before the add that receives it (its fma left out): the real PTX, whose
    contracted fma.rn.f32 exist only because Triton compiles with FP fusion on, contradicts it on both targets."""
    from harness.emulation import ptx_arith

    d, launches, index = compiled
    data = json.loads(launches.read_text())
    good = {(r.target, r.status) for r in ptx.check_compiled(data, index, d / "compiled", facts)
            if r.assumption == "contraction"}
    assert good == {("sm80", "match"), ("sm90", "match")}
    monkeypatch.setattr(ptx_arith, "fused_multiply_add", lambda *a, **k: None)
    faulty = emulation_facts()
    assert faulty.contraction == "none" and faulty.f32_divide == facts.f32_divide
    bad = [r for r in ptx.check_compiled(data, index, d / "compiled", faulty) if r.status == "mismatch"]
    assert sorted((r.target, r.assumption) for r in bad) == [("sm80", "contraction"), ("sm90", "contraction")]
    assert all("contracted: fma.rn.f32" in r.found for r in bad)


def test_a_fault_in_the_legs_default_rounding_is_seen_too(monkeypatch):
    """The other place the TF32 assumption lives: the rounding triton_emulation() gives the GPU leg by default."""
    from harness.emulation import triton_interpreter

    kw = dict(triton_interpreter.triton_emulation.__wrapped__.__kwdefaults__)
    monkeypatch.setitem(triton_interpreter.triton_emulation.__wrapped__.__kwdefaults__, "tf32_rounding", "rne")
    assert gpu_model.leg_defaults()[0] == "rne" != kw["tf32_rounding"]
    assert emulation_facts().tf32_rounding == "rne"


def test_the_command_checks_a_launches_file_and_writes_its_csv(compiled, tmp_path, capsys):
    _, launches, _ = compiled
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs

    rc = ptx.sweep(suite="smoke", case=[], target="sm90", out=str(tmp_path / "out"), launches=str(launches),
                   backend="gpu", leg_inputs=ptx_leg_inputs)
    out = capsys.readouterr().out
    with open(tmp_path / "out" / "ptx.csv") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(ptx.CSV_COLUMNS) and len(rows) == 1 + len(ptx.ASSUMPTIONS)
    n_bad = sum(r[5] in ("mismatch", "error") for r in rows[1:])
    assert rc == (1 if n_bad else 0)
    summary = [line for line in out.splitlines() if line.startswith("ptx: ")]
    assert len(summary) == 1 and summary[0].startswith("ptx: 1 kernels sm90;") and f"{n_bad} mismatches" in out
    # a launches file that does not say which selection it captured cannot vouch for a key
    assert "no key.json" in out and not (tmp_path / "out" / "key.json").exists()


@pytest.mark.parametrize("target, launches, message", [
    ("sm75", None, "--target: unknown sm75"),
    ("", None, "--target: unknown (empty)"),
    ("sm90", "no/such/launches.json", "--launches: no such file"),
])
def test_bad_input_is_exit_2_with_one_line(tmp_path, capsys, target, launches, message):
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs

    assert ptx.sweep(suite="smoke", case=[], target=target, out=str(tmp_path), launches=launches, backend="gpu",
                     leg_inputs=ptx_leg_inputs) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_parser_registers_ptx_in_the_front():
    """``parity ptx``'s options are the front's (harness/parser.py); the emulation layer's :func:`ptx.sweep` takes
    their values."""
    from harness.parser import build_parser

    parser = build_parser()
    args = parser.parse_args(["ptx", "--target", "sm80", "--out", "x"])
    assert args.verb_fn == "ptx" and args.target == "sm80" and args.suite == "smoke" and args.reuse is None
    assert args.backend == "gpu"
    assert parser.parse_args(["ptx", "--reuse", "reports/ci/ptx-smoke"]).reuse == "reports/ci/ptx-smoke"


# --reuse: a record of an earlier sweep, served when, and only when, it was made from exactly these inputs

TARGETS = ["sm80", "sm90"]
RECORD_ROWS = [ptx.Row("fla.ops.common.chunk_o.chunk_fwd_kernel_o@0123456789", t, a, "e", "f",
                       "n/a" if a == "f32_div_sqrt" else "match") for t in TARGETS for a in ptx.ASSUMPTIONS]


def smoke_leg():
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs

    return ptx_leg_inputs("gpu", "smoke", [])


@pytest.fixture(scope="module")
def current():
    return ptx.content_key(["--suite", "smoke"], TARGETS, leg_inputs=smoke_leg())


def make_record(d: Path, key: dict, rows=RECORD_ROWS, gz=False) -> Path:
    """A record as a sweep writes it (ptx.csv, facts.json, launches.json, key.json), its rows gzipped if ``gz``."""
    import gzip

    d.mkdir(parents=True, exist_ok=True)
    ptx.write_csv(rows, d / "ptx.csv")
    (d / "facts.json").write_text(json.dumps(key["inputs"]["facts"]))
    (d / "launches.json").write_text(json.dumps({"specializations": [CHUNK_FWD_O_FP32]}))
    ptx.write_key(d, key, rows, TARGETS)
    if gz:
        (d / "ptx.csv.gz").write_bytes(gzip.compress((d / "ptx.csv").read_bytes()))
        (d / "ptx.csv").unlink()
    return d


def with_inputs(key: dict, **changes) -> dict:
    """``key`` with some of its inputs changed, keyed as content_key keys them."""
    inputs = json.loads(json.dumps(key["inputs"]))
    for group, value in changes.items():
        inputs[group] = {**inputs[group], **value} if isinstance(value, dict) else value
    return {"key": ptx.digest(json.dumps(inputs, sort_keys=True).encode()), "inputs": inputs}


def ptx_args(out, reuse=None, **kw) -> dict:
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs

    from harness.app.ptx_leg import capture_command

    base = dict(suite="smoke", case=[], target="sm80,sm90", out=str(out), launches=None, reuse=reuse, backend="gpu",
                leg_inputs=ptx_leg_inputs, capture_command=capture_command)
    return {**base, **kw}


@pytest.fixture
def sweep(monkeypatch):
    """The sweep's two slow steps, faked: each call is listed; the check gives ``sweep.rows``."""
    calls = []

    def capture(command, out_json, log, **said):
        calls.append(("capture", command))
        data = {"parity_argv": command[3:], "rc": 0, "specializations": [CHUNK_FWD_O_FP32], **said}
        Path(out_json).write_text(json.dumps(data))
        return data

    def compile_kernels(launches, out_dir, targets, log):
        calls.append(("compile", list(targets)))
        return {"kernels": []}

    monkeypatch.setattr(ptx, "capture_launches", capture)
    monkeypatch.setattr(ptx, "compile_kernels", compile_kernels)
    monkeypatch.setattr(ptx, "check_compiled", lambda data, index, compiled_dir, facts: list(sweep.rows))
    sweep = argparse.Namespace(calls=calls, rows=RECORD_ROWS)
    return sweep


@pytest.fixture
def no_sweep(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a verified record must not capture or compile")

    monkeypatch.setattr(ptx, "capture_launches", refuse)
    monkeypatch.setattr(ptx, "compile_kernels", refuse)


def test_a_record_made_from_these_inputs_is_reused_without_capture_or_compile(current, tmp_path, capsys, no_sweep):
    record = make_record(tmp_path / "record", current, gz=True)
    rc = ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(record)))
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    assert out[0].startswith(f"ptx: verified by content: the record {record} (made at ")
    assert f"was made from exactly these inputs (key {current['key'][:12]}); 1 kernels sm80, 1 kernels sm90; " \
           f"{2 * (len(ptx.ASSUMPTIONS) - 1)} checks, 0 mismatches, 0 errors (0 kernels), 2 not applicable" in out[0]
    # the record's files, its rows as plain CSV
    with open(tmp_path / "out" / "ptx.csv") as fh:
        assert list(csv.reader(fh)) == [list(ptx.CSV_COLUMNS)] + [r.as_list() for r in RECORD_ROWS]
    assert not (tmp_path / "out" / "ptx.csv.gz").exists()
    assert json.loads((tmp_path / "out" / "key.json").read_text())["key"] == current["key"]
    assert {"facts.json", "launches.json"} <= {p.name for p in (tmp_path / "out").iterdir()}


def test_a_record_from_other_inputs_reruns_and_names_what_differs(current, tmp_path, capsys, sweep):
    files = sorted(current["inputs"]["files"])[:7]
    assert "harness/emulation/ptx/checks.py" in current["inputs"]["files"]
    old = with_inputs(current, versions={"triton": "3.8.0"}, files={f: "0" * 64 for f in files})
    record = make_record(tmp_path / "record", old)
    rc = ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(record)))
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and [c[0] for c in sweep.calls] == ["capture", "compile"]
    assert lines[0].startswith(f"ptx: not verified by the record {record}: it was made from other inputs: triton "
                               f"3.8.0 -> {current['inputs']['versions']['triton']}, {files[0]} (changed), ")
    assert lines[0].endswith(" and 3 more; running the sweep")  # 7 names: 5 said
    assert lines[-1] == f"ptx: to record it: parity ptx --suite smoke --target sm80,sm90 --out {record}"
    # the rerun's own key.json: this key, these rows
    key = json.loads((tmp_path / "out" / "key.json").read_text())
    assert key["key"] == current["key"] and key["inputs"] == current["inputs"]
    assert key["rows_sha256"] == ptx.digest((tmp_path / "out" / "ptx.csv").read_bytes())
    checks = 2 * (len(ptx.ASSUMPTIONS) - 1)
    assert key["summary"] == {"kernels": {"sm80": 1, "sm90": 1}, "checks": checks, "match": checks, "mismatch": 0,
                              "n/a": 2, "error": 0}
    assert "launches_from" not in key and key["capture_rc"] == 0
    # other targets, another selection: named too
    make_record(tmp_path / "record", with_inputs(current, targets=["sm90"], selection=["--suite", "regressions"]))
    ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(record)))
    assert "other inputs: targets sm90 -> sm80,sm90, selection --suite,regressions -> --suite,smoke; running" \
        in capsys.readouterr().out


@pytest.mark.parametrize("status", ["mismatch", "error"])
def test_a_record_with_a_failing_row_is_never_reused(current, tmp_path, capsys, sweep, status):
    rows = RECORD_ROWS[:-1] + [dataclasses.replace(RECORD_ROWS[-1], status=status)]
    record = make_record(tmp_path / "record", current, rows=rows)
    sweep.rows = rows  # the sweep reproduces it for real: exit 1
    assert ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(record))) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    n_mismatch, n_error = (1, 0) if status == "mismatch" else (0, 1)
    assert lines[0] == (f"ptx: not verified by the record {record}: its rows have {n_mismatch} mismatch and "
                        f"{n_error} error rows (never reused); running the sweep")
    assert [c[0] for c in sweep.calls] == ["capture", "compile"]
    assert lines[-1].startswith("ptx: not recorded: a record with mismatch or error rows is never reused")


def test_rows_edited_after_recording_are_not_reused(current, tmp_path, capsys, sweep):
    record = make_record(tmp_path / "record", current)
    text = (record / "ptx.csv").read_text()
    (record / "ptx.csv").write_text(text.replace(",f,n/a", ",f,match", 1))  # still clean, no longer the recorded
    assert ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(record))) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "its rows ptx.csv were changed after it was recorded" in first and first.endswith("running the sweep")
    assert [c[0] for c in sweep.calls] == ["capture", "compile"]


def test_refreshing_a_record_in_place_then_reusing_it(current, tmp_path, capsys, sweep, monkeypatch):
    """``--reuse X --out X`` is how a developer refreshes a record: the rerun writes its files there."""
    record = make_record(tmp_path / "record", with_inputs(current, versions={"torch": "0.0"}), gz=True)
    assert ptx.sweep(**ptx_args(record, reuse=str(record))) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"ptx: recorded: {record} now holds this sweep (key {current['key'][:12]}); commit it"
    assert (record / "ptx.csv").exists() and not (record / "ptx.csv.gz").exists()
    monkeypatch.setattr(ptx, "capture_launches", None)
    monkeypatch.setattr(ptx, "compile_kernels", None)
    assert ptx.sweep(**ptx_args(tmp_path / "ci", reuse=str(record))) == 0
    assert "verified by content" in capsys.readouterr().out


def test_a_record_from_launches_keys_as_a_capture(current, tmp_path, capsys, sweep):
    """The launches file is not an input of the key (they are a function of the inputs): a record made with
    --launches is served to a run that would capture, and says where its launches came from."""
    launches = tmp_path / "launches-smoke.json"
    launches.write_text(json.dumps({"parity_argv": ["run", "--backend", "gpu", "--suite", "smoke", "--out", "/tmp/x"],
                                    "rc": 0, "specializations": [CHUNK_FWD_O_FP32]}))
    record = tmp_path / "record"
    assert ptx.sweep(**ptx_args(record, launches=str(launches))) == 0
    assert [c[0] for c in sweep.calls] == ["compile"]
    key = json.loads((record / "key.json").read_text())
    assert key["key"] == current["key"] and key["launches_from"] == str(launches)
    assert key["launches_sha256"] == ptx.digest(launches.read_bytes())
    assert (record / "launches.json").read_bytes() == launches.read_bytes()
    capsys.readouterr()
    assert ptx.sweep(**ptx_args(tmp_path / "ci", reuse=str(record))) == 0
    assert "verified by content" in capsys.readouterr().out and [c[0] for c in sweep.calls] == ["compile"]
    # launches of another selection cannot vouch for this key: no key.json
    assert ptx.sweep(**ptx_args(record, launches=str(launches), suite="regressions")) == 0
    assert "no key.json" in capsys.readouterr().out and not (record / "key.json").exists()


@pytest.mark.parametrize("what, message", [
    ("no dir", "--reuse: no such directory"),
    ("no key", "--reuse: cannot read {d}/key.json: FileNotFoundError"),
    ("bad key", "--reuse: cannot read {d}/key.json: JSONDecodeError"),
    ("no rows", "--reuse: no ptx.csv or ptx.csv.gz in {d}"),
])
def test_a_missing_or_unreadable_record_is_exit_2_with_one_line(current, tmp_path, capsys, no_sweep, what, message):
    d = tmp_path / "record"
    if what != "no dir":
        make_record(d, current)
        if what == "no key":
            (d / "key.json").unlink()
        elif what == "bad key":
            (d / "key.json").write_text("{")
        else:
            (d / "ptx.csv").unlink()
    assert ptx.sweep(**ptx_args(tmp_path / "out", reuse=str(d))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("parity ptx: error: ")
    assert message.format(d=d) in err


def test_the_content_key_covers_the_code_the_cases_and_versions(current, monkeypatch):
    from harness.run.baseline_cache import binding_fingerprint, sources_fingerprint
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs
    from harness.legs import make_leg
    from harness.ops import get_op

    inputs = current["inputs"]
    assert current["key"] == ptx.digest(json.dumps(inputs, sort_keys=True).encode())
    for f in ("harness/emulation/ptx/checks.py", "harness/emulation/gpu_model.py", "harness/emulation/ptx_arith.py"):
        assert inputs["files"][f] == ptx.digest((ROOT / f).read_bytes()), f
    from cases.suites import get_suite

    assert inputs["cases"] == [c.id for c in get_suite("smoke")]
    assert inputs["selection"] == ["--suite", "smoke"] and inputs["targets"] == TARGETS and inputs["leg"] == "gpu"
    # the GPU leg's inputs as its cache keys them: its sources, every op's binding, fla's, triton's, torch's versions
    assert inputs["sources"] == sources_fingerprint("gpu")
    assert inputs["bindings"] == {op: binding_fingerprint(get_op(op), make_leg("gpu"))
                                  for op in {c.op for c in get_suite("smoke")}}
    assert {"fla-core", "triton", "torch"} <= set(inputs["environment"]["versions"])
    assert set(inputs["versions"]) == {"triton", "fla-core", "torch", "python"}
    assert inputs["facts"] == emulation_facts().as_dict()
    # any input moves the key: a version, a file, a binding, a fact, the targets, the cases
    leg = smoke_leg()
    key = functools.partial(ptx.content_key, ["--suite", "smoke"], facts=inputs["facts"])
    assert key(TARGETS, leg_inputs=leg)["key"] == current["key"]
    versions = ptx.key_versions()
    monkeypatch.setattr(ptx.record, "key_versions", lambda: {**versions, "triton": "3.10.0"})
    assert key(TARGETS, leg_inputs=leg)["key"] != current["key"]
    monkeypatch.undo()
    files = ptx.key_files()
    monkeypatch.setattr(ptx.record, "key_files", lambda: {**files, "harness/emulation/gpu_model.py": "0" * 64})
    assert key(TARGETS, leg_inputs=leg)["key"] != current["key"]
    monkeypatch.undo()
    moved = key(TARGETS, leg_inputs={**leg, "bindings": {**leg["bindings"], "kda": "0" * 64}})
    assert moved["key"] != current["key"]
    assert "binding of kda (changed)" in ptx.input_differences(inputs, moved["inputs"])
    assert key(TARGETS, leg_inputs={**leg, "sources": "0" * 64})["key"] != current["key"]
    assert ptx.content_key(["--suite", "smoke"], TARGETS, leg_inputs=leg,
                           facts={**inputs["facts"], "tf32_rounding": "rna"})["key"] != current["key"]
    assert key(["sm90"], leg_inputs=leg)["key"] != current["key"]
    one = ptx_leg_inputs("gpu", "smoke", inputs["cases"][:1])
    assert one["cases"] == inputs["cases"][:1] and key(TARGETS, leg_inputs=one)["key"] != current["key"]
    with pytest.raises(ValueError):
        ptx_leg_inputs("gpu", "smoke", ["nope/B1"])


def test_an_edit_to_the_emulation_or_a_gpu_binding_moves_the_key_and_one_to_a_tpu_kernel_does_not(monkeypatch):
    """The key is the emulation's files and the GPU leg's inputs: a one-line edit of a TPU kernel moves neither."""
    import pathlib

    real = pathlib.Path.read_bytes
    before = ptx.content_key(["--suite", "smoke"], TARGETS, leg_inputs=smoke_leg())["key"]
    for edited, moves in (("kernels_tpu/kda/chunk.py", False), ("harness/judge/gate.py", False),
                          ("harness/emulation/dots.py", True), ("harness/ops/kda.py", True),
                          ("harness/legs/gpu.py", True)):
        target = (ROOT / edited).resolve()
        monkeypatch.setattr(pathlib.Path, "read_bytes",
                            lambda self, t=target: real(self) + (b"\n# edited\n" if self.resolve() == t else b""))
        after = ptx.content_key(["--suite", "smoke"], TARGETS, leg_inputs=smoke_leg())["key"]
        assert (after != before) == moves, edited
        monkeypatch.undo()


@pytest.mark.slow
def test_smoke_sweep_sm80_sm90(tmp_path):
    """The whole smoke suite: every kernel the GPU leg launches compiles for both targets, and every assumption of the
    emulation holds wherever it applies (reports/ptx: 2011 checks, 0 mismatches); the exit status says so."""
    from harness.legs.registry import default_leg

    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs

    rc = ptx.sweep(suite="smoke", case=[], target="sm80,sm90", out=str(tmp_path), launches=None,
                   backend=default_leg("baseline"), leg_inputs=ptx_leg_inputs)
    with open(tmp_path / "ptx.csv") as fh:
        rows = list(csv.DictReader(fh))
    kernels = {(r["kernel"], r["target"]) for r in rows}
    assert {t for _, t in kernels} == {"sm80", "sm90"}
    assert len(rows) == len(kernels) * len(ptx.ASSUMPTIONS)
    for a in ptx.ASSUMPTIONS:
        applied = [r for r in rows if r["assumption"] == a and r["status"] != "n/a"]
        assert applied and all(r["status"] == "match" for r in applied), (a, [r for r in applied
                                                                              if r["status"] != "match"][:3])
    assert rc == 0
