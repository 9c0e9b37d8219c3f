"""The reference's token-by-token check with its backward recomputing states from one kept every 64 tokens
(references._scan.token_scan) against the same recurrence keeping every state, as it did before: the same scan, so
the forward is bit for bit and every gradient within 1e-12 relative (the issue's bound; measured: equal)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import references._scan as scan  # noqa: E402
from cases.case import Case  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from harness.ops import get_op  # noqa: E402
from harness.ops.base import call_k_first  # noqa: E402
from references._x64 import float64_cpu  # noqa: E402


def test_token_scan_is_lax_scan():
    """A decayed running sum over 100 tokens in segments of 7, 64 or 1000 (padded with zero tokens, which leave the
    state as it is, as the ops' do): the final state, every output and the vjp are lax.scan's."""
    rng = np.random.default_rng(0)
    a = rng.uniform(-0.7, 0.0, (100, 3))  # log decays
    b = rng.standard_normal((100, 3))

    def step(S, x):
        log_decay, add = x
        S = jnp.exp(log_decay) * S + add
        return S, S * S

    def loss(fn, a, b):
        S, ys = fn(step, jnp.ones(3), (a, b))
        return jnp.sum(S * 3.0) + jnp.sum(ys), (S, ys)

    with float64_cpu(True):
        pad_is_identity = step(jnp.ones(3) * 2.5, (jnp.zeros(3), jnp.zeros(3)))[0]
        assert np.array_equal(np.asarray(pad_is_identity), np.full(3, 2.5))
        ref = jax.value_and_grad(lambda a, b: loss(lax.scan, a, b), argnums=(0, 1), has_aux=True)(a, b)
        for every in (7, 64, 1000):
            got = jax.value_and_grad(lambda a, b: loss(lambda *s: scan.token_scan(*s, every=every), a, b),
                                     argnums=(0, 1), has_aux=True)(a, b)
            for x, y in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
                assert np.asarray(x).shape == np.asarray(y).shape
                np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-14, atol=0)


def _recurrent(case_id):
    case = Case.from_id(case_id)
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    jax.clear_caches()  # the references' jitted programs were traced with the other segment length
    return call_k_first(case, op.reference, inputs.as_float64(), method="recurrent", compute_dtype="float64")


@pytest.mark.parametrize("case_id", [
    "simple_gla.chunk/B2-T100-H1-K16-V8/fp32/g=logsigmoid/16/C64/h0,dht",
    pytest.param("simple_gla.chunk/B1-T80-H2-K32-V16/bf16/g=logsigmoid/16/g_gamma[]=const(-0.5)/C64/dht",
                 marks=pytest.mark.slow),
    pytest.param("gla.chunk/B1-T150-H2-K32-V16/fp32/g=logsigmoid/16/C64/lens=37+70+43,h0,dht", marks=pytest.mark.slow),
])
def test_the_reference_check_keeps_its_numbers(case_id, monkeypatch):
    monkeypatch.setattr(scan, "CHECKPOINT_EVERY", 1 << 20)  # one segment: every state kept, as before
    before = _recurrent(case_id)
    monkeypatch.setattr(scan, "CHECKPOINT_EVERY", 64)
    after = _recurrent(case_id)
    jax.clear_caches()
    assert set(before) == set(after)
    for name, old in before.items():
        new = after[name]
        if old is None:
            assert new is None, name
            continue
        old, new = np.asarray(old), np.asarray(new)
        scale = np.max(np.abs(old))
        assert np.max(np.abs(new - old)) <= 1e-12 * scale, (name, np.max(np.abs(new - old)) / scale)
    assert np.array_equal(np.asarray(before["o"]), np.asarray(after["o"]))  # the forward: the same scan
