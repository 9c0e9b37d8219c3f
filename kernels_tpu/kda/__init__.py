"""KDA (Kimi delta attention) Pallas TPU kernels: chunked (:mod:`kernels_tpu.kda.chunk`, forward and backward)
and fused-recurrent (:mod:`kernels_tpu.kda.recurrent`, the decode path, forward only)."""

from .chunk import SAFE_GATE_LOWER_BOUND, BlockSizes, check_options, chunk_kda, chunk_kda_bwd, chunk_kda_fwd
from .recurrent import fused_recurrent_kda

__all__ = ["BlockSizes", "SAFE_GATE_LOWER_BOUND", "check_options", "chunk_kda", "chunk_kda_fwd", "chunk_kda_bwd",
           "fused_recurrent_kda"]
