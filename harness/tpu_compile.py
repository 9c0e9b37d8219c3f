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

This is the library (targets, one compile, its result); the TPU leg uses it before each emulated case, and
``parity compile`` runs it over cases through :mod:`harness.compile_cases`.
"""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .status import Status
from .tpu_env import prepare_environment

TARGETS = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "v7x": "TPU7x:2x2x1"}
"""Target name -> jax topology name (``get_topology_desc(topology_name=...)``)."""

COMPILE_DEFAULT_TARGETS = ("v5e", "v6e", "v7x")  # ``parity compile``
LEG_DEFAULT_TARGETS = ("v6e",)  # the emulated TPU leg compiles each case for these

MEMORY_FIELDS = {  # column -> CompiledMemoryStats attribute (bytes, per chip)
    "mem_argument_bytes": "argument_size_in_bytes",
    "mem_output_bytes": "output_size_in_bytes",
    "mem_alias_bytes": "alias_size_in_bytes",
    "mem_temp_bytes": "temp_size_in_bytes",
    "mem_code_bytes": "generated_code_size_in_bytes",
}
ERROR_CHARS = 500
COMPILE_MODE = "aot"
"""compile.csv's ``mode``: compiled ahead of time by libtpu for a TPU topology; nothing ran on a TPU."""


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


def first_error_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message``, up to :data:`ERROR_CHARS` characters."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text[:ERROR_CHARS]


@dataclass(frozen=True)
class CompileResult:
    """``status``: ``ok``; ``error`` (lowering or compilation refused); or ``unsupported`` (the kernels'
    own argument checks raised NotImplementedError while tracing, before any lowering)."""

    target: str
    status: str
    seconds: float
    error: str = ""  # the first error line when not ok
    memory: Mapping[str, int | None] | None = None  # MEMORY_FIELDS columns when ok

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def reason(self) -> str:
        """The row reason: empty when ok, the kernels' refusal when unsupported, else what stops the build."""
        if self.ok or self.status == Status.UNSUPPORTED:
            return "" if self.ok else self.error
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

    Any failure (libtpu missing, lowering refused, Mosaic or XLA:TPU refusing)
    is returned as a result with the first error line, never raised.
    """
    t0 = time.perf_counter()
    stage = "setup"
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
        stage = "lower"
        lowered = traced.lower()
        stage = "compile"
        compiled = lowered.compile()
    except Exception as exc:  # noqa: BLE001 - every refusal becomes a result
        # a NotImplementedError while tracing is the kernels' own refusal of a valid case
        status = Status.UNSUPPORTED if stage == "trace" and isinstance(exc, NotImplementedError) else Status.ERROR
        return CompileResult(target, status, time.perf_counter() - t0, error=first_error_line(exc))
    seconds = time.perf_counter() - t0
    stats = compiled.memory_analysis()
    memory = {col: getattr(stats, attr, None) for col, attr in MEMORY_FIELDS.items()} if stats else {}
    return CompileResult(target, Status.OK, seconds, memory=memory)
