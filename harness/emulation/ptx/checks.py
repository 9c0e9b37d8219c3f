"""The checks: one function per assumption of the emulated GPU leg, each (kernel, target, ttir, ptx,
ptx_nofusion, facts) -> :class:`Row`, and the rows of a compiled sweep."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from ..gpu_model import EmulationFacts
from .parse import (FLOAT_WIDTH, FLOATS, MODE_TO_PTX, ROUNDINGS, cvt_parts, fmt, is_lowp_mma, is_tf32_mma, pick,
                    ptx_instructions, ttir_dots, ttir_ops)

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
    mmas = pick(instr, is_tf32_mma)
    cvts = pick(instr, lambda m: m.startswith("cvt.") and cvt_parts(m)[1] == "tf32")
    found = f"{len(tf32)} f32 tt.dot at tf32 in TTIR; tf32 mma: {fmt(mmas)}; cvt to tf32: {fmt(cvts)}"
    split = [p for p in other if p != "ieee"]  # tf32x3 / bf16x3 / bf16x6 convert operands themselves
    if other:
        found += f"; other f32 dots at {', '.join(other)}" + (" (their cvt are not attributed)" if split else "")
    ok_mma = bool(mmas)
    if mode == "truncate":
        ok = ok_mma and (not cvts or bool(split))
    elif mode in ("rna", "rne"):
        want = f"cvt.{MODE_TO_PTX[mode] if mode == 'rna' else 'rn'}.tf32.f32"
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
    fma = pick(instr_nf, lambda m: m == "fma.rn.f32")  # the no-fusion control: only explicit FMAs
    mmas = pick(instr, is_tf32_mma)
    tc_dots = [d for d in f32 if d.precision != "ieee"]
    found = f"{len(ieee)} f32 tt.dot at ieee in TTIR; fma.rn.f32 without FP fusion: {fmt(fma)}; tf32 mma: {fmt(mmas)}"
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
    mmas = pick(instr, lambda m: any(is_lowp_mma(m, t) for t in types))
    f32_acc = pick(mmas, lambda m: ".f32." in m)
    other_acc = {k: v for k, v in mmas.items() if k not in f32_acc}
    found = (f"{len(dots)} {'/'.join(types)} tt.dot -> {'/'.join(outs)} in TTIR; mma: {fmt(mmas)}")
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
    fused = pick(instr, lambda m: m.startswith("fma."))
    plain = pick(instr_nf, lambda m: m.startswith("fma."))
    extra = {k: fused.get(k, 0) - plain.get(k, 0) for k in set(fused) | set(plain)}
    contracted = {k: v for k, v in extra.items() if v > 0}
    # LLVM's NVPTX backend writes mul/add/sub without a rounding modifier when FP fusion is allowed, and with .rn
    # when it is not: "Without an explicit rounding mode on add.f32, ptxas is free to fuse with a multiply"
    # (llvm/test/CodeGen/NVPTX/fp-contract.ll). So unpinned multiplies and adds of one type may still be fused.
    unpinned = {}
    for t in ("f32", "bf16", "f16"):
        mul = pick(instr, lambda m: re.fullmatch(rf"mul(\.ftz)?\.{t}(x2)?", m) is not None)
        add = pick(instr, lambda m: re.fullmatch(rf"(add|sub)(\.ftz)?\.{t}(x2)?", m) is not None)
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
    found = (f"fma with Triton's FP fusion: {fmt(fused)}; without: {fmt(plain)}; contracted: {fmt(contracted)}; "
             f"mul and add/sub left to ptxas (no .rn): {fmt(unpinned)}")
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
    want = {"bf16": MODE_TO_PTX.get(facts.bf16_rounding, "?"), "f16": MODE_TO_PTX.get(facts.f16_rounding, "?")}
    to_int = {"truncate": "rzi", "nearest": "rni"}.get(facts.float_to_int, "?")
    from_int = MODE_TO_PTX.get(facts.int_to_float, "?")
    rtz_requested = bool(re.search(r"tt\.fp_to_fp[^\n]*rounding\s*=\s*rtz", ttir))
    expected = (f"emulation: f32->bf16 {facts.bf16_rounding}, f32->f16 {facts.f16_rounding}, float->int "
                f"{facts.float_to_int}, int->float {facts.int_to_float} -> cvt.{want['bf16']}.bf16*, "
                f"cvt.{want['f16']}.f16*, cvt.{to_int}.*, cvt.{from_int}.f*.[su]* (cvt.rz.* only where the kernel "
                f"asks rtz); bf16/f16 arithmetic .rn")
    seen, bad = Counter(), Counter()
    for m, n in instr.items():
        head = m.split(".")[0]
        if head == "cvt":
            rounding, dst, src = cvt_parts(m)
            if dst is None or dst == "tf32" or src is None:
                continue  # tf32: the tf32_dot check
            if dst in FLOATS and src in FLOATS:
                if FLOAT_WIDTH.get(dst, 99) >= FLOAT_WIDTH.get(src, 0):
                    continue  # widening: exact
                base = dst.rstrip("x2") if dst.endswith("x2") else dst
                exp = want.get(base, "rn")
                ok = rounding == exp or (rounding == "rz" and rtz_requested)
            elif dst in FLOATS:  # int -> float
                ok = rounding == from_int or _int_fits(src, dst)
            elif src in FLOATS:  # float -> int
                ok = rounding == to_int
            else:
                continue  # integer <-> integer
            seen[m] += n
            if not ok:
                bad[m] += n
        elif head in ("add", "sub", "mul", "fma", "neg", "abs", "min", "max") and re.search(r"\.(bf16|f16)(x2)?$", m):
            parts = set(m.split(".")[1:])
            seen[m] += n
            if head in ("add", "sub", "mul", "fma") and (parts & ROUNDINGS) - {"rn"}:
                bad[m] += n  # no modifier: PTX's default, .rn (whether ptxas fuses it: the contraction check)
    if not seen:
        return Row(kernel, target, "rounding_modes", expected, "no rounding float conversion or bf16/f16 arithmetic",
                   "n/a")
    found = f"{fmt(dict(seen))}" + (f"; contradicting: {fmt(dict(bad))}" if bad else "") + \
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
    got = pick(instr, lambda m: m.split(".")[0] in ("div", "sqrt", "rsqrt", "rcp") and m.endswith(".f32"))
    allowed = {want_div} if n_div else set()
    allowed |= {want_sqrt} if n_sqrt else set()
    allowed |= {"div.rn.f32"} if n_pdiv else set()
    allowed |= {"sqrt.rn.f32"} if n_psqrt else set()
    unexplained = {k: v for k, v in got.items() if k not in allowed}
    missing = sorted(m for m, n in ((want_div, n_div), (want_sqrt, n_sqrt)) if n and m not in got)
    found = (f"TTIR: divf x{n_div}, sqrt x{n_sqrt}, rsqrt x{n_rsqrt}, precise divf x{n_pdiv}, precise sqrt "
             f"x{n_psqrt}; PTX: {fmt(got)}")
    if unexplained:
        found += f"; not the emulation's: {fmt(unexplained)}"
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
    ftz = pick(instr, lambda m: ".ftz" in m and m.endswith("f32"))
    floats = pick(instr, lambda m: m.endswith(".f32") and m.split(".")[0] not in ("ld", "st", "mov", "cvt"))
    if not floats:
        return Row(kernel, target, "subnormals", expected, "no f32 arithmetic", "n/a")
    libdevice = [op for op in _LIBDEVICE_MATH if ttir_ops(ttir, op, "f32")]
    unexplained = {k: v for k, v in ftz.items() if not _ftz_explained(k, facts, libdevice)}
    found = f".ftz: {fmt(ftz)}" if ftz else f"no .ftz among {sum(floats.values())} f32 arithmetic instructions"
    if libdevice and any(k.startswith("fma.") for k in ftz):
        found += f" (fma.*.ftz inside libdevice's {', '.join(libdevice)})"
    if unexplained:
        found += f"; not the emulation's: {fmt(unexplained)}"
    if facts.subnormals == "flushed" and not ftz:
        unexplained = {"(no .ftz)": 1}
    return Row(kernel, target, "subnormals", expected, found, "mismatch" if unexplained else "match")


def check_exp_ex2(kernel, target, ttir, instr, instr_nf, facts: EmulationFacts) -> Row:
    n_exp, n_exp2 = ttir_ops(ttir, "math.exp"), ttir_ops(ttir, "math.exp2")
    expected = (f"emulation (documented): the GPU's exp/exp2 is {facts.exp_lowering} (the emulation uses numpy's "
                f"f32 exp, a stated difference) -> {facts.exp_lowering}[.ftz].f32")
    if not (n_exp or n_exp2):
        return Row(kernel, target, "exp_ex2", expected, "no math.exp / math.exp2 in the TTIR", "n/a")
    ex2 = pick(instr, lambda m: m.startswith("ex2."))
    want = facts.exp_lowering + "."
    found = f"TTIR: exp x{n_exp}, exp2 x{n_exp2}; PTX: {fmt(ex2)}"
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
    from ..reduce_order import PACKS_FROM, check_ptx, sites_of_ttgir

    expected = ("emulation: each float32, bf16 or fp16 tl.sum adds in its layout's order (lanes' shfl.bfly from the "
                "highest mask, then the warps' round after bar.sync; from sm_90 a 16-bit sum packed, its halves last)")
    if ttgir is None:
        return Row(kernel, target, "reduce_order", expected, "no TTGIR kept for this kernel", "error")
    packed = int("".join(ch for ch in target if ch.isdigit())) >= PACKS_FROM  # "sm90" -> 90
    status, bad = check_ptx(sites_of_ttgir(ttgir), ptx, packed)
    found = {"n/a": "no float32 tt.reduce in the TTGIR", "match": "every float32 reduction's shuffle rounds as "
             "its layout gives"}.get(status, "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""))
    return Row(kernel, target, "reduce_order", expected, found, status)


def check_kernel(kernel: str, target: str, ttir: str, ptx: str, ptx_nofusion: str,
                 facts: EmulationFacts, ttgir: Optional[str] = None) -> List[Row]:
    """Every assumption for one compiled kernel: one Row each, in :data:`ASSUMPTIONS` order."""
    instr, instr_nf = ptx_instructions(ptx), ptx_instructions(ptx_nofusion)
    return ([CHECKS[a](kernel, target, ttir, instr, instr_nf, facts) for a in CHECKS]
            + [check_reduce_order(kernel, target, ttgir, ptx)])


def kernel_label(rec: dict) -> str:
    return f"{rec['module']}.{rec['qualname']}@{rec['key']}"


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

