"""KDA (Kimi delta attention) Pallas TPU kernels; see :mod:`kernels_tpu.kda.chunk`."""

from .chunk import SAFE_GATE_LOWER_BOUND, BlockSizes, check_options, chunk_kda, chunk_kda_bwd, chunk_kda_fwd

__all__ = ["BlockSizes", "SAFE_GATE_LOWER_BOUND", "check_options", "chunk_kda", "chunk_kda_fwd", "chunk_kda_bwd"]
