"""The kernels' HBM layout choices that keep the stress footprint down (issue 25).

- **Per-token scalars travel as chunk rows** (kda's beta and dbeta, simple_gla's gate): a column
  ``[.., T, 1]`` would take a whole 128-lane tile row per token in HBM. simple_gla's dg is the one exception
  (``kernels_tpu.simple_gla.chunk.chunk_bwd_impl`` says why). The kernels turn a row
  into a column and back with :func:`kernels_tpu.common.row_to_column` / ``column_to_row``, which must be
  exact: checked here on hand-picked values, -0.0, subnormals, infinities and NaN included, bit for bit, both as jax
  ops and inside a Pallas kernel in TPU interpret mode.
- **Every backward writes its per-token gradients over its inputs** (``input_output_aliases``): checked on
  the program lowered for a real TPU (v6e, deviceless), kernel by kernel: which outputs each backward
  kernel aliases, and that no kernel takes or returns a per-token column.

That the aliased and lane-dense kernels compute the same numbers as before is the other kernel tests' job
(bit-exact packing, head padding and the float64 references); the footprints are measured in
reports/varlen/README.md.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from harness.compile.tpu_compile import target_device
from kernels_tpu.common import column_to_row, row_to_column
from kernels_tpu.gla import chunk_gla_bwd
from kernels_tpu.kda import chunk_kda_bwd
from kernels_tpu.simple_gla import chunk_simple_gla_bwd, fused_chunk_simple_gla_bwd

# every float32 class: zeros of both signs, infinities, NaN, subnormals, the extremes of the normals
HAND_VALUES = np.array([1.5, -0.0, 0.0, np.inf, -np.inf, np.nan, -3.25e38, 2.0 ** -126, -2.0 ** -126, 0.1,
                        1e-45, -1e-40, 2.0 ** -127, 3.0e38, -7.0, 2.0 ** 24 + 2], np.float32)


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def test_row_column_conversions_are_exact_on_hand_values():
    row, col = HAND_VALUES[None, :], HAND_VALUES[:, None]
    to_col, to_row = jax.jit(row_to_column)(row), jax.jit(column_to_row)(col)
    assert to_col.shape == col.shape and to_row.shape == row.shape
    np.testing.assert_array_equal(bits(to_col), bits(col))
    np.testing.assert_array_equal(bits(to_row), bits(row))
    np.testing.assert_array_equal(bits(jax.jit(lambda r: column_to_row(row_to_column(r)))(row)), bits(row))


def test_row_column_conversions_are_exact_inside_a_tpu_kernel_in_interpret_mode():
    C = HAND_VALUES.size

    def kernel(row_ref, col_ref, back_ref):
        col = row_to_column(row_ref[...])
        col_ref[...] = col
        back_ref[...] = column_to_row(col)

    col, back = pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct((C, 1), jnp.float32), jax.ShapeDtypeStruct((1, C), jnp.float32)],
        interpret=pltpu.InterpretParams())(HAND_VALUES[None, :])
    np.testing.assert_array_equal(bits(col), bits(HAND_VALUES[:, None]))
    np.testing.assert_array_equal(bits(back), bits(HAND_VALUES[None, :]))


# ------------------------------------------------------------------ what the TPU program aliases
T, H, K, C = 256, 2, 128, 64
LENS = (0, 100, 156)  # packed, an empty sequence and partial chunks included


def structs(**shapes):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.array([target_device("v6e")]), ("x",)), PartitionSpec())
    return {n: jax.ShapeDtypeStruct(s, dt, sharding=sharding) for n, (s, dt) in shapes.items()}


BF16, F32 = jnp.bfloat16, jnp.float32
TOKENS = dict(q=((1, T, H, K), BF16), k=((1, T, H, K), BF16), v=((1, T, H, K), BF16), do=((1, T, H, K), BF16))
N = len(LENS)  # sequences: one state each
STATE = dict(initial_state=((N, H, K, K), F32), dht=((N, H, K, K), F32))

# backward entry point, its extra inputs, and per backward kernel: the outputs it writes over an input
CASES = {
    "simple_gla chunk, g": (chunk_simple_gla_bwd, dict(g=((1, T, H), F32)),
                            {"chunk_simple_gla_bwd": ("dq", "dk", "dv")}),
    "simple_gla chunk, g_gamma": (chunk_simple_gla_bwd, dict(g_gamma=((H,), F32)),
                                  {"chunk_simple_gla_bwd": ("dq", "dk", "dv")}),
    "simple_gla fused_chunk, g": (fused_chunk_simple_gla_bwd, dict(g=((1, T, H), F32)),
                                  {"fused_chunk_simple_gla_bwd_dq_dk": ("dq", "dk"),
                                   "fused_chunk_simple_gla_bwd_dv_dh": ()}),
    "gla chunk": (chunk_gla_bwd, dict(g=((1, T, H, K), BF16)), {"gla_chunk_bwd": ("dq", "dk", "dv", "dg")}),
    "kda chunk": (chunk_kda_bwd, dict(g=((1, T, H, K), F32), beta=((1, T, H), F32)),
                  {"kda_bwd": ("dq", "dk", "dv", "dg", "dbeta")}),
}


@functools.lru_cache(maxsize=None)  # both tests read the same lowering of each case
def lowered_kernels(case: str) -> dict[str, tuple[int, list[str]]]:
    """kernel name -> (outputs aliased to an input, the tensor types of its operands and results), from the
    program lowered for v6e with the kernels native."""
    fn, extra, _ = CASES[case]
    args = structs(**TOKENS, **extra, **STATE)
    cu = np.cumsum((0,) + LENS)

    def program(a):
        kw = {n: a[n] for n in a if n not in ("q", "k", "v", "do")}
        return fn(a["q"], a["k"], a["v"], *([kw.pop("g"), kw.pop("beta")] if fn is chunk_kda_bwd else []),
                  do=a["do"], interpret=False, chunk_size=C, cu_seqlens=cu, **kw)

    text = jax.jit(program).trace(args).lower().as_text()
    kernels = {}
    for line in text.splitlines():
        name = re.search(r'kernel_name = "([^"]+)"', line)
        if "tpu_custom_call" in line and name:
            signature = line[line.rindex(" : ("):]  # (operand types) -> (result types)
            kernels[name.group(1)] = (line.count("#stablehlo.output_operand_alias"),
                                      re.findall(r"tensor<([0-9x]+)x(?:bf16|f32|f16)>", signature))
    return kernels


@pytest.mark.parametrize("case", CASES)
def test_backward_writes_its_gradients_over_its_inputs(case):
    kernels = lowered_kernels(case)
    for kernel, aliased in CASES[case][2].items():
        assert kernel in kernels, (kernel, sorted(kernels))
        assert kernels[kernel][0] == len(aliased), (kernel, aliased, kernels[kernel][0])


DG_COLUMN = {"chunk_simple_gla_bwd", "fused_chunk_simple_gla_bwd_dq_dk"}  # simple_gla's dg result, kept a column


@pytest.mark.parametrize("case", CASES)
def test_no_kernel_takes_or_returns_a_per_token_column(case):
    """A [.., T, 1] operand or result would pad each token's scalar to a 128-lane tile row in HBM. The one allowed
    is simple_gla's dg, a result of its backward kernels when the op has a gate."""
    gated = "g" in CASES[case][1] or "g_gamma" in CASES[case][1]
    for kernel, (_, shapes) in lowered_kernels(case).items():
        columns = [s for s in shapes if s.endswith("x1") and int(s.split("x")[-2]) >= C]
        assert len(columns) == (1 if gated and kernel in DG_COLUMN else 0), (kernel, columns)
