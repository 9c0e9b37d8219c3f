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

A tensor its op declares a sum (:mod:`harness.ops.reductions`: a gradient of a parameter shared by every token,
such as ``g_gamma``, ``A_log``, ``dt_bias``) is judged by the rules ``over="contributions"`` instead: its error
against the float64 magnitudes of the terms it sums, ``‖y − r‖₂ / ‖a‖₂ <= bound`` with ``a_i = Σ_j |c_ij|``,
which is ``rel_l2 <= bound · κ`` for the reduction's condition number ``κ = ‖a‖₂ / ‖r‖₂``
(:func:`harness.core.metrics.condition_number`; docs/definitions.md, "Bounds on reductions"). A sum whose terms
cancel is not held to a relative error its float64 terms could not give it; one that does not cancel
(κ ≈ 1) is held to ``bound`` itself.

Policy
------
For every gated metric m of every (case, tensor) present in both files:

    pass  iff  eps_tpu(m) <= eps_gpu(m) * (1 + rel_margin) + abs_floor(m)

Strict by default: ``rel_margin = 0`` and ``abs_floor = 0``. The gated metrics
default to ``rel_l2`` and ``max_abs``; the ULP metrics are reported and can be
gated with ``--gate-metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from harness.core.metrics import METRICS


@dataclass(frozen=True)
class Bound:
    rel_l2: float
    reason: str
    op: str = "*"
    tensor: str = "*"
    dtype: str = "*"  # the case dtype
    role: str = "*"  # the leg's role (harness.legs.registry.ROLES): reference, baseline or candidate
    # what the error is relative to: REFERENCE (rel_l2, every tensor) or CONTRIBUTIONS (a declared sum's terms)
    over: str = "reference"

    def __post_init__(self):
        if self.over not in OVER:
            raise ValueError(f"Bound over={self.over!r} must be one of {OVER}")

    def specificity(self) -> int:
        return sum(x != "*" for x in (self.op, self.tensor, self.dtype, self.role))

    def matches(self, op: str, tensor: str, dtype: str, role: str, over: str = "reference") -> bool:
        return self.over == over and all(rule in ("*", value) for rule, value in
                                         ((self.op, op), (self.tensor, tensor), (self.dtype, dtype), (self.role, role)))

    def limit(self, kappa: float | None = None) -> float:
        """The bound on rel_l2 itself: ``rel_l2`` over the reference; over a sum's contributions ``rel_l2 · κ``
        (``kappa``: the reduction's condition number), at most :data:`GROSS_REL_L2`."""
        return min(self.rel_l2 * kappa, GROSS_REL_L2) if self.over == CONTRIBUTIONS else self.rel_l2


REFERENCE, CONTRIBUTIONS = "reference", "contributions"
OVER = (REFERENCE, CONTRIBUTIONS)
GROSS_REL_L2 = 0.5
"""A declared sum's bound on rel_l2 never exceeds this, however much its terms cancel: a result half as far from
the sum as zero is (an all-zero gradient has rel_l2 1) is a gross error. Where the terms cancel more than
GROSS_REL_L2 / bound-fold (the candidate's: 63), a zero gradient is within the bound over the terms, and only
this catches it (gla's dg_gamma: kappa 138 on tests/test_fault_injection.py's case). Clean kernels reach rel_l2
0.17 (this project's, kappa 903) and 0.20 (fla's, kappa 3400): reports/calibration/reduction-bounds."""


BOUNDS: list[Bound] = [
    # bf16 inputs carry 2^-9 relative rounding each; outputs and gradients of a
    # few hundred accumulated terms in f32 stay well under 2 % (measured 1e-3..1e-2).
    Bound(5e-2, "bf16 inputs: 8-bit significands", dtype="bfloat16"),
    # fp16: 11-bit significands, 8x finer than bf16.
    Bound(1e-2, "fp16 inputs: 11-bit significands", dtype="float16"),
    # fp32: the GPU rounds dot inputs to TF32 (10-bit significand, ~4e-4 measured
    # on o); the TPU's DEFAULT precision is one bf16 pass. Allow both.
    Bound(1e-2, "fp32 inputs: TF32 / bf16-pass dots", dtype="float32"),
    # dg sums q.dq - k.dk, terms that cancel; under a strong decay (fla's normalizer 0.1) fla's TF32 dots leave
    # rel_l2 1.2e-2 on an H100 (reports/h100-native), which 1e-2 would turn into a GPU row without a number.
    Bound(5e-2, "fp32 inputs: dg sums cancelling TF32 terms", tensor="dg", dtype="float32"),
    # the reference leg at float32 compute: float32 rounding only.
    Bound(1e-4, "float32 re-computation of the reference", role="reference"),
    # ---- sums (tensors the op declares reductions: g_gamma's, A_log's and dt_bias's gradients), judged over the
    # magnitudes of their terms, |y - r| <= bound * sum |c| (docs/definitions.md, "Bounds on reductions"). The
    # rel_l2 rules they replace (1e-1 on dA_log, ddt_bias) were cancellation allowances: fla's dA_log 5.0e-2 on a
    # kda bf16 draw whose terms cancel 202-fold is 2.5e-4 of its terms.
    # reports/calibration/reduction-bounds: this project's kernels leave at most 4.1e-3 of the terms (bf16 dg_gamma
    # of simple_gla.chunk/B1-T256-H2/.../alibi, kappa 1.0: a bias, not cancellation); a fault of 1 % of the terms
    # is 1e-2, over 8e-3.
    Bound(8e-3, "a sum's error within 0.8 % of its terms' magnitudes", over=CONTRIBUTIONS),
    # fla's dg terms are rounded further (bf16; TF32 at fp32): gdn's dA_log and ddt_bias reach 1.4e-2 of their
    # terms at fp32 (B1-T192-H2, kappa 2.2) and 9.3e-3 at bf16; a baseline out of bounds loses its number.
    Bound(3e-2, "fla's bf16 / TF32 dg terms: a sum's error within 3 % of its terms' magnitudes", role="baseline",
          over=CONTRIBUTIONS),
    Bound(1e-4, "float32 re-computation of the reference", role="reference", over=CONTRIBUTIONS),
]


def most_specific(rules, *key):
    """The rule of ``rules`` matching ``key`` with the most non-``"*"`` fields (ties: the later rule), or None.
    Bounds and margin rules are both looked up this way."""
    matching = [(r.specificity(), i) for i, r in enumerate(rules) if r.matches(*key)]
    return rules[max(matching)[1]] if matching else None


def bound_for(op: str, tensor: str, dtype: str, role: str, rules: list[Bound] = BOUNDS,
              over: str = REFERENCE) -> Bound:
    """The bound on a ``role`` leg's error for ``op``'s ``tensor`` in a ``dtype`` case: over the reference
    (rel_l2), or, for a tensor its op declares a sum, ``over=CONTRIBUTIONS`` (:meth:`Bound.limit`)."""
    bound = most_specific(rules, op, tensor, dtype, role, over)
    if bound is None:
        raise LookupError(f"no bound for {op=} {tensor=} {dtype=} {role=} {over=}: add a rule to "
                          f"harness.core.policy.BOUNDS")
    return bound


@dataclass(frozen=True)
class MarginRule:
    """The margin of one metric where the calibration measured more noise than the metric's default allows
    (``"*"`` matches anything; the most specific matching rule wins, ties: the later rule)."""

    metric: str
    margin: float
    op: str = "*"
    dtype: str = "*"  # the case dtype
    tensor: str = "*"

    def specificity(self) -> int:
        return sum(x != "*" for x in (self.op, self.dtype, self.tensor))

    def matches(self, metric: str, op: str, dtype: str, tensor: str) -> bool:
        return self.metric == metric and all(rule in ("*", value) for rule, value in
                                              ((self.op, op), (self.dtype, dtype), (self.tensor, tensor)))


@dataclass(frozen=True)
class Policy:
    """When the candidate's error ε_TPU is worse than the baseline's ε_GPU, per metric (module doc).

    - ``margins[m]`` (or ``rel_margin`` for a metric without an entry): the relative margin, unless
      one of ``rules`` (:class:`MarginRule`, from a calibration) names the (op, dtype, tensor);
    - ``abs_floor[m]``: an absolute allowance on top (default none);
    - ``alpha``: rel_l2 only. A rel_l2 over ``eps_gpu·(1+margin)+floor`` fails only if the paired block
      bootstrap's one-sided (1 − alpha) lower bound of ε_TPU/ε_GPU also exceeds ``1 + margin``
      (:mod:`harness.core.noise`); 0 judges the point value alone.
    - ``source``: where the policy came from (a policy file, or "explicit"), for the report.
    """

    metrics: tuple[str, ...] = ("rel_l2", "max_abs")
    rel_margin: float = 0.0
    abs_floor: Mapping[str, float] = field(default_factory=dict)
    margins: Mapping[str, float] = field(default_factory=dict)
    alpha: float = 0.0
    source: str = "explicit"
    rules: tuple[MarginRule, ...] = ()

    def __post_init__(self):
        unknown = set(self.metrics) - set(METRICS)
        if unknown or not self.metrics:
            raise ValueError(f"gated metrics must be a non-empty subset of {METRICS}; got {self.metrics}")
        if not self.rel_margin >= 0:
            raise ValueError(f"{self.rel_margin=} must be >= 0")
        for name, table in (("abs_floor", self.abs_floor), ("margins", self.margins)):
            bad = {m: v for m, v in table.items() if m not in METRICS or not v >= 0}
            if bad:
                raise ValueError(f"{name} entries must be metric -> value >= 0; bad: {bad}")
        bad_rules = [r for r in self.rules if r.metric not in METRICS or not r.margin >= 0]
        if bad_rules:
            raise ValueError(f"margin rules need a metric of {METRICS} and a margin >= 0; bad: {bad_rules[0]}")
        if not (self.alpha == 0 or 0 < self.alpha < 0.5):
            raise ValueError(f"alpha must be 0 (no bootstrap) or in (0, 0.5), got {self.alpha}")

    def margin(self, metric: str, op: str = "", dtype: str = "", tensor: str = "") -> float:
        """The margin of ``metric`` for a tensor of an op at a case dtype (the most specific rule, else the
        metric's default)."""
        rule = most_specific(self.rules, metric, op, dtype, tensor)
        return self.margins.get(metric, self.rel_margin) if rule is None else rule.margin

    def allowed(self, metric: str, eps_baseline: float, **where) -> float:
        return eps_baseline * (1.0 + self.margin(metric, **where)) + self.abs_floor.get(metric, 0.0)

    def passes(self, metric: str, eps_candidate: float, eps_baseline: float, **where) -> bool:
        """The point rule alone; a NaN on either side never passes (NaN comparisons are False).
        ``where``: ``op``, ``dtype``, ``tensor``, for the margin rules."""
        return bool(eps_candidate <= self.allowed(metric, eps_baseline, **where))

    def bootstraps(self, metric: str) -> bool:
        return metric == "rel_l2" and self.alpha > 0

    def judge(self, metric: str, eps_candidate: float, eps_baseline: float, baseline_blocks=None,
              candidate_blocks=None, **where):
        """``(passed, lower)``: the verdict on one metric, and the bootstrap lower bound of the ratio when
        one was needed (None otherwise). The bootstrap only ever clears an alarm that the blocks'
        noise explains; it never fails what the point rule passes."""
        if self.passes(metric, eps_candidate, eps_baseline, **where):
            return True, None
        if not self.bootstraps(metric) or baseline_blocks is None or candidate_blocks is None:
            return False, None
        from harness.core.noise import ratio_lower_bound

        lower = ratio_lower_bound(baseline_blocks, candidate_blocks, self.alpha)
        return bool(lower <= 1.0 + self.margin(metric, **where)), lower

    def with_overrides(self, *, metrics=None, margin=None, floors=None, alpha=None) -> "Policy":
        """This policy with command-line overrides: ``margin`` replaces every per-metric margin."""
        return replace(self, metrics=self.metrics if metrics is None else tuple(metrics),
                       rel_margin=self.rel_margin if margin is None else margin,
                       margins=self.margins if margin is None else {},
                       rules=self.rules if margin is None else (),
                       abs_floor=self.abs_floor if floors is None else floors,
                       alpha=self.alpha if alpha is None else alpha,
                       source=self.source if all(x is None for x in (metrics, margin, floors, alpha))
                       else f"{self.source}, overridden on the command line")

    def describe(self) -> str:
        margins = ", ".join(f"{m} {self.margin(m):g}" for m in self.metrics)
        floors = ", ".join(f"{m}>={v:g}" for m, v in sorted(self.abs_floor.items())) or "none"
        noise = (f"; rel_l2 fails only if the paired block bootstrap's {1 - self.alpha:g} lower bound of the "
                 f"ratio exceeds 1 + margin" if self.alpha > 0 and "rel_l2" in self.metrics else "")
        rules = [r for r in self.rules if r.metric in self.metrics]
        per_tensor = f" ({len(rules)} wider where calibration measured more noise)" if rules else ""
        return (f"eps_tpu <= eps_gpu * (1 + margin) + floor; gated metrics and margins: {margins}{per_tensor}; "
                f"floors: {floors}{noise} (policy: {self.source})")

    # ---------------------------------------------------------------- policy files
    def to_toml(self, header: str = "", provenance: Mapping[str, object] | None = None) -> str:
        """The policy as a TOML file :meth:`load` reads back (``provenance`` goes to a [calibration] table)."""
        lines = [f"# {line}" if line else "#" for line in header.splitlines()]
        lines += [f"metrics = [{', '.join(repr(m).replace(chr(39), chr(34)) for m in self.metrics)}]",
                  f"alpha = {self.alpha!r}", "", "[margins]"]
        lines += [f"{m} = {self.margin(m)!r}" for m in METRICS]
        if self.abs_floor:
            lines += ["", "[abs_floor]"] + [f"{m} = {v!r}" for m, v in sorted(self.abs_floor.items())]
        for r in self.rules:
            lines += ["", "[[rules]]"] + [f"{k} = {_toml_value(getattr(r, k))}"
                                          for k in ("op", "dtype", "tensor", "metric", "margin")]
        if provenance:
            lines += ["", "[calibration]"] + [f"{k} = {_toml_value(v)}" for k, v in provenance.items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, path) -> "Policy":
        """A policy file (TOML: ``metrics``, ``alpha``, ``[margins]``, optional ``[abs_floor]`` and
        ``[calibration]``); ValueError naming the file and the field on anything else."""
        import tomllib

        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"policy file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"policy file {path}: not TOML ({exc})") from None
        known = {"metrics", "alpha", "margins", "abs_floor", "rules", "calibration"}
        if set(data) - known:
            raise ValueError(f"policy file {path}: unknown field(s) {sorted(set(data) - known)}; "
                             f"expected {sorted(known)}")
        for name in ("margins", "abs_floor"):
            table = data.get(name, {})
            if not isinstance(table, dict) or not all(isinstance(v, (int, float)) for v in table.values()):
                raise ValueError(f"policy file {path}: [{name}] must map metric names to numbers")
        if not isinstance(data.get("metrics", []), list):
            raise ValueError(f"policy file {path}: 'metrics' must be a list of metric names")
        rules = data.get("rules", [])
        fields = {"op", "dtype", "tensor", "metric", "margin"}
        if not isinstance(rules, list) or not all(isinstance(r, dict) and set(r) <= fields and {"metric", "margin"}
                                                  <= set(r) for r in rules):
            raise ValueError(f"policy file {path}: each [[rules]] entry needs metric and margin, and may name op, "
                             f"dtype and tensor")
        try:
            return cls(metrics=tuple(data.get("metrics", cls.metrics)), alpha=float(data.get("alpha", 0.0)),
                       margins={m: float(v) for m, v in data.get("margins", {}).items()},
                       abs_floor={m: float(v) for m, v in data.get("abs_floor", {}).items()}, source=str(path),
                       rules=tuple(MarginRule(**{**r, "margin": float(r["margin"])}) for r in rules))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"policy file {path}: {exc}") from None


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


DEFAULT_POLICY_FILE = Path(__file__).parents[1] / "policy.toml"
"""The shipped, calibrated policy: ``parity calibrate``'s ``policy.toml`` (docs/definitions.md, "Calibration")."""


def default_policy() -> Policy:
    """The calibrated policy every verb and the pytest plugin use unless told otherwise."""
    return replace(Policy.load(DEFAULT_POLICY_FILE), source="the shipped harness/policy.toml")


def policy_from_options(path=None, metrics: str | None = None, margin: float | None = None,
                        floors: str | None = None, alpha: float | None = None) -> Policy:
    """The policy of a command line or pytest run: the policy file (default: the calibrated one) with any
    option given on top; ValueError with a one-line reason on bad input."""
    base = Policy.load(path) if path else default_policy()
    names = None if metrics is None else tuple(m.strip() for m in metrics.split(",") if m.strip())
    return base.with_overrides(metrics=names, margin=margin, floors=None if floors is None else parse_floors(floors),
                               alpha=alpha)


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
