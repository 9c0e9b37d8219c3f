"""Gated delta rule (GDN) Pallas TPU kernels; see :mod:`kernels_tpu.gdn.chunk`."""

from .chunk import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd, log_decay

__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_fwd", "chunk_gated_delta_rule_bwd", "log_decay"]
