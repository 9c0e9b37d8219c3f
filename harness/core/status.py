"""Row statuses and gate verdicts: the words every result file and report uses, defined once.

A result row's ``status`` (per case x tensor x leg):

- ``ok``: compared, finite, within the absolute bound;
- ``bound``: compared, finite, rel_l2 above the absolute bound;
- ``nonfinite``: NaN/Inf in the leg's result where the reference is finite;
- ``not_provided``: the leg returns no such tensor;
- ``unsupported``: the leg cannot run the case (``reason`` says why);
- ``error``: validation, input generation, compilation, the leg or the reference raised.

Causality rows add ``leak``. Compile rows use ``ok``, ``error`` and ``unsupported``.
"""

from __future__ import annotations


class Status:
    OK = "ok"
    BOUND = "bound"
    NONFINITE = "nonfinite"
    NOT_PROVIDED = "not_provided"
    UNSUPPORTED = "unsupported"
    ERROR = "error"
    LEAK = "leak"


FORWARD_ONLY = "forward-only implementation: no backward, so no gradient"
"""The start of a ``not_provided`` gradient row's reason when the leg runs a forward-only implementation
(``LegBinding.differentiable=False``): the gate then covers the forward tensors only, and says so."""

NO_GRADIENT = "no gradient by design"
"""The start of a ``not_provided`` gradient row's reason when the leg's binding declares it gives no gradient of
that input by design (``LegBinding.no_gradient``), followed by the binding's reason: the gate does not compare
the tensor, and its headline counts it, as it counts a forward-only candidate's gradients."""

FAILING = (Status.BOUND, Status.NONFINITE, Status.ERROR)
"""Result-row statuses that make ``parity run`` exit 1 and fail the gate as the candidate's."""

CAUSALITY_FAILING = (Status.LEAK, Status.ERROR)
