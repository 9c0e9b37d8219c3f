"""KDA (Kimi delta attention) Pallas TPU kernels; see :mod:`kernels_tpu.kda.chunk`."""

from .chunk import BlockSizes, chunk_kda, chunk_kda_bwd, chunk_kda_fwd

__all__ = ["BlockSizes", "chunk_kda", "chunk_kda_fwd", "chunk_kda_bwd"]
