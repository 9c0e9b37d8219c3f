"""The TPU leg: ``kernels_tpu`` Pallas kernels, native on a TPU, interpreted on CPU.

Native when JAX sees a TPU device. Otherwise the same bindings run in Pallas
TPU interpret mode with uninitialised memory poisoned with NaN (a kernel that
reads scratch or output it never wrote yields NaN, which always fails) and the
MXU rounding model of ``kernels_tpu.mxu`` switched on, so float32 dots round
as the matrix unit would instead of XLA:CPU's exact float32.

Gradients come from ``jax.vjp`` through the kernels' ``custom_vjp`` with the
case's ``do`` (and ``dht``, zeros when the case has none).

Interpret mode is not evidence that a kernel builds for a TPU: when emulating,
the leg first compiles every case's forward and backward for real TPU targets
(default v6e) with libtpu (``preflight``); a case that does not compile, or one of whose kernels is not
compiled by Mosaic (:mod:`harness.compile.tpu_compile`), is an ``error`` row whose reason starts ``does not compile
for TPU <target>:``; one that compiled but whose MXU passes are not the model's (:mod:`harness.compile.mosaic_dump`),
an ``error`` row whose reason starts ``compiled for TPU <target>, but not as the interpret-mode model runs it``.
The rows carry the kernel counts (``kernels_traced``, ``kernels_mosaic``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from cases.case import Case
from cases.inputs import Inputs
from harness.ops.base import OpDescriptor, call_k_first, grad_name
from harness.core.memory import GIB_PER_JOB, available_gib, resident_fraction
from harness.core.status import Status

from .base import BackwardFailed, Environment, Leg, LegOutput, cotangent_pairs


@dataclass(frozen=True)
class TpuContext:
    """Passed to TPU bindings: how to run the kernels."""

    interpret: Any  # None natively, a pltpu.InterpretParams in interpret mode
    mxu_model: bool
    compiler_options: tuple[tuple[str, Any], ...] = ()  # XLA options of the eager run's two programs
    # interpret mode: the parallel grid axes of each pallas_call in one pass (harness.emulation.pallas_batched), the
    # default; False: jax's per-program interpret mode (the same rows, bit for bit: GRIDS)
    batched_grid: bool = False


INTERPRET_COMPILER_OPTIONS = (("xla_backend_optimization_level", 1), ("xla_cpu_use_fusion_emitters", False))
"""How XLA:CPU compiles an interpret-mode run (its forward program and its backward program): at level 1, with
every float product and transcendental fenced so that it rounds as written (:mod:`harness.emulation.rounding`: a
TPU's vector unit has no fused multiply-add, and XLA:CPU's code generator would contract ``a * b + c`` into one
at any level above 0), by XLA:CPU's loop emitters. Both grid interpreters apply the fences, and under them both
give the same rows at these options (smoke: 242 tensors, 0 differ).

Why these two (reports/bench/2026-11-29-rounding-fence, gdn and kda B1-T2048-H4 on an idle 2-core machine):
- level 1 runs 4x faster than level 0 (warm: 0.63 s against 2.45 s), and with the fences levels 1 to 3 give the
  same bits;
- the loop emitters compile faster than the fusion emitters (first run with the compile: 5.6-6.3 s against
  7.8-8.3 s; 8.3 s at level 0 with the fusion emitters), and run about as fast (0.63 against 0.54 s warm). A
  suite's small cases are compile time: at level 1 with the fusion emitters CI's tests of the leg took 22% more
  CPU than at level 0.

Until 2026-11-29 the leg compiled at level 0 with the fusion emitters, where nothing is contracted, but where
``tanh``, ``log1p``, ``expm1`` and ``rsqrt`` round differently fused behind another operation than alone; and
before 2026-11-28 with the loop emitters at level 0 and no fences, where the two grids differed in simple_gla's
backward (``dq``, ``dg``) in the last bit. The rows that moved are listed in reports/bench/2026-11-29-rounding-fence.
jax 0.12's XLA has no loop emitters, and refuses the option: see :func:`interpret_options`."""

LEVEL_0_OPTIONS = (("xla_backend_optimization_level", 0),)
"""The options where this jax cannot run the grid interpreters that apply the fences
(:func:`harness.emulation.pallas_batched.unavailable`), or where its XLA refuses :data:`INTERPRET_COMPILER_OPTIONS`:
level 0 and XLA's default emitters, where LLVM contracts nothing."""


@functools.cache
def interpret_options() -> tuple[tuple[str, Any], ...]:
    """The compiler options of this process's interpret-mode runs: :data:`INTERPRET_COMPILER_OPTIONS` where the
    fences apply and XLA:CPU takes the options (jax 0.10), else :data:`LEVEL_0_OPTIONS` (jax 0.9 and 0.12)."""
    import jax

    from harness.emulation.pallas_batched import unavailable

    if unavailable() is not None:
        return LEVEL_0_OPTIONS
    try:  # an option XLA does not have fails the compile: ask once, on a one-operation program
        jax.jit(lambda x: x + 1, compiler_options=dict(INTERPRET_COMPILER_OPTIONS)).lower(1.0).compile()
    except Exception:  # jax raises XLA's INVALID_ARGUMENT ("No such compile option") as a JaxRuntimeError
        return LEVEL_0_OPTIONS
    return INTERPRET_COMPILER_OPTIONS


GRIDS = ("batched", "per-program")
"""How an emulated leg walks each kernel launch's grid (its ``batched_grid`` keyword; ``parity run --grid``;
harness.app.settings.LegOptions). ``batched`` (the default): for this leg the batched grid interpreter
(:mod:`harness.emulation.pallas_batched`: the parallel programs together, each kernel's carry-free part before the
sequential walk), 3-24x faster on long sequences. ``per-program``: jax's own TPU interpret mode, one program after
another. Both compile with :data:`INTERPRET_COMPILER_OPTIONS` (XLA:CPU's loop emitters) and give the same rows
bit for bit (benchmarks/pallas_grid_rows.py; reports/bench/2026-11-28-default-grid). The rows record which ran
(settings ``pallas_grid``, and each kernel's plan in the row's details) and are cached apart."""


CLEAR_ABOVE = 0.25
"""The share of physical memory above which the TPU leg frees jax's compiled programs between cases."""


def tpu_available() -> bool:
    import jax

    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


def _diff_names(op: OpDescriptor, case: Case, binding) -> tuple[str, ...]:
    return tuple(op.differentiable(case)) if binding.differentiable else ()


def program(op: OpDescriptor, case: Case, ctx: TpuContext, tally=None, binding=None):
    """The TPU leg's computation of a case as one function of the input arrays.

    ``fn(arrays) -> (outputs, grads)``: the binding's forward, then its
    ``jax.vjp`` with the case's cotangents (``do``; ``dht``, zeros when the case
    has none). The emulated run calls it as two programs (:func:`_stages`);
    :mod:`harness.compile.tpu_compile` compiles the very same function for real TPU targets. With a
    ``kernels_tpu.mxu.MxuTally`` (emulated runs only) the forward's modeled MXU
    work is tallied as phase "forward" and the rest as "backward". ``binding`` defaults to the op's own
    TPU binding; a forward-only binding (``differentiable=False``) returns no gradients.
    """
    import jax
    import jax.numpy as jnp

    binding = op.pallas if binding is None else binding
    diff_names = _diff_names(op, case, binding)
    forward_only, forward_vjp, backward, _ = _stages(binding, case.replace(seed=0), ctx, diff_names)

    def fn(arrays):
        if not diff_names:  # forward only: nothing to differentiate, no gradients
            return forward_only(arrays), {}
        primals = {n: arrays[n] for n in diff_names}
        outputs, vjp = forward_vjp(primals, {n: a for n, a in arrays.items() if n not in primals})
        if tally is not None:
            jax.block_until_ready(outputs)
            jax.effects_barrier()  # the forward's dots have reported
            tally.phase = "backward"
        # zeros for an output no loss term reads (a conv state: the vjp takes one cotangent per output)
        cotangents = {name: jnp.zeros_like(value) for name, value in outputs.items()}
        for out_name, cot_name in cotangent_pairs(op, case, outputs):
            value = outputs[out_name]
            cot = arrays.get(cot_name) if cot_name else None
            cotangents[out_name] = jnp.zeros_like(value) if cot is None else cot.astype(value.dtype)
        try:
            (grads,) = backward(vjp, cotangents)
        except Exception as exc:  # the forward's numbers are real: the leg keeps them, the gradients are errors
            raise BackwardFailed(outputs, exc) from exc
        return outputs, grads

    return fn


@functools.lru_cache(maxsize=64)
def _stages(binding, case: Case, ctx: TpuContext, diff_names: tuple[str, ...]):
    """The pieces of :func:`program` for one case's shapes (the input draw selects only the arrays).

    With ``ctx.compiler_options`` (eager interpret-mode runs) each piece is one jitted program compiled
    with them: the forward with its vjp's residuals, then the backward. Kept per shape, so the causality
    runs and further draws of a case reuse them. Natively, and when traced for a real-TPU compile, the
    pieces are plain functions (the kernels' own jits compile them)."""
    import jax

    def outputs_of(arrays):
        out = call_k_first(case, binding.forward, arrays, ctx)
        return {name: value for name, value in out.items() if value is not None}

    def forward_vjp(primals, rest):
        return jax.vjp(lambda p: outputs_of({**rest, **p}), primals)

    def backward(vjp, cotangents):
        return vjp(cotangents)

    plans: list = []  # how each interpret-mode pallas_call ran (harness.emulation.pallas_batched.KernelPlan)
    if not ctx.compiler_options:
        return outputs_of, forward_vjp, backward, plans
    fns = (outputs_of, forward_vjp, backward)
    if ctx.batched_grid:
        from harness.emulation.pallas_batched import batched_interpret

        fns = tuple(batched_interpret(f, plans) for f in fns)
    else:  # jax's per-program interpret mode, its kernels' sums in the batched grid's order
        from harness.emulation.pallas_batched import pinned_sums

        fns = tuple(pinned_sums(f) for f in fns)
    options = dict(ctx.compiler_options)
    return (*(jax.jit(f, compiler_options=options) for f in fns), plans)


def kernel_grids(binding, case: Case, ctx: TpuContext, diff_names: tuple[str, ...]) -> list[str]:
    """``"<kernel>: <how its grid ran>"`` for each interpret-mode pallas_call of the case's programs (traced by
    then): batched over which axes, or per program and why (:func:`harness.emulation.pallas_batched.plan_rows`)."""
    from harness.emulation.pallas_batched import plan_rows

    return [f"{name}: {how}" for name, how in plan_rows(_stages(binding, case.replace(seed=0), ctx, diff_names)[3])]


def device_arrays(inputs: Inputs) -> dict:
    import jax.numpy as jnp

    return {name: jnp.asarray(a) for name, a in inputs.arrays.items()}  # same bits, bf16 included


NATIVE = TpuContext(interpret=None, mxu_model=False)


def kernel_refusal(op: OpDescriptor, case: Case, binding=None) -> str | None:
    """Whether the kernels take the case, asked of the kernels themselves.

    The binding's forward is traced on shape-only stand-ins of the case's inputs
    (``jax.eval_shape``, nothing runs). The kernels' public functions validate
    their arguments before any tracing of a kernel and raise NotImplementedError,
    with the reason, for a valid input they do not implement; that reason is the
    answer. The harness never re-derives the kernels' rules.
    """
    import jax

    binding = op.pallas if binding is None else binding

    from cases.inputs import input_shapes

    stand_ins = {name: jax.ShapeDtypeStruct(shape, dtype) for name, (shape, dtype) in
                 input_shapes(case, op.inputs(case)).items()}
    try:
        jax.eval_shape(lambda arrays: call_k_first(case, binding.forward, arrays, NATIVE), stand_ins)
    except NotImplementedError as exc:
        return str(exc)
    return None


class TpuLeg(Leg):
    """``compile_targets``: when emulating, each case is first compiled for these real TPU
    targets (:mod:`harness.compile.tpu_compile`; None: v6e); a case that does not compile gets ``error``
    rows."""

    source_closure = True  # the kernels are this repository's: a cached output is keyed by all they import

    def __init__(self, force_interpret: bool = False, compile_targets: tuple[str, ...] | None = None,
                 batched_grid: bool = True):
        """``batched_grid`` (emulated runs): the batched grid interpreter (True, the default) or jax's
        per-program interpret mode (False): :data:`GRIDS`."""
        from harness.compile.tpu_compile import LEG_DEFAULT_TARGETS, parse_targets

        self.batched_grid = bool(batched_grid)

        self.native = tpu_available() and not force_interpret
        targets = LEG_DEFAULT_TARGETS if compile_targets is None else tuple(compile_targets)
        if targets:  # an explicit () compiles nothing: the rows then say so (compiled_for is empty)
            parse_targets(",".join(targets), LEG_DEFAULT_TARGETS)
        self.compile_targets = () if self.native else targets
        self._shape: str | None = None  # the shapes of the case last started (start_case)

    def binding(self, op: OpDescriptor):
        return op.pallas

    def start_case(self, case: Case) -> None:
        """Free jax's compiled programs when the case's shapes change (its id less the input draw) and the
        process holds more than :data:`CLEAR_ABOVE` of this machine's memory, or the machine has less than a job's
        memory left (:data:`harness.core.memory.GIB_PER_JOB`: several workers, each under its share, can fill it
        together). Each distinct shape keeps its
        interpret-mode programs and real-TPU compiles for the life of the process: measured, 10 distinct
        user-like shapes took the leg's RSS from 0.64 to 1.28 GiB (0.66 to 0.89 GiB clearing between them),
        and a run over 60 of them exhausted 24 GiB. Below the limit they stay, because the causality runs
        reuse them (clearing at every change made smoke's TPU causality 13x slower)."""
        shape = case.replace(seed=0).id
        crowded = resident_fraction() > CLEAR_ABOVE or available_gib() < GIB_PER_JOB
        if self._shape is not None and shape != self._shape and crowded:
            import jax

            jax.clear_caches()
        self._shape = shape

    def supports(self, op: OpDescriptor, case: Case) -> str | None:
        return super().supports(op, case) or kernel_refusal(op, case, self.binding(op))

    def context(self) -> TpuContext:
        if self.native:
            return NATIVE
        from jax.experimental.pallas import tpu as pltpu

        interpret = pltpu.InterpretParams(uninitialized_memory="nan")
        # one set of compiler options for both grids (the note under INTERPRET_COMPILER_OPTIONS)
        return TpuContext(interpret=interpret, mxu_model=True, compiler_options=interpret_options(),
                          batched_grid=self.batched_grid)

    def environment(self) -> Environment:
        import jax

        from harness.compile.tpu_compile import versions
        from kernels_tpu import mxu

        ctx = self.context()
        device = jax.devices()[0].device_kind if self.native else "cpu (Pallas TPU interpret mode)"
        settings = {"interpret": repr(ctx.interpret),
                    "mxu_model": "bf16 passes per dot precision (kernels_tpu.mxu)" if ctx.mxu_model else "hardware",
                    "dot_policy": {k: str(v) for k, v in mxu.F32_DOT_PRECISION.items()}}
        if ctx.compiler_options:
            settings["xla_compiler_options"] = dict(ctx.compiler_options)
        if ctx.compiler_options:  # interpret mode: which grid interpreter ran
            settings["pallas_grid"] = ("parallel axes batched (harness.emulation.pallas_batched)" if ctx.batched_grid
                                       else "per program (jax's TPU interpret mode)")
        if not self.native:
            settings["compile_targets"] = ",".join(self.compile_targets)
        if os.environ.get("XLA_FLAGS"):  # can change XLA:CPU's numerics (fast math): recorded, and in the cache key
            settings["xla_flags"] = os.environ["XLA_FLAGS"]
        return Environment(mode="native" if self.native else "emulated", device=device, versions=versions(),
                           settings=settings)

    def preflight(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[str | None, dict]:
        """Emulated: compile the case natively for each target first (natively the run compiles)."""
        if self.native:
            return None, {"compiled_for": "native"}
        from harness.compile.tpu_compile import compile_for

        fn, arrays = program(op, case, NATIVE, binding=self.binding(op)), device_arrays(inputs)
        done, counts = [], {}
        for target in self.compile_targets:
            result = self.compile_for(compile_for, fn, arrays, target)
            if result.status == Status.UNSUPPORTED:
                break  # the kernels refuse the case while tracing; the run raises it again as unsupported
            counts = result.kernel_columns  # the last target's (the failing one's, when one fails)
            if not result.ok:
                return result.reason, {"compiled_for": ",".join(done), **counts}
            done.append(target)
        return None, {"compiled_for": ",".join(done), **counts}

    def compile_for(self, compile_for, fn, arrays, target: str):
        """One target's ahead-of-time compile of the case (a hook: an external candidate answers its TPU info)."""
        return compile_for(fn, (arrays,), target)

    def run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> LegOutput:
        from kernels_tpu.mxu import MxuTally, tally_mxu_work

        ctx = self.context()
        tally = MxuTally()
        binding = self.binding(op)
        with tally_mxu_work(tally):
            try:
                outputs, grads = program(op, case, ctx, tally if ctx.mxu_model else None,
                                         binding)(device_arrays(inputs))
                backward_error = None
            except BackwardFailed as exc:
                outputs, grads, backward_error = exc.outputs, {}, exc.cause
            tensors = {name: np.asarray(value) for name, value in outputs.items()}
            for n in op.differentiable(case):
                g = grads.get(n)
                tensors[grad_name(n)] = None if g is None else np.asarray(g)
        columns = {}
        if ctx.mxu_model:  # modeled in emulation; a TPU has no model to ask
            columns = {"mxu_cost": tally.ratio}
            for phase, tag in (("forward", "fwd"), ("backward", "bwd")):
                columns[f"mxu_macs_{tag}"] = tally.macs.get(phase, 0)
                columns[f"mxu_pass_macs_{tag}"] = tally.pass_macs.get(phase, 0)
        details = dict(binding.describe(case))
        if ctx.batched_grid:
            details["pallas_grid"] = kernel_grids(binding, case, ctx, _diff_names(op, case, binding))
        if case.cu_seqlens is not None:
            details["cu_seqlens"] = list(case.cu_seqlens)  # passed to the kernels as a static tuple
        return LegOutput(tensors=tensors, details=details, columns=columns, forward_only=not binding.differentiable,
                         backward_error=backward_error)
