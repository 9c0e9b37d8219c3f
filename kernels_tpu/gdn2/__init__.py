"""Gated DeltaNet-2 (GDN-2) Pallas TPU kernels: kda's chunk recurrence with a per-key-channel erase gate b and a
per-value-channel write gate w (:mod:`kernels_tpu.gdn2.chunk`, forward and backward), and the decode path, kda's
fused-recurrent kernel with the erase key b * k (:mod:`kernels_tpu.gdn2.recurrent`, forward only)."""

from .chunk import chunk_gdn2, chunk_gdn2_bwd, chunk_gdn2_fwd
from .recurrent import fused_recurrent_gdn2

__all__ = ["chunk_gdn2", "chunk_gdn2_fwd", "chunk_gdn2_bwd", "fused_recurrent_gdn2"]
