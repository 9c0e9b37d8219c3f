"""Gated delta rule (GDN) Pallas TPU kernels: kda's, with GDN's scalar gate; see :mod:`kernels_tpu.gdn.chunk`."""

from .chunk import (chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd,
                    fused_recurrent_gated_delta_rule, log_decay)

__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_fwd", "chunk_gated_delta_rule_bwd",
           "fused_recurrent_gated_delta_rule", "log_decay"]
