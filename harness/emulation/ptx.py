"""The emulated GPU leg's assumptions checked against Triton's own PTX for fla's kernels, per kernel, sm_80 and sm_90.

Three steps, the first two each in a fresh Python process:

1. **capture** (``python -m harness.emulation.ptx capture``): runs the ``parity`` command (its console entry point)
   as ``parity run --backend gpu --suite S -j 1`` under the Triton interpreter, with the caches off, and records every
   kernel launch: the kernel (module, qualname) and the specialization Triton's own launcher would compile for it
   (``JITFunction`` binder and ``_pack_args`` with the CUDA backend: argument types, constexprs including the pinned
   autotune config and heuristics, divisibility attributes, ``num_warps`` / ``num_stages``).
2. **compile** (``python -m harness.emulation.ptx compile``): a process without interpreter mode imports fla (its
   kernels are then ``JITFunction`` objects) and compiles each distinct specialization with
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``, keeping the TTIR and the PTX. The LLVM IR
   is also lowered to PTX a second time with FP fusion off (the backend's own ``make_ptx``), as a control that says
   which ``fma`` instructions exist only because the compiler contracted a multiply and an add.
3. **check** (this process): each PTX against :func:`harness.emulation.gpu_model.emulation_facts`, which probes
   the emulation itself (:data:`ASSUMPTIONS` lists the checks). One CSV row per kernel, target and assumption:
   ``match``, ``mismatch`` (the PTX contradicts the emulation), ``n/a`` (the kernel has no such operation) or
   ``error`` (it did not compile).

No GPU and no network: Triton's NVIDIA backend (its bundled LLVM) writes PTX on the CPU.

A sweep writes ``key.json`` beside its rows: :func:`content_key` of every input the rows are a function of (this
repository's code the sweep runs, the cases, triton / fla-core / torch / Python versions, the targets, the
emulation's facts). ``--reuse DIR`` serves a committed record of an earlier sweep instead of running one (about 12
minutes) when, and only when, its key is the current one and its rows are clean and unedited.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from harness.core.provenance import git_commit

from .gpu_model import EmulationFacts, emulation_facts
from .specialization import Specializer, compile_record, specialization_key  # noqa: F401  (the record key, also for tests)

TARGETS = {"sm80": 80, "sm90": 90}
ASSUMPTIONS = ("tf32_dot", "ieee_dot", "low_precision_dot", "contraction", "rounding_modes", "f32_div_sqrt",
               "subnormals", "exp_ex2", "reduce_order")
CSV_COLUMNS = ("kernel", "target", "assumption", "expected", "found", "status")
STATUSES = ("match", "mismatch", "n/a", "error")


class BadInput(ValueError):
    """A command-line value this command cannot use (exit 2)."""


@dataclasses.dataclass(frozen=True)
class Row:
    kernel: str
    target: str
    assumption: str
    expected: str
    found: str
    status: str

    def as_list(self) -> List[str]:
        return [self.kernel, self.target, self.assumption, self.expected, self.found, self.status]


# --------------------------------------------------------------------------------------------------------------
# reading TTIR and PTX

_PTX_INSTR = re.compile(r"^\s*(?:@!?%[\w]+\s+)?([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)\b", re.M)


def ptx_body(ptx: str) -> str:
    """The PTX with comments removed."""
    ptx = re.sub(r"/\*.*?\*/", "", ptx, flags=re.S)
    return re.sub(r"//[^\n]*", "", ptx)


def ptx_instructions(ptx: str) -> Counter:
    """Mnemonics (with all their modifiers) of every instruction, counted. Directives (``.reg``, ``.loc``, ...),
    labels and braces are not instructions."""
    return Counter(m.group(1) for m in _PTX_INSTR.finditer(ptx_body(ptx)))


_TENSOR = r"tensor<(?:\d+x)+([a-z]\w*?)(?:,[^>]*)?>"
_DOT = re.compile(r"=\s*tt\.dot\s+([^:\n]*):\s*" + _TENSOR + r"\s*\*\s*" + _TENSOR + r"\s*->\s*" + _TENSOR)


@dataclasses.dataclass(frozen=True)
class TtirDot:
    a: str
    b: str
    out: str
    precision: str  # as printed; "ieee" where MLIR elides it (the enum's default: input_precision="ieee")


def ttir_dots(ttir: str) -> List[TtirDot]:
    out = []
    for m in _DOT.finditer(ttir):
        operands, a, b, res = m.groups()
        prec = re.search(r"inputPrecision\s*=\s*(\w+)", operands)
        out.append(TtirDot(a, b, res, prec.group(1) if prec else "ieee"))
    return out


def ttir_ops(ttir: str, op: str, elem: Optional[str] = None) -> int:
    """How many ``op`` operations the TTIR has (on tensors or scalars of element type ``elem`` when given)."""
    n = 0
    for line in ttir.splitlines():
        m = re.search(r"=\s*" + re.escape(op) + r"\s", line)
        if not m:
            continue
        if elem is None or re.search(r":\s*(?:tensor<[^>]*x" + elem + r"\b|" + elem + r"\b)", line[m.end():]):
            n += 1
    return n


def _fmt(counts: Dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def _pick(instr: Counter, pred) -> Dict[str, int]:
    return {k: v for k, v in instr.items() if pred(k)}


_ROUNDINGS = {"rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi"}
_FLOATS = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "tf32", "e4m3x2", "e5m2x2"}


def _cvt_parts(mnemonic: str):
    parts = mnemonic.split(".")[1:]
    rounding = next((p for p in parts if p in _ROUNDINGS), None)
    types = [p for p in parts if p not in _ROUNDINGS and p not in ("ftz", "sat", "satfinite", "relu")]
    dst, src = (types[-2], types[-1]) if len(types) >= 2 else (None, None)
    return rounding, dst, src


_MODE_TO_PTX = {"rne": "rn", "truncate": "rz", "rna": "rna"}
_FLOAT_WIDTH = {"f64": 64, "f32": 32, "tf32": 19, "f16": 16, "f16x2": 16, "bf16": 16, "bf16x2": 16}


def _is_tf32_mma(m: str) -> bool:
    return (m.startswith("mma.") or m.startswith("wgmma.mma_async")) and ".tf32" in m


def _is_lowp_mma(m: str, t: str) -> bool:
    return (m.startswith("mma.") or m.startswith("wgmma.mma_async")) and f".{t}.{t}" in m


# --------------------------------------------------------------------------------------------------------------
# the checks: one function per assumption, each (kernel, target, ttir, ptx, ptx_nofusion, facts) -> Row


def check_tf32_dot(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    dots = ttir_dots(ttir)
    f32 = [d for d in dots if d.a == "f32" and d.b == "f32"]
    tf32 = [d for d in f32 if d.precision == "tf32"]
    other = sorted({d.precision for d in f32} - {"tf32"})
    mode = facts.tf32_rounding
    expected = {
        "truncate": "tf32 tensor-core mma on the raw f32 registers (no cvt.*.tf32.f32): operands truncated",
        "rna": "cvt.rna.tf32.f32 on the operands, then a tf32 tensor-core mma",
        "rne": "cvt.rn.tf32.f32 on the operands, then a tf32 tensor-core mma",
        "none": "no tf32 mma: full f32 products",
    }.get(mode, f"unknown emulation rounding {mode!r}")
    expected = f"emulation: f32 dot at tf32 rounds operands '{mode}' -> {expected}"
    if not tf32:
        return Row(kernel, target, "tf32_dot", expected, "no f32 tl.dot at tf32 in the TTIR"
                   + (f" (f32 dots at {', '.join(other)})" if other else ""), "n/a")
    mmas = _pick(instr, _is_tf32_mma)
    cvts = _pick(instr, lambda m: m.startswith("cvt.") and _cvt_parts(m)[1] == "tf32")
    found = f"{len(tf32)} f32 tt.dot at tf32 in TTIR; tf32 mma: {_fmt(mmas)}; cvt to tf32: {_fmt(cvts)}"
    split = [p for p in other if p != "ieee"]  # tf32x3 / bf16x3 / bf16x6 convert operands themselves
    if other:
        found += f"; other f32 dots at {', '.join(other)}" + (" (their cvt are not attributed)" if split else "")
    ok_mma = bool(mmas)
    if mode == "truncate":
        ok = ok_mma and (not cvts or bool(split))
    elif mode in ("rna", "rne"):
        want = f"cvt.{_MODE_TO_PTX[mode] if mode == 'rna' else 'rn'}.tf32.f32"
        ok = ok_mma and any(k.startswith(want) for k in cvts)
    elif mode == "none":
        ok = not mmas
    else:
        ok = False
    return Row(kernel, target, "tf32_dot", expected, found, "match" if ok else "mismatch")


def check_ieee_dot(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    f32 = [d for d in ttir_dots(ttir) if d.a == "f32" and d.b == "f32"]
    ieee = [d for d in f32 if d.precision == "ieee"]
    expected = "emulation: an f32 dot at ieee is a float32 FMA chain over K -> fma.rn.f32, no tensor core for it"
    if not ieee:
        return Row(kernel, target, "ieee_dot", expected, "no f32 tl.dot at ieee in the TTIR", "n/a")
    fma = _pick(instr_nf, lambda m: m == "fma.rn.f32")  # the no-fusion control: only explicit FMAs
    mmas = _pick(instr, _is_tf32_mma)
    tc_dots = [d for d in f32 if d.precision != "ieee"]
    found = f"{len(ieee)} f32 tt.dot at ieee in TTIR; fma.rn.f32 without FP fusion: {_fmt(fma)}; tf32 mma: {_fmt(mmas)}"
    if tc_dots:
        found += f"; {len(tc_dots)} other f32 dots use the tensor core"
    ok = bool(fma) and (not mmas or bool(tc_dots))
    return Row(kernel, target, "ieee_dot", expected, found, "match" if ok else "mismatch")


_TENSOR_CORE_FACT = re.compile(r"^tensor-core (sm_\d+): bf16 (\d+)-product blocks")


def check_low_precision_dot(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    dots = [d for d in ttir_dots(ttir) if d.a in ("bf16", "f16") and d.a == d.b]
    fact = _TENSOR_CORE_FACT.match(facts.low_precision_dot)
    arch, block = (fact.group(1), int(fact.group(2))) if fact else (None, None)
    expected = (f"emulation: bf16/fp16 dot = {facts.low_precision_dot} -> bf16/f16 tensor-core mma with an f32 "
                f"accumulator" + (f", on {arch} each instruction's k a multiple of {block}" if fact else ""))
    if not dots:
        return Row(kernel, target, "low_precision_dot", expected, "no bf16/fp16 tl.dot in the TTIR", "n/a")
    types = sorted({d.a for d in dots})
    outs = sorted({d.out for d in dots})
    mmas = _pick(instr, lambda m: any(_is_lowp_mma(m, t) for t in types))
    f32_acc = _pick(mmas, lambda m: ".f32." in m)
    other_acc = {k: v for k, v in mmas.items() if k not in f32_acc}
    found = (f"{len(dots)} {'/'.join(types)} tt.dot -> {'/'.join(outs)} in TTIR; mma: {_fmt(mmas)}")
    if fact and arch.replace("_", "") != target:
        return Row(kernel, target, "low_precision_dot", expected,
                   found + f"; the emulation models {arch}'s tensor core, not {target}'s", "n/a")
    ks = {m: re.search(r"\.m\d+n\d+k(\d+)\.", m) for m in mmas}
    off_block = [m for m, k in ks.items() if k is None or int(k.group(1)) % block] if fact else []
    if off_block:
        found += f"; k not a multiple of the {block}-product block: {', '.join(sorted(off_block))}"
    ok = bool(fact) and bool(f32_acc) and not other_acc and not off_block and outs == ["f32"]
    return Row(kernel, target, "low_precision_dot", expected, found, "match" if ok else "mismatch")


def check_contraction(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    fused = _pick(instr, lambda m: m.startswith("fma."))
    plain = _pick(instr_nf, lambda m: m.startswith("fma."))
    extra = {k: fused.get(k, 0) - plain.get(k, 0) for k in set(fused) | set(plain)}
    contracted = {k: v for k, v in extra.items() if v > 0}
    # LLVM's NVPTX backend writes mul/add/sub without a rounding modifier when FP fusion is allowed, and with .rn
    # when it is not: "Without an explicit rounding mode on add.f32, ptxas is free to fuse with a multiply"
    # (llvm/test/CodeGen/NVPTX/fp-contract.ll). So unpinned multiplies and adds of one type may still be fused.
    unpinned = {}
    for t in ("f32", "bf16", "f16"):
        mul = _pick(instr, lambda m: re.fullmatch(rf"mul(\.ftz)?\.{t}(x2)?", m) is not None)
        add = _pick(instr, lambda m: re.fullmatch(rf"(add|sub)(\.ftz)?\.{t}(x2)?", m) is not None)
        if mul and add:
            unpinned.update(mul)
            unpinned.update(add)
    fused_types = facts.contraction.split(" ", 1)[1].split(", ") if facts.contraction.startswith("fused ") else []
    if fused_types:
        expected = (f"emulation: a*b+c written as two operations rounds once in {', '.join(fused_types)} (fused) -> "
                    "the fma from contraction are of those types")
    else:
        expected = ("emulation: a*b+c written as two operations rounds twice (no contraction) -> no fma beyond those "
                    "without FP fusion, and every mul/add pinned with .rn (else ptxas may fuse them)")
    found = (f"fma with Triton's FP fusion: {_fmt(fused)}; without: {_fmt(plain)}; contracted: {_fmt(contracted)}; "
             f"mul and add/sub left to ptxas (no .rn): {_fmt(unpinned)}")
    if not fused and not plain and not unpinned:
        return Row(kernel, target, "contraction", expected, "no fma, and no unpinned mul beside an unpinned add", "n/a")
    if facts.contraction == "none":
        ok = not contracted and not unpinned
    elif fused_types:
        # every contracted fma is of a type the emulation fuses (fma.rn.f32, fma.rn.ftz.f32, fma.rn.bf16x2, ...);
        # unpinned pairs ptxas may fuse are what fusion on looks like where LLVM formed no fma itself
        ok = all(_fma_type(k) in fused_types for k in contracted)
    else:
        ok = False
    return Row(kernel, target, "contraction", expected, found, "match" if ok else "mismatch")


def _fma_type(mnemonic: str) -> str:
    """fma.rn.ftz.f32 -> f32, fma.rn.bf16x2 -> bf16."""
    t = mnemonic.split(".")[-1]
    return t[:-2] if t.endswith("x2") else t


def check_rounding_modes(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    want = {"bf16": _MODE_TO_PTX.get(facts.bf16_rounding, "?"), "f16": _MODE_TO_PTX.get(facts.f16_rounding, "?")}
    to_int = {"truncate": "rzi", "nearest": "rni"}.get(facts.float_to_int, "?")
    from_int = _MODE_TO_PTX.get(facts.int_to_float, "?")
    rtz_requested = bool(re.search(r"tt\.fp_to_fp[^\n]*rounding\s*=\s*rtz", ttir))
    expected = (f"emulation: f32->bf16 {facts.bf16_rounding}, f32->f16 {facts.f16_rounding}, float->int "
                f"{facts.float_to_int}, int->float {facts.int_to_float} -> cvt.{want['bf16']}.bf16*, "
                f"cvt.{want['f16']}.f16*, cvt.{to_int}.*, cvt.{from_int}.f*.[su]* (cvt.rz.* only where the kernel "
                f"asks rtz); bf16/f16 arithmetic .rn")
    seen, bad = Counter(), Counter()
    for m, n in instr.items():
        head = m.split(".")[0]
        if head == "cvt":
            rounding, dst, src = _cvt_parts(m)
            if dst is None or dst == "tf32" or src is None:
                continue  # tf32: the tf32_dot check
            if dst in _FLOATS and src in _FLOATS:
                if _FLOAT_WIDTH.get(dst, 99) >= _FLOAT_WIDTH.get(src, 0):
                    continue  # widening: exact
                base = dst.rstrip("x2") if dst.endswith("x2") else dst
                exp = want.get(base, "rn")
                ok = rounding == exp or (rounding == "rz" and rtz_requested)
            elif dst in _FLOATS:  # int -> float
                ok = rounding == from_int or _int_fits(src, dst)
            elif src in _FLOATS:  # float -> int
                ok = rounding == to_int
            else:
                continue  # integer <-> integer
            seen[m] += n
            if not ok:
                bad[m] += n
        elif head in ("add", "sub", "mul", "fma", "neg", "abs", "min", "max") and re.search(r"\.(bf16|f16)(x2)?$", m):
            parts = set(m.split(".")[1:])
            seen[m] += n
            if head in ("add", "sub", "mul", "fma") and (parts & _ROUNDINGS) - {"rn"}:
                bad[m] += n  # no modifier: PTX's default, .rn (whether ptxas fuses it: the contraction check)
    if not seen:
        return Row(kernel, target, "rounding_modes", expected, "no rounding float conversion or bf16/f16 arithmetic",
                   "n/a")
    found = f"{_fmt(dict(seen))}" + (f"; contradicting: {_fmt(dict(bad))}" if bad else "") + \
        ("; TTIR asks rtz" if rtz_requested else "")
    return Row(kernel, target, "rounding_modes", expected, found, "mismatch" if bad else "match")


def _int_fits(src: str, dst: str) -> bool:
    """An integer type every value of which the float type holds exactly (no rounding to check)."""
    bits = int(re.sub(r"\D", "", src) or 64)
    mant = {"f64": 53, "f32": 24, "f16": 11, "bf16": 8}.get(dst, 0)
    return bits <= mant


# the PTX instruction each fact predicts for f32 arith.divf / math.sqrt (tt.precise_divf / tt.precise_sqrt, from
# tl.div_rn / tl.sqrt_rn, are div.rn.f32 / sqrt.rn.f32 whatever the facts)
_DIVIDE_PTX = {"ieee": "div.rn.f32", "rcp": "div.full.f32"}
_SQRT_PTX = {"ieee": "sqrt.rn.f32", "ieee-ftz": "sqrt.approx.ftz.f32"}


def check_f32_div_sqrt(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    n_div = ttir_ops(ttir, "arith.divf", "f32")
    n_sqrt = ttir_ops(ttir, "math.sqrt", "f32")
    n_rsqrt = ttir_ops(ttir, "math.rsqrt", "f32")
    n_pdiv = ttir_ops(ttir, "tt.precise_divf", "f32")
    n_psqrt = ttir_ops(ttir, "tt.precise_sqrt", "f32")
    want_div, want_sqrt = _DIVIDE_PTX.get(facts.f32_divide, "?"), _SQRT_PTX.get(facts.f32_sqrt, "?")
    expected = (f"emulation: f32 / {facts.f32_divide}, sqrt {facts.f32_sqrt} (rsqrt as 1/sqrt, IEEE) -> {want_div}, "
                f"{want_sqrt}; div.rn.f32 / sqrt.rn.f32 where the kernel asks div_rn / sqrt_rn")
    if not (n_div or n_sqrt or n_rsqrt or n_pdiv or n_psqrt):
        return Row(kernel, target, "f32_div_sqrt", expected, "no f32 divf, sqrt or rsqrt in the TTIR", "n/a")
    got = _pick(instr, lambda m: m.split(".")[0] in ("div", "sqrt", "rsqrt", "rcp") and m.endswith(".f32"))
    allowed = {want_div} if n_div else set()
    allowed |= {want_sqrt} if n_sqrt else set()
    allowed |= {"div.rn.f32"} if n_pdiv else set()
    allowed |= {"sqrt.rn.f32"} if n_psqrt else set()
    unexplained = {k: v for k, v in got.items() if k not in allowed}
    missing = sorted(m for m, n in ((want_div, n_div), (want_sqrt, n_sqrt)) if n and m not in got)
    found = (f"TTIR: divf x{n_div}, sqrt x{n_sqrt}, rsqrt x{n_rsqrt}, precise divf x{n_pdiv}, precise sqrt "
             f"x{n_psqrt}; PTX: {_fmt(got)}")
    if unexplained:
        found += f"; not the emulation's: {_fmt(unexplained)}"
    if missing:
        found += f"; missing: {', '.join(missing)}"
    ok = not unexplained and not missing
    return Row(kernel, target, "f32_div_sqrt", expected, found, "match" if ok else "mismatch")


# TTIR math ops Triton lowers to a libdevice routine (__nv_logf, ...), whose own polynomial uses fma.rn.ftz.f32: the
# emulation computes them with numpy's f32 function, a stated difference like ex2.approx's
_LIBDEVICE_MATH = ("math.log", "math.log1p", "math.erf", "math.tanh", "math.sin", "math.cos", "math.pow")


# .ftz f32 instructions the emulation's facts account for: fla's exp2 (ex2.approx.ftz, when the emulation flushes
# exp2's subnormal results), tl.sqrt (sqrt.approx.ftz, when it flushes sqrt's subnormal operands) and the inside of
# a libdevice routine the kernel calls
def _ftz_explained(mnemonic: str, facts: EmulationFacts, libdevice: Sequence[str]) -> bool:
    if mnemonic.startswith("ex2."):
        return facts.exp2_subnormals == "flushed"
    if mnemonic.startswith("sqrt."):
        return facts.f32_sqrt.endswith("-ftz")
    if mnemonic.startswith("fma.") and libdevice:
        return True
    return facts.subnormals == "flushed"


def check_subnormals(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    expected = (f"emulation: f32 subnormals {facts.subnormals} in arithmetic, exp2's {facts.exp2_subnormals}, sqrt "
                f"{facts.f32_sqrt} -> .ftz only on the instructions the emulation flushes (and inside libdevice "
                "routines, which it computes with numpy)")
    ftz = _pick(instr, lambda m: ".ftz" in m and m.endswith("f32"))
    floats = _pick(instr, lambda m: m.endswith(".f32") and m.split(".")[0] not in ("ld", "st", "mov", "cvt"))
    if not floats:
        return Row(kernel, target, "subnormals", expected, "no f32 arithmetic", "n/a")
    libdevice = [op for op in _LIBDEVICE_MATH if ttir_ops(ttir, op, "f32")]
    unexplained = {k: v for k, v in ftz.items() if not _ftz_explained(k, facts, libdevice)}
    found = f".ftz: {_fmt(ftz)}" if ftz else f"no .ftz among {sum(floats.values())} f32 arithmetic instructions"
    if libdevice and any(k.startswith("fma.") for k in ftz):
        found += f" (fma.*.ftz inside libdevice's {', '.join(libdevice)})"
    if unexplained:
        found += f"; not the emulation's: {_fmt(unexplained)}"
    if facts.subnormals == "flushed" and not ftz:
        unexplained = {"(no .ftz)": 1}
    return Row(kernel, target, "subnormals", expected, found, "mismatch" if unexplained else "match")


def check_exp_ex2(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    n_exp, n_exp2 = ttir_ops(ttir, "math.exp"), ttir_ops(ttir, "math.exp2")
    expected = (f"emulation (documented): the GPU's exp/exp2 is {facts.exp_lowering} (the emulation uses numpy's "
                f"f32 exp, a stated difference) -> {facts.exp_lowering}[.ftz].f32")
    if not (n_exp or n_exp2):
        return Row(kernel, target, "exp_ex2", expected, "no math.exp / math.exp2 in the TTIR", "n/a")
    ex2 = _pick(instr, lambda m: m.startswith("ex2."))
    want = facts.exp_lowering + "."
    found = f"TTIR: exp x{n_exp}, exp2 x{n_exp2}; PTX: {_fmt(ex2)}"
    ok = bool(ex2) and all(k.startswith(want) for k in ex2)
    return Row(kernel, target, "exp_ex2", expected, found, "match" if ok else "mismatch")


CHECKS = {
    "tf32_dot": check_tf32_dot,
    "ieee_dot": check_ieee_dot,
    "low_precision_dot": check_low_precision_dot,
    "contraction": check_contraction,
    "rounding_modes": check_rounding_modes,
    "f32_div_sqrt": check_f32_div_sqrt,
    "subnormals": check_subnormals,
    "exp_ex2": check_exp_ex2,
}
assert tuple(CHECKS) + ("reduce_order", ) == ASSUMPTIONS


def check_reduce_order(kernel: str, target: str, ttgir: Optional[str], ptx: str) -> Row:
    """The emulation's float32 ``tl.sum`` order (``reduce_order``: read from each reduction's layout in this very
    compile) held against the PTX's ``shfl.sync.bfly`` rounds of the same source location."""
    from .reduce_order import check_ptx, sites_of_ttgir

    expected = ("emulation: each float32 tl.sum adds in its layout's order (lanes' shfl.bfly from the highest mask, "
                "then the warps' round after bar.sync)")
    if ttgir is None:
        return Row(kernel, target, "reduce_order", expected, "no TTGIR kept for this kernel", "error")
    status, bad = check_ptx(sites_of_ttgir(ttgir), ptx)
    found = {"n/a": "no float32 tt.reduce in the TTGIR", "match": "every float32 reduction's shuffle rounds as "
             "its layout gives"}.get(status, "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""))
    return Row(kernel, target, "reduce_order", expected, found, status)


def check_kernel(kernel: str, target: str, ttir: str, ptx: str, ptx_nofusion: str,
                 facts: EmulationFacts, ttgir: Optional[str] = None) -> List[Row]:
    """Every assumption for one compiled kernel: one Row each, in :data:`ASSUMPTIONS` order."""
    instr, instr_nf = ptx_instructions(ptx), ptx_instructions(ptx_nofusion)
    return ([CHECKS[a](kernel, target, ttir, instr, instr_nf, facts) for a in CHECKS]
            + [check_reduce_order(kernel, target, ttgir, ptx)])


# --------------------------------------------------------------------------------------------------------------
# step 1: capture launches (run in its own process)


class LaunchRecorder:
    """Patches ``InterpretedFunction.run`` (restored by :meth:`close`) to record each launch's specialization as
    Triton's CUDA launcher would compute it (:class:`specialization.Specializer`)."""

    def __init__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self._specializer = Specializer()
        self.records: Dict[str, dict] = {}
        self._cls = InterpretedFunction
        self._orig = InterpretedFunction.run
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            recorder.record(fn_self, args, kwargs)
            return recorder._orig(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run

    def close(self):
        self._cls.run = self._orig

    def record(self, interp_fn, args, kwargs):
        rec = self._specializer.record(interp_fn, args, kwargs)
        key = rec["key"]
        if key in self.records:
            self.records[key]["launches"] += 1
        else:
            rec["launches"] = 1
            self.records[key] = rec


def _parity_entry_point():
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="console_scripts"):
        if ep.name == "parity" and ep.value.startswith("harness."):
            return ep.load()
    raise RuntimeError("the `parity` console entry point is not installed (pip install -e .)")


def capture_main(out_json: str, parity_argv: Sequence[str]) -> int:
    from .setup import enable_interpreter_mode

    enable_interpreter_mode()  # before fla is imported, as the GPU leg does
    recorder = LaunchRecorder()
    t0 = time.time()
    try:
        rc = _parity_entry_point()(list(parity_argv))
    finally:
        recorder.close()
    Path(out_json).write_text(json.dumps({"parity_argv": list(parity_argv), "rc": rc, "seconds": time.time() - t0,
                                          "specializations": list(recorder.records.values())}, indent=1))
    return 0  # the launches are recorded whatever the cases' verdicts (rc, in the file)


# --------------------------------------------------------------------------------------------------------------
# step 2: compile (run in its own process, not in interpreter mode)


def compile_main(launches_json: str, out_dir: str, targets: Sequence[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile needs a process without TRITON_INTERPRET")
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # as the GPU leg
    import warnings

    import triton
    from triton._C.libtriton import llvm
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    import fla.ops  # noqa: F401

    data = read_launches(Path(launches_json))
    out = Path(out_dir)
    index = []
    for tname in targets:
        cc = TARGETS[tname]
        target = GPUTarget("cuda", cc, 32)
        backend = make_backend(target)
        (out / tname).mkdir(parents=True, exist_ok=True)
        for rec in data["specializations"]:
            entry = {"key": rec["key"], "module": rec["module"], "qualname": rec["qualname"], "target": tname}
            stem = out / tname / f"{rec['qualname']}-{rec['key']}"
            t0 = time.time()
            try:
                kernel = compile_record(rec, cc)
                opt = backend.parse_options(dict(rec["options"]))
                llir, ptx = kernel.asm["llir"], kernel.asm["ptx"]
                llvm.init_targets()  # a kernel served from Triton's cache has not initialised LLVM's targets
                nofusion = backend.make_ptx(llir, {}, dataclasses.replace(opt, enable_fp_fusion=False), cc)
                stem.with_suffix(".ttir").write_text(kernel.asm["ttir"])
                stem.with_suffix(".ttgir").write_text(kernel.asm["ttgir"])
                stem.with_suffix(".ptx").write_text(ptx)
                stem.with_suffix(".nofusion.ptx").write_text(nofusion)
                entry.update(files=stem.name, enable_fp_fusion=opt.enable_fp_fusion, num_warps=opt.num_warps,
                             num_stages=opt.num_stages, error=None)
            except Exception as exc:  # noqa: BLE001 - one kernel's failure is its row, the sweep goes on
                entry.update(files=None, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            entry["seconds"] = round(time.time() - t0, 3)
            index.append(entry)
    (out / "index.json").write_text(json.dumps({"triton": triton.__version__, "kernels": index}, indent=1))
    return 0


# --------------------------------------------------------------------------------------------------------------
# step 3 and the command


def kernel_label(rec: dict) -> str:
    return f"{rec['module']}.{rec['qualname']}@{rec['key']}"


def _run_step(argv: List[str], env: dict, what: str, log: Path) -> None:
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "harness.emulation.ptx", *argv], env=env, stdout=fh,
                              stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[2]))
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}; log {log}): {tail[0]}")


def capture(parity_argv: List[str], out_json: Path, log: Path) -> dict:
    env = dict(os.environ)
    env["PARITY_CACHE_DIR"] = ""  # no cache serves (or receives) a case: every launch happens
    env.pop("TRITON_INTERPRET", None)
    _run_step(["capture", str(out_json), "--", *parity_argv], env, "capture (the GPU leg under the interpreter)", log)
    return json.loads(out_json.read_text())


def read_launches(path: Path) -> dict:
    """A capture's launches.json (or .json.gz, as reports/ptx keeps it)."""
    if path.suffix == ".gz":
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def compile_kernels(launches: Path, out_dir: Path, targets: Sequence[str], log: Path) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="parity-ptx-triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache  # every kernel compiled here and now (and timed), none served from a cache
        _run_step(["compile", str(launches), str(out_dir), ",".join(targets)], env, "compile", log)
    return json.loads((out_dir / "index.json").read_text())


def check_compiled(data: dict, index: dict, compiled_dir: Path, facts: EmulationFacts) -> List[Row]:
    recs = {r["key"]: r for r in data["specializations"]}
    rows: List[Row] = []
    for entry in index["kernels"]:
        rec = recs[entry["key"]]
        label = kernel_label(rec)
        if entry["error"]:
            rows += [Row(label, entry["target"], a, "compiles to PTX", entry["error"], "error") for a in ASSUMPTIONS]
            continue
        stem = compiled_dir / entry["target"] / entry["files"]
        ttgir = stem.with_suffix(".ttgir")
        rows += check_kernel(label, entry["target"], stem.with_suffix(".ttir").read_text(),
                             stem.with_suffix(".ptx").read_text(), stem.with_suffix(".nofusion.ptx").read_text(),
                             facts, ttgir.read_text() if ttgir.exists() else None)
    return rows


def write_csv(rows: Iterable[Row], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow(r.as_list())


def summarize(rows: Sequence[Row], targets: Sequence[str]) -> str:
    kernels = {t: len({r.kernel for r in rows if r.target == t}) for t in targets}
    st = Counter(r.status for r in rows)
    checks = st["match"] + st["mismatch"]
    return (f"ptx: {', '.join(f'{kernels[t]} kernels {t}' for t in targets)}; {checks} checks, {st['mismatch']} "
            f"mismatches, {st['error']} errors ({st['error'] // max(1, len(ASSUMPTIONS))} kernels), "
            f"{st['n/a']} not applicable")


def parse_targets(text: str) -> List[str]:
    names = [t.strip().replace("_", "") for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if not names or bad:
        raise BadInput(f"--target: unknown {', '.join(bad) or '(empty)'}; known: {', '.join(TARGETS)}")
    return list(dict.fromkeys(names))


# --------------------------------------------------------------------------------------------------------------
# the record: verification keyed by content
#
# A sweep takes about 12 minutes, and its verdict is a function of a few things only: the code that captures and
# checks (this module, the emulation it probes, the GPU leg and the ops it runs), the cases, the installed triton,
# fla-core and torch, the targets and the emulation's facts. ``--reuse DIR`` serves a committed record of an earlier sweep when, and only
# when, every one of those is unchanged; the key is computed here from the files and versions, never written by hand.

KEY_FILE = "key.json"
ROWS_FILE = "ptx.csv"
KEY_FORMAT = 1
KEY_VERSIONS = ("triton", "fla-core", "torch")
"""The installed distributions whose versions are in the key: triton writes the PTX and records the
specializations, fla-core is the kernels, torch runs fla's Python around them (shapes, dtypes, autotune keys)."""
_ROOT = Path(__file__).resolve().parents[2]
_PACKAGE = Path(__file__).resolve().parent


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key_files(package: Path = _PACKAGE) -> Dict[str, str]:
    """{path: sha256} of every module of this package (``harness/emulation/``): the checks, the emulation whose
    facts they hold the PTX to, and the capture's interpreter fixes. The GPU leg and the op bindings the capture
    runs are the leg's own inputs (``leg_inputs`` of :func:`content_key`)."""
    root = package.parents[1]
    return {p.relative_to(root).as_posix(): _sha256(p.read_bytes()) for p in sorted(package.rglob("*.py"))}


def key_versions() -> Dict[str, Optional[str]]:
    """The versions of :data:`KEY_VERSIONS` (None where one is not installed) and Python's major.minor."""
    import importlib.metadata

    out: Dict[str, Optional[str]] = {}
    for name in KEY_VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    return out


def selection_argv(suite: str, case_ids: Sequence[str]) -> List[str]:
    """The ``parity run`` arguments that select the cases: ``--case`` each id, else ``--suite``."""
    return [a for c in case_ids for a in ("--case", c)] or ["--suite", suite]


def content_key(selection_argv: Sequence[str], targets: Sequence[str], *, leg_inputs: dict,
                facts: Optional[dict] = None) -> dict:
    """``{"key": sha256, "inputs": {...}}``: everything a sweep's rows are a function of, and its sha256.

    - ``targets``: what the kernels are compiled for;
    - ``selection`` as given, and ``leg_inputs``: what the captured leg's launches are a function of, as the
      baseline cache keys that leg's outputs (``harness.run.baseline_cache.leg_inputs``, handed in by the command
      line: this layer knows no leg): the leg, the ids of the cases selected (a suite's cases can change under its
      name), its environment (fla's, triton's and torch's versions, its settings), its sources and each op's
      binding;
    - ``versions`` (:func:`key_versions`): the compiler, the kernels and the framework around them;
    - ``files`` (:func:`key_files`): the checks and the emulation;
    - ``facts``: :func:`emulation_facts` probed live (``facts`` when the caller has them), the expectations.

    The launches file is not an input: the launches are a function of the inputs above, so a record made with
    ``--launches`` keys as one that captured them."""
    inputs = {
        "format": KEY_FORMAT,
        "targets": list(targets),
        "selection": list(selection_argv),
        **leg_inputs,
        "versions": key_versions(),
        "files": key_files(),
        "facts": dict(emulation_facts().as_dict() if facts is None else facts),
    }
    return {"key": _sha256(json.dumps(inputs, sort_keys=True).encode()), "inputs": inputs}


def input_differences(old: dict, new: dict) -> List[str]:
    """What differs between two keys' inputs, one name each: the targets, leg, selection and cases, each version,
    each fact, then each file changed, added or removed (files last: an edit moves many at once)."""
    out = []
    for name in ("format", "targets", "leg", "selection"):
        if old.get(name) != new.get(name):
            out.append(f"{name} {_brief(old.get(name))} -> {_brief(new.get(name))}")
    oc, nc = old.get("cases") or [], new.get("cases") or []
    if oc != nc:
        added, removed = len(set(nc) - set(oc)), len(set(oc) - set(nc))
        out.append(f"cases (+{added} -{removed})" if added or removed else "cases (order)")
    for group, label in (("versions", ""), ("facts", "fact "), ("environment", "leg environment "),
                         ("bindings", "binding of ")):
        o, n = old.get(group) or {}, new.get(group) or {}
        for name in sorted(set(o) | set(n)):
            if o.get(name) != n.get(name):
                out.append(f"{label}{name} {_brief(o.get(name))} -> {_brief(n.get(name))}" if group != "bindings"
                           else f"{label}{name} (changed)")
    if old.get("sources") != new.get("sources"):
        out.append(f"the {new.get('leg')} leg's sources (changed)")
    of, nf = old.get("files") or {}, new.get("files") or {}
    for path in sorted(set(of) | set(nf)):
        if of.get(path) != nf.get(path):
            out.append(f"{path} ({'added' if path not in of else 'removed' if path not in nf else 'changed'})")
    known = {"format", "targets", "leg", "selection", "cases", "versions", "facts", "files", "environment",
             "bindings", "sources"}
    out += [name for name in sorted((set(old) | set(new)) - known) if old.get(name) != new.get(name)]
    return out


def _brief(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _names(items: Sequence[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


@dataclasses.dataclass(frozen=True)
class Record:
    """A record of an earlier sweep, as ``--reuse`` reads it: its key.json and its rows (ptx.csv or ptx.csv.gz;
    ``text``: the plain CSV, whose sha256 key.json's ``rows_sha256`` names)."""

    directory: Path
    meta: dict
    rows_path: Path
    text: bytes
    rows: List[Row]


def read_record(directory: Path) -> Record:
    """The record in ``directory``; BadInput (one line, naming the file) when it or its key.json or rows are missing
    or unreadable. A key that differs is not an error here: :func:`reuse_verdict` says so, and the sweep runs."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"--reuse: no such directory {directory}")
    key_path = directory / KEY_FILE
    try:
        meta = json.loads(key_path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--reuse: cannot read {key_path}: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("key"), str) or not isinstance(meta.get("inputs"), dict):
        raise BadInput(f"--reuse: {key_path} is not a record's key.json (no key and inputs)")
    rows_path = next((p for p in (directory / ROWS_FILE, directory / (ROWS_FILE + ".gz")) if p.is_file()), None)
    if rows_path is None:
        raise BadInput(f"--reuse: no {ROWS_FILE} or {ROWS_FILE}.gz in {directory}")
    try:
        text = rows_path.read_bytes()
        if rows_path.suffix == ".gz":
            import gzip

            text = gzip.decompress(text)
        table = list(csv.reader(text.decode().splitlines()))
    except (OSError, ValueError, EOFError) as exc:
        raise BadInput(f"--reuse: cannot read {rows_path}: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not table or tuple(table[0]) != CSV_COLUMNS or any(len(r) != len(CSV_COLUMNS) or r[5] not in STATUSES
                                                          for r in table[1:]):
        raise BadInput(f"--reuse: {rows_path} is not a ptx.csv (columns {', '.join(CSV_COLUMNS)}; statuses "
                       f"{', '.join(STATUSES)})")
    return Record(directory, meta, rows_path, text, [Row(*r) for r in table[1:]])


def reuse_verdict(record: Record, current: dict) -> Optional[str]:
    """None when ``record`` verifies this sweep: made from the very inputs of ``current`` (:func:`content_key`),
    with rows that are all clean (no ``mismatch``, no ``error``: a failure is always reproduced for real) and
    unedited since (their sha256 is key.json's ``rows_sha256``). Otherwise why not, in a few words."""
    meta = record.meta
    if meta["key"] != current["key"]:
        diff = input_differences(meta["inputs"], current["inputs"])
        return (f"it was made from other inputs: {_names(diff)}" if diff else
                f"its key {meta['key'][:12]} is not the sha256 of its own inputs")
    if meta.get("rows_sha256") != _sha256(record.text):
        return (f"its rows {record.rows_path.name} were changed after it was recorded (not the rows_sha256 of "
                f"{KEY_FILE})")
    bad = Counter(r.status for r in record.rows if r.status in ("mismatch", "error"))
    if bad:
        return f"its rows have {bad['mismatch']} mismatch and {bad['error']} error rows (never reused)"
    if not record.rows:
        return "it has no rows"
    if meta.get("capture_rc", 0):
        return f"its capture's GPU-leg run exited {meta['capture_rc']}"
    return None


def copy_record(record: Record, out: Path) -> None:
    """The record's files into ``out`` (its rows as plain ptx.csv); nothing to do when ``out`` is the record."""
    import shutil

    if out.resolve() == record.directory.resolve():
        return
    for src in sorted(record.directory.iterdir()):
        if src.is_file() and src.name != ROWS_FILE + ".gz" and src != record.rows_path:
            shutil.copyfile(src, out / src.name)
    (out / ROWS_FILE).write_bytes(record.text)



def row_counts(rows: Sequence[Row], targets: Sequence[str]) -> dict:
    st = Counter(r.status for r in rows)
    return {"kernels": {t: len({r.kernel for r in rows if r.target == t}) for t in targets},
            "checks": st["match"] + st["mismatch"], **{s: st[s] for s in STATUSES}}


def write_key(out: Path, current: dict, rows: Sequence[Row], targets: Sequence[str], **provenance) -> dict:
    """key.json beside ``out``'s ptx.csv: the content key (:func:`content_key`), the commit it was made at, the
    rows' counts and their sha256 (so rows edited afterwards are never served), and ``provenance`` (where the
    launches came from, the capture's exit status): said, not keyed."""
    record = {**current, "made_at": git_commit(short=False), "made_on": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "summary": row_counts(rows, targets), "rows_sha256": _sha256((out / ROWS_FILE).read_bytes()),
              **provenance}
    (out / KEY_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def _launches_selection(data: dict) -> Optional[tuple]:
    """(leg, selection argv) of the ``parity run`` a launches file was captured with, or None (not recorded)."""
    argv = data.get("parity_argv")
    if not isinstance(argv, list):
        return None
    leg = next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--backend"), None)
    sel = [a for i in range(len(argv) - 1) if argv[i] in ("--suite", "--case") for a in (argv[i], argv[i + 1])]
    return leg, sel


def _record_command(argv: Sequence[str], targets: Sequence[str], out) -> str:
    import shlex

    return " ".join(["parity ptx", *map(shlex.quote, argv), "--target", ",".join(targets), "--out",
                     shlex.quote(str(out))])


def sweep(*, backend: str, leg_inputs, suite: str = "smoke", case: Sequence[str] = (), target: str = "sm80,sm90",
          out="reports/runs/ptx", launches: Optional[str] = None, reuse: Optional[str] = None) -> int:
    """``parity ptx``: record the GPU leg's fla launches over the cases (``suite``, or ``case`` ids), compile
    each for the ``target`` GPUs with Triton's own pipeline and check the emulation's assumptions in the PTX;
    ``launches``: an earlier run's launches, skip the capture; ``reuse``: a record that stands for this sweep
    when its key matches. ``leg_inputs(backend, suite, case)`` gives what the leg's outputs on the cases depend
    on (the record's key). Prints what it did; returns the exit status (0, 1 on a mismatch or a kernel that does
    not compile, 2 on bad input)."""
    t0 = time.time()
    case = list(case)
    given = launches  # ``launches`` is then the file the sweep reads: given, or captured here
    try:
        targets = parse_targets(target)
        if launches is not None and not Path(launches).is_file():
            raise BadInput(f"--launches: no such file {launches}")
        if not case:
            from cases.suites import SUITES

            unknown = [s for s in suite.split(",") if s.strip() not in SUITES]
            if unknown:
                raise BadInput(f"--suite: unknown {', '.join(unknown)}; known: {', '.join(SUITES)}")
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise BadInput(f"--out: {out} is not a directory")
        record = read_record(Path(reuse)) if reuse is not None else None  # before a sweep into it rewrites it
        selection = selection_argv(suite, case)
        facts = emulation_facts()
        try:
            leg = leg_inputs(backend, suite, case)
        except ValueError as exc:
            raise BadInput(f"{'--case' if case else '--suite'}: {str(exc).splitlines()[0]}") from None
        current = content_key(selection, targets, leg_inputs=leg, facts=facts.as_dict())
    except BadInput as exc:
        print(f"parity ptx: error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if record is not None:
        why = reuse_verdict(record, current)
        if why is None:
            copy_record(record, out)
            line = summarize(record.rows, targets).removeprefix("ptx: ")
            print(f"ptx: verified by content: the record {record.directory} (made at "
                  f"{record.meta.get('made_at') or 'an unknown commit'}) was made from exactly these inputs (key "
                  f"{current['key'][:12]}); {line} -> {out / ROWS_FILE}")
            return 0
        print(f"ptx: not verified by the record {record.directory}: {why}; running the sweep")
    (out / KEY_FILE).unlink(missing_ok=True)  # key.json names the files beside it: none until this sweep's are
    provenance: dict = {}
    try:
        if given is not None:
            launches = Path(given)
            t_cap = 0.0
        else:
            with tempfile.TemporaryDirectory(prefix="parity-ptx-") as tmp:
                launches = out / "launches.json"
                tc = time.time()
                capture(["run", "--backend", current["inputs"]["leg"], *selection, "--out", tmp, "-j", "1",
                         "--no-progress", "--force"], launches, out / "capture.log")
                t_cap = time.time() - tc
        data = read_launches(Path(launches))
        if data.get("rc"):
            print(f"parity ptx: note: the GPU leg's run exited {data['rc']} (its launches are checked all the same)")
        if not data["specializations"]:
            print(f"parity ptx: error: no kernel launch recorded (capture log: {out / 'capture.log'})",
                  file=sys.stderr)
            return 2
        if given is not None:
            provenance = _keep_launches(launches, data, out, current, selection)
        provenance["capture_rc"] = data.get("rc") or 0
        tc = time.time()
        index = compile_kernels(Path(launches), out / "compiled", targets, out / "compile.log")
        t_comp = time.time() - tc
    except RuntimeError as exc:
        print(f"parity ptx: error: {exc}", file=sys.stderr)
        return 1
    rows = check_compiled(data, index, out / "compiled", facts)
    write_csv(rows, out / ROWS_FILE)
    (out / (ROWS_FILE + ".gz")).unlink(missing_ok=True)  # a record's gzipped rows from before: not these
    (out / "facts.json").write_text(json.dumps(facts.as_dict(), indent=1))
    keyed = provenance.pop("keyed", True)
    if keyed:
        write_key(out, current, rows, targets, **provenance)
    line = summarize(rows, targets)
    print(f"{line}; capture {t_cap:.0f} s, compile {t_comp:.0f} s, total {time.time() - t0:.0f} s -> {out / 'ptx.csv'}")
    bad = [r for r in rows if r.status in ("mismatch", "error")]
    for r in bad[:5]:
        print(f"  {r.status}: {r.kernel} {r.target} {r.assumption}: {r.found}")
    if len(bad) > 5:
        print(f"  ... {len(bad) - 5} more in {out / 'ptx.csv'}")
    if record is not None:
        command = _record_command(selection, targets, record.directory)
        if bad:
            print(f"ptx: not recorded: a record with mismatch or error rows is never reused; once clean, to record it: "
                  f"{command}")
        elif not keyed:
            print(f"ptx: not recorded (no key.json: see the note above); to record it: {command}")
        elif out.resolve() == record.directory.resolve():
            print(f"ptx: recorded: {record.directory} now holds this sweep (key {current['key'][:12]}); commit it")
        else:
            print(f"ptx: to record it: {command}")
    return 1 if bad else 0


def _keep_launches(launches: Path, data: dict, out: Path, current: dict, selection: Sequence[str]) -> dict:
    """A sweep from ``--launches``: the file goes beside the rows (a record holds its launches), and key.json says
    where they came from. The key itself leaves the file out (:func:`content_key`); so that it still holds, the
    launches must come from a capture of this leg and selection, else no key.json is written (``keyed``: False)."""
    import shutil

    name = "launches.json" + (".gz" if launches.suffix == ".gz" else "")
    dest = out / name
    if not (dest.exists() and dest.resolve() == launches.resolve()):
        shutil.copyfile(launches, dest)
    other = out / ("launches.json" if name.endswith(".gz") else "launches.json.gz")
    other.unlink(missing_ok=True)
    provenance = {"launches_from": str(launches), "launches_sha256": _sha256(launches.read_bytes())}
    captured = _launches_selection(data)
    if captured != (current["inputs"]["leg"], list(selection)):
        said = (f"a capture of `parity run --backend {captured[0]} {' '.join(captured[1])}`" if captured
                else "no capture command")
        print(f"parity ptx: note: no {KEY_FILE}: {launches} records {said}, not of this leg and selection "
              f"(--backend {current['inputs']['leg']} {' '.join(selection)})")
        provenance["keyed"] = False
    return provenance


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["capture"] and len(argv) >= 3 and argv[2] == "--":
        return capture_main(argv[1], argv[3:])
    if argv[:1] == ["compile"] and len(argv) == 4:
        return compile_main(argv[1], argv[2], argv[3].split(","))
    print("python -m harness.emulation.ptx runs its capture and compile steps; the command is `parity ptx`",
          file=sys.stderr)
    return 2

if __name__ == "__main__":
    sys.exit(main())
