"""``tl.sum`` in the order the compiled kernel adds, read from Triton's own layout for that kernel.

The Triton interpreter sums a block with ``np.sum``, whose order is numpy's: sequential along a strided axis,
pairwise along a contiguous one. A GPU adds in the order the reduction's *layout* gives, and that layout is chosen
by the compiler per kernel, specialization, ``num_warps`` and target. So the order is read, never written by hand:

1. **The layout, from the compile.** Each launch's specialization (:class:`specialization.Specializer`) is
   compiled for the target (``sm_90`` by default) in a separate process that is not in interpreter mode
   (:func:`compile_sites`, served by ``python -m harness.emulation.reduce_order serve``). Every ``tt.reduce`` of
   its TTGIR gives a :class:`ReduceSite`: the source location of the ``tl.sum`` (the chain of calls in fla's
   files), the axis, the shape, and the operand's layout as Triton's own linear layout
   (``GluonOpBuilder.to_linear_layout``): which element each register, lane and warp bit moves to.
2. **The order, from Triton's lowering of ``tt.reduce``** (``ReduceOpToLLVM``, triton 3.9; the PTX check in
   ``parity ptx`` holds it against the PTX, see :func:`sum_levels`): a coordinate along the axis is the XOR of the
   bases of the register, lane and warp bits that hold it, so the reduction is a sequence of pairwise levels, one
   per bit of the axis coordinate:

   - **within a thread**, a binary tree over the registers that move along the axis, in register order: first the
     pairs that differ in the first such register bit, then the next;
   - **within a warp**, ``shfl.sync.bfly`` over the lane bits that move along the axis, from the highest lane bit
     to the lowest ("the legacy inverse order" of ``warpReduce``);
   - **across warps**, through shared memory: the warps' partial sums go to lanes, and the same butterfly runs
     over them, highest warp bit first.

   Each level is an add in the sum's own type (float32, bf16 or fp16), correctly rounded. The first level within
   a thread adds two of the kernel's products when the summand is a product (``tl.sum(a * b)``): LLVM contracts
   the multiply of the left (lower register) operand into that add (``fma.rn.f32``, ``fma.rn.bf16x2``), as
   ``ptx_arith`` contracts any multiply feeding an add.

   **16-bit sums are packed.** Triton keeps two 16-bit registers in one 32-bit word (registers 2i and 2i + 1), and
   reduces the words with vector adds (``add.bf16x2``): the tree within a thread runs over the word bits (register
   bits 1, 2, ... in order) first, and only then adds the two halves of the last word (register bit 0), before the
   shuffles. Read in the PTX of fla's three bf16 sums (``chunk_o.py`` 273, ``kda/chunk_bwd.py`` 263,
   ``gdn2/chunk_bwd.py`` 194 on sm_90): ``mul.bf16x2``, ``fma.rn.bf16x2`` of the lower word's product into it,
   ``add.bf16x2`` over the words, then ``mov.b32 {_, hi}`` and an ``add.bf16x2`` of the halves. When register bit 0
   does not move the axis, a word holds two different sums and the order is the plain one. **sm_80** has no
   ``add.bf16x2``: there Triton adds each word's halves first (``fma.rn.bf16x2`` by 1.0, after ``fma.rn.bf16x2`` of
   the lower product into the upper), then the words: the plain register order, as for float32 (``parity ptx`` found
   the difference on kda's, chunk_o's and gdn2's sums).
3. **The interpreter.** A launch makes its sites current; a float32, bf16 or fp16 ``tl.sum`` finds its site by its
   call's source location (file, line and column, through the chain of jitted calls) and sums in that order. A sum with no site
   in the compile (the compiler removed it as dead, or it was folded into another op) keeps numpy's order; the
   number of such sums is counted per launch (``ReduceOrder.unmatched``) and a test holds it at zero on fla's
   kernels.

Not modelled, and said so: a layout whose basis moves the axis and another dimension at once (refused:
:class:`LayoutNotModelled`), and ``tl.reduce`` with a combine function other than the sum.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .handles import encode, real
from .ptx_arith import PRODUCT, keep_product
from .specialization import Specializer
from .tensor_core import DEFAULT_ARCH as DEFAULT_TARGET  # one GPU generation for dots and sums

TARGETS = {"sm_80": 80, "sm_90": 90, "sm_100": 100}  # the generations Triton 3.9's NVIDIA backend compiles for
PACKED = ("bf16", "f16")  # element types Triton reduces two to a 32-bit word (the module doc)
PACKS_FROM = 90  # the first generation whose 16-bit sums add the words before their halves (the module doc)

Where = Tuple[Tuple[str, int, int], ...]


class LayoutNotModelled(ValueError):
    """A reduction layout whose order this module does not derive (a basis moving the axis and another dimension)."""


@dataclasses.dataclass(frozen=True)
class ReduceSite:
    """One ``tt.reduce`` of a compiled kernel: where (``(file, line, column)`` per call, outermost first; the file
    as its last two path components), what (axis, shape, element type) and the operand's linear layout (each
    register / lane / warp bit's basis: the element coordinates it moves)."""

    where: Where
    axis: int
    shape: Tuple[int, ...]
    element: str
    registers: Tuple[Tuple[int, ...], ...]
    lanes: Tuple[Tuple[int, ...], ...]
    warps: Tuple[Tuple[int, ...], ...]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ReduceSite":
        tup = lambda xs: tuple(tuple(x) for x in xs)  # noqa: E731
        return cls(where=tuple((str(f), int(ln), int(c)) for f, ln, c in d["where"]), axis=int(d["axis"]),
                   shape=tuple(d["shape"]), element=d["element"], registers=tup(d["registers"]),
                   lanes=tup(d["lanes"]), warps=tup(d["warps"]))


# --------------------------------------------------------------------------------------------------------------
# the order


def _axis_bits(bases: Sequence[Sequence[int]], axis: int, what: str) -> List[int]:
    """For each basis in order: the bit of the axis coordinate it moves, or -1 when it moves none (it moves another
    dimension, or is a broadcast)."""
    bits = []
    for basis in bases:
        a = int(basis[axis])
        others = any(int(v) for i, v in enumerate(basis) if i != axis)
        if a == 0:
            bits.append(-1)
            continue
        if others or a & (a - 1):
            raise LayoutNotModelled(f"{what} basis {list(basis)} moves axis {axis} by {a} and other dimensions: "
                                    "its reduction order is not derived here")
        bits.append(a.bit_length() - 1)
    return bits


def sum_levels(site: ReduceSite, packed: bool = True) -> Tuple[Tuple[str, int], ...]:
    """The pairwise levels of the site's reduction, first to last, as ``(where, bit)``: ``where`` is "thread",
    "halves" (a 16-bit sum's two halves of a word), "lane" or "warp", ``bit`` the bit of the axis coordinate whose two
    values that level adds. Registers in register order, a 16-bit sum's register bit 0 after the others when
    ``packed`` (the target adds 16-bit words before their halves: sm_90 and later, :data:`PACKS_FROM`); lanes and
    warps from their highest bit to their lowest (the module doc). Every bit of the axis appears
    exactly once, or :class:`LayoutNotModelled` is raised."""
    axis = site.axis
    regs = _axis_bits(site.registers, axis, "register")
    lanes = [b for b in _axis_bits(site.lanes, axis, "lane") if b >= 0]
    warps = [b for b in _axis_bits(site.warps, axis, "warp") if b >= 0]
    halves = []
    if packed and site.element in PACKED and regs and regs[0] >= 0:  # the two halves of a word are added after the words
        halves, regs = [("halves", regs[0])], regs[1:]
    levels = ([("thread", b) for b in regs if b >= 0] + halves + [("lane", b) for b in reversed(lanes)]
              + [("warp", b) for b in reversed(warps)])
    n = int(site.shape[axis])
    want = set(range(n.bit_length() - 1))
    got = [b for _, b in levels]
    if n & (n - 1) or sorted(got) != sorted(want):
        raise LayoutNotModelled(f"the layout's axis bits {got} do not cover an axis of {n} once each")
    return tuple(levels)


def add_f32(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A float32 add, correctly rounded."""
    return np.add(lo, hi, dtype=np.float32)


def ordered_sum(x: np.ndarray, axis: int, levels: Sequence[Tuple[str, int]], product=None, fma=None,
                add=add_f32) -> np.ndarray:
    """Sum ``x`` along ``axis`` level by level (:func:`sum_levels`), each level ``add`` (a correctly rounded add in
    the sum's type; float32 by default) of the elements whose axis coordinates differ only in that level's bit (the
    lower coordinate on the left).

    ``product``: ``(a, b)`` with ``x = a * b`` elementwise, and ``fma(a, b, c)`` the fused multiply-add in the
    sum's type; when given and the first level is within a thread, that level is ``fma(a_lo, b_lo, x_hi)`` (the
    contraction of the module doc). The axis is removed from the result."""
    x = np.moveaxis(np.asarray(x), axis, -1)
    n = x.shape[-1]
    m = n.bit_length() - 1
    lead = x.shape[:-1]
    # the axis as m binary digits, most significant first: digit d of the reshaped array is bit (m - 1 - d)
    bits = list(range(m - 1, -1, -1))

    def digits(v):
        return np.moveaxis(np.asarray(v), axis, -1).reshape(lead + (2, ) * m)

    x = x.reshape(lead + (2, ) * m)
    for i, (where, bit) in enumerate(levels):
        d = len(lead) + bits.index(bit)
        lo, hi = x[(slice(None), ) * d + (0, )], x[(slice(None), ) * d + (1, )]  # views: the level's two halves
        if i == 0 and where == "thread" and product is not None:
            a, b = (digits(p)[(slice(None), ) * d + (0, )] for p in product)
            x = fma(a, b, hi)
        else:
            x = add(lo, hi)
        bits.remove(bit)
    return x.reshape(lead)


# --------------------------------------------------------------------------------------------------------------
# reading the compile (in a process that is not in interpreter mode)

_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$", re.M)


def _split_top(text: str, sep: str) -> Tuple[str, str]:
    """``text`` split at the first ``sep`` outside parentheses and quotes."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and text.startswith(sep, i):
            return text[:i], text[i + len(sep):]
    raise ValueError(f"no {sep!r} in {text!r}")


def _resolve_loc(body: str, defs: Dict[str, str], depth: int = 0) -> List[Tuple[str, int, int]]:
    """The file locations of an MLIR location, outermost call first (``callsite(callee at caller)``: the caller's,
    then the callee's)."""
    body = body.strip()
    if depth > 64:
        return []
    if body.startswith("#loc"):
        return _resolve_loc(defs.get(body, "unknown"), defs, depth + 1)
    if body.startswith("loc(") and body.endswith(")"):
        return _resolve_loc(body[4:-1], defs, depth + 1)
    if body.startswith("callsite(") and body.endswith(")"):
        callee, caller = _split_top(body[len("callsite("):-1], " at ")
        return _resolve_loc(caller, defs, depth + 1) + _resolve_loc(callee, defs, depth + 1)
    if body.startswith("fused"):
        inner = body[body.index("[") + 1:body.rindex("]")]
        return _resolve_loc(_split_top(inner + ",", ",")[0], defs, depth + 1)
    m = re.fullmatch(r'"([^"]*)":(\d+):(\d+)', body)
    if m:
        return [(m.group(1), int(m.group(2)), int(m.group(3)))]
    m = re.fullmatch(r'"[^"]*"\((.*)\)', body, re.S)  # a named location: the name, then where
    if m:
        return _resolve_loc(m.group(1), defs, depth + 1)
    return []


def file_key(path: str) -> str:
    """A source file as its last two path components (the same on every machine and install)."""
    parts = Path(path).parts
    return "/".join(parts[-2:])


def _is_triton_source(path: str) -> bool:
    parts = Path(path).parts
    return "triton" in parts and ("language" in parts or "runtime" in parts)


def reduce_locations(ttgir: str) -> List[Where]:
    """Each ``tt.reduce`` of the TTGIR text, in textual order: its chain of call locations in files outside Triton."""
    defs = {m.group(1): m.group(2) for m in _LOC_DEF.finditer(ttgir)}
    out, inside = [], False
    for line in ttgir.splitlines():
        if '"tt.reduce"(' in line:
            inside = True
            continue
        if inside and line.lstrip().startswith("}) :"):
            inside = False
            m = re.search(r"loc\((#loc\d*|.*)\)\s*$", line)
            chain = _resolve_loc(m.group(1), defs) if m else []
            out.append(tuple((file_key(f), ln, col) for f, ln, col in chain if not _is_triton_source(f)))
    return out


def sites_of_ttgir(ttgir: str) -> List[ReduceSite]:
    """Every reduction of a compiled kernel's TTGIR, with its operand's layout as Triton's linear layout."""
    from triton._C.libtriton import gluon_ir, ir

    ctx = ir.context()
    ir.load_dialects(ctx)
    try:
        from triton._C.libtriton import nvidia

        nvidia.load_dialects(ctx)
    except ImportError:  # pragma: no cover - a Triton build without the NVIDIA backend
        pass
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ttgir", delete=False) as fh:  # Triton parses MLIR from a file only
        fh.write(ttgir)
    try:
        module = ir.parse_mlir_module(fh.name, ctx)
    finally:
        os.unlink(fh.name)
    ops: list = []
    reshaped: Dict[int, object] = {}  # a tt.reshape's result -> its source

    def visit(op):
        if op.get_name() == "tt.reduce":
            ops.append(op)
        elif op.get_name() == "tt.reshape":
            reshaped[op.get_result(0).id()] = op.get_operand(0)

    module.walk(visit)
    wheres = reduce_locations(ttgir)
    if len(wheres) != len(ops):
        raise RuntimeError(f"{len(ops)} tt.reduce ops but {len(wheres)} in the TTGIR text")
    builder = gluon_ir.GluonOpBuilder(ctx)
    sites = []
    def bases(v):
        shape = list(builder.get_shape_from_tensor(v))
        ll = builder.to_linear_layout(builder.get_gluon_layout_from_tensor(v)._to_ir(builder), shape)
        return shape, [ll.reg_bases, ll.lane_bases, ll.warp_bases]

    for op, where in zip(ops, wheres):
        v = op.get_operand(0)
        shape, (regs, lanes, warps) = bases(v)
        source = reshaped.get(v.id())
        if source is not None and len(shape) == 1:
            # tl.sum(x) of a block: x reshaped to 1-D with allow_reorder, which moves no value between registers,
            # lanes or warps: each keeps the source elements it held. The interpreter flattens row-major, so the
            # order is the source layout's with each basis as a row-major flat offset.
            src_shape, src_bases = bases(source)
            strides = [int(np.prod(src_shape[d + 1:])) for d in range(len(src_shape))]
            regs, lanes, warps = ([[sum(int(c) * st for c, st in zip(b, strides))] for b in group]
                                  for group in src_bases)
        sites.append(ReduceSite(where=where, axis=int(op.get_int_attr("axis")), shape=tuple(shape),
                                element=_element_type(str(v.get_type())),
                                registers=tuple(tuple(b) for b in regs), lanes=tuple(tuple(b) for b in lanes),
                                warps=tuple(tuple(b) for b in warps)))
    return sites


def _element_type(ty: str) -> str:
    m = re.search(r"tensor<(?:\d+x)+([a-z0-9]+)", ty)
    return m.group(1) if m else ty


def compile_sites(rec: dict, target: str) -> List[ReduceSite]:
    """The reduction sites of a specialization record compiled for ``target``."""
    from .specialization import compile_record

    kernel = compile_record(rec, TARGETS[target])
    return sites_of_ttgir(kernel.asm["ttgir"])


def serve() -> int:
    """One request per input line (JSON ``{"record": ..., "target": ...}``), one answer per output line
    (``{"sites": [...]}`` or ``{"error": "..."}``): the compile side of :class:`ReduceOrder`, in a process that is
    not in interpreter mode."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print(json.dumps({"error": "the reduction-order server needs a process without TRITON_INTERPRET"}),
              flush=True)
        return 2
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # as the GPU leg
    import warnings

    warnings.filterwarnings("ignore")
    import fla.ops  # noqa: F401  (every kernel importable by module and name)

    for line in sys.stdin:
        req = json.loads(line)
        try:
            sites = compile_sites(req["record"], req["target"])
            answer = {"sites": [s.as_dict() for s in sites]}
        except Exception as exc:  # noqa: BLE001 - the caller turns it into the case's error
            answer = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(json.dumps(answer), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------------------
# the PTX's evidence

_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', re.M)
_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)(?:.*?inlined_at\s+(\d+)\s+(\d+)\s+(\d+))?")
_PTX_PACKED = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:add|fma)(?:\.rn)?\.(?:bf16|f16)x2\s")
_PTX_SHFL = re.compile(r"^\s*(?:@!?%\w+\s+)?shfl\.sync\.bfly\.b32\s+[^,]+,\s*[^,]+,\s*(\d+)\s*,")


def _located_lines(ptx: str):
    """Each instruction line of the PTX with the source location it belongs to (the innermost place outside
    Triton's files, see :func:`ptx_shuffle_rounds`; None before the first ``.loc``)."""
    files = {int(n): path for n, path in _PTX_FILE.findall(ptx)}
    where = None
    for line in ptx.splitlines():
        m = _PTX_LOC.match(line)
        if m:
            f, ln, col, fi, li, ci = m.groups()
            path = files.get(int(f), "")
            if _is_triton_source(path) and fi is not None:
                path, ln, col = files.get(int(fi), ""), li, ci
            where = (file_key(path), int(ln), int(col))
            continue
        yield where, line


def ptx_packed_locations(ptx: str) -> set:
    """The source locations at which the PTX adds 16-bit pairs packed in a word (``add``/``fma`` on ``bf16x2`` or
    ``f16x2``): where a 16-bit sum's halves level (:func:`sum_levels`) says Triton packs."""
    return {where for where, line in _located_lines(ptx) if where is not None and _PTX_PACKED.match(line)}


def ptx_shuffle_rounds(ptx: str) -> Dict[Tuple[str, int, int], List[List[int]]]:
    """The ``shfl.sync.bfly`` masks of each source location (the innermost place outside Triton's files: a sum's
    ``.loc`` is in Triton's ``standard.py``, ``inlined_at`` the kernel's call), in program order, split into rounds at
    each ``bar.sync`` (the shared-memory round between the warps), each round's masks in order of first use (the
    chains of several registers interleave)."""
    rounds: Dict[Tuple[str, int, int], List[List[int]]] = {}
    for where, line in _located_lines(ptx):
        if line.strip().startswith("bar.sync"):
            for r in rounds.values():
                if r[-1]:
                    r.append([])
            continue
        m = _PTX_SHFL.match(line)
        if m and where is not None:
            r = rounds.setdefault(where, [[]])
            mask = int(m.group(1))
            if mask not in r[-1]:
                r[-1].append(mask)
    return {k: [x for x in v if x] for k, v in rounds.items()}


def expected_shuffle_rounds(site: ReduceSite) -> List[Tuple[str, List[int]]]:
    """The ``shfl.sync.bfly`` rounds :func:`sum_levels` says the site's reduction runs, as ``(kind, masks)``: its
    lanes' round ("lane": the lane bits that move the axis, as masks from the highest down); then, when warps move
    the axis, the round over the warps' partial sums ("warp": one shuffle per warp bit, highest first). Which lanes
    hold the partials in that round is Triton's choice (``getInterLayout``), so a warp round is predicted by its
    length and its descending order, not by its masks (they are those of the low lanes here)."""
    axis = site.axis
    lane_bits = [i for i, b in enumerate(_axis_bits(site.lanes, axis, "lane")) if b >= 0]
    warp_bits = [b for b in _axis_bits(site.warps, axis, "warp") if b >= 0]
    out = []
    if lane_bits:
        out.append(("lane", [1 << i for i in reversed(lane_bits)]))
    if warp_bits:
        out.append(("warp", [1 << i for i in reversed(range(len(warp_bits)))]))
    return out


def _rounds_agree(want: List[Tuple[str, List[int]]], got: List[List[int]]) -> bool:
    """The PTX's rounds at a location are the predicted ones, once or repeated (a reduction the compiler emits more
    than once: an unrolled or pipelined loop): a lane round mask for mask, a warp round as many shuffles in
    descending order."""
    if not want:
        return not got
    if not got or len(got) % len(want):
        return False
    for i in range(0, len(got), len(want)):
        for (kind, masks), found in zip(want, got[i:i + len(want)]):
            if kind == "lane" and found != masks:
                return False
            if kind == "warp" and (len(found) != len(masks) or found != sorted(found, reverse=True)):
                return False
    return True


def check_ptx(sites: Sequence[ReduceSite], ptx: str, packed: bool = True) -> Tuple[str, List[str]]:
    """The order :func:`sum_levels` reads from the layouts held against the PTX: ("match", []) when every float
    reduction's shuffle rounds agree with the PTX's (:func:`_rounds_agree`) and, on a target that adds 16-bit words
    before their halves (``packed``), every 16-bit one whose levels say so is packed there
    (:func:`ptx_packed_locations`); ("n/a", []) without one, else ("mismatch", what differs)."""
    found = ptx_shuffle_rounds(ptx)
    words = ptx_packed_locations(ptx)
    modelled = [s for s in sites if s.element in ("f32", ) + PACKED and s.where]
    if not modelled:
        return "n/a", []
    bad = []
    for s in modelled:
        where = f"{s.where[-1][0]}:{s.where[-1][1]}:{s.where[-1][2]} axis {s.axis} of {list(s.shape)} ({s.element})"
        want = expected_shuffle_rounds(s)
        got = found.get(s.where[-1], [])
        if not _rounds_agree(want, got):
            bad.append(f"{where}: layout says {[m for _, m in want]} "
                       f"({', '.join(k for k, _ in want) or 'no shuffle'}), PTX {got}")
        if any(kind == "halves" for kind, _ in sum_levels(s, packed)) and s.where[-1] not in words:
            bad.append(f"{where}: the layout's halves level says the sum is packed, the PTX adds no 16-bit pair there")
    return ("mismatch" if bad else "match"), bad


# --------------------------------------------------------------------------------------------------------------
# serving the sites to the interpreter


LAYOUTS_SUBDIR = "reduce-layouts"
"""Where compiled layouts are kept under the caches' root (harness.core.cache_dir)."""


class _Server:
    """The compile process (started on the first miss, reused for the process's life)."""

    def __init__(self):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        self._proc = subprocess.Popen([sys.executable, "-m", "harness.emulation.reduce_order", "serve"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, env=env, cwd=str(Path(__file__).resolve().parents[2]))

    def ask(self, rec: dict, target: str) -> dict:
        self._proc.stdin.write(json.dumps({"record": rec, "target": target}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the reduction-order compile process ended without an answer")
        return json.loads(line)


SHIPPED = Path(__file__).with_name("reduce_layouts.json.gz")
"""Layouts of the suites' kernels compiled when this file was made (``python -m harness.emulation.reduce_order
ship DIR``: a cache directory's ``reduce-layouts``), under the same keys: a key holds the kernel's source files,
the specialization, the target and Triton's version, so an entry serves only the very compile it records; every
other launch compiles. It spares a cold run (CI's, a new user's) the compiles of the suites' kernels."""


def _shipped() -> Dict[str, dict]:
    if _PROCESS.get("shipped") is None:
        try:
            _PROCESS["shipped"] = json.loads(gzip.decompress(SHIPPED.read_bytes())) if SHIPPED.exists() else {}
        except (OSError, ValueError):
            _PROCESS["shipped"] = {}
    return _PROCESS["shipped"]


def ship(directory: Path) -> int:
    """Pack a cache directory's layouts (``<cache>/reduce-layouts/*.json.gz``) into :data:`SHIPPED`."""
    entries = {}
    for path in sorted(Path(directory).glob("*.json.gz")):
        entries[path.name[:-len(".json.gz")]] = json.loads(gzip.decompress(path.read_bytes()))
    SHIPPED.write_bytes(gzip.compress(json.dumps(entries, sort_keys=True).encode(), mtime=0))
    return len(entries)


# one per process, whatever the number of emulation blocks: the compile process (started on the first miss, it
# imports fla once) and the layouts already read (their key holds the target, so blocks of two targets share it)
_PROCESS: dict = {"specializer": [None], "memory": {}, "lock": threading.Lock(), "server": None}


class ReduceOrder:
    """Sites per launch, compiled once per (kernel source, specialization, target, Triton version) and kept on disk
    under ``directory`` (the caches' root's ``reduce-layouts/``, :data:`LAYOUTS_SUBDIR`; None: the shipped table and
    memory only)."""

    def __init__(self, target: str = DEFAULT_TARGET, directory: Optional[Path] = None):
        if target not in TARGETS:
            raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
        import triton

        self.target = target
        self.directory = None if directory is None else Path(directory)
        self.packed = TARGETS[target] >= PACKS_FROM  # its 16-bit sums add the words first (the module doc)
        self._triton = triton.__version__
        # shared by every block of the process: one compile process, one specializer, the layouts read so far
        self._specializer, self._memory, self._lock = _PROCESS["specializer"], _PROCESS["memory"], _PROCESS["lock"]
        self.unmatched: Dict[str, int] = {}  # kernel -> float sums that kept the interpreter's order
        self.matched: Dict[str, int] = {}  # kernel -> float sums in the compiled layout's order
        self.failed: Dict[str, str] = {}  # kernel -> why its compile gave no layouts

    def _key(self, rec: dict, source_key: str) -> str:
        body = json.dumps({"spec": rec["key"], "source": source_key, "target": self.target, "triton": self._triton},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:20]

    def sites(self, interp_fn, args, kwargs) -> Dict[Tuple[Tuple[str, int], ...], List[ReduceSite]]:
        """The launch's sites, by their call chain of (file, line)."""
        with self._lock:
            if self._specializer[0] is None:
                self._specializer[0] = Specializer()
            rec = self._specializer[0].record(interp_fn, args, kwargs)
            key = self._key(rec, source_key(interp_fn.fn))
            if key in self._memory:
                return self._memory[key]
            sites = self._load(key)
            if sites is None:
                if _PROCESS["server"] is None:
                    _PROCESS["server"] = _Server()
                answer = _PROCESS["server"].ask(rec, self.target)
                if "error" in answer:
                    # a kernel the compile process cannot load (one written in a test or a script that needs
                    # interpreter mode to import) keeps numpy's order; it is said in ``failed`` and its sums count
                    # as unmatched
                    self.failed[rec["qualname"]] = answer["error"]
                    sites = []
                else:
                    sites = [ReduceSite.from_dict(d) for d in answer["sites"]]
                    self._store(key, rec, sites)
            table: Dict[Tuple[Tuple[str, int], ...], List[ReduceSite]] = {}
            for s in sites:
                table.setdefault(tuple((f, ln) for f, ln, _ in s.where), []).append(s)
            self._memory[key] = table
            return table

    def _load(self, key: str) -> Optional[List[ReduceSite]]:
        d = self.directory
        path = None if d is None else d / f"{key}.json.gz"
        if path is None or not path.exists():
            shipped = _shipped().get(key)
            return None if shipped is None else [ReduceSite.from_dict(s) for s in shipped["sites"]]
        try:
            data = json.loads(gzip.decompress(path.read_bytes()))
            return [ReduceSite.from_dict(s) for s in data["sites"]]
        except (OSError, ValueError, KeyError):
            return None  # a torn or foreign file is compiled again

    def _store(self, key: str, rec: dict, sites: List[ReduceSite]) -> None:
        d = self.directory
        if d is None:
            return
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(gzip.compress(json.dumps({"kernel": rec["qualname"], "target": self.target,
                                                  "sites": [s.as_dict() for s in sites]}).encode()))
        os.replace(tmp, d / f"{key}.json.gz")


_FILE_HASHES: Dict[str, str] = {}


def source_key(fn) -> str:
    """A hash of the files that hold a kernel and the jitted functions it names (one level: fla's helpers), so that
    an edit of either compiles its layouts again. (Triton's own ``JITFunction.cache_key`` cannot be computed in an
    interpreter-mode process: the callees are interpreted functions there.)"""
    files = {fn.__code__.co_filename}
    for name in fn.__code__.co_names:
        callee = getattr(fn.__globals__.get(name), "fn", None)
        code = getattr(callee, "__code__", None)
        if code is not None:
            files.add(code.co_filename)
    h = hashlib.sha256()
    for path in sorted(files):
        if path not in _FILE_HASHES:
            try:
                _FILE_HASHES[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            except OSError:
                _FILE_HASHES[path] = "unreadable"
        h.update(f"{file_key(path)}:{_FILE_HASHES[path]}".encode())
    return h.hexdigest()


_STATE = threading.local()
_POSITIONS: Dict[object, list] = {}  # a code object's instruction positions (line, end line, column, end column)
_KERNEL_FILES: Dict[str, Optional[str]] = {}  # a frame's file: its file_key, or None for Triton's and the harness's


def _call_chain(kernel_code) -> Tuple[Tuple[Tuple[str, int], ...], Optional[int]]:
    """The chain of (file, line) of the calls from the running kernel down to the ``tl.sum`` being executed (frames
    in Triton's own files skipped), and the column of the innermost call."""
    frame = sys._getframe(2)
    chain: List[Tuple[str, int]] = []
    col = None
    while frame is not None:
        code = frame.f_code
        key = _KERNEL_FILES.get(code.co_filename, False)
        if key is False:  # once per file: a path is read per frame per sum otherwise
            parts = Path(code.co_filename).parts
            key = _KERNEL_FILES[code.co_filename] = (
                None if _is_triton_source(code.co_filename) or "harness" in parts else file_key(code.co_filename))
        if key is not None:
            if col is None and hasattr(code, "co_positions"):
                positions = _POSITIONS.get(code)
                if positions is None:
                    positions = _POSITIONS[code] = list(code.co_positions())
                pos = positions[frame.f_lasti // 2]
                col = None if pos[2] is None else pos[2] + 1  # MLIR's columns count from 1
            chain.append((key, frame.f_lineno))
            if code.co_name == kernel_code[0] and key == kernel_code[1]:
                break
        frame = frame.f_back
    return tuple(reversed(chain)), col


def install(patcher, order: ReduceOrder) -> None:
    """Patch the interpreter (see the module doc): launches make their sites current, float sums follow them."""
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton.runtime.interpreter import InterpretedFunction

    orig_run = InterpretedFunction.run

    def run(fn_self, *args, grid, warmup, **kwargs):
        stack = getattr(_STATE, "launches", None)
        if stack is None:
            stack = _STATE.launches = []
        stack.append((fn_self, args, kwargs, (fn_self.fn.__name__, file_key(fn_self.fn.__code__.co_filename)), {}))
        try:
            return orig_run(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            stack.pop()

    base = interp.ReduceOps
    builder = interp.interpreter_builder
    TH = interp.TensorHandle

    ordered_types = (tl.float32, tl.bfloat16, tl.float16)  # the sums' types whose order is modelled

    def arithmetic(t):
        """The sum's add and fused multiply-add in type ``t``, on float32 values (a 16-bit operand is decoded first;
        the add of two 16-bit values is exact in float32, so rounding it to ``t`` after is correctly rounded)."""
        if t == tl.float32:  # the values are the data: no decoding
            return add_f32, lambda a, b, c: builder.create_fma(TH(a, t), TH(b, t), TH(c, t)).data

        def rounded(values):
            return real(TH(encode(values, t), t))

        def add(lo, hi):
            return rounded((lo + hi).astype(np.float32))

        def fma(a, b, c):  # a, b: the product's operands as the interpreter stores them
            return real(builder.create_fma(TH(a, t), TH(b, t), TH(encode(c, t), t)))

        return add, fma

    class OrderedReduceOps(base):

        def unravel(self, input, axis):  # the stock flatten of tl.sum(x), keeping x's product operands
            ret, axis_out = super().unravel(input, axis)
            if axis is None:
                ret = tuple(t if t is s else tl.core.tensor(keep_product(s.handle, t.handle), t.type)
                            for s, t in zip(input, ret))
            return ret, axis_out

        def sum(self, input):
            stack = getattr(_STATE, "launches", None)
            data = input.handle.data
            if not stack or input.dtype not in ordered_types or not hasattr(data, "ndim"):
                return super().sum(input)
            fn_self, args, kwargs, kernel_code, table = stack[-1]
            if not table:
                table.update(order.sites(fn_self, args, kwargs) or {None: []})
            chain, col = _call_chain(kernel_code)
            candidates = [s for s in table.get(chain, []) if col is None or s.where[-1][2] == col] or \
                table.get(chain, [])
            name = kernel_code[0]
            axis = self.axis
            site = candidates[0] if len(candidates) == 1 else None
            product = getattr(input.handle, "attr", {}).get(PRODUCT)
            if site is not None and axis is None and len(site.shape) == 1:
                data = data.reshape(-1) if data.size == site.shape[0] else data.reshape(data.shape[0], -1)
                product = None if product is None else tuple(p.data.reshape(data.shape) for p in product)
                axis = data.ndim - 1
            elif product is not None:
                product = tuple(p.data for p in product)
            if site is None or axis is None or tuple(data.shape[data.ndim - len(site.shape):]) != site.shape:
                order.unmatched[name] = order.unmatched.get(name, 0) + 1
                return super().sum(input)
            local_axis = axis - (data.ndim - len(site.shape))
            if local_axis != site.axis:
                order.unmatched[name] = order.unmatched.get(name, 0) + 1
                return super().sum(input)
            if product is not None and any(np.shape(p) != data.shape for p in product):
                product = None
            add, fma = arithmetic(input.dtype)
            values = data if input.dtype == tl.float32 else real(TH(data, input.dtype))
            out = ordered_sum(values, axis, sum_levels(site, order.packed), product=product, fma=fma, add=add)
            out = out if input.dtype == tl.float32 else encode(np.asarray(out, np.float32), input.dtype)
            order.matched[name] = order.matched.get(name, 0) + 1
            if self.keep_dims:  # as np.sum(..., keepdims=True) gives it
                out = (np.expand_dims(out, axis) if self.axis is not None
                       else np.reshape(out, (1, ) * input.handle.data.ndim))
            return self.to_tensor(out if np.ndim(out) else out.item(), input.dtype)

    patcher.set_attr(InterpretedFunction, "run", run)
    patcher.set_attr(interp, "ReduceOps", OrderedReduceOps)




if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        sys.exit(serve())
    if len(sys.argv) == 3 and sys.argv[1] == "ship" and Path(sys.argv[2]).is_dir():
        print(f"{ship(Path(sys.argv[2]))} layouts -> {SHIPPED}")
        sys.exit(0)
    print("usage: python -m harness.emulation.reduce_order serve | ship CACHE/reduce-layouts", file=sys.stderr)
    sys.exit(2)
