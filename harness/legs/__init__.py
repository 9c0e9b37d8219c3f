"""Legs: the registry (:mod:`harness.legs.registry`) names them; ``ref`` (float64 reference recomputed),
``gpu`` (fla Triton) and ``tpu`` (Pallas) are built in, and any implementation can join as a candidate."""

from __future__ import annotations

from .base import Environment, Leg, LegOutput
from .registry import ROLES, LegSpec, default_leg, leg_spec, legs, make_leg, parse_impl, register_implementation

__all__ = ["Environment", "Leg", "LegOutput", "LegSpec", "ROLES", "default_leg", "leg_spec", "legs", "make_leg",
           "parse_impl", "register_implementation"]
