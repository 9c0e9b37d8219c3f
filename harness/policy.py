"""Absolute sanity bounds and the parity policy: one table each, no literals elsewhere.

Bounds
------
Each leg's error on each tensor must satisfy ``rel_l2 <= bound``. The bound is
looked up in :data:`BOUNDS`, a list of rules keyed by (op, tensor, case dtype,
leg) where ``"*"`` matches anything; the most specific matching rule wins
(ties: the later rule). Bounds are deliberately loose: they catch gross bugs
(an all-zero gradient has rel_l2 = 1, a dropped K tile about 0.7, a missing
transpose O(1)) even when the other leg has no number. They are not the parity
rule. Inputs are quantized to the case dtype, so the bound keys on the *case*
dtype, also for tensors declared float32 (ht, dg, dh0).

Policy
------
For every gated metric m of every (case, tensor) present in both files:

    pass  iff  eps_tpu(m) <= eps_gpu(m) * (1 + rel_margin) + abs_floor(m)

Strict by default: ``rel_margin = 0`` and ``abs_floor = 0``. The gated metrics
default to ``rel_l2`` and ``max_abs``; the ULP metrics are reported and can be
gated with ``--gate-metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .metrics import METRICS


@dataclass(frozen=True)
class Bound:
    rel_l2: float
    reason: str
    op: str = "*"
    tensor: str = "*"
    dtype: str = "*"  # the case dtype
    leg: str = "*"

    def specificity(self) -> int:
        return sum(x != "*" for x in (self.op, self.tensor, self.dtype, self.leg))

    def matches(self, op: str, tensor: str, dtype: str, leg: str) -> bool:
        return all(rule in ("*", value) for rule, value in
                   ((self.op, op), (self.tensor, tensor), (self.dtype, dtype), (self.leg, leg)))


BOUNDS: list[Bound] = [
    # bf16 inputs carry 2^-9 relative rounding each; outputs and gradients of a
    # few hundred accumulated terms in f32 stay well under 2 % (measured 1e-3..1e-2).
    Bound(5e-2, "bf16 inputs: 8-bit significands", dtype="bfloat16"),
    # fp16: 11-bit significands, 8x finer than bf16.
    Bound(1e-2, "fp16 inputs: 11-bit significands", dtype="float16"),
    # fp32: the GPU rounds dot inputs to TF32 (10-bit significand, ~4e-4 measured
    # on o); the TPU's DEFAULT precision is one bf16 pass. Allow both.
    Bound(1e-2, "fp32 inputs: TF32 / bf16-pass dots", dtype="float32"),
    # the reference leg at float32 compute: float32 rounding only.
    Bound(1e-4, "float32 re-computation of the reference", leg="ref"),
]


def bound_for(op: str, tensor: str, dtype: str, leg: str, rules: list[Bound] = BOUNDS) -> Bound:
    matching = [(r.specificity(), i, r) for i, r in enumerate(rules) if r.matches(op, tensor, dtype, leg)]
    if not matching:
        raise LookupError(f"no bound for {op=} {tensor=} {dtype=} {leg=}: add a rule to harness.policy.BOUNDS")
    return max(matching)[2]


@dataclass(frozen=True)
class Policy:
    """ε_TPU ≤ ε_GPU · (1 + rel_margin) + abs_floor, for each metric in ``metrics``."""

    metrics: tuple[str, ...] = ("rel_l2", "max_abs")
    rel_margin: float = 0.0
    abs_floor: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.metrics) - set(METRICS)
        if unknown or not self.metrics:
            raise ValueError(f"gated metrics must be a non-empty subset of {METRICS}; got {self.metrics}")
        if not self.rel_margin >= 0:
            raise ValueError(f"{self.rel_margin=} must be >= 0")
        bad = {m: v for m, v in self.abs_floor.items() if m not in METRICS or not v >= 0}
        if bad:
            raise ValueError(f"abs_floor entries must be metric -> value >= 0; bad: {bad}")

    def allowed(self, metric: str, eps_gpu: float) -> float:
        return eps_gpu * (1.0 + self.rel_margin) + self.abs_floor.get(metric, 0.0)

    def passes(self, metric: str, eps_tpu: float, eps_gpu: float) -> bool:
        # a NaN on either side never passes (NaN comparisons are False)
        return bool(eps_tpu <= self.allowed(metric, eps_gpu))

    def describe(self) -> str:
        floors = ", ".join(f"{m}>={v:g}" for m, v in sorted(self.abs_floor.items())) or "none"
        return (f"eps_tpu <= eps_gpu * (1 + {self.rel_margin:g}) + floor; gated metrics: "
                f"{', '.join(self.metrics)}; floors: {floors}")


def parse_floors(text: str | None) -> dict[str, float]:
    """``"rel_l2=1e-6,max_abs=1e-5"`` -> dict; raises ValueError with the expected form."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"floor {item!r} must look like metric=value, e.g. rel_l2=1e-6")
        out[name.strip()] = float(value)
    return out
