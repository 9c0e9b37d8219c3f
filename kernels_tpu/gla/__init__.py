"""GLA (gated linear attention, per-key-channel decay) Pallas TPU kernels.

A standalone library (imports only jax and kernels_tpu.mxu). Layout
``[B,T,H,K]`` (fla); state ``[B,H,K,V]`` float32.

- ``chunk_gla``: differentiable forward (custom_vjp), ``(o, ht or None)``.
- ``chunk_gla_fwd`` / ``chunk_gla_bwd``: the forward and backward kernels called directly.
- ``gla_dispatch(g, g_gamma, path)``: which path runs ("fused" or "chunk").
- ``BlockSizes``: the tiling, validated on construction.

Paths: ``chunk.py`` (per-channel g: four pallas_calls, stabilised sub-chunk
exponentials) and ``fused.py`` (g_gamma: one pallas_call forward, one
backward with reverse index maps and a real dg_gamma). See ``api.py``.
"""

from .api import chunk_gla, chunk_gla_bwd, chunk_gla_fwd, gla_dispatch
from .common import PATHS, BlockSizes

__all__ = ["BlockSizes", "PATHS", "chunk_gla", "chunk_gla_bwd", "chunk_gla_fwd", "gla_dispatch"]
