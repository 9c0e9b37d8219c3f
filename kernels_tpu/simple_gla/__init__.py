"""simple_gla Pallas TPU kernels: chunk and fused_chunk, forward and backward.

Layout [B, T, H, K] (fla); state [B, H, K, V] float32. See chunk.py for the maths.
"""

from .chunk import chunk_simple_gla, chunk_simple_gla_bwd, chunk_simple_gla_fwd
from .common import BlockSizes
from .fused_chunk import fused_chunk_simple_gla, fused_chunk_simple_gla_bwd, fused_chunk_simple_gla_fwd

__all__ = [
    "BlockSizes",
    "chunk_simple_gla",
    "chunk_simple_gla_fwd",
    "chunk_simple_gla_bwd",
    "fused_chunk_simple_gla",
    "fused_chunk_simple_gla_fwd",
    "fused_chunk_simple_gla_bwd",
]
