"""Any team's implementation as the candidate leg: the TPU leg's machinery around someone else's kernels.

An implementation is a Python object (registered with ``--impl NAME=module:object`` or an entry point, see
:mod:`harness.legs.registry`) with

- ``bindings``: a mapping of op name (``simple_gla``, ``gla``, ``kda``) to a
  :class:`harness.ops.base.LegBinding`: ``forward(case, arrays, ctx)`` returns the op's outputs (``o``,
  ``ht``) as jax arrays from the case's input arrays (the names of ``parity cases``'s inputs; ``ctx`` says
  whether to interpret, and can be ignored); ``supports(case)`` returns a reason to refuse a case, or None;
  ``differentiable=False`` marks a forward-only implementation (no backward: its gradient rows are
  ``not_provided``, and the gate says the verdict covers the forward only); ``describe(case)`` adds facts to
  the rows' details. A forward that raises NotImplementedError refuses the case with its message
  (``unsupported``); anything else it raises is an ``error`` row with its first line, never an abort;
- optionally ``version``: the string its rows' ``versions`` record (default: the version of the
  distribution that provides the module);
- optionally ``tests_rule``: the tolerance its own tests hold its outputs to (a JSON-able mapping, the format
  :mod:`harness.report.peer_report` reads), recorded in its rows' settings; ``peers.md`` applies it to the same numbers;
- optionally ``platform``: what its kernels are built for (:data:`PLATFORMS`), ``"tpu"``
  unless it says ``"gpu"``. A GPU implementation (Pallas Mosaic GPU, Triton called from jax) gets none of what
  follows: it runs natively where jax has a GPU, as it is, and refuses every case elsewhere with the reason (no
  interpreter or model of a GPU's arithmetic exists here, and a TPU's would measure the wrong machine).

What the leg adds, so that another team's Pallas kernels run here without their cooperation:

- interpret mode forced on every ``pallas_call`` (``pltpu.force_tpu_interpret_mode``), with uninitialised
  memory poisoned with NaN, as for this project's kernels, and ref reshapes taught to the interpreter
  (:mod:`harness.emulation.pallas_refs`: Mosaic compiles them, the interpreter cannot read them);
- an answer to ``pltpu.get_tpu_info()`` on a machine without a TPU: the info of the chip being compiled
  for (v6e while interpreting), as a kernel that sizes its tiles from it would get on that chip;
- every ``dot_general`` it binds rounded as a TPU's matrix unit rounds it (:func:`mxu_rounding`): XLA:CPU
  computes f32 dots exactly, which would make a kernel look more accurate than on hardware; a dot outside the
  kernels (pure-JAX code) only where XLA:TPU keeps it on the MXU, read from the program it compiles for the
  interpreted chip (:mod:`harness.compile.xla_dots`; the rows' ``details.xla_dots`` say which ran where);
- the same ahead-of-time compile for v5e, v6e and v7x as this project's kernels: a case that does not
  compile is an ``error`` row, and the gate fails it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import sys
import threading

from harness.compile import xla_dots
from harness.emulation.pallas_refs import ref_reshapes
from harness.ops.serving import served_binding
from harness.compile.tpu_compile import rebound

from .base import Leg
from .tpu import TpuLeg, kernel_refusal

CHIPS = {"v5e": "TPU_V5E", "v6e": "TPU_V6E", "v7x": "TPU_7X"}
"""Compile targets (:data:`harness.compile.tpu_compile.TARGETS`) -> jax's ``ChipVersion`` member names."""

INTERPRET_CHIP = "v6e"
"""The chip whose TPU info an interpreted run answers with."""


# ------------------------------------------------------------------------------- MXU rounding of any dot
_local = threading.local()


@contextlib.contextmanager
def unmodelled_dots():
    """Dots bound in this thread inside the block go through as they are, not through the MXU model: the model's
    own passes, and an analysis that builds its own model of a dot (reports/bisect/ejkernel)."""
    inside = getattr(_local, "inside", False)
    _local.inside = True
    try:
        yield
    finally:
        _local.inside = inside


INTERPRETER_EVAL = "_interpret_jaxpr"
"""The function of Pallas's TPU interpreter that binds a traced kernel's eqns one by one (jax 0.10 - 0.12)."""


def _modeled_dot_general(original):
    def bind(*args, **params):
        import jax.numpy as jnp
        from jax import lax

        from kernels_tpu import mxu

        from harness.emulation.pallas_batched import replaying

        a, b = args
        floats = all(jnp.issubdtype(x.dtype, jnp.floating) for x in (a, b))
        # each dot is modeled once, where it is traced; Pallas's interpreter (or the batched grid's) later
        # evaluates the traced kernel eqn by eqn (re-binding the model's own passes), and those go through as they are
        replayed = sys._getframe(1).f_code.co_name == INTERPRETER_EVAL or replaying()
        if (not getattr(_local, "active", False) or getattr(_local, "inside", False) or replayed or not floats
                or jnp.float16 in (a.dtype, b.dtype)):
            return original(*args, **params)
        dims = params["dimension_numbers"]
        out_dtype = params.get("preferred_element_type") or jnp.result_type(a.dtype, b.dtype)
        xla = getattr(_local, "xla", None)  # a dot XLA:TPU computes off the MXU runs in f32, as there
        if xla is not None:
            sig = xla_dots.signature(a, b, dims, params.get("preferred_element_type"))
            if not xla.on_mxu(sig):
                return original(*args, **params)
            if (sig in xla.kernel and sig not in xla.sites
                    and mxu.on_vector_unit(a.shape, a.dtype, b.shape, b.dtype, dims)):
                return mxu.vector_unit_dot(a, b, dims).astype(out_dtype)  # a kernel's: Mosaic runs it on the VPU
        if a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16:  # one exact pass, as the MXU does: counted only
            mxu.record_dot(a.shape, b.shape, dims, passes=1)
            return original(*args, **params)
        precision = params.get("precision")
        precision = (precision[0] if isinstance(precision, tuple) else precision) or lax.Precision.DEFAULT
        if precision != lax.Precision.DEFAULT:  # HIGH, HIGHEST: the MXU takes them on f32 operands
            a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        passes = mxu.mxu_passes(precision, a.dtype, b.dtype, pallas=False)
        mxu.record_dot(a.shape, b.shape, dims, len(passes))
        return modeled_dot_p().bind(a, b, passes=passes, dimension_numbers=dims,
                                    precision=precision).astype(out_dtype)

    return bind


@functools.cache
def modeled_dot_p():
    """The MXU model of one dot (``kernels_tpu.mxu.modeled_dot``: its ``passes``, f32 result) as a jax primitive
    that is bilinear as ``lax.dot_general`` is, so that autodiff differentiates the dot, not the model.

    The model splits its operands into bf16 pieces with bit masks, whose derivative is zero: differentiated as
    written, every gradient through a candidate's pure-JAX dot would be zero. A TPU differentiates the dot itself
    and runs its two cotangent dots on the MXU too, at the dot's precision. So is it here: the transpose rules are
    ``lax.dot_general``'s own, whose cotangent dots go back through :func:`mxu_rounding` (modeled in turn, at
    the dot's precision). The tangent of the dot (forward mode, and a linearisation) is the same primitive on the
    tangent, linear in it, which is what lets jax transpose a dot that another primitive's derivative makes
    (``solve_triangular``'s, whose JVP multiplies tangents: a ``custom_vjp`` there could not be transposed,
    "Transpose rule ... for 'custom_vjp_call' not implemented"). It batches into a dot with one more batch axis."""
    import inspect

    import jax.numpy as jnp
    from jax._src import dispatch
    from jax._src.core import ShapedArray
    from jax._src.lax import lax as lax_internal
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    from kernels_tpu import mxu

    prim = Primitive("mxu_modeled_dot")

    def evaluate(a, b, *, passes, dimension_numbers, precision):
        del precision  # the passes say it
        with unmodelled_dots():  # the passes' own dots are the model's
            return mxu.modeled_dot(a, b, passes, dimension_numbers, record=False)

    def abstract(a, b, *, passes, dimension_numbers, precision):
        del passes, precision
        (ca, cb), (ba, bb) = dimension_numbers
        free_a = [n for i, n in enumerate(a.shape) if i not in ca and i not in ba]
        free_b = [n for i, n in enumerate(b.shape) if i not in cb and i not in bb]
        return ShapedArray((*(a.shape[i] for i in ba), *free_a, *free_b), jnp.float32)

    takes_sharding = "out_sharding" in inspect.signature(lax_internal._dot_general_transpose_lhs).parameters

    def transpose(rule, cotangent, x, y, *, passes, dimension_numbers, precision):
        del passes  # the cotangent dots are modeled where lax.dot_general binds them
        sharding = {"out_sharding": None} if takes_sharding else {}
        return rule(cotangent, x, y, dimension_numbers=dimension_numbers, precision=precision,
                    preferred_element_type=jnp.float32, **sharding)

    def batch(args, axes, *, passes, dimension_numbers, precision):
        size = next(x.shape[d] for x, d in zip(args, axes) if d is not None)
        a, b = (jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *x.shape))
                for x, d in zip(args, axes))
        (ca, cb), (ba, bb) = dimension_numbers
        shift = lambda dims: tuple(i + 1 for i in dims)  # noqa: E731
        dims = ((shift(ca), shift(cb)), ((0, *shift(ba)), (0, *shift(bb))))
        return prim.bind(a, b, passes=passes, dimension_numbers=dims, precision=precision), 0

    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(abstract)
    mlir.register_lowering(prim, mlir.lower_fun(evaluate, multiple_results=False))
    ad.defbilinear(prim, functools.partial(transpose, lax_internal._dot_general_transpose_lhs),
                   functools.partial(transpose, lax_internal._dot_general_transpose_rhs))
    batching.primitive_batchers[prim] = batch
    return prim


def mxu_rounding():
    """Inside the block, on this thread, every ``lax.dot_general`` with an f32 operand computes as a TPU's
    MXU does at its stated precision (kernels_tpu.mxu's model, ``mxu_passes``: DEFAULT one bf16 pass, HIGH
    three, HIGHEST six, split as Mosaic splits them), and reports its modeled work to an active
    ``kernels_tpu.mxu.tally_mxu_work``. Two bf16 operands
    are left alone (exact products, f32 accumulation, as on the MXU). Applies at trace time, so jitted code
    must be traced inside the block (the leg clears jax's caches around it)."""
    from jax import lax

    return rebound((lax.dot_general_p,), _modeled_dot_general, _local)


# ------------------------------------------------------------------------------- TPU info, interpret mode
@contextlib.contextmanager
def tpu_info_for(target: str):
    """``pltpu.get_tpu_info()`` answers with ``target``'s chip where the default device is not a TPU (jax
    raises "Unsupported TPU device kind: cpu" otherwise). jax's own per-device-kind registry, restored after."""
    import jax
    from jax._src.pallas.mosaic import tpu_info  # the registry get_tpu_info consults (jax 0.10 - 0.12)

    kind = jax.devices()[0].device_kind
    chip = getattr(tpu_info.ChipVersion, CHIPS[target])
    before = tpu_info.registry.get(kind)
    tpu_info.registry[kind] = lambda: tpu_info.get_tpu_info_for_chip(chip, 1)
    tpu_info.get_tpu_info.cache_clear()  # it memoises its answer
    try:
        yield
    finally:
        if before is None:
            tpu_info.registry.pop(kind, None)
        else:
            tpu_info.registry[kind] = before
        tpu_info.get_tpu_info.cache_clear()


# ------------------------------------------------------------------------------- a TPU host's runtime
HOST_QUERIES = ("default_backend", "devices", "local_devices", "device_count", "local_device_count")
"""The runtime queries of ``jax`` that :func:`tpu_host` answers as a TPU host would."""

TPU_HOST = ("while compiling for a TPU target, jax.default_backend() answers 'tpu' and jax.devices(), "
            "jax.local_devices() that target's chip (harness.legs.external.tpu_host), as on a TPU host")
"""What the compile rows' settings (and ``parity compile``'s ``program``) say was done."""

_host = threading.local()
_host_lock = threading.Lock()
_host_users = [0]


def _host_query(name: str, original, device):
    def answer(*args, **kwargs):
        target = getattr(_host, "device", None)
        if target is None:  # another thread, or outside the block: the real runtime
            return original(*args, **kwargs)
        position = 1 if name == "local_devices" else 0  # local_devices(process_index, backend, host_id)
        backend = kwargs.get("backend", args[position] if len(args) > position else None)
        backend = getattr(backend, "platform", backend)  # a client, or its platform's name
        if backend not in (None, target.platform):  # an explicit other platform: the real one
            return original(*args, **kwargs)
        if name == "default_backend":
            return target.platform  # the topology's devices are TPUs
        if name in ("devices", "local_devices"):
            return [target]
        return 1  # device_count, local_device_count: the one chip compiled for

    answer.original = original
    return answer


@contextlib.contextmanager
def tpu_host(target: str):
    """Inside the block, on this thread, the runtime queries a library may use to choose interpret mode
    (:data:`HOST_QUERIES`) answer as a one-chip host of ``target`` would: ``jax.default_backend()`` is
    ``"tpu"``, ``jax.devices()`` and ``jax.local_devices()`` are ``[device 0 of the target's topology]`` (its
    ``platform`` is ``"tpu"``, its ``device_kind`` the chip's), the device counts 1. A query naming another
    backend, and every query on other threads, get the real answer; jax's own internals, which call its
    private runtime, are untouched. The public functions are replaced on entry and restored when the last
    block exits. A library that caches its answer at module level (tops' ``is_tpu_runtime``) keeps what it
    cached first."""
    import jax

    from harness.compile.tpu_compile import target_device

    device = target_device(target)
    with _host_lock:
        if _host_users[0] == 0:
            for name in HOST_QUERIES:
                setattr(jax, name, _host_query(name, getattr(jax, name), device))
        _host_users[0] += 1
    before = getattr(_host, "device", None)
    _host.device = device
    try:
        yield
    finally:
        _host.device = before
        with _host_lock:
            _host_users[0] -= 1
            if _host_users[0] == 0:
                for name in HOST_QUERIES:
                    setattr(jax, name, getattr(jax, name).original)


# ------------------------------------------------------------------------------- the leg
def load(target: str):
    """The object at ``module:object``."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def implementation_version(impl, target: str) -> str:
    """The rows' version of an implementation: its ``version``; else that of the distribution it names
    (``distribution``: a binding shipped apart from the kernels it binds, as ``peers/`` are); else that of the
    distribution providing its module."""
    version = getattr(impl, "version", None)
    if version:
        return str(version)
    named = getattr(impl, "distribution", None)
    top = target.split(":", 1)[0].split(".", 1)[0]
    for dist in [named] if named else importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            return f"{dist} (not installed)"
    return "unversioned"


# ------------------------------------------------------------------------------- the platform
PLATFORMS = ("tpu", "gpu")
"""What an implementation's kernels are built for (its object's optional ``platform``; the first is the default):
Pallas TPU kernels (native on a TPU, else interpret mode, the MXU model and the TPU compile), or kernels for a GPU
(native on a GPU only; every case refused elsewhere)."""
DEFAULT_PLATFORM, GPU_PLATFORM = PLATFORMS


def implementation_platform(impl) -> str:
    """The implementation's ``platform`` (:data:`PLATFORMS`; an object that names none is the default's), or a
    ValueError of one line."""
    platform = getattr(impl, "platform", DEFAULT_PLATFORM)
    if platform not in PLATFORMS:
        raise ValueError(f"platform {platform!r} must be one of {PLATFORMS}")
    return platform


GPU_ONLY = "GPU: its kernels run natively on a GPU only (never interpreted, modeled or compiled for a TPU)"
"""What the rows' settings say (``platform``) of an implementation that declares platform = "gpu"."""


def gpu_available() -> bool:
    import jax

    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def off_gpu(target: str) -> str:
    """Why a GPU implementation refuses every case on this machine."""
    import jax

    return (f"the implementation {target} declares platform 'gpu': its kernels run natively on a GPU only (this "
            f"harness has no interpreter or arithmetic model of a GPU), and jax's default backend here is "
            f"{jax.default_backend()!r}")


# ------------------------------------------------------------------------------- declared dtypes
RETURNED_DTYPES = "returned_dtypes"
"""The details key naming each tensor a candidate returned in another dtype than its op declares."""


def as_declared(op, case, out):
    """``out`` with every tensor in the dtype its op declares (``TensorSpec.resolve_dtype``), rounded to nearest
    even where the candidate returned another one, and the dtypes that came back named in the details.

    A candidate that returns a bf16 case's o in float32 returns precision its users never see: their model holds o
    in bf16. Compared as returned, it would pass on that difference (rel-L2 3e-6 against fla's bf16 2.4e-3); compared
    as the declared dtype holds it, it passes or fails on its arithmetic alone."""
    import dataclasses

    import numpy as np

    from cases.inputs import NP_DTYPES, quantize

    declared = {spec.name: spec.resolve_dtype(case) for spec in op.tensors(case)}
    tensors, returned = dict(out.tensors), {}
    for name, y in out.tensors.items():
        if y is None or name not in declared:
            continue
        y = np.asarray(y)
        if y.dtype != np.dtype(NP_DTYPES[declared[name]]):
            returned[name] = f"{y.dtype} returned, compared as {declared[name]}"
            tensors[name] = quantize(y, declared[name])
    if not returned:
        return out
    return dataclasses.replace(out, tensors=tensors, details={**out.details, RETURNED_DTYPES: returned})


class ExternalLeg(TpuLeg):
    """The candidate leg ``name``, running the implementation at ``target`` (see the module doc)."""

    compile_note = TPU_HOST  # what ``parity compile``'s rows say of how the program was traced

    def __init__(self, name: str, target: str, force_interpret: bool = False,
                 compile_targets: tuple[str, ...] | None = None, batched_grid: bool = True):
        super().__init__(force_interpret=force_interpret, compile_targets=compile_targets, batched_grid=batched_grid)
        self.name, self.target = name, target
        self._impl = None
        self._lock = threading.Lock()  # the compile (a thread beside the run) and the run trace apart
        # its object declares platform = "gpu" (PLATFORMS), read where the leg is built
        self.gpu_only = self._declares_gpu()
        if self.gpu_only:  # native where jax has a GPU; never interpreted, modeled or TPU-compiled
            self.native = gpu_available() and not force_interpret
            self.compile_targets = ()

    def _declares_gpu(self) -> bool:
        """Whether its object declares platform = "gpu"; an unknown platform is a one-line ValueError. A target
        that does not load is not judged here: it fails where it is used, with its own error."""
        try:
            impl = self.impl
        except Exception:  # noqa: BLE001 - the load's error belongs to the first use (harness.legs.registry)
            return False
        try:
            return implementation_platform(impl) == GPU_PLATFORM
        except ValueError as exc:
            raise ValueError(f"implementation {self.name}={self.target}: {exc}") from None

    @property
    def impl(self):
        if self._impl is None:
            self._impl = load(self.target)
        return self._impl

    def binding(self, op):
        # the serving options (a state pool, decode chains) are applied around it, as around the built-in legs'
        return served_binding(op, dict(getattr(self.impl, "bindings", {})).get(op.name))

    def environment(self):
        env = super().environment()
        settings = {k: v for k, v in env.settings.items() if k != "dot_policy"}
        device = env.device
        if self.gpu_only:  # nothing of the TPU leg's emulation applies
            settings = {k: v for k, v in settings.items() if k not in ("compile_targets", "xla_compiler_options")}
            settings.update(implementation=self.target, platform=GPU_ONLY, interpret="None (never interpreted)",
                            mxu_model="none: the GPU's own arithmetic")
            if not self.native:
                import jax

                device = f"{jax.default_backend()} (no GPU: every case refused)"
        else:
            settings.update(implementation=self.target,
                            mxu_model=("every dot_general rounded as the MXU does "
                                       "(harness.legs.external.mxu_rounding)" if not self.native else "hardware"),
                            tpu_info=f"{INTERPRET_CHIP} while interpreting; each target's own when compiling",
                            tpu_host=TPU_HOST)
        rule = getattr(self.impl, "tests_rule", None)
        if rule:  # its own tests' tolerance, for peers.md (harness.report.peer_report)
            settings["tests_rule"] = rule
        versions = {**env.versions, self.name: implementation_version(self.impl, self.target)}
        return type(env)(mode=env.mode, device=device, versions=versions, settings=settings)

    def supports(self, op, case):
        if self.binding(op) is None:
            return f"the implementation {self.target} has no binding for {op.name}"
        if self.gpu_only:  # the binding's own reason first (it may say more), then the machine's
            return (Leg.supports(self, op, case) or (None if self.native else off_gpu(self.target))
                    or kernel_refusal(op, case, self.binding(op)))
        with tpu_info_for(INTERPRET_CHIP):  # the refusal check traces the forward, as the run does
            return super().supports(op, case)

    def compile_for(self, compile_for, fn, arrays, target: str):
        import jax

        jax.clear_caches()  # a library's jitted code traced under the real runtime chose for it
        try:
            with tpu_info_for(target), tpu_host(target):
                return compile_for(fn, (arrays,), target)
        finally:
            jax.clear_caches()  # nor does a trace made as a TPU host reach the run

    def preflight(self, op, case, inputs):
        import jax

        with self._lock:
            jax.clear_caches()  # no trace made under the MXU model reaches the real compiler
            return super().preflight(op, case, inputs)

    def run(self, op, case, inputs):
        return as_declared(op, case, self._run(op, case, inputs))

    def _run(self, op, case, inputs):
        import jax

        if self.native:
            return super().run(op, case, inputs)
        if self.gpu_only:  # supports refused it already; never interpreted as a TPU kernel
            raise NotImplementedError(off_gpu(self.target))
        import dataclasses

        from jax.experimental.pallas import tpu as pltpu

        from .tpu import NATIVE, device_arrays, program

        with self._lock:
            jax.clear_caches()
            try:
                with tpu_info_for(INTERPRET_CHIP):  # which dots outside the kernels XLA:TPU puts on the MXU
                    xla = xla_dots.read(program(op, case, NATIVE, binding=self.binding(op)),
                                        (device_arrays(inputs),), INTERPRET_CHIP)
                jax.clear_caches()
                _local.xla = xla
                with tpu_info_for(INTERPRET_CHIP), mxu_rounding(), ref_reshapes(), \
                        pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(uninitialized_memory="nan")):
                    out = super().run(op, case, inputs)
                if not xla.outside and not xla.reason:  # every dot is a kernel's: nothing to say
                    return out
                return dataclasses.replace(out, details={**out.details, "xla_dots": xla.summary()})
            finally:
                _local.xla = None
                jax.clear_caches()
