"""How the emulated TPU leg compiles its interpret-mode programs (harness.legs.tpu.INTERPRET_COMPILER_OPTIONS)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from cases.case import Case  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from harness.emulation.pallas_batched import batched_interpret, pinned_sums, unavailable  # noqa: E402
from harness.legs.tpu import INTERPRET_COMPILER_OPTIONS, LEVEL_0_OPTIONS, TpuLeg, interpret_options  # noqa: E402
from harness.ops import get_op  # noqa: E402

SMALL = "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64/h0,dht"


def test_products_and_sums_round_as_written():
    """a = b = 1 + 2^-12: a*b = 1 + 2^-11 + 2^-24 exactly. Rounded to float32 (ulp 2^-23 at 1) that is a tie,
    which goes to the even 1 + 2^-11, so a*b - (1 + 2^-11) is 0 with two roundings and 2^-24 fused.
    Contraction depends on the host's vector unit; the leg's programs (its options, and the fences that both grid
    interpreters put on every product: harness.emulation.rounding) must give the two-rounding answer, in the calls
    around the kernels as in the kernels (tests/test_rounding.py)."""
    options = dict(TpuLeg(force_interpret=True, compile_targets=()).context().compiler_options)
    a = np.full(1024, 1 + 2.0 ** -12, dtype=np.float32)
    c = np.full(1024, -(1 + 2.0 ** -11), dtype=np.float32)
    assert float(a[0]) * float(a[0]) + float(c[0]) == 2.0 ** -24  # the exact (fused) value
    assert np.all(a * a + c == 0)  # numpy: two roundings
    for grid in (batched_interpret, pinned_sums):
        f = jax.jit(grid(lambda a, b, c: a * b + c), compiler_options=options)
        assert np.all(np.asarray(f(a, a, c)) == 0), grid.__name__


def test_leg_records_its_compile_options():
    """Level 1 with the fences, by the loop emitters; level 0 where this jax cannot run the grid interpreters that
    apply the fences (jax 0.9 and 0.12, whose XLA also has no loop emitters)."""
    leg = TpuLeg(force_interpret=True, compile_targets=())
    want = INTERPRET_COMPILER_OPTIONS if unavailable() is None else LEVEL_0_OPTIONS
    assert interpret_options() == want
    assert leg.context().compiler_options == want
    # in the settings, so in the rows and in the candidate cache's key
    assert leg.environment().settings["xla_compiler_options"] == dict(want)


def test_another_draw_of_a_case_compiles_nothing():
    """The staged forward and backward programs are kept per shape: the causality runs and further draws
    reuse them; and a draw's outputs do not depend on what ran before it."""
    from jax._src import monitoring

    compiles = collections.Counter()

    def count(event, duration, **kwargs):
        compiles[event] += 1

    monitoring.register_event_duration_secs_listener(count)
    leg = TpuLeg(force_interpret=True, compile_targets=())
    case = Case.from_id(SMALL)
    op = get_op(case.op)
    runs = {}
    key = "/jax/core/compile/backend_compile_duration"
    for seed in (0, 1, 0):
        c = case.replace(seed=seed)
        before = compiles[key]
        out = leg.run(op, c, make_inputs(c, op.inputs(c)))
        if seed in runs:
            assert compiles[key] == before, "a second draw of the same shapes recompiled"
            assert all(np.array_equal(runs[seed][t], v, equal_nan=True) for t, v in out.tensors.items())
        runs.setdefault(seed, out.tensors)
    assert not np.array_equal(runs[0]["o"], runs[1]["o"])  # the draws are different inputs


def test_options_this_xla_refuses_give_level_0(monkeypatch):
    """A jax whose XLA has no such option (jax 0.12 has no loop emitters) runs the leg at level 0, rather than
    failing every case's compile."""
    import harness.legs.tpu as tpu

    monkeypatch.setattr(tpu, "INTERPRET_COMPILER_OPTIONS", (("xla_no_such_option_anywhere", True),))
    tpu.interpret_options.cache_clear()
    try:
        assert tpu.interpret_options() == LEVEL_0_OPTIONS
    finally:
        tpu.interpret_options.cache_clear()
