"""One case on one leg against the golden, for analysis scripts (``reports/*/locate*.py`` and their kind): the
case's inputs, its float64 golden, a leg's tensors and their errors, without a result file.

    from harness.app.analysis import golden, run_case, rel_l2

    r = run_case("kda.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64", "tpu")
    r.rel_l2("dq"), r.rel_l2("o", axis=(0, 2, 3))   # one number; one per token
    r.metrics("dq")                                 # the result file's metric columns (harness.core.metrics)

    g = golden(case_id)                             # the inputs and golden once, for several legs
    for leg in ("gpu", "tpu"):
        print(leg, run_case(g, leg).rel_l2("ht"))

A leg runs as ``parity run`` runs it (the candidate's interpret mode and MXU model), but a candidate compiles for
no real TPU here (``compile_targets=()``, its tensors the same) unless the options say otherwise, and the golden is
computed in memory (no cache is read or written). The leg is called directly (``Leg.run``), so an error is raised,
not turned into a row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cases.case import Case
from cases.inputs import Inputs, make_inputs
from harness.app.selection import case_from_id
from harness.core.metrics import compare
from harness.legs.registry import leg_spec, make_leg
from harness.ops import get_op
from harness.ops.base import OpDescriptor
from harness.run.reference_cache import ReferenceCache


def f64(x) -> np.ndarray:
    """``x`` as a float64 array."""
    return np.asarray(x, np.float64)


def rel_l2(got, ref, axis=None):
    """``‖got − ref‖₂ / ‖ref‖₂`` in float64, over ``axis`` (None: the whole tensor; a tuple: one value per
    remaining index, e.g. ``axis=(0, 2, 3)`` of a ``[B, T, H, V]`` tensor is one per token). No check of finite
    values: a NaN shows as NaN (the result files' ``rel_l2``, :func:`harness.core.metrics.rel_l2`, says inf)."""
    got, ref = f64(got), f64(ref)
    return np.sqrt(((got - ref) ** 2).sum(axis) / (ref ** 2).sum(axis))


@dataclasses.dataclass(frozen=True)
class Golden:
    """A case, its op, its inputs and their float64 golden."""

    case: Case
    op: OpDescriptor
    inputs: Inputs
    tensors: dict  # tensor name -> the golden (float64)


def golden(case: Case | str | Golden) -> Golden:
    """The case (or its id) with its inputs and float64 golden, computed in memory."""
    if isinstance(case, Golden):
        return case
    case = case_from_id(case) if isinstance(case, str) else case
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    return Golden(case, op, inputs, dict(ReferenceCache(None).get(op, case, inputs)))


@dataclasses.dataclass(frozen=True)
class CaseRun:
    """One leg's tensors of one case beside the golden."""

    leg: str
    golden: Golden
    tensors: dict  # tensor name -> the leg's value (absent: the leg gives no such tensor)

    @property
    def case(self) -> Case:
        return self.golden.case

    def error(self, tensor: str) -> np.ndarray:
        """``got − ref`` in float64."""
        return f64(self.tensors[tensor]) - f64(self.golden.tensors[tensor])

    def rel_l2(self, tensor: str, axis=None):
        return rel_l2(self.tensors[tensor], self.golden.tensors[tensor], axis)

    def metrics(self, tensor: str) -> dict:
        """The result file's metric columns of ``tensor`` (rel_l2, max_abs, ULPs in the tensor's dtype, ...)."""
        spec = next(s for s in self.golden.op.tensors(self.case) if s.name == tensor)
        return compare(self.tensors[tensor], self.golden.tensors[tensor], spec.resolve_dtype(self.case))


def make(leg: str, **options):
    """Leg ``leg`` as the analysis runs it: a candidate with no real-TPU compile unless ``options`` say."""
    if leg_spec(leg).role == "candidate":
        options.setdefault("compile_targets", ())
    return make_leg(leg, **options)


def run_case(case: Case | str | Golden, leg: str, **options) -> CaseRun:
    """``leg`` on ``case`` (a case, its id, or a :func:`golden` already made), beside the golden. ``options``:
    the leg's (:func:`harness.legs.make_leg`)."""
    g = golden(case)
    return CaseRun(leg, g, dict(make(leg, **options).run(g.op, g.case, g.inputs).tensors))
