"""Checks beyond the comparison, each a walk over cases through a leg's runner: causality and isolation
(:mod:`~harness.probes.causality`), the real-TPU compile of every case (:mod:`~harness.probes.compile_cases`,
``parity compile``) and the MXU probe (:mod:`~harness.probes.mxu_probe`)."""
