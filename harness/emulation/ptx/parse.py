"""Reading what Triton wrote: the instructions of a PTX body and the dots and ops of a TTIR."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Dict, List, Optional

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


def fmt(counts: Dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def pick(instr: Counter, pred) -> Dict[str, int]:
    return {k: v for k, v in instr.items() if pred(k)}


ROUNDINGS = {"rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi"}
FLOATS = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "tf32", "e4m3x2", "e5m2x2"}


def cvt_parts(mnemonic: str):
    parts = mnemonic.split(".")[1:]
    rounding = next((p for p in parts if p in ROUNDINGS), None)
    types = [p for p in parts if p not in ROUNDINGS and p not in ("ftz", "sat", "satfinite", "relu")]
    dst, src = (types[-2], types[-1]) if len(types) >= 2 else (None, None)
    return rounding, dst, src


MODE_TO_PTX = {"rne": "rn", "truncate": "rz", "rna": "rna"}
FLOAT_WIDTH = {"f64": 64, "f32": 32, "tf32": 19, "f16": 16, "f16x2": 16, "bf16": 16, "bf16x2": 16}


def is_tf32_mma(m: str) -> bool:
    return (m.startswith("mma.") or m.startswith("wgmma.mma_async")) and ".tf32" in m


def is_lowp_mma(m: str, t: str) -> bool:
    return (m.startswith("mma.") or m.startswith("wgmma.mma_async")) and f".{t}.{t}" in m

