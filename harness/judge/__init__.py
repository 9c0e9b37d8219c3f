"""Judging rows: the gate (ε_candidate ≤ ε_baseline under the policy, fail closed: :mod:`~harness.judge.gate`),
the sequential test over input draws (:mod:`~harness.judge.sequential`) and the calibration of the policy on
clean kernels (:mod:`~harness.judge.calibrate`). Rows in, verdicts out: nothing here runs a leg."""
