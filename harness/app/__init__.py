"""The application layer: what the two front ends, the CLI (:mod:`harness.cli`) and the pytest plugin
(:mod:`harness.pytest_plugin`), share, so they cannot drift apart.

- **Which cases.** :class:`~harness.app.selection.Selection` (:mod:`harness.app.selection`).
- **How a run runs.** Frozen settings records built once by each front end (:mod:`harness.app.settings`), and
  the run object that builds the runners and the worker pool and runs the stages (:mod:`harness.app.session`;
  the pool: :mod:`harness.app.workers`).
- **What the gate writes.** :func:`~harness.app.session.write_gate`: parity.csv, parity.md, parity.html and
  parity.png, and ``$GITHUB_STEP_SUMMARY``.
- **What a binding receives.** :func:`binding_inputs`, for ``parity cases --inputs``.
- **One case on one leg, for analysis scripts.** :func:`~harness.app.analysis.run_case` and
  :func:`~harness.app.analysis.golden` (:mod:`harness.app.analysis`): tensors and errors against the golden.

Every error is a ValueError with one line; each front end turns it into its own usage error.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Selection": "selection", "case_from_id": "selection", "find_case": "selection", "load_cases": "selection",
    "result_in": "selection",
    "Outcome": "session", "Run": "session", "gate_case": "session", "write_gate": "session",
    "GateSettings": "settings", "LegOptions": "settings", "RunSettings": "settings",
    "golden": "analysis", "run_case": "analysis", "rel_l2": "analysis",
}
"""The layer's names, each from its module, imported when first asked for: a worker process imports
:mod:`harness.app.workers` alone, not the gate's renderers."""


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"harness.app.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness.app' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


class _Received(Exception):
    """Raised by :func:`binding_inputs`'s recording forward once it has seen its arrays."""


def binding_inputs(op, case) -> tuple[object, list[tuple[str, tuple[int, ...], str]]]:
    """What a candidate binding's ``forward`` receives for ``case``, read by tracing the leg's own call of a
    recording binding on shape-only inputs: (the case of its first call, [(name, shape, dtype)]). The state
    arrives K-first whatever the case's layout; a served case (``pool=``, ``decode=``) hands each call its
    requests' states, and a decode chain's first call is its prefill (the case returned)."""
    import jax

    from cases.inputs import NP_DTYPES
    from harness.legs.tpu import NATIVE
    from harness.ops.base import LegBinding, call_k_first
    from harness.ops.serving import served_binding

    seen = {}

    def record(call, arrays, ctx):
        seen["case"] = call
        seen["arrays"] = [(name, tuple(a.shape), str(a.dtype)) for name, a in arrays.items()]
        raise _Received

    binding = served_binding(op, LegBinding(record, differentiable=False))
    structs = {s.name: jax.ShapeDtypeStruct(tuple(int(d) for d in s.shape(case)), NP_DTYPES[s.resolve_dtype(case)])
               for s in op.inputs(case)}
    try:
        jax.eval_shape(lambda a: call_k_first(case, binding.forward, a, NATIVE), structs)
    except _Received:
        pass
    return seen.get("case", case), seen.get("arrays", [])
