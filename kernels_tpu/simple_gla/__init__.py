"""simple_gla Pallas TPU kernels: chunk and fused_chunk, forward and backward."""

from .chunk import chunk_simple_gla, chunk_simple_gla_bwd, chunk_simple_gla_fwd
from .common import BlockSizes

__all__ = [
    "BlockSizes",
    "chunk_simple_gla",
    "chunk_simple_gla_fwd",
    "chunk_simple_gla_bwd",
]
