"""The op registry: one descriptor per op. Adding an op adds one line here."""

from __future__ import annotations

from .base import LegBinding, OpDescriptor, TensorSpec
from .gdn import GDN
from .gdn2 import GDN2
from .gla import GLA
from .kda import KDA
from .serving import served
from .simple_gla import SIMPLE_GLA

# every op takes the serving options (a state pool, decode steps after a prefill): harness.ops.serving
REGISTRY: dict[str, OpDescriptor] = {d.name: served(d) for d in (SIMPLE_GLA, GLA, KDA, GDN, GDN2)}


def get_op(name: str) -> OpDescriptor:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; registered ops: {sorted(REGISTRY)}") from None


__all__ = ["REGISTRY", "get_op", "LegBinding", "OpDescriptor", "TensorSpec"]
