"""Gated DeltaNet-2 (GDN-2) Pallas TPU kernels: kda's chunk recurrence with a per-key-channel erase gate b and a
per-value-channel write gate w; see :mod:`kernels_tpu.gdn2.chunk`."""

from .chunk import chunk_gdn2, chunk_gdn2_bwd, chunk_gdn2_fwd

__all__ = ["chunk_gdn2", "chunk_gdn2_fwd", "chunk_gdn2_bwd"]
