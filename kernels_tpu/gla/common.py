"""Shared pieces of the GLA Pallas TPU kernels: block sizes, config, dots, masks.

Layout inside the kernels: ``[B,T,H,K]`` inputs are viewed (free reshape) as
``[B,T,H*K]`` so a block ``(C, K)`` at column-block ``h`` is head ``h`` and the
last two block dims are TPU tile friendly (C a multiple of 8, K/V multiples
of 128: the public functions lane-pad them, ``kernels_tpu.common.HeadPadding``).
Per-chunk states are ``[B,NT,H*K,V]`` float32, single states ``[B,H*K,V]``
float32.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_tpu import mxu
from kernels_tpu.common import BlockSizes, Walk
from kernels_tpu.varlen import ChunkWalk, Packing

f32 = jnp.float32
NN, TN, NT_T = mxu.NN, mxu.TN, mxu.NT_T  # a @ b, a.T @ b, a @ b.T (kernels_tpu.mxu)
SQ = pl.squeezed  # a squeezed (size-1, dropped) block dimension

PATHS = ("auto", "fused", "chunk")


@dataclass(frozen=True)
class Config:
    """Static (hashable) settings threaded through custom_vjp as a nondiff argument."""

    scale: float
    blocks: BlockSizes
    interpret: Any  # False or a pltpu.InterpretParams
    mxu_model: bool
    dtype: str  # the public q/k/v dtype: picks the dot policy
    packing: Packing  # the public token axis's sequences (cu_seqlens), laid out by self.walk

    @property
    def policy(self) -> mxu.Policy:
        return mxu.policy_for(self.dtype, self.mxu_model)

    @property
    def C(self) -> int:
        return self.blocks.chunk_size

    @property
    def walk(self) -> ChunkWalk:
        """The chunks the kernels walk: packed sequences chunk-aligned in one row, no padding rows."""
        return ChunkWalk(self.packing, self.C)

    def dims(self, q, v):
        """(B, T, H, K, V, NT, BV, NV) of padded q [B,T,H,K] and v [B,T,H,V]: NT chunks, NV V tiles of BV."""
        B, T, H, K = q.shape
        V = v.shape[-1]
        BV = self.blocks.block_v_for(V)
        return B, T, H, K, V, T // self.C, BV, V // BV

    def compiler_params(self, *semantics: str):
        """Grid dimension semantics; the sequential (time) axis is last and "arbitrary"."""
        return pltpu.CompilerParams(dimension_semantics=tuple(semantics))


# ------------------------------------------------------------- index maps
def index_maps(NV: int):
    """Index maps of gla's grids (R, H, NV, NT), time last, over the token-major layout [R, T, H*X]:
    q/k/g blocks [1, C, K] (all of K), v/o blocks [1, C, BV] (V tile ``iv`` of NV), the state
    [1, K, BV] (fixed across time: VMEM-resident carry), per-chunk states [1, 1, K, BV]. The
    state-carrying passes walk time with :func:`walk_maps` instead."""
    def qk_map(b, h, iv, t):
        del iv
        return (b, t, h)

    def v_map(b, h, iv, t):
        return (b, t, h * NV + iv)

    def state_map(b, h, iv, t):
        del t
        return (b, h, iv)

    def states_map(b, h, iv, t):
        return (b, t, h, iv)

    return qk_map, v_map, state_map, states_map


def walk_maps(NV: int, walk: Walk):
    """:func:`index_maps` for a grid walking a :class:`kernels_tpu.common.Walk` (the state-carrying
    passes): every map also takes the walk's tables, and the state of one sequence, [N, H*K, V]
    blocks [1, K, BV], is the visited chunk's (its slot)."""
    def qk_map(b, h, iv, t, *tables):
        del iv
        return (b, walk.block(t), h)

    def v_map(b, h, iv, t, *tables):
        return (b, walk.block(t), h * NV + iv)

    def state_map(b, h, iv, t, slot_ref, edge_ref):
        return (walk.slot(b, t, slot_ref), h, iv)

    def states_map(b, h, iv, t, *tables):
        return (b, walk.block(t), h, iv)

    return qk_map, v_map, state_map, states_map


# ----------------------------------------------------------- in-kernel maths
def mm(a, b, dims=NN, *, policy: mxu.Policy):
    """A dot of the recurrence, through the one precision policy (kernels_tpu.mxu.Policy)."""
    return policy.dot(a, b, dims)


def with_static(fn, **kw):
    """functools.partial that keeps a readable kernel name."""
    import functools

    return functools.wraps(fn)(functools.partial(fn, **kw))


def replace(cfg: Config, **kw) -> Config:
    return dataclasses.replace(cfg, **kw)


def zeros_like_ref(ref):
    return jnp.zeros(ref.shape, ref.dtype)


__all__ = ["BlockSizes", "Config", "PATHS"]
