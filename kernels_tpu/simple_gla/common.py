"""Shared pieces of the simple_gla Pallas TPU kernels.

Shapes use fixed letters: ``B`` batch, ``T`` tokens, ``H`` heads, ``K`` key
dim, ``V`` value dim, ``BT`` chunk size, ``NT = ceil(T / BT)`` chunks, ``Tp =
NT * BT`` padded length. The public layout is fla's ``[B, T, H, K]``; inside
the kernels everything is head-major ``[B, H, Tp, K]`` so every block is a
``(BT, K)`` tile whose last two dims are (8, 128)-aligned.

Between the two layouts (:func:`kernel_operands`, :func:`public_tokens`): K and
V are zero-padded to lane multiples (:class:`kernels_tpu.common.HeadPadding`)
and packed sequences (``cu_seqlens``) are laid chunk-aligned in one kernel row
(:class:`kernels_tpu.varlen.ChunkWalk`; the state-walking kernels reset at each
sequence's first chunk); with neither, the kernels see the batch as given. Both
are exact (zero channels, identity tokens).

Gates. ``g_t <= 0`` is a log decay (a concrete positive gate is a ValueError,
see :mod:`op_contract`). Within chunk ``c`` the kernels use the chunk-local
cumulative gate ``b_i = g_{cBT} + ... + g_{cBT+i}`` (so ``b <= 0`` and
non-increasing), and ``b_last = b_{BT-1}``. For ``g_gamma`` this is
``b_i = gamma * (i + 1)``, computed in the kernel from an iota, never from a
synthetic per-token tensor, and held at its value on the chunk's last real token
(padding tokens have gate 0; each chunk's real tokens are in SMEM). Every exponent
the kernels evaluate is ``<= 0``: ``b_i``, ``b_last - b_j`` and, on the causal
triangle only, ``b_i - b_j``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from op_contract import check_simple_gla
from kernels_tpu import mxu
from kernels_tpu.common import (BlockSizes, HeadPadding, causal_mask, check_limits, check_one_gate,
                                check_per_head_gamma, chunk_rows, chunk_states_map, masked_exp, row_to_column)
from kernels_tpu.interpret import resolve_interpret, resolve_mxu_model
from kernels_tpu.varlen import ChunkWalk, Packing

F32 = jnp.float32

NN, TN, NT_T = mxu.NN, mxu.TN, mxu.NT_T  # a @ b, a.T @ b, a @ b.T (kernels_tpu.mxu)



# ---------------------------------------------------------------- dots
def mm(a, b, policy: mxu.Policy, dims=NN):
    """A dot of the recurrence. Operands are first rounded to the input dtype's MXU operand type
    (bf16 for bf16 inputs: the decayed scores and the f32 state too, as fla rounds them)."""
    return policy.dot(a.astype(policy.operand_dtype), b.astype(policy.operand_dtype), dims)


def mm_f32(a, b, policy: mxu.Policy, dims=NN):
    """An f32-accurate dot for the gate gradient's reverse cumsum, whatever the input dtype."""
    return policy.exact(a, b, dims)


# ------------------------------------------------------------ in-kernel maths
def causal_decay(b_col, b_row):
    """Intra-chunk decay matrix ``D[i, j] = exp(b_i - b_j) [i >= j]``, ``[BT, BT]`` f32.

    Above the diagonal ``b_i - b_j = -(g_{i+1} + ... + g_j) >= 0`` can be huge
    (ALiBi gamma=-0.7071 at BT=128 gives up to 89.8 > 88.7: exp overflows to
    inf), so the exponent is zeroed there BEFORE exp and the result masked after.
    """
    return masked_exp(b_col - b_row, causal_mask(b_col.shape[0]))


def split_refs(refs, n_data: int, gate: str):
    """A kernel's refs, in the order every simple_gla kernel takes them: ``n_data`` data refs,
    then the gate's refs (:func:`gate_specs`: one for ``g``, two for ``g_gamma``), then the rest (a list)."""
    n_gate = 1 if gate == "g" else 2
    return refs[:n_data], refs[n_data:n_data + n_gate], list(refs[n_data + n_gate:])


def chunk_gates(gate_refs, *, gate: str, BT: int, NT: int, chunk, step: int):
    """Chunk-local cumulative gate of one chunk: ``(b_col [BT,1], b_row [1,BT], b_last [1,1])``.

    gate == "g": ``gate_refs = (grow_ref [NS, 1, BT],)`` holds the wrapper's chunk-local
      cumsum as chunk rows (padded tokens have gate 0); the column is made from the row.
    gate == "g_gamma": ``gate_refs = (gamma_ref [H], real_ref [rows * NT])`` in SMEM
      (each chunk's real tokens: :meth:`kernels_tpu.varlen.ChunkWalk.real_tokens`);
      ``b_i = gamma * min(i + 1, n_real)`` with ``n_real`` the real tokens of chunk
      ``chunk`` of this kernel row: the clamp gives padding tokens (past a sequence's
      end, or past T) a zero gate, so padding stays exact and a sequence's final
      state is its own.
    """
    if gate == "g":
        (grow_ref,) = gate_refs
        b_row = grow_ref[step]
        return row_to_column(b_row), b_row, b_row[:, BT - 1:BT]
    gamma_ref, real_ref = gate_refs
    gamma = gamma_ref[pl.program_id(1)]
    n_real = real_ref[pl.program_id(0) * NT + chunk]  # real tokens of this chunk
    pos_col = jax.lax.broadcasted_iota(jnp.int32, (BT, 1), 0) + 1
    pos_row = jax.lax.broadcasted_iota(jnp.int32, (1, BT), 1) + 1
    b_col = gamma * jnp.minimum(pos_col, n_real).astype(F32)
    b_row = gamma * jnp.minimum(pos_row, n_real).astype(F32)
    return b_col, b_row, b_row[:, BT - 1:BT]


def gate_specs(gate: str, BT: int, NS: int, row_map=chunk_states_map):
    """BlockSpecs of the gate inputs (see :func:`chunk_gates`): ``g``'s chunk rows [NS, 1, BT], walking time
    with the grid's index map of per-chunk states; ``g_gamma``'s two SMEM vectors."""
    if gate == "g_gamma":
        return [pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.SMEM)]
    return [pl.BlockSpec((None, None, NS, 1, BT), row_map)]


# ------------------------------------------------------------ config, layout
@dataclasses.dataclass(frozen=True)
class Config:
    """Static (hashable) configuration of one call, shared by fwd and bwd."""

    packing: Packing  # the public token axis's sequences (cu_seqlens), laid out by self.walk
    scale: float
    blocks: BlockSizes
    gate: str  # "g" | "g_gamma" | "none" (no decay: gamma = 0)
    dtype: str  # the public q/k/v dtype: sets the dot policy and the dtype of o, dq, dk, dv
    output_final_state: bool
    interpret: Any  # False or a pltpu.InterpretParams
    mxu_model: bool

    @property
    def walk(self) -> ChunkWalk:
        """The chunks the kernels walk: packed sequences chunk-aligned in one row, no padding rows."""
        return ChunkWalk(self.packing, self.blocks.chunk_size)

    @property
    def kernel_gate(self) -> str:
        return "g" if self.gate == "g" else "g_gamma"

    def compiler_params(self, *semantics):
        return pltpu.CompilerParams(dimension_semantics=tuple(semantics))


def to_heads(x):
    """Kernel rows [R, Tp, H, X] -> head-major [R, H, Tp, X]; fp16 widened to f32 (Mosaic loads no fp16)."""
    (x,) = mxu.widen_fp16(x)
    return jnp.transpose(x, (0, 2, 1, 3))


def public_tokens(cfg: Config, x, dtype):
    """Head-major kernel rows [R, H, Tp, X] -> the public [B, T, H, X] in ``dtype``: the real tokens
    only (chunk padding dropped, packed sequences gathered back)."""
    return cfg.walk.to_tokens(jnp.transpose(x, (0, 2, 1, 3))).astype(dtype)


def kernel_operands(cfg: Config, q, k, v, g, g_gamma, h0, do=None, dht=None):
    """The public arrays as the kernels take them: K, V zero-padded to lane multiples, the tokens in
    the walk's rows (whole chunks; packed sequences chunk-aligned in one row), head-major; the gate operands
    (:func:`prepare_gates`); h0, dht lane-padded f32. Returns ``(pad, (q, k, v, do), gates, h0, dht)``
    with ``pad`` the HeadPadding that slices the results back."""
    pad = HeadPadding.of(q, v)

    def rows(x):
        return None if x is None else to_heads(cfg.walk.to_rows(x))

    tokens = (rows(pad.keys(q)), rows(pad.keys(k)), rows(pad.values(v)),
              None if do is None else rows(pad.values(do.astype(q.dtype))))
    gates = prepare_gates(cfg, cfg.walk.to_rows(g), g_gamma, q.shape[2])
    h0, dht = (None if x is None else pad.state(x.astype(F32)) for x in (h0, dht))
    return pad, tokens, gates, h0, dht


def prepare_gates(cfg: Config, g, g_gamma, H: int):
    """Kernel gate operands: the chunk-local cumsum of ``g`` [R, NT * BT, H] (kernel rows) as chunk rows
    [R, H, NT, 1, BT] (:func:`kernels_tpu.common.chunk_rows`); or ``g_gamma`` as an f32 [H] vector (zeros
    when there is no decay) and each chunk's real tokens as an int32 [R * NT] vector, both for SMEM."""
    BT = cfg.blocks.chunk_size
    if cfg.gate == "g":
        R, NT = g.shape[0], cfg.walk.NT  # rows of whole chunks, padding with gate 0: exact
        g = jnp.transpose(g.astype(F32), (0, 2, 1))  # [R, H, NT * BT]
        b = jnp.cumsum(g.reshape(R, H, NT, BT), axis=-1)  # chunk-local cumsum, f32
        return (chunk_rows(b.reshape(R, H, NT * BT), BT),)
    gamma = g_gamma.astype(F32) if cfg.gate == "g_gamma" else jnp.zeros((H,), F32)
    return (gamma, cfg.walk.real_tokens())


# ---------------------------------------------------------------- validation
def validate(q, k, v, g, g_gamma, scale, initial_state, chunk_size, *, num_steps: int = 1, do=None,
             dht=None, cu_seqlens=None) -> tuple[float, BlockSizes]:
    """Checks every argument before any tracing: the op contract (:func:`op_contract.check_simple_gla`,
    ValueError), then the kernels' limits (NotImplementedError). Returns the resolved scale (from the
    true K: before any lane padding) and the blocks."""
    dims, scale = check_simple_gla(q, k, v, g, g_gamma, scale, initial_state, chunk_size, do=do, dht=dht,
                                   cu_seqlens=cu_seqlens)
    check_limits(q, dims)
    check_one_gate(g, g_gamma)
    check_per_head_gamma(g_gamma)
    return scale, BlockSizes(chunk_size=chunk_size, num_steps=num_steps)


def make_config(q, g, g_gamma, scale, blocks, output_final_state, interpret, mxu_model, cu_seqlens=None):
    interpret = resolve_interpret(interpret)
    mxu_model = resolve_mxu_model(mxu_model, interpret)
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be a bool, got {output_final_state=}")
    gate = "g" if g is not None else ("g_gamma" if g_gamma is not None else "none")
    return Config(packing=Packing.of(cu_seqlens, q), scale=scale, blocks=blocks, gate=gate,
                  dtype=jnp.dtype(q.dtype).name,
                  output_final_state=output_final_state,
                  interpret=interpret, mxu_model=bool(mxu_model))
