"""The leg interface: run one op on one case, return plain named arrays.

A leg never judges. It says whether it can run a case (``supports``), runs it
(``run``), and describes how it ran (``environment`` for the whole run and
``LegOutput.details`` per case). The runner turns all of that into rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from cases.case import Case
from cases.inputs import Inputs
from harness.core.schema import MODES
from harness.ops.base import OpDescriptor



@dataclass
class LegOutput:
    """Named float arrays (numpy, any float dtype); a missing name is ``not_provided``."""

    tensors: Mapping[str, np.ndarray | None]
    details: Mapping[str, Any] = field(default_factory=dict)  # per-case provenance: configs, dispatch
    columns: Mapping[str, Any] = field(default_factory=dict)  # per-case values with columns of their own
    forward_only: bool = False  # a forward-only implementation: its missing gradients are not_provided as such
    # the backward raised after the forward ran: the forward's tensors are compared, every gradient row is an
    # error with this exception (its traceback kept beside the rows)
    backward_error: BaseException | None = None


class BackwardFailed(Exception):
    """A case's backward raised after its forward had run: ``outputs`` holds the forward's tensors, so their rows
    keep their numbers (a leg returns them in a :class:`LegOutput` with ``backward_error``)."""

    def __init__(self, outputs: Mapping[str, Any], cause: BaseException):
        super().__init__(f"the backward failed after the forward ran: {type(cause).__name__}: {cause}")
        self.outputs, self.cause = outputs, cause


@dataclass(frozen=True)
class Environment:
    """How a leg executes on this machine; recorded on every row."""

    mode: str  # "native" or "emulated"
    device: str  # e.g. "NVIDIA H100", "TPU v5e", "cpu (Triton interpreter)"
    versions: Mapping[str, str]
    settings: Mapping[str, Any] = field(default_factory=dict)  # dot precision, interpret params, mxu model

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"{self.mode=} must be one of {MODES}")

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


class Leg:
    """Base class: subclasses implement ``binding`` (or ``sources``), ``environment`` and ``run``. A leg's
    ``name`` is the one the leg registry gave it (:func:`harness.legs.registry.make_leg`)."""

    name: str = ""
    source_closure: bool = False
    """Whether the code this leg runs an op with lives in this repository, so a cache of its outputs
    (:mod:`harness.run.baseline_cache`) must hash every module the binding imports from it, not the binding's
    own module alone (the TPU kernels; fla's code is versioned by its package)."""

    def environment(self) -> Environment:
        raise NotImplementedError

    def binding(self, op: OpDescriptor):
        """How this leg runs ``op`` (a :class:`harness.ops.base.LegBinding`), or None."""
        return None

    def sources(self, op: OpDescriptor) -> tuple:
        """The functions this leg's output on ``op`` depends on, besides the leg's own module (what a cache
        of its output hashes): the binding's, and the op's list of differentiable inputs."""
        binding = self.binding(op)
        if binding is None:
            return ()
        return binding.forward, binding.supports, binding.describe, op.differentiable

    def keep_caches_under(self, root) -> None:
        """Where a leg that keeps caches of its own (beyond its outputs' cache, harness.run.baseline_cache) keeps
        them: the caches' root the run was given (None: none). Called once by the recipe that builds the leg's
        runner; most legs keep none."""

    def supports(self, op: OpDescriptor, case: Case) -> str | None:
        """None when this leg can run the case, else the reason it cannot."""
        binding = self.binding(op)
        if binding is None:
            return f"op {op.name!r} has no {self.name} binding"
        return binding.supports(case)

    def start_case(self, case: Case) -> None:
        """Called before a case's preflight and run (which may overlap): the place for per-process upkeep
        between cases (the TPU leg frees the compiled programs of the shapes it is done with)."""

    def preflight(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[str | None, dict]:
        """A check before ``run``: (an error reason, or None to go on; extra columns for the case's rows).

        The TPU leg compiles the case for real TPU targets here when it emulates.
        """
        return None, {}

    def run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> LegOutput:
        raise NotImplementedError


def cotangent_pairs(op: OpDescriptor, case: Case, outputs: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(output, upstream-gradient input) for every output the op produced.

    An output whose upstream gradient is not an input of this case (``ht``
    without ``dht``) gets ``None``: it is fed zeros.
    """
    return [(name, op.cotangents.get(name)) for name, value in outputs.items() if value is not None
            and name in op.cotangents]
