"""One kernel call's static configuration and the layout steps around its ``pallas_call``, shared by the chunked
delta-rule kernels (kda, gdn2 and gdn through kda), their decode kernels and the gated recurrent kernels
(:mod:`kernels_tpu.gated_recurrent`): the :class:`Config` a ``custom_vjp`` carries as its static argument, how
one is made (interpret mode and the MXU model resolved, the dot policy checked before tracing), the head-major
kernel rows and the public output taken back from them."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from kernels_tpu import mxu
from kernels_tpu.common import BlockSizes, HeadPadding
from kernels_tpu.interpret import resolve_interpret, resolve_mxu_model
from kernels_tpu.varlen import ChunkWalk, Packing


@dataclasses.dataclass(frozen=True)
class Config:
    """Static configuration of one call (hashable: a ``custom_vjp`` nondiff argument)."""

    scale: float
    blocks: BlockSizes
    interpret: Any  # False, or a pltpu.InterpretParams
    mxu_model: bool
    dtype: str  # the public q/k/v dtype: picks the dot policy
    packing: Packing  # the public token axis's sequences (cu_seqlens), laid out by self.walk
    f32_precision: Any = None  # None: the policy's table; the decode path asks for f32-accurate dots

    @property
    def policy(self) -> mxu.Policy:
        return mxu.policy_for(self.dtype, self.mxu_model, self.f32_precision)

    @property
    def walk(self) -> ChunkWalk:
        """The chunks the kernels walk: packed sequences chunk-aligned in one row, no padding rows."""
        return ChunkWalk(self.packing, self.blocks.chunk_size)


def make_config(scale, blocks: BlockSizes, interpret, mxu_model, dtype, packing: Packing,
                 f32_precision=None) -> Config:
    """A call's :class:`Config`: interpret mode and the MXU model resolved from the arguments (None: this
    machine's), and the dot policy asked now, so that a bad precision is a ValueError before tracing."""
    interpret = resolve_interpret(interpret)
    mxu_model = resolve_mxu_model(mxu_model, interpret)
    mxu.policy_for(dtype, mxu_model, f32_precision)  # a bad precision is a ValueError before tracing
    return Config(scale=scale, blocks=blocks, interpret=interpret,
                  mxu_model=mxu_model, dtype=jnp.dtype(dtype).name, packing=packing, f32_precision=f32_precision)


def head_major(x):
    """Kernel rows [R,L,H,...] -> [R,H,L,...]. fp16 is widened to f32: Mosaic loads no fp16."""
    (x,) = mxu.widen_fp16(x)
    return jnp.swapaxes(x, 1, 2)


def public_o(cfg: Config, pad: HeadPadding, o, like):
    """Head-major kernel rows of o -> [B, T, H, V]: real tokens, true V, in the dtype of ``like`` (q)."""
    return pad.unpad_values(cfg.walk.to_tokens(jnp.swapaxes(o, 1, 2))).astype(like.dtype)
