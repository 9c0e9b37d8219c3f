"""Where gla's chunk output kernel differs between the batched grid and jax's per-program interpret mode (fp32).

A cut-down copy of ``kernels_tpu.gla.chunk._fwd_o_kernel`` (one head, T = 128, C = 64, row blocks of 16, the
precomputed cumulative gate ``b`` passed in), run both ways under the fusion emitters; prints how many output bits
differ. Flags (comma-separated) switch pieces off:

- ``inter``, ``diag``, ``off``: drop the inter-chunk term ``(q e^b) S``, the diagonal block, the earlier columns;
- ``unroll``: the row blocks as a Python loop instead of the kernel's ``fori_loop``;
- ``noexp``: ``q b`` instead of ``q e^b`` in the inter-chunk term;
- ``plain``: the inter-chunk dot as one f32 ``HIGHEST`` dot instead of the MXU model's three bf16 passes.

Found (reports/bench/2026-11-27-cpu-legs): ``unroll`` alone differs, ``unroll,diag,off,noexp`` still differs,
``unroll,diag,off,plain`` does not, nor does any variant without ``unroll``.

    .venv/bin/python benchmarks/gla_fwd_o_batched.py unroll,diag,off,noexp
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import harness.legs.tpu as tpu  # noqa: E402
from harness.emulation.pallas_batched import batched_interpret  # noqa: E402
from kernels_tpu import mxu  # noqa: E402
from kernels_tpu.common import causal_mask, iota, masked_exp  # noqa: E402

F32, BC, C, T, D = jnp.float32, 16, 64, 128, 128
FLAGS = frozenset(f for f in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if f)
POLICY = mxu.policy_for(F32, mxu_model=True)


def _inter(qI, bI, S):
    e = bI if "noexp" in FLAGS else jnp.exp(bI)
    if "plain" in FLAGS:
        return jax.lax.dot_general(qI * e, S, mxu.NN, precision=jax.lax.Precision.HIGHEST)
    return POLICY.dot(qI * e, S)


def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref):
    b_all, k_all, v_all, S = b_ref[...], k_ref[...], v_ref[...], h_ref[...]

    def row_block(i, carry):  # rows r0..r0+BC of o
        rows = pl.ds(pl.multiple_of(i * BC, 8), BC)
        qI, kI, vI, bI = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], b_ref[rows, :]
        ref = b_ref[pl.ds(pl.multiple_of(i * BC, 8), 1), :]
        acc = jnp.zeros((BC, D), F32)
        if "inter" not in FLAGS:
            acc = acc + _inter(qI, bI, S)
        if "diag" not in FLAGS:
            decay = masked_exp(bI[:, None, :] - bI[None, :, :], causal_mask(BC, trailing=1))
            acc = acc + POLICY.dot(jnp.sum(qI[:, None, :] * kI[None, :, :] * decay, axis=-1), vI)
        if "off" not in FLAGS:
            k_off = k_all * masked_exp(ref - b_all, iota((C, 1), 0) < i * BC)
            acc = acc + POLICY.dot(POLICY.dot(qI * jnp.exp(bI - ref), k_off, mxu.NT_T), v_all)
        o_ref[rows, :] = acc
        return carry

    if "unroll" in FLAGS:
        for i in range(C // BC):
            row_block(i, 0)
    else:
        jax.lax.fori_loop(0, C // BC, row_block, 0)


def call(q, k, v, b, h):
    spec = pl.BlockSpec((None, C, D), lambda hh, t: (hh, t, 0))
    return pl.pallas_call(
        kernel, grid=(q.shape[0], T // C),
        in_specs=[spec, spec, spec, spec, pl.BlockSpec((None, None, D, D), lambda hh, t: (hh, t, 0, 0))],
        out_specs=spec, out_shape=jax.ShapeDtypeStruct(q.shape, F32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=pltpu.InterpretParams(uninitialized_memory="nan"), name="gla_fwd_o_copy")(q, k, v, b, h)


def main() -> int:
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(key, (1, T, D), F32) for key in keys[:3])
    g = -jax.nn.softplus(jax.random.normal(keys[3], (1, T, D), F32)) / 10
    b = jnp.cumsum(g.reshape(1, T // C, C, D), axis=2).reshape(1, T, D)  # the gate's cumsum within each chunk
    h = jax.random.normal(keys[4], (1, T // C, D, D), F32)
    options = dict(tpu.INTERPRET_COMPILER_OPTIONS)
    per_program = np.asarray(jax.jit(call, compiler_options=options)(q, k, v, b, h))
    batched = np.asarray(jax.jit(batched_interpret(call), compiler_options=options)(q, k, v, b, h))
    differ = per_program.view(np.uint32) != batched.view(np.uint32)
    print(f"flags {sorted(FLAGS)}: {int(differ.sum())} of {differ.size} output elements differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
