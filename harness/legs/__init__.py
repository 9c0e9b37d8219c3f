"""Legs: ``ref`` (float64 reference recomputed), ``gpu`` (fla Triton), ``tpu`` (Pallas)."""

from __future__ import annotations

from .base import Environment, Leg, LegOutput

LEG_NAMES = ("ref", "gpu", "tpu")

LEG_VERSION_KEYS = {"ref": "numpy", "gpu": "triton", "tpu": "libtpu"}
"""The package each leg's environment names in its rows' ``versions``: a file whose rows say
``leg=gpu`` but carry no triton version was not made by the GPU leg (the gate checks it)."""


def make_leg(name: str, **options) -> Leg:
    """Build a leg by name; heavy frameworks are imported only here, on demand."""
    if name == "ref":
        from .ref import RefLeg

        return RefLeg(**options)
    if name == "gpu":
        from .gpu import GpuLeg

        return GpuLeg(**options)
    if name == "tpu":
        from .tpu import TpuLeg

        return TpuLeg(**options)
    raise ValueError(f"unknown backend {name!r}; choose one of {LEG_NAMES}")


__all__ = ["Environment", "Leg", "LegOutput", "LEG_NAMES", "LEG_VERSION_KEYS", "make_leg"]
