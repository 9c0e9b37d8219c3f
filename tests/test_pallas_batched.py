"""The batched Pallas grid interpreter (harness/emulation/pallas_batched.py) against today's per-program interpret mode,
bit for bit: the TPU leg's rows of small cases (every tensor and the MXU tally columns) and synthetic kernels
(an "arbitrary" axis accumulating into an output block; parallel programs writing one block must fall back)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import harness.legs.tpu as tpu  # noqa: E402
from cases.case import Case  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from harness.emulation.pallas_batched import batched_interpret, pinned_sums, plan_rows, unavailable  # noqa: E402
from harness.ops import get_op  # noqa: E402

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}: every call runs per program")

OPTS = dict(tpu.interpret_options())  # level 1, the loop emitters (see _leg)
# jax's own per-program interpreter is compared as the leg runs it (pinned_sums): at the leg's level its products
# round as written only with the fences that both grid interpreters put on them (harness.emulation.rounding)


def _bits(x):
    x = np.asarray(x)
    return x.shape, x.dtype, x.view(np.uint8).tobytes()


def _leg(batched: bool):
    """The TPU leg with its pallas_calls by the batched grid or by jax's per-program interpret mode, both under the
    leg's compiler options (level 1 with the fences, by the loop emitters: at level 0 without fences simple_gla's dq
    and dg moved in their last bits batched under the loop emitters, harness/legs/tpu.py)."""

    class Leg(tpu.TpuLeg):
        def context(self):
            return dataclasses.replace(super().context(), batched_grid=batched,
                                       compiler_options=tpu.interpret_options())

    return Leg(force_interpret=True, compile_targets=())


def _assert_same_rows(case_id, every_kernel_batched=True):
    """The leg's row (every tensor, the MXU tally columns) with the batched grid and per program: the same bits;
    the row names how each kernel's grid ran (every kernel batched, or at least one where a kernel has a single
    parallel program)."""
    case = Case.from_id(case_id)
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    a, b = _leg(False).run(op, case, inputs), _leg(True).run(op, case, inputs)
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        if a.tensors[name] is None:
            assert b.tensors[name] is None
            continue
        assert _bits(a.tensors[name]) == _bits(b.tensors[name]), f"{case_id}: {name} differs"
    assert a.columns == b.columns  # mxu_macs_fwd/bwd, mxu_pass_macs_fwd/bwd, mxu_cost
    assert "pallas_grid" not in a.details
    grids = b.details["pallas_grid"]
    batched = [": batched over axes" in g for g in grids]
    assert grids and (all(batched) if every_kernel_batched else any(batched)), grids


@pytest.mark.parametrize("case_id", [
    "gdn.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64/h0",
    "kda.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht",
    "gdn.chunk/B1-T128-H2-K64-V64/bf16/g=logsigmoid/16/C64/lens=37+70+21,h0,dht",  # varlen: scalar-prefetched walk
    # at level 0 by XLA:CPU's loop emitters, without fences, these two differed in the last bit (dq, dg); at the
    # leg's options they do not (harness.legs.tpu.INTERPRET_COMPILER_OPTIONS)
    "simple_gla.chunk/B1-T64-H2-K64-V64/fp32/g=logsigmoid/16/C64/h0,dht",
    "simple_gla.chunk/B1-T128-H2-K64-V64/bf16/g=logsigmoid/16/C64/lens=37+70+21,h0,dht",
])
def test_leg_rows_bit_equal(case_id):
    _assert_same_rows(case_id)


@pytest.mark.parametrize("case_id", [
    # gla's chunk output kernel moved ``o`` by up to 17 ulp batched while the MXU model's operand split rounded f32
    # to bf16 with a float conversion (kernels_tpu.mxu.round_bf16 says why it no longer does)
    "gla.chunk/B1-T128-H1-K128-V128/fp32/g=logsigmoid/10/C64/h0,dht",
    "gla.chunk/B1-T128-H1-K128-V128/fp16/g=logsigmoid/10/C64/h0,dht",
    # a smoke case whose backward's in-kernel sums XLA:CPU ordered differently batched (dg: 333 elements) until
    # they were pinned (harness.emulation.pallas_batched.pinned_sum_p)
    "gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
])
def test_gla_rows_bit_equal(case_id):
    _assert_same_rows(case_id, every_kernel_batched=False)  # at H1 only the output kernel has parallel programs


def test_pinned_sums_halve_and_batch_bit_for_bit():
    """[1, u, u, u] with u = 2^-24 (half an ulp of 1): in order, each add rounds back to 1 (a tie, to even); halved,
    (1 + u) + (u + u) = 1 + 2^-23, one ulp up. And a batch of rows sums each row as it sums alone."""
    from harness.emulation.pallas_batched import pinned_sum_p

    u = 2.0 ** -24
    x = np.array([[1.0, u, u, u], [u, u, u, 1.0]], np.float32)
    assert np.asarray(pinned_sum_p.bind(jnp.asarray(x[0]), axes=(0,))) == np.float32(1 + 2.0 ** -23)
    assert float(np.float32(1) + np.float32(u) + np.float32(u) + np.float32(u)) == 1.0  # the order it replaces
    rows = np.random.default_rng(0).standard_normal((5, 7, 33)).astype(np.float32)
    batched = jax.jit(jax.vmap(lambda r: pinned_sum_p.bind(r, axes=(1,))))(rows)
    for i in range(5):
        assert np.array_equal(np.asarray(batched[i]), np.asarray(jax.jit(
            lambda r: pinned_sum_p.bind(r, axes=(1,)))(rows[i])))
    both = pinned_sum_p.bind(jnp.asarray(rows), axes=(0, 2))  # the last axis first, then the first
    assert both.shape == (7,)
    np.testing.assert_allclose(np.asarray(both), rows.astype(np.float64).sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)


def test_the_row_and_the_settings_say_which_grid_ran():
    assert _leg(True).environment().settings["pallas_grid"] == "parallel axes batched (harness.emulation.pallas_batched)"
    assert _leg(False).environment().settings["pallas_grid"] == "per program (jax's TPU interpret mode)"


def test_the_batched_grid_is_the_default():
    """The leg's default and ``batched_grid=True``: the batched grid; ``batched_grid=False``: jax's per-program
    interpret mode; both under the same compiler options, said in the settings (which key the cache). The front's
    choice (``--grid``, ``$PARITY_TPU_GRID``) reaches the leg as that keyword: tests/test_settings.py."""
    for leg in (tpu.TpuLeg(force_interpret=True, compile_targets=()),
                tpu.TpuLeg(force_interpret=True, compile_targets=(), batched_grid=True)):
        ctx = leg.context()
        assert ctx.batched_grid and ctx.compiler_options == tpu.INTERPRET_COMPILER_OPTIONS
        settings = leg.environment().settings
        assert settings["pallas_grid"].startswith("parallel axes batched")
        assert settings["xla_compiler_options"] == dict(tpu.INTERPRET_COMPILER_OPTIONS)
    leg = tpu.TpuLeg(force_interpret=True, compile_targets=(), batched_grid=False)
    ctx = leg.context()
    assert not ctx.batched_grid and ctx.compiler_options == tpu.INTERPRET_COMPILER_OPTIONS


# ------------------------------------------------------------------ synthetic kernels
def _accumulate_kernel(x_ref, o_ref, acc_ref):
    """o[i] = ((x[i, 0] * 1.1 + x[i, 1]) * 1.1 + x[i, 2]) ...: the order of the arbitrary axis matters."""
    t = pl.program_id(1)

    @pl.when(t == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] = acc_ref[...] * 1.1 + x_ref[...]
    o_ref[...] = acc_ref[...] + jnp.float32(pl.program_id(0))


def _accumulate(x, interpret):
    n, steps = x.shape[0], x.shape[1]
    return pl.pallas_call(
        _accumulate_kernel,
        grid=(n, steps),
        in_specs=[pl.BlockSpec((None, None, 8, 128), lambda i, t: (i, t, 0, 0))],
        out_specs=pl.BlockSpec((None, 8, 128), lambda i, t: (i, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((n, 8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret, name="accumulate")(x)


@pytest.mark.parametrize("interpret", [pltpu.InterpretParams(uninitialized_memory="nan"), True],
                         ids=["tpu-interpret", "hlo-interpret"])
def test_arbitrary_axis_accumulates_in_order(interpret):
    x = jax.random.normal(jax.random.key(0), (3, 5, 8, 128), jnp.float32)
    f = functools.partial(_accumulate, interpret=interpret)
    b = batched_interpret(f)
    want = jax.jit(pinned_sums(f), compiler_options=OPTS)(x)
    got = jax.jit(b, compiler_options=OPTS)(x)
    assert _bits(want) == _bits(got)
    [(name, how)] = plan_rows(b.plans)
    assert name == "accumulate" and how.startswith("batched over axes (0,) of grid (3, 5); ")
    assert how.endswith(" kernel equations before the sequential walk")
    # and the order is the sequential one
    ref = np.zeros((3, 8, 128), np.float32)
    for t in range(5):
        ref = ref * np.float32(1.1) + np.asarray(x[:, t])
    np.testing.assert_array_equal(np.asarray(got), ref + np.arange(3, dtype=np.float32)[:, None, None])


# ------------------------------------------------------------------ the walk split, aliased outputs
def _in_place_kernel(x_ref, o_ref, acc_ref):
    """o (aliased to x, bf16) = exp(x) * 1.1 + acc, acc = acc * 0.9 + x: exp(x) needs no carried value, acc does."""
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...].astype(jnp.float32)
    y = jnp.exp(x) * 1.1 + acc_ref[...]
    acc_ref[...] = acc_ref[...] * 0.9 + x
    o_ref[...] = y.astype(o_ref.dtype)


def _in_place(x, interpret, index_map):
    n, steps = x.shape[0], x.shape[1]
    spec = pl.BlockSpec((None, None, 8, 128), index_map)
    return pl.pallas_call(
        _in_place_kernel, grid=(n, steps), in_specs=[spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), input_output_aliases={0: 0},
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret, name="in_place")(x)


@pytest.mark.parametrize("interpret", [pltpu.InterpretParams(uninitialized_memory="nan"), True],
                         ids=["tpu-interpret", "hlo-interpret"])
@pytest.mark.parametrize("visits", ["each block once", "one block per program"])
def test_aliased_output_written_in_place(interpret, visits):
    """A bf16 output written over its input: each step's block read once (the carry-free part, exp(x), runs before
    the walk) or one block revisited by every step (then the walk carries the input block, which holds what the
    previous step wrote, as in TPU interpret mode; the HLO interpreter reads the input's own array throughout).
    Bit for bit either way, and the plan says how much ran before the walk."""
    index_map = (lambda i, t: (i, t, 0, 0)) if visits == "each block once" else (lambda i, t: (i, 0, 0, 0))
    x = jax.random.normal(jax.random.key(5), (3, 4, 8, 128), jnp.float32).astype(jnp.bfloat16)
    f = functools.partial(_in_place, interpret=interpret, index_map=index_map)
    b = batched_interpret(f)
    want = jax.jit(pinned_sums(f), compiler_options=OPTS)(x)
    got = jax.jit(b, compiler_options=OPTS)(x)
    assert _bits(want) == _bits(got)
    [plan] = b.plans
    before, total = plan.before_walk
    assert 0 < before < total
    if visits == "each block once" and interpret is not True:  # exp(x) and its scaling need nothing carried
        x_small = jax.random.normal(jax.random.key(5), (3, 4, 8, 128), jnp.float32).astype(jnp.bfloat16)
        other = batched_interpret(functools.partial(_in_place, interpret=interpret,
                                                    index_map=lambda i, t: (i, 0, 0, 0)))
        jax.jit(other, compiler_options=OPTS)(x_small)
        assert before > other.plans[0].before_walk[0]


def _stores_into_input_kernel(x_ref, o_ref):
    x_ref[...] = x_ref[...] + 1.0
    o_ref[...] = x_ref[...] * 2.0


def test_a_kernel_storing_into_an_input_falls_back():
    def f(x):
        return pl.pallas_call(
            _stores_into_input_kernel, grid=(2, 3),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda i, t: (i, 0, 0))],
            out_specs=pl.BlockSpec((None, 8, 128), lambda i, t: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
            interpret=pltpu.InterpretParams(uninitialized_memory="nan"), name="stores_into_input")(x)

    x = jax.random.normal(jax.random.key(6), (2, 8, 128), jnp.float32)
    b = batched_interpret(f)
    assert _bits(jax.jit(pinned_sums(f), compiler_options=OPTS)(x)) == _bits(jax.jit(b, compiler_options=OPTS)(x))
    assert plan_rows(b.plans) == [("stores_into_input", "per program: the kernel stores into input 0")]


def test_vjp_through_a_custom_vjp_kernel():
    """Forward and vjp of a custom_vjp whose forward and backward are interpret-mode kernels."""
    interpret = pltpu.InterpretParams(uninitialized_memory="nan")

    @jax.custom_vjp
    def f(x):
        return _accumulate(x, interpret)

    def fwd(x):
        return f(x), x

    def bwd(x, ct):
        return (_accumulate(x * ct[:, None], interpret)[:, None] * jnp.ones_like(x),)

    f.defvjp(fwd, bwd)

    def fwd_vjp(x):
        return jax.vjp(f, x)

    def backward(vjp, ct):
        return vjp(ct)

    x = jax.random.normal(jax.random.key(1), (2, 3, 8, 128), jnp.float32)
    ct = jax.random.normal(jax.random.key(2), (2, 8, 128), jnp.float32)
    out_a, vjp_a = jax.jit(pinned_sums(fwd_vjp), compiler_options=OPTS)(x)
    out_b, vjp_b = jax.jit(batched_interpret(fwd_vjp), compiler_options=OPTS)(x)
    assert _bits(out_a) == _bits(out_b)
    bw = batched_interpret(backward)
    (ga,) = jax.jit(pinned_sums(backward), compiler_options=OPTS)(vjp_a, ct)
    (gb,) = jax.jit(bw, compiler_options=OPTS)(vjp_b, ct)
    assert _bits(ga) == _bits(gb)
    assert all(how.startswith("batched") for _, how in plan_rows(bw.plans))


def _shared_block_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def test_parallel_programs_writing_one_block_fall_back():
    interpret = pltpu.InterpretParams(uninitialized_memory="nan")

    def f(x):
        return pl.pallas_call(
            _shared_block_kernel, grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),  # every program writes block 0
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
            interpret=interpret, name="shared_block")(x)

    x = jax.random.normal(jax.random.key(3), (4, 8, 128), jnp.float32)
    b = batched_interpret(f)
    assert _bits(jax.jit(pinned_sums(f), compiler_options=OPTS)(x)) == _bits(jax.jit(b, compiler_options=OPTS)(x))
    [(name, how)] = plan_rows(b.plans)
    assert name == "shared_block"
    assert how.startswith("per program: output") and "written by several parallel programs" in how


def _slot_kernel(slot_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _by_table(slots, x):
    """Program i writes block slots[i] (a scalar-prefetched table): disjoint only when the table has no repeat."""
    return pl.pallas_call(
        _slot_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda i, slot: (i, 0, 0))],
            out_specs=pl.BlockSpec((None, 8, 128), lambda i, slot: (slot[i], 0, 0))),
        out_shape=jax.ShapeDtypeStruct((4, 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(uninitialized_memory="nan"), name="by_table")(slots, x)


@pytest.mark.parametrize("table", [(2, 0, 3, 1), (0, 0, 1, 2)], ids=["permutation", "repeat"])
def test_output_blocks_chosen_by_a_table(table):
    """An output index map that reads a scalar-prefetched table, known when traced: evaluated over the grid, the
    blocks are disjoint for a permutation (batched) and shared for a repeat (per program, saying so)."""
    x = jax.random.normal(jax.random.key(7), (4, 8, 128), jnp.float32)
    f = functools.partial(_by_table, jnp.asarray(table, jnp.int32))
    b = batched_interpret(f)
    jax.jit(b, compiler_options=OPTS).lower(x)  # traced: the plan is made (jax's own interpreter refuses a repeat)
    [(name, how)] = plan_rows(b.plans)
    if len(set(table)) == 4:
        assert how == "batched over axes (0,) of grid (4,)"
        assert _bits(jax.jit(pinned_sums(f), compiler_options=OPTS)(x)) == _bits(jax.jit(b, compiler_options=OPTS)(x))
    else:
        assert how.startswith("per program: output") and "written by several parallel programs" in how


def test_no_parallel_axis_falls_back():
    x = jax.random.normal(jax.random.key(4), (3, 5, 8, 128), jnp.float32)

    def f(x):
        return pl.pallas_call(
            _accumulate_kernel, grid=(3, 5),
            in_specs=[pl.BlockSpec((None, None, 8, 128), lambda i, t: (i, t, 0, 0))],
            out_specs=pl.BlockSpec((None, 8, 128), lambda i, t: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((3, 8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
            interpret=pltpu.InterpretParams(), name="sequential")(x)

    b = batched_interpret(f)
    assert _bits(jax.jit(pinned_sums(f), compiler_options=OPTS)(x)) == _bits(jax.jit(b, compiler_options=OPTS)(x))
    assert plan_rows(b.plans) == [("sequential", "per program: no parallel grid axis")]


def test_runs_in_a_fresh_process():
    """Nothing it needs comes from a module something else imported first (``jax.extend`` is not loaded by
    ``import jax``): a kernel batched in a process that imported only jax and this module."""
    import subprocess
    import sys

    code = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from harness.emulation.pallas_batched import batched_interpret, plan_rows

def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

def f(x):
    return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
                          interpret=pltpu.InterpretParams(uninitialized_memory="nan"), name="double")(x)

b = batched_interpret(f)
x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
assert (jax.jit(b)(x) == 2 * x).all()
print(plan_rows(b.plans))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "('double', 'batched over axes (0,) of grid (2,)')" in out.stdout


# ------------------------------------------------------------------ a replay is a replay
def _bf16_dot_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)


def _bf16_dots(a, b):
    n = a.shape[0]
    return pl.pallas_call(
        _bf16_dot_kernel, grid=(n,),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0)), pl.BlockSpec((128, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((n, 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(), name="bf16_dots")(a, b)


def test_a_dot_is_seen_fresh_once_however_the_grid_is_walked(monkeypatch):
    """A model that rewrites or counts dots where they are traced (an outside candidate's MXU model,
    harness.legs.external) sees each dot of the program once, fresh, and every later bind of it as a replay
    (``replaying()``): the batched walk re-traces each kernel (islands, state discharge) and re-binds the calls around
    it. Before that re-trace was a replay, the batched grid counted each bf16 dot of a candidate's kernel again (its
    MXU tally differed from the per-program run's; reports/bench/2026-11-29-pallas-grid-sglang-jax)."""
    from harness.emulation import pallas_batched

    fresh = []
    original = jax.lax.dot_general_p.bind

    def bind(*args, **params):
        if not pallas_batched.replaying():
            fresh.append(tuple(x.dtype for x in args))
        return original(*args, **params)

    monkeypatch.setattr(jax.lax.dot_general_p, "bind", bind)
    a = jax.random.normal(jax.random.key(0), (3, 8, 128), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (128, 128), jnp.bfloat16)
    seen = {}
    for name, transform in (("batched", batched_interpret), ("per-program", pallas_batched.pinned_sums)):
        jax.clear_caches()  # the kernel traced again: its dot is fresh once more
        fresh.clear()
        jax.block_until_ready(transform(_bf16_dots)(a, b))
        seen[name] = list(fresh)
    assert seen["batched"] == seen["per-program"] == [(jnp.bfloat16, jnp.bfloat16)], seen
