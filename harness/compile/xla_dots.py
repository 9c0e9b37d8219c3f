"""Which ``dot_general``s outside Pallas kernels XLA:TPU runs on the MXU, read from the program it compiled.

A candidate's pure-JAX code (sglang-jax's GDN forms, a ``lax.scan`` recurrence) is compiled by XLA:TPU, which
decides per dot whether the matrix unit computes it: a dot it keeps becomes a ``convolution`` (or ``dot``)
instruction of the optimized module, its f32 operands rounded to bf16 at DEFAULT precision; one it fuses away
becomes f32 multiplies and a reduce on the vector unit, no bf16 anywhere. Which one happens depends on XLA's
fusion passes, not on the dot alone: a lone batched matrix-vector einsum stays a convolution, while the same
einsum inside sglang-jax's decode step is fused into an f32 multiply-reduce. So the emulated leg asks the
compiler: it compiles the case's program for the interpreted chip (deviceless, as the compile step does), and
reads each MXU instruction's source location (the module's stack frame tables: the innermost user frame, file and
line), which the traced program's equations also carry. Running the case, a dot outside the kernels (recognised by
its :func:`signature`) is rounded as the MXU rounds it only when XLA put the dots of that signature's source lines
on the MXU; otherwise it is computed in f32, as XLA:TPU computes it. Dots inside Pallas kernels
are Mosaic's (always the MXU; their passes checked against Mosaic's own output by the compile step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

Site = tuple[str, int]
"""(file name, line) of the innermost user frame that made a dot."""

MXU_INSTRUCTION = re.compile(r"=\s*\S+\s+(convolution|dot)\(.*stack_frame_id=(\d+)")
TABLE_ENTRY = re.compile(r"^(\d+)\s+(.*)$")


def _tables(hlo_text: str) -> dict[str, dict[int, str]]:
    """The module's ``FileNames``, ``FileLocations`` and ``StackFrames`` tables: id -> entry text."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
        elif current is not None and (m := TABLE_ENTRY.match(line)):
            current[int(m.group(1))] = m.group(2)
        elif current is not None and line.strip():
            current = None
    return tables


def mxu_sites(hlo_text: str) -> frozenset[Site]:
    """The source sites of the MXU instructions (``convolution``, ``dot``) of an optimized XLA:TPU module's text
    (``compiled.as_text()``); Mosaic's kernels are custom calls, not counted here."""
    t = _tables(hlo_text)
    files = {i: text.strip('"') for i, text in t.get("FileNames", {}).items()}
    locations = {}
    for i, text in t.get("FileLocations", {}).items():
        f, line = re.search(r"file_name_id=(\d+)", text), re.search(r"\bline=(\d+)", text)
        if f and line:
            locations[i] = (files.get(int(f.group(1)), "?"), int(line.group(1)))
    frames = {i: int(m.group(1)) for i, text in t.get("StackFrames", {}).items()
              if (m := re.search(r"file_location_id=(\d+)", text))}
    sites = set()
    for line in hlo_text.splitlines():
        if (m := MXU_INSTRUCTION.search(line)) and int(m.group(2)) in frames:
            sites.add(locations.get(frames[int(m.group(2))]))
    return frozenset(s for s in sites if s)


def site_of(traceback) -> Site | None:
    """The innermost user frame of a jax traceback (an equation's ``source_info.traceback``, or the current one)."""
    from jax._src import source_info_util

    frame = source_info_util.user_frame(traceback)
    return None if frame is None else (frame.file_name, frame.start_line)


Signature = tuple
"""What a dot looks like where it is bound: its operands' shapes and dtypes, its dimension numbers and result
type. Bound inside nested traces (``jnp.einsum`` is itself jitted), a dot's Python stack no longer shows the line
that made it, so the run recognises a dot by its signature: the traced program maps each signature to the sites
that made it."""


def signature(a, b, dimension_numbers, preferred_element_type) -> Signature:
    dims = tuple(tuple(tuple(int(i) for i in part) for part in pair) for pair in dimension_numbers)
    return (tuple(a.shape), str(a.dtype), tuple(b.shape), str(b.dtype), dims, str(preferred_element_type))


@dataclass(frozen=True)
class XlaDots:
    """What the compiled program says of a case's dots outside Pallas kernels: for each signature, the sites that
    made one (``sites``); the sites XLA:TPU put on the MXU (``mxu``); the signatures of dots inside kernels
    (``kernel``); ``reason`` when the compile could not say (then every dot is rounded, as before)."""

    sites: dict = field(default_factory=dict)  # Signature -> frozenset[Site]
    kernel: frozenset = frozenset()  # Signatures
    mxu: frozenset = frozenset()  # Sites
    reason: str = ""

    @property
    def outside(self) -> frozenset:
        return frozenset().union(*self.sites.values()) if self.sites else frozenset()

    def on_mxu(self, sig: Signature) -> bool:
        """Whether a dot of this signature runs on the MXU: a kernel's always; one outside the kernels where XLA
        kept every dot of that signature's sites on the MXU (sites that disagree: rounded, and the summary says
        so); every dot when the compile could not say, or one the traced program did not have."""
        if self.reason or sig in self.kernel or sig not in self.sites:
            return True
        return bool(self.sites[sig] & self.mxu)

    def summary(self) -> dict:
        if self.reason:
            return {"unverified": self.reason}
        outside = self.outside
        out = {"outside_kernels": len(outside), "on_mxu": len(outside & self.mxu),
               "on_vpu_f32": sorted(f"{f.rsplit('/', 1)[-1]}:{n}" for f, n in outside - self.mxu)}
        mixed = [sig for sig, sites in self.sites.items() if sites & self.mxu and sites - self.mxu]
        if mixed:
            out["mixed_signatures"] = len(mixed)  # one shape made on and off the MXU: rounded everywhere
        return out


def dot_sites(closed) -> tuple[dict, frozenset]:
    """(outside, kernel): a traced program's dot_generals outside Pallas kernels, signature -> the sites that made
    them, and the signatures of those inside kernels."""
    from harness.compile.mosaic_dump import sub_jaxprs

    outside: dict = {}
    kernel = set()

    def walk(jaxpr, in_kernel):
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                a, b = (v.aval for v in eqn.invars)
                sig = signature(a, b, eqn.params["dimension_numbers"], eqn.params.get("preferred_element_type"))
                if in_kernel:
                    kernel.add(sig)
                elif (site := site_of(eqn.source_info.traceback)) is not None:
                    outside.setdefault(sig, set()).add(site)
            entering = in_kernel or "interpret" in eqn.params  # pallas_call / core_map: a kernel body
            for sub in sub_jaxprs(eqn):
                walk(sub, entering)

    walk(closed, False)
    return {sig: frozenset(sites) for sig, sites in outside.items()}, frozenset(kernel)


def read(fn, args, target: str) -> XlaDots:
    """Trace ``fn(*args)`` with every Pallas kernel native, and when it has dots outside its kernels, compile it
    for ``target`` (deviceless) and read which of them XLA:TPU put on the MXU. Never raises: a program that
    cannot be compiled says why (``reason``), and its dots are all rounded."""
    try:
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from harness.compile.tpu_compile import compile_lowered, native_pallas, target_device

        device = target_device(target)
        sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
        structs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
        with native_pallas():
            traced = jax.jit(fn).trace(*structs)
        sites, kernel = dot_sites(traced.jaxpr)
        if not sites:
            return XlaDots(sites, kernel)
        return XlaDots(sites, kernel, mxu_sites(compile_lowered(traced.lower()).as_text()))
    except Exception as exc:  # noqa: BLE001 - the run goes on with every dot rounded, and its rows say why
        return XlaDots(reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
