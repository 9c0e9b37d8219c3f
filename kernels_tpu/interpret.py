"""How every kernel in this library resolves ``interpret`` and ``mxu_model``.

- ``interpret=None`` (or False): compile natively for TPU.
- ``interpret=True``: Pallas TPU interpret mode with uninitialised memory read
  as NaN, so a kernel reading scratch or output it never wrote shows up.
- a ``pltpu.InterpretParams``: passed through.
- ``mxu_model=None``: model the MXU's rounding (``kernels_tpu.mxu``) exactly
  when interpreting; never on a real TPU, whose hardware rounds by itself.
"""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu


def resolve_interpret(interpret):
    if interpret is None or interpret is False:
        return False
    if interpret is True:
        return pltpu.InterpretParams(uninitialized_memory="nan")
    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    raise ValueError(f"interpret must be None, a bool or a pltpu.InterpretParams, got {interpret=}")


def resolve_mxu_model(mxu_model, interpret) -> bool:
    """``interpret`` as returned by :func:`resolve_interpret`."""
    if mxu_model is None:
        return interpret is not False
    if not isinstance(mxu_model, bool):
        raise ValueError(f"mxu_model must be None or a bool, got {mxu_model=}")
    return mxu_model
