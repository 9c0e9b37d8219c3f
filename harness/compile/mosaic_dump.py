"""What Mosaic compiled: the MXU passes of every dot of every kernel, read from libtpu's own dump, and checked
against the MXU model (``kernels_tpu.mxu.mxu_passes``) that the emulated TPU leg rounds by.

**Where it comes from.** With ``--xla_mosaic_dump_to=DIR`` in ``LIBTPU_INIT_ARGS`` when libtpu starts
(``harness.compile.tpu_env.prepare_environment`` sets it, to a directory of this process's own), Mosaic writes each
kernel's MLIR after each of its passes, deviceless compiles included. After ``lower-to-llo`` (the file
``*-post-lower-to-llo.txt``) every MXU instruction is one op, in program order:

- ``llo.vlatch`` / ``llo.vlatchi``: weights (the dot's right operand) pushed into the MXU, with the
  ``gain_latch_mode`` that says which bf16 piece of them: ``f32`` (rounded), ``hi.f32``, ``low.f32`` /
  ``soft_middle_eight.f32``, ``soft_low_eight.f32`` (the truncation split's high, middle and low 8 bits),
  ``packed.bf16`` (bf16 as it is), with an ``xpose.`` prefix when transposed;
- ``llo.vmatmul`` / ``llo.vmatmul.mubr``: left-operand rows streamed through, with their ``matmul_mode``
  (``round``, ``high``, ``low`` / ``soft_middle_eight``, ``soft_low_eight``) and ``data_format`` (f32, bf16);
- ``llo.vdwg``: the end of one weight phase.

A **phase** is one weight latch and the rows multiplied by it: one bf16 pass over one weight tile. A dot of
``n`` passes over ``t`` tiles is ``n·t`` phases, each tile's passes in Mosaic's accumulation order.

**The check, per kernel.** The model's side is the kernel's traced body: every ``dot_general`` in program
order, each with the passes ``mxu_passes(precision, lhs dtype, rhs dtype)`` says it runs; a matrix-vector dot
Mosaic puts on the VPU runs none, and a dot repeating an earlier one is Mosaic's once (:func:`model_dots`). The
compiler's side is the kernel's phase sequence. Consecutive dots with the same passes are taken together (their
tiles cannot be told apart, and need not be), and the phases must read as each group's passes repeated at least
once per dot, group after group, with nothing left over. The first place they do not is a mismatch that names the
kernel, the dot (its position, operands, precision and source line) and both pass lists.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Iterable

from harness.core.schema import MOSAIC_COLUMNS  # noqa: F401  (the rows' columns this module fills)

LLO_DUMP = "-post-lower-to-llo.txt"
"""The file of each kernel's MLIR after Mosaic's lower-to-llo pass: one op per MXU instruction."""



VERIFIED, MISMATCH, UNVERIFIED = "verified", "mismatch", "unverified"

_OP = re.compile(r'"llo\.(vlatch\w*|vmatmul[\w.]*|vdwg)"([^\n]*)')
_LATCH_MODE = re.compile(r"gain_latch_mode<([\w.]+)>")
_MATMUL_MODE = re.compile(r"matmul_mode<(\w+)>")
_DATA_FORMAT = re.compile(r"matmul_data_format<(\w+)>")
_FUNC = re.compile(r'func\.func @(?:"([^"]+)"|([\w$.-]+))\(|"func\.func"\(\) <\{[^\n]*?sym_name = "([^"]+)"')
"""The kernel's function, the module's first (index maps follow it), printed in MLIR's custom form or, as some
kernels' LLO dumps are, in the generic form with a ``sym_name`` attribute; a name with a ``-`` is quoted."""


class DumpError(ValueError):
    """A dump this module cannot read (an op or mode it does not know): the check is ``unverified``."""


def _piece(mode: str, data_format: str) -> str:
    """One MXU operand piece (``kernels_tpu.mxu``'s names) from an LLO mode and the operand's format."""
    from kernels_tpu import mxu

    if data_format == "bf16" and mode in ("", "round"):  # bf16 fed as it is
        return mxu.BF16
    pieces = {"round": mxu.NEAREST, "": mxu.NEAREST, "high": mxu.HI8, "hi": mxu.HI8, "low": mxu.MID8,
              "soft_middle_eight": mxu.MID8, "soft_low_eight": mxu.LO8}
    if data_format not in ("f32", "bf16") or mode not in pieces:
        raise DumpError(f"unknown MXU operand mode {mode!r} ({data_format})")
    return pieces[mode]


def _latch_piece(gain_latch_mode: str) -> str:
    """``xpose.hi.f32`` -> the high 8-bit piece; ``packed.bf16`` -> bf16 as it is; ``f32`` -> rounded."""
    tokens = [t for t in gain_latch_mode.split(".") if t not in ("xpose", "packed")]
    data_format = tokens[-1] if tokens else ""
    return _piece(".".join(tokens[:-1]), data_format)


def llo_phases(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The kernel's name and its MXU phases, ``(lhs piece, rhs piece)`` each in program order, from the text
    of a ``*-post-lower-to-llo.txt`` dump."""
    name = _FUNC.search(text)
    if name is None:
        raise DumpError("no func.func in the LLO dump")
    phases: list[tuple[str, str]] = []
    latched: set[str] = set()
    streamed: set[str] = set()

    def close():
        if streamed:
            if len(latched) != 1 or len(streamed) != 1:
                raise DumpError(f"one MXU phase mixes operand pieces: weights {sorted(latched)}, "
                                f"rows {sorted(streamed)}")
            phases.append((streamed.pop(), latched.pop()))
        latched.clear()
        streamed.clear()

    for op, attrs in _OP.findall(text):
        if op.startswith("vlatch"):
            if streamed:  # new weights after rows were streamed: the previous phase is over
                close()
            mode = _LATCH_MODE.search(attrs)
            if mode is None:
                raise DumpError(f"llo.{op} without a gain_latch_mode")
            latched.add(_latch_piece(mode.group(1)))
        elif op.startswith("vmatmul"):
            mode, fmt = _MATMUL_MODE.search(attrs), _DATA_FORMAT.search(attrs)
            if mode is None or fmt is None:
                raise DumpError(f"llo.{op} without a matmul_mode and data_format")
            streamed.add(_piece(mode.group(1), fmt.group(1)))
        else:  # vdwg: done with these weights
            close()
    close()
    return next(g for g in name.groups() if g), phases


# ------------------------------------------------------------------------------- the model's dots
@dataclass(frozen=True)
class Dot:
    """One ``dot_general`` of a kernel body as the model runs it."""

    index: int  # 1-based, in program order within the kernel
    label: str  # operands, precision, source line
    passes: tuple[tuple[str, str], ...]


def _precision(params) -> object:
    p = params.get("precision")
    return p[0] if isinstance(p, tuple) else p


def sub_jaxprs(eqn):
    """The sub-programs of an equation (jit, vjp, control flow, a kernel's body), in parameter order."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, (ClosedJaxpr, Jaxpr)):
                yield x


def model_dots(body) -> list[Dot]:
    """The ``dot_general``s of a kernel body (a Jaxpr or ClosedJaxpr, sub-programs entered in order) that Mosaic
    computes, each with the passes the MXU model gives it. A dot the model cannot run (a precision Mosaic refuses)
    raises DumpError: the compile itself says why.

    Two kinds of dot run no MXU pass, as Mosaic's own passes show (docs/precision.md):

    - a dot that repeats an earlier one (the same operands, by :func:`value_numbers`, and the same parameters):
      Mosaic's ``*-simplify`` passes (MLIR's common-subexpression elimination) keep one of them, whose result both
      uses read. It is left out here; interpret mode computes it twice, to the same bits. Not so a dot whose one
      use is an add (:func:`accumulated`): the add becomes its accumulator, and it is a dot of its own;
    - a matrix-vector dot Mosaic puts on the vector unit (``kernels_tpu.mxu.on_vector_unit``): it is kept, with
      no passes, and the model computes it as the VPU does."""
    from jax._src import source_info_util
    from jax.extend.core import ClosedJaxpr

    from kernels_tpu import mxu

    dots: list[Dot] = []

    def visit(j):
        j = j.jaxpr if isinstance(j, ClosedJaxpr) else j
        numbers, seen, folded = value_numbers(j), set(), accumulated(j)
        for e in j.eqns:
            if e.primitive.name == "dot_general":
                key = (_params_key(e.params), tuple(numbers[v] for v in e.invars[:2]))
                if key in seen and e.outvars[0] not in folded:  # computed once by Mosaic
                    continue
                if e.outvars[0] not in folded:
                    seen.add(key)
                a, b = (v.aval for v in e.invars[:2])
                precision = _precision(e.params)
                if mxu.on_vector_unit(a.shape, a.dtype, b.shape, b.dtype, e.params["dimension_numbers"]):
                    passes, precision = (), f"{precision or 'DEFAULT'}, on the VPU (f32 multiply-adds)"
                else:
                    try:
                        passes = mxu.mxu_passes(precision, a.dtype, b.dtype)
                    except ValueError as exc:
                        raise DumpError(str(exc)) from None
                where = source_info_util.summarize(e.source_info)
                operands = f"{a.str_short(short_dtypes=True)} · {b.str_short(short_dtypes=True)}"
                dots.append(Dot(len(dots) + 1, f"{operands} at {precision or 'DEFAULT'}, {where}", passes))
                continue
            for sub in sub_jaxprs(e):
                visit(sub)

    visit(body)
    return dots


ADDS = ("add", "add_any")


def accumulated(jaxpr) -> set:
    """The dot results whose one use is an add: Mosaic folds ``a + matmul(l, r, 0)`` into ``matmul(l, r, a)``
    (its ``CanonicalizeAddOfMatmul``), and the folded dot, with an accumulator of its own, is no longer the same as
    another dot of the same operands (CSE keeps both)."""
    from jax.extend.core import Literal

    uses: dict = {}
    for e in jaxpr.eqns:
        for x in e.invars:
            if not isinstance(x, Literal):
                uses.setdefault(x, []).append(e.primitive.name)
    for x in jaxpr.outvars:
        if not isinstance(x, Literal):
            uses.setdefault(x, []).append("output")
    return {e.outvars[0] for e in jaxpr.eqns
            if e.primitive.name == "dot_general" and uses.get(e.outvars[0], []) in ([a] for a in ADDS)}


def _params_key(params) -> str:
    return repr(sorted((k, repr(v)) for k, v in params.items()))


def value_numbers(jaxpr) -> dict:
    """Each variable of ``jaxpr`` -> a number that two variables share exactly when they are the same pure
    computation of the same inputs (the same primitive, parameters and operand numbers, literals by value), as
    common-subexpression elimination merges them. An equation with effects (a ref's load or store) or with a
    sub-program gets numbers of its own: two loads of one ref may read different values."""
    from jax.extend.core import Literal

    numbers: dict = {}
    keys: dict = {}

    def number(x):
        if isinstance(x, Literal):
            return ("literal", repr(x.val), str(x.aval))
        return numbers.setdefault(x, ("var", len(numbers)))

    for v in (*jaxpr.constvars, *jaxpr.invars):
        number(v)
    for e in jaxpr.eqns:
        if e.effects or any(True for _ in sub_jaxprs(e)):
            for v in e.outvars:
                numbers[v] = ("var", len(numbers))
            continue
        key = (e.primitive.name, _params_key(e.params), tuple(number(x) for x in e.invars))
        for i, v in enumerate(e.outvars):
            numbers[v] = keys.setdefault((key, i), ("var", len(numbers)))
    return numbers


def _show(passes: Iterable[tuple[str, str]]) -> str:
    passes = list(passes)
    return f"{len(passes)} pass{'es' if len(passes) != 1 else ''} ({', '.join(f'{a}·{b}' for a, b in passes)})"


def _known_passes() -> list[tuple[tuple[str, str], ...]]:
    """Every pass list the MXU model knows (any precision, any operand dtypes), longest first."""
    import jax.numpy as jnp
    from jax import lax

    from kernels_tpu import mxu

    known = set()
    for precision in (lax.Precision.DEFAULT, lax.Precision.HIGH, lax.Precision.HIGHEST):
        for a, b in itertools.product((jnp.float32, jnp.bfloat16), repeat=2):
            try:
                known.add(mxu.mxu_passes(precision, a, b, pallas=False))
            except ValueError:
                pass
    return sorted(known, key=len, reverse=True)


def _passes_at(phases: list[tuple[str, str]], i: int) -> list[tuple[str, str]]:
    """What Mosaic runs from phase ``i``: the longest pass list of any precision that the phases start with
    (one tile of one dot), else the one phase there."""
    for passes in _known_passes():
        if tuple(phases[i:i + len(passes)]) == passes:
            return list(passes)
    return phases[i:i + 1]


def mismatch(kernel: str, dots: list[Dot], phases: list[tuple[str, str]]) -> str:
    """"" when the phases read as the dots' passes (see the module doc), else where and how they differ."""
    i = 0
    for passes, group in itertools.groupby((d for d in dots if d.passes), key=lambda d: d.passes):
        group = list(group)
        width, reps = len(passes), 0
        while tuple(phases[i:i + width]) == passes:
            i, reps = i + width, reps + 1
        if reps < len(group):
            first = group[reps]  # the first dot of the group whose passes are not there
            found = _passes_at(phases, i)
            return (f"kernel {kernel}, dot {first.index} of {len(dots)} ({first.label}): the model runs "
                    f"{_show(passes)}, Mosaic {_show(found) if found else 'no MXU pass'}")
    if i < len(phases):
        return (f"kernel {kernel}: Mosaic runs {len(phases) - i} MXU phases after the model's {len(dots)} dots "
                f"({_show(_passes_at(phases, i))} first)")
    return ""


# ------------------------------------------------------------------------------- one program's check
@dataclass(frozen=True)
class MxuCheck:
    """The outcome for one compiled program: ``status`` (:data:`VERIFIED`, :data:`MISMATCH`, or
    :data:`UNVERIFIED`), the dots and their passes summed (model; Mosaic's when every dot was read),
    and the reason when not verified."""

    status: str
    dots: int | None = None
    passes_model: int | None = None
    passes_mosaic: int | None = None
    reason: str = ""

    @property
    def columns(self) -> dict:
        check = self.status if self.status != UNVERIFIED else f"{UNVERIFIED}: {self.reason}"
        return dict(zip(MOSAIC_COLUMNS, (self.dots, self.passes_model, self.passes_mosaic, check)))


def check(kernels: list[tuple[str, object]], dumps: dict[str, list[list[tuple[str, str]]]]) -> MxuCheck:
    """``kernels``: (name, traced body) of each kernel of the program; ``dumps``: kernel name -> the phase
    sequences of the kernels of that name Mosaic compiled for it (jax may compile two equal kernels once).
    A kernel matches when one of its name's dumps reads as its dots."""
    total_dots = total_passes = 0
    problems, unread = [], []
    for name, body in kernels:
        try:
            dots = model_dots(body)
        except DumpError as exc:
            return MxuCheck(UNVERIFIED, reason=f"kernel {name}: {exc}")
        total_dots += len(dots)
        total_passes += sum(len(d.passes) for d in dots)
        candidates = dumps.get(name, [])
        if not candidates:
            unread.append(name)
            continue
        reasons = [mismatch(name, dots, phases) for phases in candidates]
        if all(reasons):
            problems.append(reasons[0])
    if problems:
        return MxuCheck(MISMATCH, total_dots, total_passes, None, "; ".join(problems))
    if unread:
        return MxuCheck(UNVERIFIED, total_dots, total_passes, None,
                        f"no Mosaic LLO dump for kernel{'s' if len(unread) > 1 else ''} {', '.join(unread)}")
    return MxuCheck(VERIFIED, total_dots, total_passes, total_passes)


def dumped_kernel_name(fname: str, func_name: str) -> str:
    """The kernel a dump file is of: its function's name, unless Mosaic renamed that ``main`` (libtpu 0.0.37),
    then the name in the file's (``<id>-<pass no>-mosaic-dump-<kernel>-<pass>.txt``; libtpu 0.0.42.1 writes
    ``anonymous`` there instead)."""
    if func_name != "main":
        return func_name
    m = re.search(r"-mosaic-dump-(.+)" + re.escape(LLO_DUMP) + "$", fname)
    return m.group(1) if m else func_name


# ------------------------------------------------------------------------------- the dump directory
@dataclass
class DumpDir:
    """The directory libtpu dumps Mosaic's passes into, as this process configured it. ``owned``: made by
    the harness for this process (files read are removed); a directory the user named is only read."""

    path: str | None
    owned: bool
    why_not: str = ""  # when ``path`` is None

    def snapshot(self) -> set[str]:
        """The files there now; an owned directory is emptied first (what no check read is stale)."""
        names = self._list()
        if self.owned:
            self._remove(names)
            return set()
        return names

    def _list(self) -> set[str]:
        try:
            return set(os.listdir(self.path)) if self.path else set()
        except OSError:
            return set()

    def _remove(self, names) -> None:
        for fname in names:
            try:
                os.remove(os.path.join(self.path, fname))
            except OSError:
                pass

    def read_since(self, before: set[str]) -> dict[str, list[list[tuple[str, str]]]]:
        """Kernel name -> phase sequences of the LLO dumps written since ``before`` (a :meth:`snapshot`).
        An owned directory's new files are removed once read."""
        new = sorted(self._list() - before)
        out: dict[str, list[list[tuple[str, str]]]] = {}
        try:
            for fname in new:
                if fname.endswith(LLO_DUMP):
                    with open(os.path.join(self.path, fname)) as fh:
                        name, phases = llo_phases(fh.read())
                    out.setdefault(dumped_kernel_name(fname, name), []).append(phases)
        finally:
            if self.owned:
                self._remove(new)
        return out


def dump_dir(environ=os.environ) -> DumpDir:
    """Where this process's libtpu dumps Mosaic's passes, from ``LIBTPU_INIT_ARGS`` (see
    :func:`harness.compile.tpu_env.prepare_environment`)."""
    from harness.compile.tpu_env import MOSAIC_DUMP_FLAG, MOSAIC_DUMP_OWNER

    flags = environ.get("LIBTPU_INIT_ARGS", "")
    m = re.search(re.escape(MOSAIC_DUMP_FLAG) + r"=(\S+)", flags)
    if m is None:
        return DumpDir(None, False, f"LIBTPU_INIT_ARGS has no {MOSAIC_DUMP_FLAG}=DIR")
    owned = environ.get(MOSAIC_DUMP_OWNER) == str(os.getpid())
    return DumpDir(m.group(1), owned)
