"""The reference leg: the float64 reference recomputed another way.

It runs the op's reference binding with ``method`` (default the token-by-token
recurrence, so every run re-checks the chunked golden) at ``compute_dtype``
(float64 by default; float32 gives an honest second result file with which to
exercise the gate before hardware legs exist). It runs natively on the CPU. It takes
every case: the recurrence's backward (references._rank_one, every op's) keeps a state per chunk
(per 64 tokens where a case has no chunk size), never one per token.
"""

from __future__ import annotations

import platform

import jax
import jaxlib
import numpy as np

from cases.case import Case
from cases.inputs import Inputs
from harness.ops.base import OpDescriptor, call_k_first

from .base import Environment, Leg, LegOutput



class RefLeg(Leg):
    """The op's float64 reference, recomputed another way (recurrent, or chunked at float32)."""

    def __init__(self, method: str = "recurrent", compute_dtype: str = "float64"):
        self.method = method
        self.compute_dtype = compute_dtype

    def environment(self) -> Environment:
        return Environment(
            mode="native",
            device=f"cpu ({platform.machine()})",
            versions={"jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": np.__version__},
            settings={"method": self.method, "compute_dtype": self.compute_dtype},
        )

    def sources(self, op: OpDescriptor) -> tuple:
        return op.reference, op.differentiable  # the float64 reference, not a leg binding

    def supports(self, op: OpDescriptor, case: Case) -> str | None:
        """Every case: the op's reference has no binding to refuse with, and its recurrence's backward keeps a
        state per chunk (references._rank_one), so no case is too large (until 2026-11-28 it refused above 2 GiB of
        states)."""
        return None

    def run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> LegOutput:
        out = call_k_first(case, op.reference, inputs.as_float64(), method=self.method,
                           compute_dtype=self.compute_dtype)
        details = {"method": self.method, "compute_dtype": self.compute_dtype}
        if case.cu_seqlens is not None:
            details["cu_seqlens"] = list(case.cu_seqlens)
        return LegOutput(tensors=out, details=details)
