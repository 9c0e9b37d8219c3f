"""A batched grid interpreter for interpret-mode ``pallas_call``\\ s: the parallel grid axes in one pass.

:func:`batched_interpret` transforms a function: every ``pallas_call`` it makes in interpret mode (a
``pltpu.InterpretParams``: Pallas TPU interpret mode; ``True``: the HLO interpreter) is run by a grid
interpreter that evaluates all programs of the call's "parallel" grid axes at once (``jax.vmap`` over their
program ids: slice each program's blocks by its index maps, evaluate the state-discharged kernel, write the
blocks back) while the "arbitrary" axes stay a sequential loop, in order. Scratch buffers, and the VMEM
buffers of the blocks, are per parallel program and persist along the sequential axes, as on a TPU core.

The kernel body is split in two before the walk (:func:`_split`). What the walk carries is the output blocks,
the scratch buffers, and an input block that may hold what an earlier step wrote (one the kernel stores into;
an aliased input whose index map may visit a block twice, :func:`_read_once`). Every equation that depends on
none of them, such as a chunk kernel's intra-chunk products and its triangular inverse, is evaluated for every
program and several steps at once (a group of about :data:`_PROGRAMS_PER_PASS` points), then the rest (the state
recurrence) runs through the group's steps in order, and so on group by group. Each equation still runs once per (program, step), on the same
values.

What it reproduces, bit for bit, is the per-program interpreter of the same mode, for a kernel that reads
only what it wrote (``jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py`` for TPU mode,
``jax/_src/pallas/hlo_interpreter.py`` for ``interpret=True``):

- blocks are sliced from, and written back to, the whole (padded) arrays at the same start indices, by
  the same index maps (``BlockMapping.compute_start_indices_interpret``), under the same grid env;
- TPU mode: an input block is loaded when its start indices change along the sequential walk (and at each
  program's first step); an output block's VMEM buffer is written to the array when the next step's start
  indices differ or at the program's last step; an aliased output shares its input's array;
  uninitialised memory is ``InterpretParams.uninitialized_memory`` (NaN; integer max; True);
- HLO mode: every block is sliced and written back every step (outputs initialised with
  ``pallas.primitives.uninitialized_value``), as the HLO interpreter does;
- output arrays are updated through their bits (a 16-bit float array as uint16, which XLA:CPU updates in
  place), and, in TPU mode, an output block is written every step unless an aliased input reads that array back
  (the same array results: a block kept for the next step is written again by the same program later);
- every ``dot_general`` of the kernel runs per program at the program's own shape (a batched dot whose
  operands both carry the program axis: an operand the programs share is broadcast), so XLA:CPU's matrix
  library sums in the same order as for one program;
- every float ``reduce_sum`` of the kernel (``jnp.sum``) runs in one fixed order, :func:`kernels_tpu.eft.halving_sum`'s
  (:data:`pinned_sum_p`), here and in the per-program run (:func:`pinned_sums`): XLA:CPU would pick each sum's order
  from its shape, which batching changes;
- every ``jax.debug.callback`` of the kernel (``kernels_tpu.mxu.record_dot``'s MXU tally) runs once per
  program, with that program's operands, as the per-program interpreter runs it;
- every float product and transcendental, in the kernels and in the calls around them, is fenced so that it rounds
  as written (:mod:`harness.emulation.rounding`), here and in the per-program run alike.

Where it does not batch, the call runs per program by jax's own interpreter (its float sums pinned, as below) and the reason is
recorded (:class:`KernelPlan`): no parallel axis of more than one program, a mesh/core_map, dynamic grid
bounds, a vmapped pallas_call, manual DMAs / semaphores / HBM or ANY refs / ``run_scoped``, non-default
``InterpretParams`` (race detection, several cores, a grid-point recorder, skipped float ops), a kernel that
stores into an input block, an aliased input whose block map is not its output's, an output whose blocks
parallel programs could share (proved disjoint only where, for every parallel axis of more than one program,
the output's index map returns that axis's program id itself for a blocked or squeezed dimension), a debug
callback inside a kernel conditional, or anything unrecognised.

Where the two differ (by construction, for kernels that read memory they never wrote): the per-program
interpreter hands program p the scratch and VMEM block buffers program p-1 left (TPU mode: in a seeded
random order of the parallel programs), where this one hands every program fresh uninitialised (NaN)
buffers; an out-of-bounds block read raises in TPU interpret mode and is clamped here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src import debugging
from jax._src.interpreters import batching
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import lax as lax_internal
from jax._src.lax.control_flow import conditionals
from jax._src.pallas import core as pallas_core
from jax._src.pallas import hlo_interpreter
from jax._src.pallas import primitives as pallas_primitives
from jax._src.pallas.pallas_call import pallas_call_p
from jax._src.pallas.mosaic import core as mosaic_core
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
from jax._src.pallas.mosaic.interpret import utils as tpu_interpret_utils
from jax.experimental.pallas import tpu as pltpu
from jax.extend import linear_util  # imported by name: `jax.extend` is not loaded by `import jax`

from harness.emulation import rounding


# ------------------------------------------------------------------ what it reads of jax
_READS = {
    jax_core: ("ClosedJaxpr", "DebugInfo", "Jaxpr", "Literal", "ShapedArray", "Var", "eval_jaxpr", "join_effects",
               "no_effects"),
    batching: ("moveaxis",),
    pe: ("trace_to_jaxpr_dynamic",),
    hlo_interpreter: ("_dynamic_slice", "_dynamic_update_slice", "_eval_jaxpr_hop_rules", "_pad_to_block_dimension",
                      "kernel_to_hlo_jaxpr", "resolve_physical_types"),
    pallas_core: ("Blocked", "Element", "GridAxis", "MemorySpace", "Squeezed", "_get_block_shape", "grid_env"),
    pallas_primitives: ("load_p", "run_scoped_p", "swap_p", "uninitialized_value"),
    tpu_interpret: ("_interpret_impls",),
    tpu_interpret_utils: ("get_uninitialized_array", "pad_to_block_dimension"),
    lax_internal: ("_dot_general_batch_rule", "dot_general_p", "reduce_sum_p"),
    mosaic_core: ("MemorySpace",),
}


def unavailable() -> str | None:
    """Why this jax cannot run the batched grid interpreter (a private name it reads has moved), or None."""
    missing = [f"{m.__name__}.{a}" for m, names in _READS.items() for a in names if not hasattr(m, a)]
    return f"this jax ({jax.__version__}) lacks {', '.join(missing)}" if missing else None


# ------------------------------------------------------------------ replaying a traced kernel
_replay = threading.local()


def replaying() -> bool:
    """Whether this thread is evaluating a kernel that was traced already (as Pallas's own interpreter replays
    one): a model that rewrote the kernel's dots when it was traced (an outside candidate's MXU rounding,
    :func:`harness.legs.external.mxu_rounding`) must let the replayed dots through as they are."""
    return getattr(_replay, "depth", 0) > 0


@contextlib.contextmanager
def _replaying():
    _replay.depth = getattr(_replay, "depth", 0) + 1
    try:
        yield
    finally:
        _replay.depth -= 1


# ------------------------------------------------------------------ the record
@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """How one interpret-mode ``pallas_call`` was run: batched over ``axes`` of ``grid``, or per program
    (``axes`` None) with the ``reason``."""

    name: str
    grid: tuple
    axes: tuple[int, ...] | None
    reason: str = ""
    before_walk: tuple[int, int] | None = None  # (equations, of all the kernel's) evaluated before the sequential walk

    @property
    def batched(self) -> bool:
        return self.axes is not None

    def describe(self) -> str:
        if self.batched:
            how = f"batched over axes {self.axes} of grid {self.grid}"
            if self.before_walk and len(self.grid) > len(self.axes):
                how += f"; {self.before_walk[0]} of {self.before_walk[1]} kernel equations before the sequential walk"
            return how
        return f"per program: {self.reason}"


def plan_rows(plans) -> list[tuple[str, str]]:
    """``(kernel name, how it ran)`` per distinct kernel plan, in first-traced order (for a leg's row)."""
    seen: dict[tuple[str, str], None] = {}
    for p in plans:
        seen.setdefault((p.name, p.describe()), None)
    return list(seen)


_NOT_MAPPED = None  # jax._src.interpreters.batching marks an unbatched value with None

# ------------------------------------------------------------------ per-program primitives under vmap
# A dot and a debug callback as the kernel wrote them, with batching rules that keep them per program:
# the dot's shared operand is broadcast (a batched dot of per-program GEMMs), the callback runs once per
# program. Outside a vmap both are the plain primitives.
program_dot_p = jax_core.Primitive("program_dot_general")


def _program_dot_abstract(*avals, **params):
    return lax_internal.dot_general_p.abstract_eval(*avals, **params)


program_dot_p.def_effectful_abstract_eval(_program_dot_abstract)
program_dot_p.def_impl(lambda *args, **params: lax_internal.dot_general_p.bind(*args, **params))
mlir.register_lowering(program_dot_p, mlir.lower_fun(
    lambda *args, **params: lax_internal.dot_general_p.bind(*args, **params), multiple_results=False))


def _program_dot_batch(axis_data, vals, dims, **params):
    lhs, rhs = vals
    ld, rd = dims
    if ld is _NOT_MAPPED and rd is _NOT_MAPPED:
        return lax_internal.dot_general_p.bind(lhs, rhs, **params), _NOT_MAPPED
    if ld is _NOT_MAPPED:
        lhs, ld = lax.broadcast(lhs, (axis_data.size,)), 0
    if rd is _NOT_MAPPED:
        rhs, rd = lax.broadcast(rhs, (axis_data.size,)), 0
    return lax_internal._dot_general_batch_rule(axis_data, (lhs, rhs), (ld, rd), **params)


batching.fancy_primitive_batchers[program_dot_p] = _program_dot_batch

program_callback_p = jax_core.Primitive("program_debug_callback")
program_callback_p.multiple_results = True


@program_callback_p.def_effectful_abstract_eval
def _program_callback_abstract(*avals, callback, effect, partitioned):
    return [], {effect}


def _program_callback_impl(*args, callback, effect, partitioned):
    return debugging.debug_callback_p.bind(*args, callback=callback, effect=effect, partitioned=partitioned)


program_callback_p.def_impl(_program_callback_impl)
mlir.register_lowering(program_callback_p, mlir.lower_fun(_program_callback_impl, multiple_results=True))


def _per_program(callback, size, batched, *args):
    for i in range(size):
        callback(*(a[i] if b else a for a, b in zip(args, batched)))
    return ()


def _program_callback_batch(axis_data, vals, dims, *, callback, effect, partitioned):
    vals = [v if d is _NOT_MAPPED else batching.moveaxis(v, d, 0) for v, d in zip(vals, dims)]
    batched = tuple(d is not _NOT_MAPPED for d in dims)
    loop = functools.partial(_per_program, callback, axis_data.size, batched)
    return program_callback_p.bind(*vals, callback=loop, effect=effect, partitioned=partitioned), []


batching.fancy_primitive_batchers[program_callback_p] = _program_callback_batch


# ------------------------------------------------------------------ in-kernel sums in one order
# A kernel's float ``reduce_sum`` (``jnp.sum``) as XLA:CPU compiles it sums in an order XLA picks from the reduce's
# shape: batched over programs ([P, C, K] -> [P, 1, K]) it summed gla's backward terms in another order than one
# program's ([C, K] -> [1, K]) does, and moved its dg (333 of 32768 elements, bf16, B1-T128-H2). In interpret mode
# every such sum runs as kernels_tpu.eft.halving_sum (the axis padded with zeros to a power of two, its halves added
# until one element is left; several axes one after another, the last first): elementwise adds of slices, so the
# same bits for one program or for many, under the per-program interpreter (pinned_sums) and this one alike. A
# TPU's sum across lanes or sublanes has that shape; its order across a long axis is not modeled either way.
pinned_sum_p = jax_core.Primitive("pinned_reduce_sum")


def _pinned_sum(x, *, axes, **_):
    from kernels_tpu.eft import halving_sum

    for axis in sorted(axes, reverse=True):
        x = lax.squeeze(halving_sum(x, axis), (axis,))
    return x


pinned_sum_p.def_abstract_eval(lambda x, *, axes, **_: jax_core.ShapedArray(
    tuple(n for i, n in enumerate(x.shape) if i not in axes), x.dtype))
pinned_sum_p.def_impl(_pinned_sum)
mlir.register_lowering(pinned_sum_p, mlir.lower_fun(_pinned_sum, multiple_results=False))


def _pinned_sum_batch(vals, dims, *, axes, **params):
    (x,), (d,) = vals, dims
    x = batching.moveaxis(x, d, 0)
    return pinned_sum_p.bind(x, axes=tuple(a + 1 for a in axes), **params), 0


batching.primitive_batchers[pinned_sum_p] = _pinned_sum_batch


def _is_float_sum(eqn) -> bool:
    return (eqn.primitive is lax_internal.reduce_sum_p
            and jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.floating))


# ------------------------------------------------------------------ kernel checks and rewrites
_DENIED = {"dma_start", "dma_wait", "semaphore_signal", "semaphore_wait", "semaphore_read", "run_scoped",
           "get_barrier_semaphore", "prng_seed", "prng_random_bits", "delay", "axis_index", "device_id",
           "async_copy", "async_remote_copy", "atomic_rmw", "atomic_cas"}


def _sub_jaxprs(params):
    for value in params.values():
        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(v, jax_core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax_core.Jaxpr):
                yield v


def _walk(jaxpr, in_cond=False):
    for eqn in jaxpr.eqns:
        yield eqn, in_cond
        inner = in_cond or eqn.primitive is conditionals.cond_p
        for sub in _sub_jaxprs(eqn.params):
            yield from _walk(sub, inner)


def _kernel_refusal(jaxpr) -> str | None:
    for eqn, in_cond in _walk(jaxpr):
        name = eqn.primitive.name
        if name in _DENIED or eqn.primitive in tpu_interpret._interpret_impls:
            return f"kernel uses {name}"
        if eqn.primitive in (pallas_primitives.load_p, pallas_primitives.swap_p):
            return f"kernel uses pallas {name} (pl.load / pl.store, possibly masked)"
        if eqn.primitive is debugging.debug_callback_p and in_cond:
            return "a debug callback inside a kernel conditional (its count per program is not kept under vmap)"
    return None


def _rewrite(jaxpr: jax_core.Jaxpr, programs: bool = True, kernel: bool = True) -> jax_core.Jaxpr:
    """``jaxpr`` with every fenced float result (:func:`harness.emulation.rounding.rounds`, at any depth) rounded
    as written; in a kernel (``kernel``) also every float reduce_sum as :data:`pinned_sum_p`, and (``programs``)
    every dot_general / debug_callback as its per-program primitive."""
    return jaxpr.replace(eqns=[_rewrite_eqn(eqn, programs, kernel) for eqn in jaxpr.eqns])


def _rewrite_eqn(eqn, programs: bool, kernel: bool):
    params = {key: _rewrite_param(value, programs, kernel) for key, value in eqn.params.items()}
    prim = eqn.primitive
    if rounding.rounds(eqn):
        prim = rounding.rounded(prim)
    elif kernel and _is_float_sum(eqn):
        prim = pinned_sum_p
    elif kernel and programs and prim is lax_internal.dot_general_p:
        prim = program_dot_p
    elif kernel and programs and prim is debugging.debug_callback_p:
        prim = program_callback_p
    return eqn.replace(primitive=prim, params=params)


def _rewrite_param(value, programs: bool, kernel: bool):
    if isinstance(value, jax_core.ClosedJaxpr):
        return jax_core.ClosedJaxpr(_rewrite(value.jaxpr, programs, kernel), value.consts)
    if isinstance(value, jax_core.Jaxpr):
        return _rewrite(value, programs, kernel)
    if isinstance(value, tuple) and value and all(isinstance(v, (jax_core.ClosedJaxpr, jax_core.Jaxpr))
                                                  for v in value):
        return tuple(_rewrite_param(v, programs, kernel) for v in value)
    return value


def _islands(jaxpr: jax_core.Jaxpr, consts):
    """``jaxpr`` (a kernel before state discharge) with every ref read's value and every stored value passed
    through ``optimization_barrier``: in the per-program interpreter each read arrives from, and each store
    leaves to, a callback, so XLA:CPU fuses no arithmetic across a read or a store; here neither does it (and
    a value read twice stays two values, not one it could fuse differently)."""
    from jax._src.state import primitives as state_primitives

    def apply(eqn, invals):
        prim = eqn.primitive
        if prim is state_primitives.swap_p:
            invals[1] = lax.optimization_barrier(invals[1])
        if prim in hlo_interpreter._eval_jaxpr_hop_rules:
            out = hlo_interpreter._eval_jaxpr_hop_rules[prim](_islands, *invals, **eqn.params)
        else:
            out = prim.bind(*invals, **prim.get_bind_params(eqn.params))
        if prim in (state_primitives.get_p, state_primitives.swap_p):
            out = lax.optimization_barrier(out)
        return out

    return _traced(functools.partial(_evaluate, apply, jaxpr, consts), jaxpr)


def _traced(run, jaxpr):
    """``run`` (a function of ``jaxpr``'s inputs) traced to a new jaxpr and its consts."""
    fun = linear_util.wrap_init(run, debug_info=jaxpr.debug_info)
    new_jaxpr, _, new_consts = pe.trace_to_jaxpr_dynamic(fun, [v.aval for v in jaxpr.invars])
    return new_jaxpr, new_consts


def _kernel_to_hlo_jaxpr(jaxpr, grid_mapping):
    """``hlo_interpreter.kernel_to_hlo_jaxpr`` with :func:`_islands` applied before the state discharge."""
    from jax._src.state import discharge as state_discharge

    with grid_mapping.trace_env():
        phys_jaxpr, phys_consts = hlo_interpreter.resolve_physical_types(jaxpr, ())
        phys_jaxpr, phys_consts = _islands(phys_jaxpr, phys_consts)
        scratch_avals = [v.aval for v in phys_jaxpr.invars[grid_mapping.slice_scratch_ops]]
        discharged = state_discharge.discharge_state(jax_core.ClosedJaxpr(phys_jaxpr, phys_consts))
    return discharged.jaxpr, discharged.consts, scratch_avals


# ------------------------------------------------------------------ the plan of one call
def _tpu_params_refusal(p) -> str | None:
    if p.detect_races:
        return "InterpretParams(detect_races=True)"
    if p.skip_floating_point_ops:
        return "InterpretParams(skip_floating_point_ops=True)"
    if p.num_cores_or_threads != 1:
        return f"InterpretParams(num_cores_or_threads={p.num_cores_or_threads})"
    if p.grid_point_recorder is not None:
        return "InterpretParams(grid_point_recorder=...)"
    return None


def _parallel_prefix(compiler_params, ndim) -> int:
    sem = getattr(compiler_params, "dimension_semantics", None)
    if not sem:
        return 0
    n = 0
    for s in sem:
        if s in ("parallel", getattr(mosaic_core, "PARALLEL", "parallel")) or getattr(s, "name", "") == "PARALLEL":
            n += 1
        else:
            break
    return min(n, ndim)


def _memory_space_refusal(space) -> str | None:
    if space is None:
        return None
    if space is pallas_core.MemorySpace.ANY or space is mosaic_core.MemorySpace.HBM:
        return f"a ref in {space}"
    if space is mosaic_core.MemorySpace.SEMAPHORE or "SEMAPHORE" in str(space).upper():
        return "a semaphore"
    return None


def _blocks_disjoint(bm, grid, n_par, scalars) -> str | None:
    """None when parallel programs provably write disjoint blocks of this output, else why not: proved from the
    index map's form (it returns each parallel program id for a blocked dimension), or else by evaluating it over
    the whole grid (:func:`_grid_starts`: two points of different parallel programs never share a block)."""
    why = _blocks_disjoint_by_form(bm, grid, n_par)
    if why is None:
        return None
    starts = _grid_starts(bm, grid, scalars)
    if starts is None:
        return why + "; its blocks depend on scalar-prefetched tables not known when traced"
    program = np.ravel_multi_index(np.stack(np.meshgrid(*[np.arange(d) for d in grid], indexing="ij"), -1)
                                   .reshape(-1, len(grid))[:, :n_par].T, grid[:n_par])
    order = np.lexsort(starts.T[::-1])
    same_block = np.all(starts[order][1:] == starts[order][:-1], axis=1)
    if np.any(same_block & (program[order][1:] != program[order][:-1])):
        return f"output {bm.origin} is written by several parallel programs (its blocks evaluated over the grid)"
    return None


def _blocks_disjoint_by_form(bm, grid, n_par) -> str | None:
    jaxpr = bm.index_map_jaxpr.jaxpr
    outs = jaxpr.outvars
    for axis in range(n_par):
        if grid[axis] == 1:
            continue
        ok = False
        for j, (out, bd) in enumerate(zip(outs, bm.block_shape)):
            if (isinstance(out, jax_core.Var) and out is jaxpr.invars[axis]
                    and isinstance(bd, (pallas_core.Blocked, pallas_core.Squeezed))):
                ok = True
        if not ok:
            return (f"output {bm.origin} may be written by several programs of parallel axis {axis} "
                    "(its index map does not return that program id for a blocked dimension)")
    return None


def _same_map(a, b) -> bool:
    return (tuple(a.block_shape) == tuple(b.block_shape)
            and str(a.index_map_jaxpr) == str(b.index_map_jaxpr))


def _plan(grid_mapping, compiler_params, interpret, mesh, input_output_aliases, kernel_jaxpr, scalars):
    """(number of leading parallel axes batched, None) or (None, reason)."""
    if mesh is not None:
        return None, "a mesh (core_map)"
    if grid_mapping.num_dynamic_grid_bounds:
        return None, "dynamic grid bounds"
    if grid_mapping.vmapped_dims:
        return None, "a vmapped pallas_call"
    if grid_mapping.local_grid_env is not None:
        return None, "a local grid env"
    if isinstance(interpret, pltpu.InterpretParams):
        if (why := _tpu_params_refusal(interpret)):
            return None, why
    elif interpret is not True:
        return None, f"interpret={interpret!r} (not TPU or HLO interpret mode)"
    grid = tuple(grid_mapping.grid)
    n_par = _parallel_prefix(compiler_params, len(grid))
    if n_par == 0:
        return None, "no parallel grid axis"
    if math.prod(grid[:n_par]) == 1:
        return None, "parallel axes of one program"
    for bm in grid_mapping.block_mappings:
        if (why := _memory_space_refusal(bm.transformed_block_aval.memory_space)):
            return None, why
        if any(isinstance(bd, pallas_core.Element) and bd.padding != (0, 0) for bd in bm.block_shape):
            return None, "padded Element block dims"
        if not all(isinstance(bd, (pallas_core.Blocked, pallas_core.Squeezed, pallas_core.Element))
                   for bd in bm.block_shape):
            return None, "a block dim that is not Blocked, Squeezed or Element"
    for var in kernel_jaxpr.invars[grid_mapping.slice_scratch_ops]:
        if (why := _memory_space_refusal(getattr(var.aval, "memory_space", None))):
            return None, why
        if isinstance(var.aval, jax_core.ShapedArray) is False and not hasattr(var.aval, "inner_aval"):
            return None, f"a scratch operand {var.aval}"
    if (why := _kernel_refusal(kernel_jaxpr)):
        return None, why
    outputs = tuple(grid_mapping.block_mappings_output)
    for bm in outputs:
        if any(isinstance(bd, pallas_core.Element) for bd in bm.block_shape):
            return None, f"output {bm.origin} has Element block dims"
        if (why := _blocks_disjoint(bm, grid, n_par, scalars)):
            return None, why
    n_scalars = grid_mapping.num_index_operands
    for i, o in input_output_aliases:
        if i < n_scalars:
            return None, "an aliased scalar prefetch operand"
        if not _same_map(grid_mapping.block_mappings[i - n_scalars], outputs[o]):
            return None, f"aliased input {i} is not read by its output's block map"
    return n_par, None


# ------------------------------------------------------------------ the batched grid interpreter
def _uninitialized(shape, dtype, interpret):
    if isinstance(interpret, pltpu.InterpretParams):
        return tpu_interpret_utils.get_uninitialized_array(shape, dtype, interpret.uninitialized_memory)
    return pallas_primitives.uninitialized_value(shape, dtype)


def _pad(x, block_shape, interpret):
    if isinstance(interpret, pltpu.InterpretParams):
        return tpu_interpret_utils.pad_to_block_dimension(x, block_shape, interpret.uninitialized_memory)
    return hlo_interpreter._pad_to_block_dimension(x, block_shape)


def _as_bits(x):
    """A 16-bit float array as its bits (uint16); any other unchanged."""
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize == 2:
        return lax.bitcast_convert_type(x, jnp.uint16)
    return x


def _from_bits(x, dtype):
    """The inverse of :func:`_as_bits` for an array of ``dtype``."""
    return lax.bitcast_convert_type(x, dtype) if x.dtype != dtype else x


def _unravel(i, dims):
    out = []
    for d in reversed(dims):
        out.append(i % d)
        i = i // d
    return tuple(reversed(out))


def _grid_starts(bm, grid, scalars):
    """The start indices of ``bm``'s block at every grid point, [points, dims] in row-major grid order, computed
    when the call is traced; None where they depend on scalar-prefetched tables whose values are not known then
    (traced, not constants of the program)."""
    closed = bm.index_map_jaxpr
    used = {v for e in closed.jaxpr.eqns for v in e.invars if isinstance(v, jax_core.Var)}
    used |= {v for v in closed.jaxpr.outvars if isinstance(v, jax_core.Var)}
    if (any(v in used for v in closed.jaxpr.invars[len(grid):])
            and any(isinstance(x, jax_core.Tracer) for x in scalars)):
        return None
    points = np.stack(np.meshgrid(*[np.arange(d) for d in grid], indexing="ij"), -1).reshape(-1, len(grid))
    with jax.ensure_compile_time_eval():
        def one(idx):
            loop_idx = tuple(idx[i] for i in range(len(grid)))
            with pallas_core.grid_env(tuple(pallas_core.GridAxis(i, b) for i, b in zip(loop_idx, grid))):
                return jnp.stack([jnp.asarray(x, jnp.int32)
                                  for x in bm.compute_start_indices_interpret(loop_idx, *scalars)])
        return np.asarray(jax.vmap(one)(jnp.asarray(points, jnp.int32)))


def _read_once(bm, grid, scalars) -> bool:
    """Whether every grid point of the call reads a block of its own through ``bm`` (its index map injective over
    the grid): then no program reads a block another step has written."""
    starts = _grid_starts(bm, grid, scalars)
    return starts is not None and len(np.unique(starts, axis=0)) == len(starts)


@dataclasses.dataclass
class _Split:
    """A discharged kernel in two parts: ``pre``, every equation that depends on no carried value (the output
    blocks and scratch, which persist along the sequential axes, and an input block that may hold what an earlier
    step wrote), evaluated for every program and step at once; ``rest``, the equations that do, in the loop.
    ``pre`` maps the free inputs to ``crossing``, the values ``rest`` reads (or returns) besides the carried ones."""

    pre: jax_core.Jaxpr
    rest: jax_core.Jaxpr
    free: list[int]  # kernel invar positions read by pre
    carried: list[int]  # kernel invar positions (and their outvars) carried by the loop


def _split(kernel: jax_core.Jaxpr, carried: list[int]) -> _Split:
    dependent = {kernel.invars[i] for i in carried}
    pre_eqns, rest_eqns = [], []
    for eqn in kernel.eqns:
        if any(isinstance(v, jax_core.Var) and v in dependent for v in eqn.invars):
            rest_eqns.append(eqn)
            dependent.update(eqn.outvars)
        else:
            pre_eqns.append(eqn)
    free = [i for i in range(len(kernel.invars)) if i not in set(carried)]
    outs = [kernel.outvars[i] for i in carried]
    needed = {v for e in rest_eqns for v in e.invars if isinstance(v, jax_core.Var)}
    needed |= {v for v in outs if isinstance(v, jax_core.Var)}
    crossing = [v for v in dict.fromkeys([kernel.invars[i] for i in free]
                                         + [o for e in pre_eqns for o in e.outvars])
                if v in needed and v not in kernel.constvars]

    def part(invars, eqns, outvars):
        effects = jax_core.join_effects(*(e.effects for e in eqns)) if eqns else jax_core.no_effects
        info = jax_core.DebugInfo("pallas_batched", getattr(kernel.debug_info, "func_src_info", "kernel"),
                                  tuple(str(v) for v in invars), None)
        return jax_core.Jaxpr(kernel.constvars, invars, outvars, eqns, effects, debug_info=info)

    return _Split(pre=part([kernel.invars[i] for i in free], pre_eqns, crossing),
                  rest=part(crossing + [kernel.invars[i] for i in carried], rest_eqns, outs),
                  free=free, carried=list(carried))


_PROGRAMS_PER_PASS = 256
"""How many (program, step) points the carry-free part evaluates in one vmapped pass: enough to amortise each op's
dispatch over the batch, few enough to keep every intermediate of the pass in memory."""


def _stores_into_an_input(jaxpr, grid_mapping) -> str | None:
    """Why the kernel (``jaxpr`` before state discharge) cannot be batched: it stores into an input block (which the
    two per-program interpreters keep differently), read from its write effects; or None."""
    from jax._src.state import types as state_types

    n_idx, n_in = grid_mapping.num_index_operands, grid_mapping.num_inputs
    refs = [v for v in jaxpr.invars]
    written = set()
    for e in jaxpr.effects:
        if isinstance(e, (state_types.WriteEffect, state_types.AccumEffect)):
            i = e.input if isinstance(e.input, int) else next((j for j, v in enumerate(refs) if v is e.input), -1)
            if n_idx <= i < n_idx + n_in:
                written.add(i - n_idx)
    written = sorted(written)
    return f"the kernel stores into input {written[0]}" if written else None


def _batched_call(args, kernel, kernel_consts, scratch_avals, *, input_output_aliases, grid_mapping, interpret,
                  n_par, **_):
    tpu_mode = isinstance(interpret, pltpu.InterpretParams)
    grid = tuple(grid_mapping.grid)
    par, seq = grid[:n_par], grid[n_par:]
    P, S = math.prod(par), math.prod(seq)
    kernel = _rewrite(kernel)
    n_idx = grid_mapping.num_index_operands
    scalars, ins = list(args[:n_idx]), list(args[n_idx:])
    n_in, n_out = grid_mapping.num_inputs, grid_mapping.num_outputs
    bms = grid_mapping.block_mappings
    block_shapes = [pallas_core._get_block_shape(bm.block_shape) for bm in bms]
    squeeze = [tuple(isinstance(bd, pallas_core.Squeezed) for bd in bm.block_shape) for bm in bms]
    kernel_block_avals = [v.aval for v in kernel.invars[n_idx:n_idx + n_in + n_out]]

    # the whole arrays, padded to whole blocks; an aliased output starts as (and is) its input's array
    alias = {o: i - n_idx for i, o in input_output_aliases}
    in_arrays = [_pad(x, bs, interpret) for x, bs in zip(ins, block_shapes[:n_in])]
    out_arrays = []
    for o, bm in enumerate(grid_mapping.block_mappings_output):
        if o in alias:
            out_arrays.append(in_arrays[alias[o]])
        else:
            out_arrays.append(_pad(_uninitialized(bm.array_aval.shape, bm.array_aval.dtype, interpret),
                                   block_shapes[n_in + o], interpret))
    # TPU mode: an aliased input reads its output's (shared) array. The HLO interpreter starts the output as a copy of
    # its input and reads the input's own array throughout.
    read_from = {alias[o]: o for o in alias} if tpu_mode else {}
    # The output arrays are carried as their bits: XLA:CPU updates a bf16 or fp16 array by converting the whole of
    # it to f32 and back, once per block written, where an update of the same bits in an unsigned integer array
    # is done in place. Exact either way.
    out_arrays = [_as_bits(a) for a in out_arrays]

    # What the loop carries: the output blocks and scratch, and an aliased input block that a step may read after
    # another step wrote it (the kernel stores into no input block: _stores_into_an_input). Every other input block is the same slice of
    # the input array whenever it is read, so the kernel's work on it alone is done for all steps before the loop.
    free_inputs = [k for k in range(n_in) if k not in read_from or _read_once(bms[k], grid, scalars)]
    carried_inputs = [k for k in range(n_in) if k not in free_inputs]
    split = _split(kernel, [n_idx + k for k in carried_inputs] + list(range(n_idx + n_in, len(kernel.invars))))
    before_walk = (len(split.pre.eqns), len(kernel.eqns))

    def local_env(loop_idx):
        return tuple(pallas_core.GridAxis(idx, b) for idx, b in zip(loop_idx, grid))

    def starts(loop_idx):
        with pallas_core.grid_env(local_env(loop_idx)):
            return [tuple(jnp.asarray(s, jnp.int32) for s in bm.compute_start_indices_interpret(loop_idx, *scalars))
                    for bm in bms]

    def slice_block(array, start, k):
        return hlo_interpreter._dynamic_slice(start, block_shapes[k], array, squeeze[k])

    par_ids = [jnp.asarray(a.reshape(-1), jnp.int32)
               for a in np.meshgrid(*[np.arange(d) for d in par], indexing="ij")]

    def evaluate(part, loop_idx, operands):
        # each part of the kernel body as its own island, as in the per-program interpreter (whose blocks arrive
        # from and leave to callbacks): XLA:CPU fuses nothing across its edge, so it compiles the body as it
        # compiles one program's
        operands = lax.optimization_barrier(list(operands))
        with pallas_core.grid_env(local_env(loop_idx)), _replaying():
            return lax.optimization_barrier(list(jax_core.eval_jaxpr(part, kernel_consts, *operands)))

    def pre_program(point):
        """The carry-free part of one program's step (vmapped over every program and step)."""
        pid, s = point
        loop_idx = (*pid, *_unravel(s, seq))
        cur = starts(loop_idx)
        blocks = {n_idx + k: slice_block(in_arrays[k], cur[k], k) for k in free_inputs}
        return evaluate(split.pre, loop_idx, [scalars[i] if i < n_idx else blocks[i] for i in split.free])

    # the walk in groups of steps: the carry-free part of a group's steps in one pass, then its steps in order (the
    # values crossing from one part to the other are kept for one group only)
    steps_per_pass = max(d for d in range(1, S + 1) if S % d == 0 and d * P <= max(P, _PROGRAMS_PER_PASS))

    def group_terms(s0):
        steps = s0 + jnp.repeat(jnp.arange(steps_per_pass, dtype=jnp.int32), P)
        crossing = jax.vmap(pre_program)(([jnp.tile(p, steps_per_pass) for p in par_ids], steps))
        return [c.reshape(steps_per_pass, P, *c.shape[1:]) for c in crossing]

    def program_step(pid, s, crossing, in_bufs, out_bufs, scratch, out_arrays):
        """The carried part of one program's step s (vmapped over pid)."""
        seq_idx = _unravel(s, seq)
        loop_idx = (*pid, *seq_idx)
        cur = starts(loop_idx)
        nxt = starts((*pid, *_unravel(jnp.minimum(s + 1, S - 1), seq)))
        prv = starts((*pid, *_unravel(jnp.maximum(s - 1, 0), seq)))
        blocks_in = []
        for j, k in enumerate(carried_inputs):
            if k in read_from:
                fresh = _from_bits(slice_block(out_arrays[read_from[k]], cur[k], k), in_arrays[k].dtype)
            else:
                fresh = slice_block(in_arrays[k], cur[k], k)
            if tpu_mode:
                changed = (s == 0) | functools.reduce(jnp.logical_or, [a != b for a, b in zip(cur[k], prv[k])],
                                                      jnp.bool_(False))
                fresh = lax.select(jnp.broadcast_to(changed, fresh.shape), fresh, in_bufs[j])
            blocks_in.append(fresh)
        blocks_out = []
        for o in range(n_out):
            k = n_in + o
            if tpu_mode:
                blocks_out.append(out_bufs[o])
            else:
                blocks_out.append(_from_bits(slice_block(out_arrays[o], cur[k], k), kernel_block_avals[k].dtype))
        res = evaluate(split.rest, loop_idx, [*crossing, *blocks_in, *blocks_out, *scratch])
        n_c = len(carried_inputs)
        res_in, res_out, res_scratch = res[:n_c], res[n_c:n_c + n_out], res[n_c + n_out:]
        if tpu_mode:
            writes = [(s == S - 1) | functools.reduce(jnp.logical_or,
                                                       [a != b for a, b in zip(cur[n_in + o], nxt[n_in + o])],
                                                       jnp.bool_(False)) for o in range(n_out)]
        else:
            writes = [jnp.bool_(True)] * n_out
        return (list(res_in), list(res_out), list(res_scratch),
                [cur[n_in + o] for o in range(n_out)], writes)

    # TPU mode writes an output block back when the program's next step moves to another block (or at its last
    # step). Writing it every step leaves the same array: a block kept for the next step is written again later by
    # the same program, and no other program writes it. Only an output that an input reads back (aliased) must see
    # the array exactly as it stands between steps; the others are written unconditionally, in place.
    read_back = set(read_from.values())

    def step(s, crossing, carry):
        in_bufs, out_bufs, scratch, out_arrays_c = carry
        res_in, res_out, res_scratch, out_starts, writes = jax.vmap(
            program_step, in_axes=(0, None, 0, 0, 0, 0, None))(
            par_ids, s, crossing, in_bufs, out_bufs, scratch, out_arrays_c)
        new_arrays = []
        for o in range(n_out):
            k = n_in + o
            arr = out_arrays_c[o]

            def put(p, arr, o=o, k=k):
                start = tuple(st[p] for st in out_starts[o])
                block = _as_bits(res_out[o][p])
                if tpu_mode and o in read_back:
                    old = hlo_interpreter._dynamic_slice(start, block_shapes[k], arr, squeeze[k])
                    block = lax.select(jnp.broadcast_to(writes[o][p], block.shape), block, old)
                return hlo_interpreter._dynamic_update_slice(start, block_shapes[k], arr, block, squeeze[k])

            new_arrays.append(lax.fori_loop(0, P, put, arr))
        return res_in, res_out, res_scratch, new_arrays

    in_bufs = [jnp.broadcast_to(_uninitialized(kernel_block_avals[k].shape, kernel_block_avals[k].dtype, interpret),
                                (P, *kernel_block_avals[k].shape)) for k in carried_inputs]
    out_bufs = [jnp.broadcast_to(_uninitialized(a.shape, a.dtype, interpret), (P, *a.shape))
                for a in kernel_block_avals[n_in:]]
    scratch = [jnp.broadcast_to(_uninitialized(a.shape, a.dtype, interpret), (P, *a.shape))
               for a in scratch_avals]
    def group(j, carry):
        s0 = j * steps_per_pass
        crossing = group_terms(s0)
        return lax.fori_loop(0, steps_per_pass, lambda i, c: step(s0 + i, [x[i] for x in crossing], c), carry)

    *_, final = lax.fori_loop(0, S // steps_per_pass, group, (in_bufs, out_bufs, scratch, out_arrays))
    outs = []
    for arr, bm in zip(final, grid_mapping.block_mappings_output):
        arr = _from_bits(arr, bm.array_aval.dtype)
        if arr.shape != bm.array_aval.shape:
            arr = lax.slice(arr, (0,) * arr.ndim, bm.array_aval.shape)
        outs.append(arr)
    return outs, before_walk


def _pallas_call(plans, *args, **params):
    interpret = params.get("interpret")
    gm = params["grid_mapping"]
    name = params.get("name") or getattr(params["jaxpr"].debug_info, "func_name", "kernel")
    n_par, why = _plan(gm, params.get("compiler_params"), interpret, params.get("mesh"),
                       params["input_output_aliases"], params["jaxpr"], args[:gm.num_index_operands])
    plan = KernelPlan(str(name), tuple(gm.grid), None if n_par is None else tuple(range(n_par)), why or "")
    if n_par is None:
        plans.append(plan)
        return _pinned_call(*args, **params)  # per program, its sums pinned as everywhere
    if (why := _stores_into_an_input(params["jaxpr"], gm)):
        plans.append(dataclasses.replace(plan, axes=None, reason=why))
        return _pinned_call(*args, **params)  # per program, its sums pinned as everywhere
    kernel, kernel_consts, scratch_avals = _kernel_to_hlo_jaxpr(params["jaxpr"], gm)
    # the call's operands and results cross a barrier, as they cross callbacks in the per-program interpreter:
    # XLA:CPU fuses nothing of the program around the call into the call's slicing (or the reverse), so the
    # arithmetic around it compiles as it does around the per-program interpreter
    args = lax.optimization_barrier(list(args))
    outs, before_walk = _batched_call(args, kernel, kernel_consts, scratch_avals, n_par=n_par, **params)
    plans.append(dataclasses.replace(plan, before_walk=before_walk))
    return lax.optimization_barrier(list(outs))


# ------------------------------------------------------------------ the outer evaluator
_INLINE = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
           "checkpoint", "remat", "custom_lin"}


def _has_interpreted_call(jaxpr) -> bool:
    for eqn, _ in _walk(jaxpr):
        if eqn.primitive is pallas_call_p and eqn.params.get("interpret"):
            return True
    return False


def _inner(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        value = eqn.params.get(key)
        if isinstance(value, jax_core.ClosedJaxpr):
            return value.jaxpr, value.consts
        if isinstance(value, jax_core.Jaxpr):
            return value, ()
    return None


def _evaluate(apply, jaxpr, consts, *args):
    """Evaluate ``jaxpr`` equation by equation, ``apply(eqn, invals) -> out`` binding each (under its context)."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jax_core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        with eqn.ctx.manager:
            out = apply(eqn, [read(v) for v in eqn.invars])
        env.update(zip(eqn.outvars, out) if eqn.primitive.multiple_results else [(eqn.outvars[0], out)])
    return [read(v) for v in jaxpr.outvars]


def _eval(call, jaxpr, consts, *args):
    """The outer program: interpret-mode pallas_calls by ``call(*args, **params)``, the calls around them inlined."""
    def apply(eqn, invals):
        prim = eqn.primitive
        if prim is pallas_call_p and eqn.params.get("interpret"):
            return call(*invals, **eqn.params)
        if not any(_has_interpreted_call(j) for j in _sub_jaxprs(eqn.params)):  # rounded as written, at any depth
            eqn = _rewrite_eqn(eqn, programs=False, kernel=False)
            return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        if prim.name in _INLINE and _inner(eqn) is not None:
            inner, inner_consts = _inner(eqn)
            return _eval(call, inner, inner_consts, *invals)
        if prim in hlo_interpreter._eval_jaxpr_hop_rules and prim is not pallas_primitives.run_scoped_p:
            return hlo_interpreter._eval_jaxpr_hop_rules[prim](functools.partial(_retrace, call), *invals,
                                                              **eqn.params)
        raise NotImplementedError(f"batched_interpret: an interpret-mode pallas_call inside {prim.name}")

    return _evaluate(apply, jaxpr, consts, *args)


def _retrace(call, jaxpr, consts):
    return _traced(functools.partial(_eval, call, jaxpr, consts), jaxpr)


def _transformed(fn: Callable, call) -> Callable:
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
        flat = jax.tree_util.tree_leaves((args, kwargs))
        # everything from here binds the equations of a program traced just above (the calls around the kernels,
        # and each kernel as it is re-traced into islands and discharged): a replay, which a model that rewrote or
        # counted the dots when they were traced (harness.legs.external's) must let through as they are
        with _replaying():
            out = _eval(call, closed.jaxpr, closed.consts, *flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), out)

    return wrapped


def _pinned_call(*args, **params):
    """One interpret-mode pallas_call per program, by jax's own interpreter, its kernel's float sums pinned."""
    params = dict(params, jaxpr=_rewrite(params["jaxpr"], programs=False))
    return pallas_call_p.bind(*args, **params)


def pinned_sums(fn: Callable) -> Callable:
    """``fn`` with every interpret-mode ``pallas_call`` run by jax's own per-program interpreter, each float
    ``reduce_sum`` of its kernel in :data:`pinned_sum_p`'s order, as :func:`batched_interpret` runs it: the
    per-program run of the TPU leg. Used inside ``jax.jit``, as :func:`batched_interpret` is."""
    if unavailable() is not None:
        return fn
    return _transformed(fn, _pinned_call)


def batched_interpret(fn: Callable, plans: list | None = None) -> Callable:
    """``fn`` with every interpret-mode ``pallas_call`` run by the batched grid interpreter (module doc).

    The returned function traces ``fn`` to a jaxpr at each call and evaluates it, calls inlined; use it
    inside ``jax.jit`` (as the TPU leg's stages do) and differentiate inside ``fn`` (a ``custom_vjp``
    reached by ``batched_interpret(f)`` is evaluated as its primal). ``.plans`` lists a :class:`KernelPlan`
    per interpret-mode ``pallas_call`` traced so far (:func:`plan_rows` for a row); several functions can share
    one ``plans`` list."""
    plans = [] if plans is None else plans
    why = unavailable()
    if why is not None:  # every pallas_call runs per program, as before; the record says why
        @functools.wraps(fn)
        def unbatched(*args, **kwargs):
            plans.append(KernelPlan("every kernel", (), None, why))
            return fn(*args, **kwargs)

        unbatched.plans = plans
        return unbatched

    wrapped = _transformed(fn, functools.partial(_pallas_call, plans))
    wrapped.plans = plans
    return wrapped
