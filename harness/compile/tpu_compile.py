"""Ahead-of-time compilation of the TPU leg for real TPU targets, on any machine.

Pallas interpret mode skips the Mosaic compiler's rules, so a kernel that
interprets correctly may not build for any TPU. With libtpu installed, jax
compiles for a TPU *topology* without a TPU device
(``jax.experimental.topologies``): the program is lowered, Mosaic compiles
every kernel, and XLA:TPU schedules the whole program, refusing what a real
chip would refuse (unsupported layouts and dtypes, VMEM overflows).

The compiled program is the TPU leg's own (:func:`harness.legs.tpu.program`):
the op's TPU binding forward plus its ``jax.vjp`` backward, with the kernels
native (no interpret mode, no MXU model), on ``ShapeDtypeStruct`` stand-ins
of the case's inputs placed on one device of the target topology.

Targets are named by TPU generation; :data:`TARGETS` maps each to the
topology it is compiled for (one chip is used).

The compile counts its kernels, and no interpreter can pass it. Every Pallas kernel in the traced program
(``pallas_call``, ``core_map``: each equation with an ``interpret`` parameter) is lowered natively whatever
its library decided: the traced program is rewritten with ``interpret=False`` on each (:func:`native_kernels`),
the way the emulated run forces interpret mode on. Then each kernel must appear in the lowered program as a
Mosaic custom call (``tpu_custom_call``, which XLA:TPU compiles with Mosaic), matched by name. The result
carries the two counts, and is ``error``, naming the kernels, when

- a kernel did not reach Mosaic (lowered some other way), or
- a kernel's library asked for interpret mode (tops, for one, decides it from the runtime: on a machine
  without a TPU it interprets). The compile lowered its body natively, and says whether that compiled, but a
  library that chose to interpret may have built a different kernel than it builds for a TPU (memory
  spaces, tiles), so no verdict on it can be ``ok``. A binding that passes its ``ctx.interpret`` to the
  library's own option (None natively) compiles what a TPU runs.

The compile also reads what Mosaic emitted for each kernel and checks every dot's MXU passes against the MXU
model (:mod:`harness.compile.mosaic_dump`): a mismatch is ``error``; a dump it cannot read leaves the check
``unverified``, with the reason.

This is the library (targets, one compile, its result); the TPU leg uses it before each emulated case, and
``parity compile`` runs it over cases through :mod:`harness.probes.compile_cases`.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from harness.compile.mosaic_dump import MISMATCH, MxuCheck, UNVERIFIED, dump_dir, sub_jaxprs
from harness.compile.mosaic_dump import check as check_mxu
from harness.core.schema import COMPILE_MODE, KERNEL_COLUMNS, MEMORY_COLUMNS, MOSAIC_COLUMNS  # noqa: F401
from harness.core.status import Status
from harness.compile.tpu_env import prepare_environment
from harness.compile.xla_cache import not_written

TARGETS = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "v7x": "TPU7x:2x2x1"}
"""Target name -> jax topology name (``get_topology_desc(topology_name=...)``)."""

COMPILE_DEFAULT_TARGETS = ("v5e", "v6e", "v7x")  # ``parity compile``
LEG_DEFAULT_TARGETS = ("v6e",)  # the emulated TPU leg compiles each case for these

MEMORY_FIELDS = dict(zip(MEMORY_COLUMNS, (  # column -> CompiledMemoryStats attribute (bytes, per chip)
    "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
    "generated_code_size_in_bytes")))
ERROR_CHARS = 500


def parse_targets(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """``"v5e,v6e"`` -> ("v5e", "v6e"); None or "" -> ``default``. Unknown names are a ValueError."""
    if not text:
        return tuple(default)
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise ValueError(f"unknown TPU target(s) {unknown or [text]}; choose from {', '.join(TARGETS)}")
    return names


def versions() -> dict[str, str]:
    """jax, jaxlib and libtpu versions ("not installed" for a missing libtpu)."""
    import jax
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu_version() or "not installed"}


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


_DEVICES: dict[str, Any] = {}


def target_device(target: str):
    """Device 0 of the target's topology (cached per process)."""
    if target not in _DEVICES:
        prepare_environment()
        from jax.experimental import topologies

        topo = topologies.get_topology_desc(topology_name=TARGETS[target], platform="tpu")
        _DEVICES[target] = topo.devices[0]
    return _DEVICES[target]


def compile_lowered(lowered):
    """``lowered.compile()`` for a TPU target, never written to jax's persistent cache: what a compile for a TPU
    is read for (Mosaic's dump, the compiled module) must come from running the compiler
    (:mod:`harness.compile.xla_cache`)."""
    with not_written():
        return lowered.compile()


def first_error_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message``, up to :data:`ERROR_CHARS` characters."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text[:ERROR_CHARS]


# ------------------------------------------------------------------------------- kernels and Mosaic

MOSAIC_CALL = re.compile(r"stablehlo\.custom_call @tpu_custom_call\(.*?(?:kernel_name = \"([^\"]*)\"|$)",
                         re.MULTILINE)
"""One Mosaic kernel in the lowered module's text: a custom call to ``tpu_custom_call`` (one line each), and the
kernel's name, which jax's Mosaic lowering attaches as the ``kernel_name`` attribute."""


@dataclass(frozen=True)
class Kernels:
    """The Pallas kernels of one traced program, by name (a kernel traced twice counts twice).

    ``traced``: one name per kernel equation, each distinct sub-program visited once (as jax lowers it once);
    ``interpreted``: those whose library asked for interpret mode (then lowered natively by the compile);
    ``mosaic``: the kernel names of the lowered module's Mosaic custom calls."""

    traced: tuple[str, ...]
    interpreted: tuple[str, ...] = ()
    mosaic: tuple[str, ...] = ()

    @property
    def missing(self) -> list[str]:
        """Traced kernels with no Mosaic custom call of their name, in trace order. By name, not by count: jax
        may lower two equal kernels of different sub-programs once (jax 0.12 does, for gla's recomputed
        forward), while a kernel lowered some other way lowers so wherever it is traced."""
        mosaic = set(self.mosaic)
        return [name for name in self.traced if name not in mosaic]

    @property
    def counts(self) -> dict[str, int]:
        """:data:`KERNEL_COLUMNS`: traced, and traced that reached Mosaic as their library built them (neither
        missing nor asked by their library for interpret mode)."""
        as_built = _minus(_minus(self.traced, self.missing), self.interpreted)
        return dict(zip(KERNEL_COLUMNS, (len(self.traced), len(as_built))))

    def problem(self) -> str:
        """Why the kernels fail the compile ("" when every kernel reached Mosaic as its library built it)."""
        parts = []
        if self.missing:
            parts.append(f"{_names(self.missing)} did not reach Mosaic (no tpu_custom_call in the lowered program)")
        forced = _minus(self.interpreted, self.missing)
        if forced:
            parts.append(f"{_names(forced)} asked by their library for interpret mode (lowered natively they "
                         "compile, but what it builds for a TPU may differ: pass interpret=False through its "
                         "API, the binding's ctx.interpret)")
        if not parts:
            return ""
        return (f"Mosaic compiled {self.counts['kernels_mosaic']} of {len(self.traced)} kernels as their library "
                "built them; " + "; ".join(parts))


def _minus(names, taken) -> list[str]:
    """``names`` less ``taken``, as multisets, in the order of ``names``."""
    left = collections.Counter(taken)
    out = []
    for name in names:
        if left[name] > 0:
            left[name] -= 1
        else:
            out.append(name)
    return out


def _names(names) -> str:
    counted = collections.Counter(names)
    return ", ".join(n if k == 1 else f"{n} (x{k})" for n, k in counted.items())


def kernel_name(params: Mapping[str, Any]) -> str:
    """A Pallas kernel equation's name as Mosaic's lowering names its custom call: the kernel's ``name``
    (``name_and_src_info.name`` in older jax), else its body's function name, sanitized as jax sanitizes it."""
    from jax._src.interpreters.mlir import sanitize_name  # what the Mosaic lowering applies (jax 0.9 - 0.12)

    name = params.get("name")
    if name is None and params.get("name_and_src_info") is not None:
        name = params["name_and_src_info"].name
    if not name:  # an unnamed kernel (tops', tpu-inference's): named by its body's function
        name = getattr(getattr(params.get("jaxpr"), "debug_info", None), "func_name", None)
    return sanitize_name(str(name)) if name else "unnamed kernel"


def kernel_equations(closed) -> list:
    """The Pallas kernel equations of a traced program ``closed`` (a ClosedJaxpr), in trace order: every equation
    with an ``interpret`` parameter (``pallas_call``, ``core_map``). Sub-programs (jit, vjp, control flow) are
    visited once each, as jax lowers each once; kernel bodies are not entered."""
    from jax.extend.core import ClosedJaxpr

    found: list = []
    seen: set[int] = set()

    def visit(j):
        j = j.jaxpr if isinstance(j, ClosedJaxpr) else j
        if id(j) in seen:
            return
        seen.add(id(j))
        for e in j.eqns:
            if "interpret" in e.params:
                found.append(e)
                continue
            for sub in sub_jaxprs(e):
                visit(sub)

    visit(closed)
    return found


def traced_kernels(closed) -> Kernels:
    """The Pallas kernels of a traced program (:func:`kernel_equations`), ``mosaic`` left empty."""
    eqns = kernel_equations(closed)
    return Kernels(tuple(kernel_name(e.params) for e in eqns),
                   tuple(kernel_name(e.params) for e in eqns if e.params["interpret"]))


@contextlib.contextmanager
def rebound(primitives, wrap, state: threading.local):
    """Inside the block, on this thread (``state.active``), each jax primitive binds through ``wrap(original)``:
    installed once per primitive (a Primitive's ``bind`` is an instance attribute here), it must pass through
    to ``original`` wherever ``state.active`` is off. Used to force what a library cannot be asked for."""
    for prim in primitives:
        if prim is not None and not hasattr(prim.bind, "original"):
            bind = wrap(prim.bind)
            bind.original = prim.bind
            prim.bind = bind
    state.active = True
    try:
        yield
    finally:
        state.active = False


_native = threading.local()


def _native_bind(original):
    def bind(*args, **params):
        if getattr(_native, "active", False) and params.get("interpret"):
            params = {**params, "interpret": False}
        return original(*args, **params)

    return bind


def native_pallas():
    """Inside the block, on this thread, every Pallas kernel is bound with ``interpret=False``, whatever its
    library passed: the mirror of ``pltpu.force_tpu_interpret_mode``, which the emulated run uses. Applies at
    trace time, so a program traced before (jax's caches) must be traced again inside the block."""
    from jax._src.pallas import core as pallas_core  # the Pallas kernel primitives (jax 0.9 - 0.12)
    from jax._src.pallas import pallas_call as pallas_call_module

    kernels = (pallas_call_module.pallas_call_p, getattr(pallas_core, "core_map_p", None))
    return rebound(kernels, _native_bind, _native)


def mosaic_kernels(module_text: str) -> tuple[str, ...]:
    """The kernel names of the Mosaic custom calls in a lowered module's text (``Lowered.as_text()``)."""
    return tuple(m.group(1) or "unnamed kernel" for m in MOSAIC_CALL.finditer(module_text))


@dataclass(frozen=True)
class CompileResult:
    """``status``: ``ok`` (compiled, every kernel by Mosaic); ``error`` (lowering or compilation refused, or a
    kernel that did not reach Mosaic as its library built it: :meth:`Kernels.problem`); or ``unsupported``
    (the kernels' own argument checks raised NotImplementedError while tracing, before any lowering)."""

    target: str
    status: str
    seconds: float
    error: str = ""  # the first error line when not ok
    memory: Mapping[str, int | None] | None = None  # MEMORY_FIELDS columns when ok
    kernels: Kernels | None = None  # None when tracing failed
    mxu: MxuCheck | None = None  # None when nothing was compiled

    @property
    def kernel_counts(self) -> dict[str, int | None]:
        """:data:`KERNEL_COLUMNS` (None each when the program was not traced)."""
        return self.kernels.counts if self.kernels else dict.fromkeys(KERNEL_COLUMNS)

    @property
    def kernel_columns(self) -> dict:
        """The rows' columns: :attr:`kernel_counts` and the MXU check's :data:`MOSAIC_COLUMNS` (None each when
        nothing was compiled)."""
        return {**self.kernel_counts, **(self.mxu.columns if self.mxu else dict.fromkeys(MOSAIC_COLUMNS))}

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def compiled(self) -> bool:
        """Whether Mosaic compiled every kernel as its library built it (not so when the build stopped, or a
        kernel did not reach Mosaic), whatever the MXU check found."""
        return self.memory is not None and self.kernels is not None and not self.kernels.problem()

    @property
    def reason(self) -> str:
        """The row reason: empty when ok, the kernels' refusal when unsupported, what stops the build when it
        did not compile; and for a program that compiled but whose dots Mosaic does not run as the interpret-mode
        model does (:mod:`harness.compile.mosaic_dump`), that: the emulated numbers are not the chip's."""
        if self.ok or self.status == Status.UNSUPPORTED:
            return "" if self.ok else self.error
        if self.compiled:
            return (f"compiled for TPU {self.target}, but not as the interpret-mode model runs it (its numbers "
                    f"would not be the chip's): {self.error}")
        return f"does not compile for TPU {self.target}: {self.error}"

    @property
    def hbm_bytes(self) -> int | None:
        """Arguments + outputs + temporaries - aliased bytes: the program's HBM footprint per chip."""
        m = self.memory or {}
        parts = [m.get(k) for k in ("mem_argument_bytes", "mem_output_bytes", "mem_temp_bytes")]
        if any(p is None for p in parts):
            return None
        return sum(parts) - (m.get("mem_alias_bytes") or 0)


def compile_for(fn, args, target: str) -> CompileResult:
    """Lower and compile ``fn(*args)`` for ``target``; ``args`` is a pytree of arrays or ShapeDtypeStructs.

    Every Pallas kernel is lowered natively and must reach Mosaic (see the module doc). Any failure (libtpu
    missing, lowering refused, Mosaic or XLA:TPU refusing, a kernel not compiled by Mosaic) is returned as a
    result with the first error line, never raised.
    """
    t0 = time.perf_counter()
    stage = "setup"
    kernels = None
    try:
        if libtpu_version() is None:
            raise RuntimeError("libtpu is not installed: pip install -e '.[cpu]' (or '.[tpu]')")
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        device = target_device(target)
        sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
        structs = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
        stage = "trace"
        traced = jax.jit(fn).trace(*structs)
        kernels = traced_kernels(traced.jaxpr)
        if kernels.interpreted:  # the library chose interpret mode: trace again with every kernel native
            jax.clear_caches()  # its jitted functions were traced with its choice
            with native_pallas():
                traced = jax.jit(fn).trace(*structs)
        bodies = [(kernel_name(e.params), e.params["jaxpr"]) for e in kernel_equations(traced.jaxpr)]
        with mosaic_output() as read_mxu:  # some libtpu versions run Mosaic while lowering (0.0.37)
            stage = "lower"
            lowered = traced.lower()
            kernels = Kernels(kernels.traced, kernels.interpreted, mosaic_kernels(lowered.as_text()))
            stage = "compile"
            compiled = compile_lowered(lowered)
            mxu = read_mxu(bodies)
    except Exception as exc:  # noqa: BLE001 - every refusal becomes a result
        # a NotImplementedError while tracing is the kernels' own refusal of a valid case
        status = Status.UNSUPPORTED if stage == "trace" and isinstance(exc, NotImplementedError) else Status.ERROR
        error = first_error_line(exc)
        if kernels is not None and kernels.interpreted:  # say what was compiled
            error = f"{_names(kernels.interpreted)} asked by their library for interpret mode; natively: {error}"
        return CompileResult(target, status, time.perf_counter() - t0, error=error[:ERROR_CHARS], kernels=kernels)
    seconds = time.perf_counter() - t0
    stats = compiled.memory_analysis()
    memory = {col: getattr(stats, attr, None) for col, attr in MEMORY_FIELDS.items()} if stats else {}
    problem = "; ".join(p for p in (kernels.problem(),
                                    f"MXU passes: {mxu.reason}" if mxu.status == MISMATCH else "") if p)
    if problem:  # compiled, but not every kernel by Mosaic as its library built it, or not as the model runs it
        return CompileResult(target, Status.ERROR, seconds, error=problem[:ERROR_CHARS], memory=memory,
                             kernels=kernels, mxu=mxu)
    return CompileResult(target, Status.OK, seconds, memory=memory, kernels=kernels, mxu=mxu)


_COMPILING = threading.Lock()
"""One compile at a time reads the dump directory: what appears there during it is its own kernels'."""


@contextlib.contextmanager
def mosaic_output():
    """Inside the block, this process's compiles are this one's; it yields ``read(bodies)``, which checks every
    kernel's dots (``bodies``: name, traced body) against what Mosaic emitted in the block
    (:mod:`harness.compile.mosaic_dump`)."""
    where = dump_dir()
    with _COMPILING:
        before = where.snapshot()

        def read(bodies) -> MxuCheck:
            if where.path is None:
                return MxuCheck(UNVERIFIED, reason=where.why_not)
            try:
                dumps = where.read_since(before)
            except (OSError, ValueError) as exc:  # a dump this harness cannot read
                return MxuCheck(UNVERIFIED, reason=first_error_line(exc))
            return check_mxu(bodies, dumps)

        yield read
